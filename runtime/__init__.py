"""tecc runtime: runs a compiled plan over a kernel library; needs neither torch nor the compiler."""

from .executor import (
    CudaExecutor,
    Executor,
    PlanError,
    TensorSpec,
    make_executor,
    unflatten_outputs,
)
from .package import Package, PackageError, load_package, write_package
from .threads import configure_threads, kernel_threads

# TVM reads the variable when its thread pool is first used, not at import
configure_threads()

__all__ = [
    "CudaExecutor",
    "Executor",
    "Package",
    "PackageError",
    "PlanError",
    "TensorSpec",
    "configure_threads",
    "kernel_threads",
    "load_package",
    "make_executor",
    "unflatten_outputs",
    "write_package",
]
