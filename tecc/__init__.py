"""tecc: compile PyTorch models to fast CPU and GPU code with TVM.

`tecc.load` needs only the TVM runtime: the compiler (and torch) is imported on
first use of `compile` and friends, so a deployment host can run packages without it.
"""

from __future__ import annotations

import os
from typing import Any

__version__ = "0.1.0"

# torch's OpenMP runtime (libgomp) keeps each worker spinning about 300000 iterations
# (milliseconds) after every parallel region, on the cores tecc's kernels need next:
# where torch and tecc run in turn (graph breaks, fallback="torch") both slow down
# (ResNet-18 with a graph break after each stage, 2 cores: 50 ms, 25 with a short spin,
# eager and tecc alone no slower). libgomp reads GOMP_SPINCOUNT once, when it loads (with
# torch, or with TVM, which imports torch): set here where the user chose no spin or
# wait policy; OPENMP_SPINS_LONG tells that libgomp had loaded already (too late).
OPENMP_SPIN_COUNT = "10000"
OPENMP_SPINS_LONG = False


def _libgomp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:  # not Linux: no libgomp to configure
        return False


if not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(os.environ):
    OPENMP_SPINS_LONG = _libgomp_loaded()
    # set even then: the processes this one starts (tuning workers) read it at their start
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
_COMPILER_API = {"compile", "CompiledModel", "import_model", "retarget", "tune"}


def load(path: str | os.PathLike) -> Any:
    """Load a deployment package (runtime only: no torch, no compiler)."""
    from tecc import runtime

    return runtime.load_package(os.fspath(path))


def __getattr__(name: str) -> Any:
    if name == "PartitionedModel":
        from tecc import partition

        return partition.PartitionedModel
    if name in _COMPILER_API:
        from tecc import api

        return getattr(api, name)
    raise AttributeError(f"module 'tecc' has no attribute {name!r}")


__all__ = ["CompiledModel", "PartitionedModel", "__version__", "compile", "import_model", "load",
           "retarget", "tune"]
