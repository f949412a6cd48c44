"""The builder: schedules and compiles tuning candidates into libraries a runner loads.

    with LocalBuilder(n_parallel=2, timeout_s=30) as builder:
        built = builder.build([MeasureInput(task, config), ...])

Building needs the compiler (the task's schedule and tvm.compile); it runs in worker
processes, candidates in parallel on the cores, each with a time-out, and a build that
raises, hangs or kills its process fails that candidate only (build_error,
build_timeout). The libraries export their kernel as tecc.autotune.runner.ENTRY.

This module imports neither tvm nor the compiler at module level: the build workers
import it first and load the compiler when the first job arrives.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tecc.autotune.errors import BUILD_ERROR, BUILD_TIMEOUT, format_error
from tecc.autotune.pool import JobOutcome, WorkerPool
from tecc.autotune.runner import ENTRY

if TYPE_CHECKING:
    import tvm
    from tecc.autotune.measure import MeasureInput
    from tecc.autotune.task import TunableTask
    from tecc.schedules.space import Config


@dataclass
class BuildResult:
    path: str | None  # the exported .so, None when the build failed
    error: str | None  # "kind: message" or None
    build_s: float
    # (shape, dtype) of every PrimFunc argument, inputs then outputs: the runner
    # allocates outputs from these without asking the compiler.
    arg_specs: list[tuple[tuple[int, ...], str]] = field(default_factory=list)


@runtime_checkable
class Builder(Protocol):
    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """One result per input, in order; a failed build has path None and its error."""
        ...

    def close(self) -> None: ...


def as_target(target: Any) -> tvm.target.Target:
    import tvm

    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


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
    if target.kind.name == "cuda":
        from tecc.cuda_toolchain import compile_cuda

        # cubins by nvcc, embedded in the library (a stand-in driver where none is)
        ex = compile_cuda(tvm.IRModule({ENTRY: func}), target)
    else:
        ex = tvm.compile(tvm.IRModule({ENTRY: func}), target=target)
    path = os.path.join(out_dir, f"{task.name}-{uuid.uuid4().hex[:12]}.so")
    ex.export_library(path)
    return path, specs, time.perf_counter() - t0


def build_result(outcome: JobOutcome) -> BuildResult:
    """A worker pool's outcome of build_candidate as the builder reports it."""
    if outcome.status == "ok":
        path, specs, build_s = outcome.value
        return BuildResult(path, None, build_s, specs)
    if outcome.status == "timeout":
        return BuildResult(None, format_error(BUILD_TIMEOUT, outcome.value), outcome.seconds)
    if outcome.status == "died":
        return BuildResult(None, format_error(BUILD_ERROR,
                                              f"build process died ({outcome.value})"),
                           outcome.seconds)
    return BuildResult(None, format_error(BUILD_ERROR, outcome.value), outcome.seconds)


class LocalBuilder:
    """Builds candidates in `n_parallel` worker processes (None: one per CPU this
    process may run on) into a private temp folder (removed by close()). The workers
    persist across batches."""

    def __init__(self, n_parallel: int | None = None, timeout_s: float = 30.0,
                 out_dir: str | None = None) -> None:
        if n_parallel is None:
            from tecc.runtime.cpu import host_cores

            n_parallel = host_cores()
        self.timeout_s = timeout_s
        self._own_dir = out_dir is None
        if out_dir is None:
            root = build_root()
            remove_orphan_build_dirs(root)
            out_dir = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root)
        self.out_dir = out_dir
        os.makedirs(self.out_dir, exist_ok=True)
        self.pool = WorkerPool(n_parallel, warm_imports=("tvm", "tvm.s_tir.schedule"))

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        payloads = [(inp.task, inp.config, self.out_dir) for inp in inputs]
        return [build_result(o) for o in self.pool.map(build_candidate, payloads,
                                                       self.timeout_s)]

    def close(self) -> None:
        self.pool.close()
        if self._own_dir:
            shutil.rmtree(self.out_dir, ignore_errors=True)

    def __enter__(self) -> LocalBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_root() -> Path:
    """The parent of every run's build folder, each named "<pid of its run>-...": the
    folder of a killed run (SIGKILL skips close()) is found and removed by the next."""
    root = Path(tempfile.gettempdir()) / "tecc-build"
    root.mkdir(exist_ok=True)
    return root


def remove_orphan_build_dirs(root: Path) -> None:
    """Remove the build folders under `root` whose run's process is gone."""
    for folder in root.iterdir():
        pid = folder.name.split("-", 1)[0]
        if folder.is_dir() and pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_built(built: Sequence[BuildResult]) -> None:
    """Delete the libraries of built candidates."""
    for b in built:
        if b.path is not None and os.path.exists(b.path):
            os.unlink(b.path)
