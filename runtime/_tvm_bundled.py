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
_device_attr = tvm_ffi.get_global_func("runtime.GetDeviceAttr")
_set_stream = tvm_ffi.get_global_func("runtime.Device_SetStream")
_stream_sync = tvm_ffi.get_global_func("runtime.Device_StreamSync")
_view = tvm_ffi.get_global_func("runtime.TVMTensorCreateView")


class Device(tvm_ffi.core.Device):
    """The device methods the runtime uses, as apache-tvm's tvm.runtime.Device has them
    (tvm_ffi's own Device holds only the type and index)."""

    @property
    def exist(self) -> bool:
        return _device_attr(self.dlpack_device_type(), self.index, 0) != 0

    def set_raw_stream(self, stream: int) -> None:
        _set_stream(self, stream)

    def sync(self, stream: int | None = None) -> None:
        _stream_sync(self, stream or 0)


# Devices made by tvm_ffi (tvm_ffi.device, tensors' .device) are of this class, as
# `import tvm` arranges for its own.
tvm_ffi.core._set_class_device(Device)


def load_module(path: str) -> Any:
    return tvm_ffi.load_module(os.path.realpath(path))


def empty(shape: tuple[int, ...], dtype: str, dev: Any) -> Any:
    return _alloc(tvm_ffi.Shape(shape), tvm_ffi.dtype(dtype), dev, None)


def device(kind: str, index: int = 0) -> Any:
    return tvm_ffi.device(kind, index)


def create_view(tensor: Any, shape: tuple[int, ...], dtype: str, byte_offset: int) -> Any:
    return _view(tensor, tvm_ffi.Shape(shape), dtype, byte_offset)
