"""The runner: loads built candidates and times them.

A runner takes `RunJob`s (a library path, input arrays, output specs, the expected
outputs) and returns one `RunOutcome` per job. It needs only the TVM runtime and numpy,
never the compiler or torch: GPU candidates are built on one machine and timed on
another that may have the runtime alone (this module imports neither tvm nor anything
of tecc's compiler at module level; its worker loads libtvm_runtime only).

    runner = LocalRunner(number=4, repeat=3, timeout_s=10)
    outcomes = runner.run([RunJob(path, inputs, output_specs, expected), ...])

`LocalRunner` times kernels on this machine in one isolated worker process: CPU
kernels with TVM's time_evaluator; CUDA kernels (`device="cuda"`) either with
time_evaluator (warm L2) or, with `cache_flush`, one call at a time between CUDA events
with the L2 cache overwritten before each call (a model's weights are mostly cold in
L2). A CUDA error can leave the worker's context unusable (an illegal address is sticky),
so a CUDA worker is replaced after any candidate that raised.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tecc.autotune.errors import (
    RUN_ERROR,
    RUN_TIMEOUT,
    RUNTIME_CRASH,
    WRONG_RESULT,
    format_error,
)
from tecc.autotune.pool import JobOutcome, WorkerPool
from tecc.autotune.records import Timed

# The function name every candidate library exports (the builder renames the PrimFunc).
ENTRY = "main"
# A first call shorter than this is always followed by the full measurement: below it,
# a cold cache or waking the thread pool can make the first call several times slower.
CUTOFF_FLOOR_S = 1e-3


@dataclass
class RunJob:
    """One built candidate to run: everything the running side needs, no task."""

    path: str
    inputs: list[np.ndarray]
    output_specs: list[tuple[tuple[int, ...], str]]
    expected: list[np.ndarray] | None  # None: do not check
    device: str = "cpu"  # "cpu" or "cuda"
    # Candidates of one key (workload and target) are compared with each other: the
    # slow-candidate cutoff of LocalRunner is per key.
    key: str = ""


@dataclass
class RunOptions:
    number: int = 4
    repeat: int = 3
    min_repeat_ms: int = 20
    warmup: int = 1
    cache_flush: bool = False
    # whether the task side computes expected outputs for the jobs (None: unchecked)
    check_correctness: bool = True
    rtol: float = 1e-3
    atol: float = 1e-4
    seed: int = 0  # of the reference inputs, and of the garbage outputs start with
    # bytes written between cold CUDA calls: twice the L2 (the H200's is 60 MB)
    flush_bytes: int = 128 << 20


@dataclass
class RunOutcome(Timed):
    costs_s: list[float]  # seconds per run, one per repeat; empty on error
    error: str | None  # "kind: message" or None
    run_s: float  # wall seconds spent on the job


@runtime_checkable
class Runner(Protocol):
    """Times built candidates on one kind of device."""

    options: RunOptions

    def run(self, jobs: Sequence[RunJob],
            on_done: Callable[[int, RunOutcome], None] | None = None) -> list[RunOutcome]:
        """One outcome per job, in order; `on_done(index, outcome)` as each finishes.
        A candidate that fails (see tecc.autotune.errors) fails alone."""
        ...

    def close(self) -> None: ...


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


def run_candidate(payload: tuple[RunJob, RunOptions, float | None]
                  ) -> tuple[list[float], str | None]:
    """In the run worker: load one library, check its outputs, time it. A first call
    slower than `cutoff_s` is the candidate's only timing (None: always in full)."""
    import tvm

    job, opt, cutoff_s = payload
    if job.device == "cuda":
        from tecc.runtime.cuda import ensure_tvm_cuda_runtime

        ensure_tvm_cuda_runtime()  # a runtime-only worker does not load it by itself
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
            return [], format_error(WRONG_RESULT, problem)
    if cutoff_s is not None and first_s > cutoff_s:
        return [first_s], None
    for _ in range(max(0, opt.warmup - 1)):
        func(*args)
    dev.sync()
    if opt.cache_flush and job.device == "cuda":
        return time_cuda_cold(func, args, dev, opt.repeat * opt.number, opt.flush_bytes), None
    # TVM's evaluator makes one more untimed call, then `repeat` averages of `number`
    # runs (more when a repeat is shorter than min_repeat_ms).
    preproc = "cache_flush_cpu_non_first_arg" if opt.cache_flush and job.device == "cpu" else ""
    timer = mod.time_evaluator(ENTRY, dev, number=opt.number, repeat=opt.repeat,
                               min_repeat_ms=opt.min_repeat_ms, f_preproc=preproc)
    return [float(c) for c in timer(*args).results], None


def time_cuda_cold(func: Any, args: Sequence[Any], dev: Any, calls: int,
                   flush_bytes: int) -> list[float]:
    """GPU seconds of `calls` single calls of `func`, each after `flush_bytes` of device
    memory were overwritten (TVM's time_evaluator has no L2 flush for CUDA), timed by
    CUDA events on the stream TVM launches on (the default one)."""
    import tvm
    from tecc.runtime import cuda

    flush = tvm.runtime.empty((flush_bytes,), "uint8", dev)
    start, end = cuda.Event(), cuda.Event()
    costs = []
    for i in range(max(1, calls)):
        cuda.memset_async(flush.data_ptr(), i & 0xFF, flush_bytes, 0)
        start.record(0)
        func(*args)
        end.record(0)
        costs.append(end.seconds_since(start))
    return costs


def run_outcome(outcome: JobOutcome) -> RunOutcome:
    """A worker pool's outcome of run_candidate as the runner reports it."""
    if outcome.status == "ok":
        costs, error = outcome.value
        return RunOutcome(costs, error, outcome.seconds)
    if outcome.status == "timeout":
        return RunOutcome([], format_error(RUN_TIMEOUT, outcome.value), outcome.seconds)
    if outcome.status == "died":
        return RunOutcome([], format_error(RUNTIME_CRASH, f"run process died ({outcome.value})"),
                          outcome.seconds)
    return RunOutcome([], format_error(RUN_ERROR, outcome.value), outcome.seconds)


class LocalRunner:
    """Runs built candidates on this machine, one after another, in one persistent
    worker process that loads the TVM runtime only (as a deployment does; a library
    that needs more fails here). A crash or a hang fails that candidate only; the
    worker restarts and the batch goes on.

    number/repeat/min_repeat_ms go to TVM's time_evaluator; `warmup` untimed calls
    come first (the first of them is the one checked against the job's expected
    outputs). Outputs start as random garbage.

    On the CPU, a candidate whose checked first call already takes more than
    `slow_ratio` times the best cost this runner measured for its key in earlier
    batches (and more than CUTOFF_FLOOR_S) keeps that call as its only timing: it cannot
    be the best, and the full measurement of slow candidates (repeat x min_repeat_ms
    and more each) is most of a random search's running time. None measures every
    candidate in full.

    `device` is the kind of device its jobs run on ("cpu" or "cuda"). With "cuda",
    `cache_flush` times `number` x `repeat` single calls with L2 overwritten before each
    (`flush_bytes`), and the worker is replaced after every candidate that raised (a
    CUDA fault poisons the process's context); `run_fn` is the job function the worker
    runs (a module-level function; tests simulate GPU faults with it)."""

    def __init__(self, number: int = 4, repeat: int = 3, min_repeat_ms: int = 20,
                 warmup: int = 1, timeout_s: float = 10.0, cache_flush: bool = False,
                 check_correctness: bool = True, rtol: float = 1e-3, atol: float = 1e-4,
                 seed: int = 0, slow_ratio: float | None = 3.0, device: str = "cpu",
                 flush_bytes: int = 128 << 20,
                 run_fn: Callable[[Any], tuple[list[float], str | None]] | None = None
                 ) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r}: cpu or cuda")
        self.options = RunOptions(number, repeat, min_repeat_ms, max(1, warmup), cache_flush,
                                  check_correctness, rtol, atol, seed, flush_bytes)
        self.device = device
        self.timeout_s = timeout_s
        self.slow_ratio = slow_ratio
        self.run_fn = run_fn or run_candidate
        self.pool = WorkerPool(1, env=self.worker_env(device), warm_imports=("tvm",),
                               retire_after_error=device == "cuda")
        self._best_s: dict[str, float] = {}  # key -> best cost measured

    @staticmethod
    def worker_env(device: str = "cpu") -> dict[str, str]:
        """TVM_USE_RUNTIME_LIB: the worker loads libtvm_runtime, not the compiler.
        CPU kernels are timed on the threads a deployment on this host runs them on."""
        if device == "cuda":
            return {"TVM_USE_RUNTIME_LIB": "1"}
        from tecc.runtime.threads import kernel_threads

        return {"TVM_USE_RUNTIME_LIB": "1", "TVM_NUM_THREADS": str(kernel_threads())}

    def _cutoff(self, job: RunJob) -> float | None:
        best = self._best_s.get(job.key)
        if self.slow_ratio is None or best is None or job.device != "cpu":
            return None
        return max(self.slow_ratio * best, CUTOFF_FLOOR_S)

    def run(self, jobs: Sequence[RunJob],
            on_done: Callable[[int, RunOutcome], None] | None = None) -> list[RunOutcome]:
        # cutoffs from earlier batches only: within a batch, no candidate's luck
        # decides how another one is measured
        for job in jobs:
            if job.device != self.device:
                raise ValueError(f"a {job.device} job given to a {self.device} runner")
        payloads = [(job, self.options, self._cutoff(job)) for job in jobs]

        def done(index: int, outcome: JobOutcome) -> None:
            result = run_outcome(outcome)
            if result.ok:
                key = jobs[index].key
                self._best_s[key] = min(self._best_s.get(key, math.inf), result.cost)
            if on_done is not None:
                on_done(index, result)

        return [run_outcome(o) for o in self.pool.map(self.run_fn, payloads,
                                                      self.timeout_s, done)]

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
