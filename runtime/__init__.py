"""tecc runtime: runs a compiled plan over a kernel library; needs neither torch nor the compiler."""

from .executor import Executor, PlanError, TensorSpec, unflatten_outputs
from .package import Package, PackageError, load_package, write_package

__all__ = [
    "Executor",
    "Package",
    "PackageError",
    "PlanError",
    "TensorSpec",
    "load_package",
    "unflatten_outputs",
    "write_package",
]
