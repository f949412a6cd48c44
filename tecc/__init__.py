"""tecc: compile PyTorch models to fast CPU and GPU code with TVM.

`tecc.load` needs only the TVM runtime: the compiler (and torch) is imported on
first use of `compile` and friends, so a deployment host can run packages without it.
"""

from __future__ import annotations

import os
from typing import Any

__version__ = "0.1.0"
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
