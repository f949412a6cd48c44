"""tecc runtime: runs a compiled plan over a kernel library; needs neither torch nor the compiler."""

from .executor import Executor, PlanError, TensorSpec, unflatten_outputs
from .package import Package, PackageError, load_package, write_package
from .threads import configure_threads, kernel_threads

# TVM reads the variable when its thread pool is first used, not at import
configure_threads()

__all__ = [
    "Executor",
    "Package",
    "PackageError",
    "PlanError",
    "TensorSpec",
    "configure_threads",
    "kernel_threads",
    "load_package",
    "unflatten_outputs",
    "write_package",
]
