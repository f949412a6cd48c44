"""The TVM runtime API the runtime uses, in one place. Here it comes from the `tvm`
package (with TVM_USE_RUNTIME_LIB=1 that loads libtvm_runtime only); a Python
deployment package replaces this module with _tvm_bundled.py, which takes the same
names from `tvm_ffi` and the libtvm_runtime.so it carries."""

from __future__ import annotations

from typing import Any

import tvm

VERSION: str = tvm.__version__
from_dlpack = tvm.runtime.from_dlpack
load_module = tvm.runtime.load_module
empty = tvm.runtime.empty


def device(kind: str, index: int = 0) -> Any:
    return tvm.device(kind, index)


def create_view(tensor: Any, shape: tuple[int, ...], dtype: str, byte_offset: int) -> Any:
    """A tensor of `shape` and `dtype` over `tensor`'s memory from `byte_offset` on."""
    return tensor._create_view(shape, dtype, relative_byte_offset=byte_offset)
