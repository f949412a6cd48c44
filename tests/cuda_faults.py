"""A CUDA tuning task whose configs misbehave on purpose, and a stand-in for the runner's
job function that raises the errors a GPU gives, for machines without one. Module
level: the build and run workers import it by name (the run worker has the TVM runtime
only, so the compiler is imported where a task is built)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tecc.autotune.runner import RunJob, RunOptions
    from tecc.schedules.space import Config, ConfigSpace

N = 64
FAULTS = ["none", "illegal_address", "run_hang", "wrong"]
# What a CUDA fault raises in TVM, and what it leaves: the context stays broken.
ILLEGAL_ADDRESS = ("CUDA: an illegal memory access was encountered "
                   "(CUDA_ERROR_ILLEGAL_ADDRESS)")
LAUNCH_FAILURE = "CUDA: too many resources requested for launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)"


def fault_space() -> ConfigSpace:
    from tecc.schedules.space import ConfigSpace

    space = ConfigSpace()
    space.define_choice("fault", FAULTS)
    return space


@dataclass
class CudaFaultTask:
    """C = A @ B, N x N x N, on the GPU: a block per row, a thread per column."""

    target: dict[str, Any] = field(default_factory=lambda: {"kind": "cuda", "arch": "sm_90"})
    name: str = "cuda_faults"
    workload: dict[str, Any] = field(default_factory=lambda: {
        "template": "cuda_faults", "shapes": [[N, N], [N, N]], "dtype": "float32"})

    @property
    def space(self) -> ConfigSpace:
        return fault_space()

    def build_primfunc(self, config: Config) -> Any:
        import tvm
        from tvm import te
        from tvm.s_tir.schedule import Schedule

        fault = config["fault"]
        # illegal_address: reads 2^30 rows past A (256 GB away, more than a GPU holds:
        # unmapped);
        # run_hang: 2^40 steps per output; wrong: one reduction step short
        extent = N - 1 if fault == "wrong" else N
        offset = tvm.tirx.const(1 << 30 if fault == "illegal_address" else 0, "int64")
        a = te.placeholder((N, N), name="A")
        b = te.placeholder((N, N), name="B")
        k = te.reduce_axis((0, extent), name="k")
        axes = [k]
        if fault == "run_hang":
            axes = [te.reduce_axis((0, 1 << 20), name="r"), te.reduce_axis((0, 1 << 20),
                                                                          name="s"), k]
        c = te.compute((N, N), lambda i, j: te.sum(a[i + offset, k] * b[k, j], axis=axes),
                       name="C")
        sch = Schedule(tvm.IRModule({"main": te.create_prim_func([a, b, c])}))
        block = sch.get_sblock("C")
        i, j = sch.get_loops(block)[:2]
        sch.bind(i, "blockIdx.x")
        sch.bind(j, "threadIdx.x")
        return sch.mod["main"]

    def reference_inputs(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.uniform(-1, 1, (N, N)).astype("float32") for _ in range(2)]

    def reference_outputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [inputs[0] @ inputs[1]]


# -- the stand-in job function: behaves like run_candidate on a GPU, by the job's path
POISONED = False  # set by a simulated fault: later calls in this process fail


def fake_cuda_run(payload: tuple[RunJob, RunOptions, float | None]
                  ) -> tuple[list[float], str | None]:
    """Raises the CUDA errors a faulting candidate gives, hangs or kills its process
    by the word in the job's path; any call after a fault in the same process fails
    as a broken CUDA context does. Writes its process id next to the job's path."""
    global POISONED
    job = payload[0]
    with open(job.path + ".pid", "w") as f:
        f.write(str(os.getpid()))
    if POISONED:
        raise RuntimeError(ILLEGAL_ADDRESS + " (an earlier fault in this process)")
    if "illegal_address" in job.path:
        POISONED = True
        raise RuntimeError(ILLEGAL_ADDRESS)
    if "launch_failure" in job.path:
        POISONED = True
        raise RuntimeError(LAUNCH_FAILURE)
    if "run_hang" in job.path:
        time.sleep(3600)
    if "abort" in job.path:
        os.abort()
    return [1e-4, 1.1e-4], None
