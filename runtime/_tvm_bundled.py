"""The TVM runtime API of a Python deployment package: the `tvm_ffi` package (a few MB)
and the libtvm_runtime.so beside this file, instead of the whole apache-tvm wheel and
its compiler. Written into the package as _tvm.py by tecc.deploy, which fills in the
TVM version the library comes from."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import tvm_ffi  # loads libtvm_ffi.so, which libtvm_runtime.so needs

VERSION: str = "@TVM_VERSION@"
# Global: the kernels of lib.so call into the runtime (its thread pool, workspaces).
_RUNTIME = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "libtvm_runtime.so"), mode=ctypes.RTLD_GLOBAL)
from_dlpack = tvm_ffi.from_dlpack
_alloc = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")


def load_module(path: str) -> Any:
    return tvm_ffi.load_module(os.path.realpath(path))


def empty(shape: tuple[int, ...], dtype: str, dev: Any) -> Any:
    return _alloc(tvm_ffi.Shape(shape), tvm_ffi.dtype(dtype), dev, None)


def device(kind: str, index: int = 0) -> Any:
    return tvm_ffi.device(kind, index)
