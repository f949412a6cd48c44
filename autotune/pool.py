"""Worker processes for measuring: each runs one job at a time, and one that crashes or
hangs past its job's time-out is replaced while the batch goes on.

The builder and the runner each own a pool (AutoTVM's and MetaSchedule's split): the
builder's workers compile candidates in parallel, the runner's one worker loads the TVM
runtime only and times them. Standard library only: a job's function decides what its
worker imports.
"""

from __future__ import annotations

import collections
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

WORKER_NAME = "tecc-measure-worker"
# A worker's exit code when it finds itself running the main script again (spawn
# imports it; a script that tunes without `if __name__ == "__main__":` would tune anew
# in every worker)
REIMPORTED_MAIN_EXIT = 77


class WorkerStartError(RuntimeError):
    """The pool's worker processes stop before they are ready: a fault of the
    environment or of the calling script, not of a job."""


def exit_if_in_worker() -> None:
    """End this process with REIMPORTED_MAIN_EXIT if it is a measuring worker running
    the main script again (spawn's import of it). Called where tuning starts, before
    anything slow, so that the tuner that started the worker can name the cause."""
    if multiprocessing.current_process().name == WORKER_NAME:
        os._exit(REIMPORTED_MAIN_EXIT)  # no clean-up of the half-imported script


def _start_failure_message(failures: int, last: str) -> str:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    guard = 'if __name__ == "__main__":'
    if last == f"exit code {REIMPORTED_MAIN_EXIT}":
        return (f"the tuner's worker processes stopped at their start: each ran the main "
                f"script {main} again (the workers are spawned, as TVM is not fork-safe, "
                f"and a spawned process imports the main script), and it tunes when "
                f"imported. Put the tuning under `{guard}` in {main}.")
    hint = (f" If tuning runs from a script, it must run under `{guard}`: spawned "
            f"workers import the main script ({main})." if main else "")
    return (f"the tuner's worker processes stop before they are ready ({failures} starts; "
            f"the last: {last}): a fault of this environment, not of a candidate (their "
            f"own error, if any, is printed above).{hint}")


def describe_exit(exitcode: int | None) -> str:
    """How a worker process ended: the signal that killed it, or its exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def describe_exception(exc: BaseException, skip_files: Sequence[str] = ()) -> str:
    """The exception in a line or two, and the last frame outside the installed
    packages, this module and `skip_files` (the schedule or task line that raised,
    not the job function that called it)."""
    text = str(exc).strip()
    if "Error message:" in text:
        # a ScheduleError: the IR dump between its first line and the reason is long
        text = text.splitlines()[0] + " " + text.rsplit("Error message:", 1)[1].strip()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename and f.filename.endswith(".py")
              and f.filename != __file__ and f.filename not in skip_files]
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
            code = getattr(fn, "__code__", None)
            reply = ("error", describe_exception(exc, [code.co_filename] if code else []))
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result
            conn.send(("error", f"cannot send the result back: {exc}"))


@dataclass
class JobOutcome:
    """What became of one job."""

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
                                 daemon=True, name=WORKER_NAME)
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
    whole when one worker dies and has no per-job time-out. `retire_after_error`: a
    worker whose job raised is replaced too (its process state may be broken, as a
    CUDA context is after a fault)."""

    def __init__(self, size: int, env: dict[str, str] | None = None,
                 warm_imports: Sequence[str] = ("tvm",), start_timeout_s: float = 120.0,
                 start_method: str = "spawn", retire_after_error: bool = False) -> None:
        exit_if_in_worker()
        ctx = multiprocessing.get_context(start_method)
        self.workers = [_Worker(ctx, dict(env or {}), tuple(warm_imports))
                        for _ in range(max(1, size))]
        self.start_timeout_s = start_timeout_s
        self.retire_after_error = retire_after_error
        self.restarts = 0  # workers killed or lost to a candidate (for logs and tests)
        self._finalizer = weakref.finalize(self, WorkerPool._kill_all, self.workers)

    @staticmethod
    def _kill_all(workers: list[_Worker]) -> None:
        for w in workers:
            w.stop()

    def close(self) -> None:
        self._finalizer()

    def map(self, fn: Callable[[Any], Any], payloads: Sequence[Any], timeout_s: float,
            on_done: Callable[[int, JobOutcome], None] | None = None) -> list[JobOutcome]:
        """fn(payload) for each payload in the workers; results in payload order.
        `fn` must be a module-level function (it is pickled by name)."""
        results: list[JobOutcome | None] = [None] * len(payloads)
        queue = collections.deque(range(len(payloads)))
        failed_starts = 0
        last_failure = ""

        def finish(index: int, outcome: JobOutcome) -> None:
            results[index] = outcome
            if on_done is not None:
                on_done(index, outcome)

        def lost(w: _Worker, outcome_status: str, description: str) -> None:
            nonlocal failed_starts, last_failure
            if w.state == "busy":
                finish(w.job, JobOutcome(outcome_status, description,
                                       time.monotonic() - w.started))
                self.restarts += 1
            else:
                failed_starts += 1
                last_failure = description
            w.kill()

        while queue or any(w.state == "busy" for w in self.workers):
            if failed_starts >= 3 * len(self.workers):  # broken environment, not a job
                if not any(w.state in ("busy", "idle") for w in self.workers):
                    # none ready: its jobs would all fail, as recorded faults of theirs
                    for w in self.workers:
                        w.kill()
                    raise WorkerStartError(_start_failure_message(failed_starts, last_failure))
                while queue:  # the busy ones still finish
                    finish(queue.popleft(), JobOutcome("died", "worker processes fail to "
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
                        finish(index, JobOutcome("error", f"cannot send the job: {exc}", 0.0))
                        continue
                    try:
                        w.assign(index, data, timeout_s)
                    except OSError:  # the worker died while idle: requeue, restart
                        queue.appendleft(index)
                        failed_starts += 1
                        last_failure = "died while idle"
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
                    lost(w, "died", describe_exit(w.proc.exitcode))
                elif w.state == "starting":
                    w.state, w.deadline, failed_starts = "idle", float("inf"), 0
                else:
                    status, value = message
                    finish(w.job, JobOutcome(status, value, time.monotonic() - w.started))
                    w.state, w.deadline = "idle", float("inf")
                    if status == "error" and self.retire_after_error:
                        w.kill()  # its process state is not trusted: a fresh one next
                        self.restarts += 1
            now = time.monotonic()
            for w in live:
                if w.state in ("starting", "busy") and now >= w.deadline:
                    lost(w, "timeout", f"no result after {now - w.started:.1f} s")
        return [r if r is not None else JobOutcome("died", "not run", 0.0) for r in results]
