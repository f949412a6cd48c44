"""Measuring tuning candidates: build them in parallel worker processes, run them in an
isolated one, compare their outputs with the task's reference, time them with TVM's
time_evaluator, and append one tuning record per candidate.

    builder = LocalBuilder(n_parallel=2, timeout_s=30)
    runner = LocalRunner(number=4, repeat=3, timeout_s=10)
    results = measure_batch(builder, runner, [MeasureInput(task, cfg), ...], writer)

Building and running are separate (Builder / Runner) because a GPU candidate is built
on this machine and run on another one: build a batch here, ship the libraries, run
them there, read the timings back. The running half is `run_built_batch(jobs, options)`
over `RunJob`s (a library path, input arrays, output specs, expected outputs); it and
its worker need only tvm.runtime and numpy, so it can ship with the runtime.

Every failure of a candidate is recorded with its error as "kind: message", never the
tuner's end (DESIGN.md, "Errors"). Kinds:
  build_error    the schedule or the compiler raised, or the build process died
  build_timeout  the build took longer than the builder's timeout_s
  run_error      loading or calling the library raised (a Python-level error)
  runtime_crash  the kernel killed its process (segfault, abort); the worker restarts
  run_timeout    the kernel ran longer than the runner's timeout_s; the worker restarts
  wrong_result   outputs differ from the task's reference_outputs

This module imports neither tvm nor the compiler at module level: worker processes
import it first and choose what to load (the run worker loads the TVM runtime only).
"""

from __future__ import annotations

import collections
import math
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from tecc.autotune.records import Record, RecordWriter, Timed, workload_key

if TYPE_CHECKING:
    import tvm
    from tecc.autotune.task import TunableTask
    from tecc.schedules.space import Config

BUILD_ERROR = "build_error"
BUILD_TIMEOUT = "build_timeout"
RUN_ERROR = "run_error"
RUNTIME_CRASH = "runtime_crash"
RUN_TIMEOUT = "run_timeout"
WRONG_RESULT = "wrong_result"

# The function name every candidate library exports (the build renames the PrimFunc).
ENTRY = "main"
_MAX_MESSAGE = 500
# A first call shorter than this is always followed by the full measurement: below it,
# a cold cache or waking the thread pool can make the first call several times slower.
CUTOFF_FLOOR_S = 1e-3


# ---------------------------------------------------------------------------- data


@dataclass(frozen=True)
class MeasureInput:
    task: TunableTask
    config: Config


@dataclass
class BuildResult:
    path: str | None  # the exported .so, None when the build failed
    error: str | None  # "kind: message" or None
    build_s: float
    # (shape, dtype) of every PrimFunc argument, inputs then outputs: the runner
    # allocates outputs from these without asking the compiler.
    arg_specs: list[tuple[tuple[int, ...], str]] = field(default_factory=list)


@dataclass
class MeasureResult(Timed):
    costs_s: list[float]  # seconds per run, one per repeat; empty on error
    error: str | None
    all_cost: float  # wall seconds spent on this candidate (build + run)
    timestamp: float

    @property
    def error_kind(self) -> str | None:
        return self.error.split(":", 1)[0] if self.error else None


@dataclass
class RunJob:
    """One built candidate to run: everything the running side needs, no task."""

    path: str
    inputs: list[np.ndarray]
    output_specs: list[tuple[tuple[int, ...], str]]
    expected: list[np.ndarray] | None  # None: do not check
    device: str = "cpu"  # "cpu" or "cuda"
    # A first call slower than this (seconds) is the candidate's only timing: see
    # LocalRunner's slow_ratio. None: always the full time_evaluator measurement.
    cutoff_s: float | None = None


@dataclass
class RunOptions:
    number: int = 4
    repeat: int = 3
    min_repeat_ms: int = 20
    warmup: int = 1
    cache_flush: bool = False
    rtol: float = 1e-3
    atol: float = 1e-4
    seed: int = 0  # for the garbage the outputs start with


@dataclass
class RunOutcome:
    costs_s: list[float]
    error: str | None
    run_s: float


def _error(kind: str, message: str) -> str:
    # one line: records are JSON Lines and TVM errors span screens
    return f"{kind}: {' '.join(str(message).split())[:_MAX_MESSAGE]}"


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


# ------------------------------------------------------------------ worker processes


def _describe_exception(exc: BaseException) -> str:
    """The exception in a line or two, and the last frame outside the installed
    packages (the schedule or task line that raised)."""
    text = str(exc).strip()
    if "Error message:" in text:
        # a ScheduleError: the IR dump between its first line and the reason is long
        text = text.splitlines()[0] + " " + text.rsplit("Error message:", 1)[1].strip()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename and f.filename.endswith(".py")
              and f.filename != __file__]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    name = type(exc).__name__
    return f"{text}{where}" if text.startswith(name) else f"{name}: {text}{where}"


def _worker_main(conn: multiprocessing.connection.Connection, env: dict[str, str],
                 warm_imports: Sequence[str]) -> None:
    """A worker's loop: receive (fn, payload), send ("ok", result) or ("error", text)."""
    os.environ.update(env)  # before tvm is imported: TVM_USE_RUNTIME_LIB, threads
    for name in warm_imports:  # so a job's time-out does not include importing tvm
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - the job will report it
            pass
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        fn, payload = message
        try:
            reply: tuple[str, Any] = ("ok", fn(payload))
        except BaseException as exc:  # noqa: BLE001 - everything a candidate raises
            reply = ("error", _describe_exception(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result
            conn.send(("error", f"cannot send the result back: {exc}"))


@dataclass
class _Outcome:
    status: str  # "ok", "error" (raised), "timeout", "died"
    value: Any  # the result, the error text, or a description
    seconds: float


class _Worker:
    def __init__(self, ctx: Any, env: dict[str, str], warm: Sequence[str]) -> None:
        self._ctx, self._env, self._warm = ctx, env, warm
        self.proc: Any = None
        self.conn: multiprocessing.connection.Connection | None = None
        self.state = "down"  # down -> starting -> idle <-> busy
        self.job = -1
        self.started = 0.0
        self.deadline = float("inf")

    def start(self, start_timeout_s: float) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        # daemon: a worker never outlives the tuner, even when it is killed
        proc = self._ctx.Process(target=_worker_main, args=(child, self._env, self._warm),
                                 daemon=True, name="tecc-measure-worker")
        try:
            proc.start()
        except BaseException:
            # e.g. spawn refusing a script without `if __name__ == "__main__":`; that
            # error is the one to see, not a failed clean-up of a process never started
            parent.close()
            child.close()
            raise
        self.proc = proc
        child.close()  # our copy: the pipe then reads EOF when the worker dies
        self.conn = parent
        self.state = "starting"
        self.deadline = time.monotonic() + start_timeout_s

    def assign(self, index: int, data: bytes, timeout_s: float) -> None:
        assert self.conn is not None
        self.conn.send_bytes(data)
        self.state, self.job = "busy", index
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn, self.state, self.deadline = None, None, "down", float("inf")

    def stop(self) -> None:
        if self.conn is not None and self.state == "idle":
            try:
                self.conn.send(None)
                self.proc.join(2)
            except (OSError, ValueError):
                pass
        self.kill()


class WorkerPool:
    """Persistent worker processes (spawned: TVM is not fork-safe once its threads
    exist) that run one job each at a time. A worker that hangs past its job's time-out
    is killed, one that dies is noticed; either is restarted and the batch goes on.
    Only the affected job fails, unlike concurrent.futures, whose pool breaks as a
    whole when one worker dies and has no per-job time-out."""

    def __init__(self, size: int, env: dict[str, str] | None = None,
                 warm_imports: Sequence[str] = ("tvm",), start_timeout_s: float = 120.0,
                 start_method: str = "spawn") -> None:
        ctx = multiprocessing.get_context(start_method)
        self.workers = [_Worker(ctx, dict(env or {}), tuple(warm_imports))
                        for _ in range(max(1, size))]
        self.start_timeout_s = start_timeout_s
        self.restarts = 0  # workers killed or lost to a candidate (for logs and tests)
        self._finalizer = weakref.finalize(self, WorkerPool._kill_all, self.workers)

    @staticmethod
    def _kill_all(workers: list[_Worker]) -> None:
        for w in workers:
            w.stop()

    def close(self) -> None:
        self._finalizer()

    def map(self, fn: Callable[[Any], Any], payloads: Sequence[Any], timeout_s: float,
            on_done: Callable[[int, _Outcome], None] | None = None) -> list[_Outcome]:
        """fn(payload) for each payload in the workers; results in payload order.
        `fn` must be a module-level function (it is pickled by name)."""
        results: list[_Outcome | None] = [None] * len(payloads)
        queue = collections.deque(range(len(payloads)))
        failed_starts = 0

        def finish(index: int, outcome: _Outcome) -> None:
            results[index] = outcome
            if on_done is not None:
                on_done(index, outcome)

        def lost(w: _Worker, outcome_status: str, description: str) -> None:
            nonlocal failed_starts
            if w.state == "busy":
                finish(w.job, _Outcome(outcome_status, description,
                                       time.monotonic() - w.started))
                self.restarts += 1
            else:
                failed_starts += 1
            w.kill()

        while queue or any(w.state == "busy" for w in self.workers):
            if failed_starts >= 3 * len(self.workers):  # broken environment, not a job
                while queue:  # the busy ones still finish
                    finish(queue.popleft(), _Outcome("died", "worker processes fail to "
                                                     "start", 0.0))
            for w in self.workers:
                if w.state == "idle" and not w.proc.is_alive():
                    w.kill()  # died between jobs: restart it
                if w.state == "down" and queue:
                    w.start(self.start_timeout_s)
                if w.state == "idle" and queue:
                    index = queue.popleft()
                    try:  # pickled here, so a payload that cannot be is that job's error
                        data = bytes(ForkingPickler.dumps((fn, payloads[index])))
                    except Exception as exc:  # noqa: BLE001 - whatever pickling raises
                        finish(index, _Outcome("error", f"cannot send the job: {exc}", 0.0))
                        continue
                    try:
                        w.assign(index, data, timeout_s)
                    except OSError:  # the worker died while idle: requeue, restart
                        queue.appendleft(index)
                        failed_starts += 1
                        w.kill()
            live = [w for w in self.workers if w.state in ("starting", "busy")]
            if not live:
                continue
            wait_s = max(0.0, min(w.deadline for w in live) - time.monotonic())
            handles = [w.conn for w in live] + [w.proc.sentinel for w in live]
            ready = multiprocessing.connection.wait(
                handles, timeout=wait_s if wait_s != float("inf") else None)
            for w in live:
                if w.conn not in ready and w.proc.sentinel not in ready:
                    continue
                try:
                    message = w.conn.recv() if w.conn.poll() else None
                except (EOFError, OSError):
                    message = None
                if message is None:
                    if w.proc.is_alive():
                        continue  # a spurious wake-up; the sentinel will say
                    w.proc.join(1)
                    lost(w, "died", _describe_exit(w.proc.exitcode))
                elif w.state == "starting":
                    w.state, w.deadline, failed_starts = "idle", float("inf"), 0
                else:
                    status, value = message
                    finish(w.job, _Outcome(status, value, time.monotonic() - w.started))
                    w.state, w.deadline = "idle", float("inf")
            now = time.monotonic()
            for w in live:
                if w.state in ("starting", "busy") and now >= w.deadline:
                    lost(w, "timeout", f"no result after {now - w.started:.1f} s")
        return [r if r is not None else _Outcome("died", "not run", 0.0) for r in results]


# ---------------------------------------------------------------------------- build


class Builder(Protocol):
    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]: ...


def as_target(target: Any) -> tvm.target.Target:
    import tvm

    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


def target_json(target: Any) -> dict[str, Any]:
    if isinstance(target, dict):
        return dict(target)
    from tecc.target import target_to_json

    return target_to_json(target)


def build_candidate(payload: tuple[TunableTask, Config, str]) -> tuple[str, list, float]:
    """In a build worker: schedule, compile and export one candidate."""
    import tvm

    task, config, out_dir = payload
    t0 = time.perf_counter()
    target = as_target(task.target)
    func = task.build_primfunc(config)
    # the runner calls ENTRY whatever symbol the task gave its kernel
    func = func.with_attr("global_symbol", ENTRY)
    specs = []
    for param in func.params:
        # 0.27's PrimFunc params are the buffers themselves (no buffer_map any more)
        buf = func.buffer_map[param] if hasattr(func, "buffer_map") else param
        if getattr(buf, "shape", None) is None:
            raise TypeError(f"parameter {param} is not a buffer: candidates take tensors only")
        specs.append((tuple(int(d) for d in buf.shape), str(buf.dtype)))
    with target:  # cuda needs the target in scope for its arch
        ex = tvm.compile(tvm.IRModule({ENTRY: func}), target=target)
    path = os.path.join(out_dir, f"{task.name}-{uuid.uuid4().hex[:12]}.so")
    ex.export_library(path)
    return path, specs, time.perf_counter() - t0


class LocalBuilder:
    """Builds candidates in `n_parallel` worker processes into a private temp folder
    (removed by close()). The workers persist across batches."""

    def __init__(self, n_parallel: int = 2, timeout_s: float = 30.0,
                 out_dir: str | None = None) -> None:
        self.timeout_s = timeout_s
        self._own_dir = out_dir is None
        self.out_dir = out_dir or tempfile.mkdtemp(prefix="tecc-build-")
        os.makedirs(self.out_dir, exist_ok=True)
        self.pool = WorkerPool(n_parallel, warm_imports=("tvm", "tvm.s_tir.schedule"))

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        payloads = [(inp.task, inp.config, self.out_dir) for inp in inputs]
        results = []
        for outcome in self.pool.map(build_candidate, payloads, self.timeout_s):
            if outcome.status == "ok":
                path, specs, build_s = outcome.value
                results.append(BuildResult(path, None, build_s, specs))
            elif outcome.status == "timeout":
                results.append(BuildResult(None, _error(BUILD_TIMEOUT, outcome.value),
                                           outcome.seconds))
            elif outcome.status == "died":
                results.append(BuildResult(None, _error(
                    BUILD_ERROR, f"build process died ({outcome.value})"), outcome.seconds))
            else:
                results.append(BuildResult(None, _error(BUILD_ERROR, outcome.value),
                                           outcome.seconds))
        return results

    def close(self) -> None:
        self.pool.close()
        if self._own_dir:
            shutil.rmtree(self.out_dir, ignore_errors=True)

    def __enter__(self) -> LocalBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- run
# Everything from here to LocalRunner needs only numpy and tvm.runtime.


def _garbage(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random starting contents for an output, so a kernel that skips writing some of it
    (or accumulates into it) cannot pass by luck, as it could on zeros."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        return (rng.standard_normal(shape) * 1e3).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 100, shape).astype(dtype)


def compare_outputs(got: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float,
                    atol: float) -> str | None:
    """None when every output is within atol * scale + rtol * |expected|, else the
    message. scale is the expected output's RMS (at least 1): a long reduction, or
    Winograd's transforms, round in proportion to the values summed, so a near-zero
    output of a large-valued tensor is off by more than a bare atol."""
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        e = np.asarray(e)
        if g.shape != e.shape:
            return f"output {i} has shape {g.shape}, expected {e.shape}"
        if e.dtype == np.bool_ or g.dtype == np.bool_:
            bad = int(np.count_nonzero(g != e))
            if bad:
                return f"output {i}: {bad} of {e.size} values differ"
            continue
        g64, e64 = g.astype(np.float64), e.astype(np.float64)
        diff = np.abs(g64 - e64)
        finite = np.isfinite(diff)
        scale = max(1.0, float(np.sqrt(np.mean(e64[finite] ** 2)))) if finite.any() else 1.0
        if not np.all(np.isfinite(g64) == np.isfinite(e64)) or not np.all(
                diff[finite] <= atol * scale + rtol * np.abs(e64[finite])):
            err = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
            return (f"max abs err {err:.3g} in output {i} (rtol {rtol:g}, atol {atol:g} x "
                    f"RMS {scale:.3g})")
    return None


def run_candidate(payload: tuple[RunJob, RunOptions]) -> tuple[list[float], str | None]:
    """In the run worker: load one library, check its outputs, time it."""
    import tvm

    job, opt = payload
    dev = tvm.device(job.device, 0)
    mod = tvm.runtime.load_module(job.path)
    func = mod[ENTRY]
    rng = np.random.default_rng(opt.seed)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in job.inputs]
    args += [tvm.runtime.tensor(_garbage(shape, dtype, rng), dev)
             for shape, dtype in job.output_specs]
    started = time.perf_counter()
    func(*args)  # the first call: its outputs are the ones checked
    dev.sync()
    first_s = time.perf_counter() - started
    if job.expected is not None:
        outputs = [a.numpy() for a in args[len(job.inputs):]]
        problem = compare_outputs(outputs, job.expected, opt.rtol, opt.atol)
        if problem is not None:
            return [], _error(WRONG_RESULT, problem)
    if job.cutoff_s is not None and first_s > job.cutoff_s:
        return [first_s], None
    for _ in range(max(0, opt.warmup - 1)):
        func(*args)
    dev.sync()
    # TVM's evaluator makes one more untimed call, then `repeat` averages of `number`
    # runs (more when a repeat is shorter than min_repeat_ms).
    preproc = "cache_flush_cpu_non_first_arg" if opt.cache_flush and job.device == "cpu" else ""
    timer = mod.time_evaluator(ENTRY, dev, number=opt.number, repeat=opt.repeat,
                               min_repeat_ms=opt.min_repeat_ms, f_preproc=preproc)
    return [float(c) for c in timer(*args).results], None


def run_built_batch(jobs: Sequence[RunJob], options: RunOptions, timeout_s: float = 10.0,
                    pool: WorkerPool | None = None,
                    on_done: Callable[[int, RunOutcome], None] | None = None
                    ) -> list[RunOutcome]:
    """Runs built candidates one after another in an isolated worker process that loads
    the TVM runtime only: what a remote machine executes on a shipped batch. A crash or
    a hang fails that candidate only; the worker restarts and the batch goes on."""
    own = pool is None
    pool = pool or run_worker_pool()

    def convert(outcome: _Outcome) -> RunOutcome:
        if outcome.status == "ok":
            costs, error = outcome.value
            return RunOutcome(costs, error, outcome.seconds)
        if outcome.status == "timeout":
            return RunOutcome([], _error(RUN_TIMEOUT, outcome.value), outcome.seconds)
        if outcome.status == "died":
            return RunOutcome([], _error(RUNTIME_CRASH, f"run process died ({outcome.value})"),
                              outcome.seconds)
        return RunOutcome([], _error(RUN_ERROR, outcome.value), outcome.seconds)

    callback = None if on_done is None else (lambda i, o: on_done(i, convert(o)))
    try:
        outcomes = pool.map(run_candidate, [(job, options) for job in jobs], timeout_s,
                            callback)
    finally:
        if own:
            pool.close()
    return [convert(o) for o in outcomes]


def run_worker_pool() -> WorkerPool:
    # TVM_USE_RUNTIME_LIB: the worker loads libtvm_runtime, not the compiler, as a
    # deployment or a remote GPU machine does; a library that needs more fails here.
    from tecc.runtime.threads import kernel_threads

    # Kernels are timed on the threads a deployment on this host runs them on.
    return WorkerPool(1, env={"TVM_USE_RUNTIME_LIB": "1",
                              "TVM_NUM_THREADS": str(kernel_threads())},
                      warm_imports=("tvm",))


class Runner(Protocol):
    def run(self, inputs: Sequence[MeasureInput], build_results: Sequence[BuildResult],
            callback: Callable[[int, MeasureResult], None] | None = None
            ) -> list[MeasureResult]: ...


def _device_of(target: Any) -> str:
    kind = target.get("kind") if isinstance(target, dict) else target.kind.name
    return "cuda" if kind == "cuda" else "cpu"


class LocalRunner:
    """Runs built candidates on this machine in one persistent isolated worker.

    Inputs come from task.reference_inputs(seed), expected outputs from
    task.reference_outputs(inputs) (computed here, once per task); outputs start as
    random garbage. number/repeat/min_repeat_ms go to TVM's time_evaluator; `warmup`
    untimed calls come first (the first of them is the one checked).

    On the CPU, a candidate whose checked first call already takes more than
    `slow_ratio` times the best cost this runner measured for its workload in earlier
    batches (and more than CUTOFF_FLOOR_S) keeps that call as its only timing: it cannot
    be the best, and the full measurement of slow candidates (repeat x min_repeat_ms
    and more each) is most of a random search's running time. None measures every
    candidate in full."""

    def __init__(self, number: int = 4, repeat: int = 3, min_repeat_ms: int = 20,
                 warmup: int = 1, timeout_s: float = 10.0, cache_flush: bool = False,
                 check_correctness: bool = True, rtol: float = 1e-3, atol: float = 1e-4,
                 seed: int = 0, slow_ratio: float | None = 3.0) -> None:
        self.options = RunOptions(number, repeat, min_repeat_ms, max(1, warmup), cache_flush,
                                  rtol, atol, seed)
        self.timeout_s = timeout_s
        self.check_correctness = check_correctness
        self.seed = seed
        self.slow_ratio = slow_ratio
        self.pool = run_worker_pool()
        self._references: dict[tuple[str, str, str], tuple[list, list | None]] = {}
        self._best_s: dict[tuple[str, str, str], float] = {}

    @staticmethod
    def _key(task: TunableTask) -> tuple[str, str, str]:
        return (task.name, workload_key(task.workload), str(target_json(task.target)))

    def _reference(self, task: TunableTask) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        key = self._key(task)
        if key not in self._references:
            inputs = [np.ascontiguousarray(a) for a in task.reference_inputs(self.seed)]
            expected = None
            if self.check_correctness:
                expected = [np.asarray(e) for e in task.reference_outputs(inputs)]
            self._references[key] = (inputs, expected)
        return self._references[key]

    def run(self, inputs: Sequence[MeasureInput], build_results: Sequence[BuildResult],
            callback: Callable[[int, MeasureResult], None] | None = None
            ) -> list[MeasureResult]:
        results: list[MeasureResult | None] = [None] * len(inputs)

        def done(index: int, result: MeasureResult) -> None:
            results[index] = result
            if callback is not None:
                callback(index, result)

        # Candidates that did not build are reported at once, in order with the others
        # as far as possible: the records file then follows the batch.
        jobs: list[RunJob] = []
        job_index: list[int] = []
        pending_failures: list[tuple[int, MeasureResult]] = []
        for i, (inp, built) in enumerate(zip(inputs, build_results, strict=True)):
            if built.path is None:
                pending_failures.append((i, MeasureResult([], built.error, built.build_s,
                                                          time.time())))
                continue
            try:
                ref_inputs, expected = self._reference(inp.task)
                # tasks whose configs change the kernel's layout (conv channel blocks,
                # dense weight packing) convert the canonical reference to it
                adapt = getattr(inp.task, "adapt_io", None)
                if adapt is not None:
                    ref_inputs, expected = adapt(inp.config, ref_inputs, expected)
            except Exception as exc:  # noqa: BLE001 - a broken task fails its candidates
                pending_failures.append((i, MeasureResult(
                    [], _error(RUN_ERROR, f"reference failed: {type(exc).__name__}: {exc}"),
                    built.build_s, time.time())))
                continue
            n_in = len(ref_inputs)
            device = _device_of(inp.task.target)
            best = self._best_s.get(self._key(inp.task))
            cutoff = None
            if self.slow_ratio is not None and best is not None and device == "cpu":
                cutoff = max(self.slow_ratio * best, CUTOFF_FLOOR_S)
            jobs.append(RunJob(built.path, ref_inputs, list(built.arg_specs[n_in:]), expected,
                               device, cutoff))
            job_index.append(i)

        def flush_failures(before: int) -> None:
            while pending_failures and pending_failures[0][0] < before:
                done(*pending_failures.pop(0))

        def job_done(j: int, outcome: RunOutcome) -> None:
            i = job_index[j]
            flush_failures(i)
            result = MeasureResult(outcome.costs_s, outcome.error,
                                   build_results[i].build_s + outcome.run_s, time.time())
            if result.ok:
                key = self._key(inputs[i].task)
                self._best_s[key] = min(self._best_s.get(key, math.inf), result.cost)
            done(i, result)

        run_built_batch(jobs, self.options, self.timeout_s, self.pool, job_done)
        flush_failures(len(inputs) + 1)
        return [r for r in results if r is not None]

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- both


def measure_batch(builder: Builder, runner: Runner, inputs: Sequence[MeasureInput],
                  writer: RecordWriter | None = None, keep_libs: bool = False,
                  callback: Callable[[int, MeasureResult], None] | None = None
                  ) -> list[MeasureResult]:
    """Builds and runs `inputs`; appends one record per candidate to `writer` as soon
    as that candidate is measured (flushed by the writer), then calls `callback`.
    The built libraries are deleted afterwards unless `keep_libs`."""
    built = builder.build(inputs)

    def record(index: int, result: MeasureResult) -> None:
        if writer is not None:
            writer.write(record_of(inputs[index], result))
        if callback is not None:
            callback(index, result)

    try:
        return runner.run(inputs, built, record)
    finally:
        if not keep_libs:
            remove_built(built)


def record_of(inp: MeasureInput, result: MeasureResult, verify: str | None = None) -> Record:
    """The tuning record of one measured candidate."""
    return Record(target_json(inp.task.target), inp.task.workload, inp.config.to_json(),
                  list(result.costs_s), result.error, result.timestamp, verify=verify)


def remove_built(built: Sequence[BuildResult]) -> None:
    """Delete the libraries of built candidates."""
    for b in built:
        if b.path is not None and os.path.exists(b.path):
            os.unlink(b.path)
