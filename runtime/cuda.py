"""CUDA pieces of the runtime: TVM's CUDA runtime library, the CUDA runtime API calls
the executor needs beyond TVM's (graph capture and replay, asynchronous copies), and
the GPU's compute capability.

Runtime only: ctypes and TVM's runtime API; no torch, no compiler. TVM launches every
kernel on its current stream of the device (Device.set_raw_stream); a CUDA graph is
captured by beginning a capture on a stream of our own, setting it as TVM's stream
and calling the kernels once.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

from . import _tvm

CUDA_SUCCESS = 0
STREAM_NON_BLOCKING = 1
CAPTURE_MODE_RELAXED = 2  # TVM's launch path may call non-stream APIs while capturing
MEMCPY_DEFAULT = 4  # direction from the pointers (unified addressing)
ATTR_COMPUTE_CAPABILITY_MAJOR, ATTR_COMPUTE_CAPABILITY_MINOR = 75, 76
KDL_CUDA = 2


class CudaError(RuntimeError):
    """A CUDA runtime call failed, or CUDA is not usable here."""


def _cuda_runtime_loaded() -> bool:
    return any(os.path.basename(p) == "libtvm_runtime_cuda.so" for p in _loaded_libraries())


def ensure_tvm_cuda_runtime() -> None:
    """Load TVM's CUDA runtime (libtvm_runtime_cuda.so, beside libtvm_runtime.so) if
    `import tvm` did not: with TVM_USE_RUNTIME_LIB=1 TVM loads only its core runtime,
    and without a driver the CUDA runtime does not load at all."""
    if _cuda_runtime_loaded():
        return
    folders = sorted({os.path.dirname(p) for p in _loaded_libraries()
                      if os.path.basename(p).startswith("libtvm_runtime.")})
    errors = []
    for folder in folders:
        path = os.path.join(folder, "libtvm_runtime_cuda.so")
        if not os.path.isfile(path):
            continue
        for attempt in range(2):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError as err:
                if attempt or not _preload_cudart():
                    errors.append(str(err))
                    break
    detail = "; ".join(errors) or f"no libtvm_runtime_cuda.so beside libtvm_runtime.so in {folders}"
    raise CudaError(
        f"TVM's CUDA runtime cannot be loaded ({detail}). It needs the NVIDIA driver "
        "(libcuda.so.1) and the CUDA 13 runtime (libcudart.so.13) on the loader path.")


def _preload_cudart() -> bool:
    """Load libcudart.so.13 from the CUDA toolkit when the loader path lacks it (torch
    brings its own; a runtime-only process may not)."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in filter(None, roots):
        for sub in ("lib64", "lib"):
            path = os.path.join(root, sub, "libcudart.so.13")
            if os.path.isfile(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    return True
                except OSError:
                    continue
    return False


def _loaded_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if line.rstrip().endswith(".so")})
    except OSError:
        return []


@functools.cache
def cudart() -> ctypes.CDLL:
    """The CUDA runtime library TVM's CUDA runtime uses (already loaded by then)."""
    ensure_tvm_cuda_runtime()
    loaded = [p for p in _loaded_libraries() if os.path.basename(p).startswith("libcudart.so")]
    for name in (*loaded, "libcudart.so.13", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise CudaError("the CUDA runtime library (libcudart.so.13) cannot be loaded")
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, args in {
        "cudaStreamCreateWithFlags": [ctypes.POINTER(vp), ctypes.c_uint],
        "cudaStreamDestroy": [vp],
        "cudaStreamSynchronize": [vp],
        "cudaStreamBeginCapture": [vp, ctypes.c_int],
        "cudaStreamEndCapture": [vp, ctypes.POINTER(vp)],
        "cudaGraphInstantiate": [ctypes.POINTER(vp), vp, ctypes.c_ulonglong],
        "cudaGraphLaunch": [vp, vp],
        "cudaGraphDestroy": [vp],
        "cudaGraphExecDestroy": [vp],
        "cudaMemcpyAsync": [vp, vp, sz, ctypes.c_int, vp],
        "cudaDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
        "cudaGetDeviceCount": [ctypes.POINTER(ctypes.c_int)],
        "cudaMemsetAsync": [vp, ctypes.c_int, sz, vp],
        "cudaEventCreate": [ctypes.POINTER(vp)],
        "cudaEventRecord": [vp, vp],
        "cudaEventSynchronize": [vp],
        "cudaEventElapsedTime": [ctypes.POINTER(ctypes.c_float), vp, vp],
        "cudaEventDestroy": [vp],
    }.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    lib.cudaGetErrorString.argtypes = [ctypes.c_int]
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    return lib


def check(code: int, what: str) -> None:
    if code != CUDA_SUCCESS:
        message = cudart().cudaGetErrorString(code)
        raise CudaError(f"{what} failed: CUDA error {code} "
                        f"({message.decode() if message else 'unknown'})")


def device_arch(index: int = 0) -> str:
    """The compute capability of CUDA device `index` as "sm_XY"."""
    lib = cudart()
    major, minor = ctypes.c_int(), ctypes.c_int()
    check(lib.cudaDeviceGetAttribute(ctypes.byref(major), ATTR_COMPUTE_CAPABILITY_MAJOR, index),
          "cudaDeviceGetAttribute")
    check(lib.cudaDeviceGetAttribute(ctypes.byref(minor), ATTR_COMPUTE_CAPABILITY_MINOR, index),
          "cudaDeviceGetAttribute")
    return f"sm_{major.value}{minor.value}"


def cuda_device(index: int = 0) -> Any:
    """TVM's device `index`, or CudaError saying why there is none."""
    ensure_tvm_cuda_runtime()
    dev = _tvm.device("cuda", index)
    if not dev.exist:
        raise CudaError(f"no CUDA device {index} is visible here (no NVIDIA GPU, or its driver "
                        "is not loaded); a cuda model runs on a machine with an NVIDIA GPU")
    return dev


def new_stream() -> int:
    handle = ctypes.c_void_p()
    check(cudart().cudaStreamCreateWithFlags(ctypes.byref(handle), STREAM_NON_BLOCKING),
          "cudaStreamCreateWithFlags")
    return int(handle.value or 0)


def synchronize(stream: int) -> None:
    check(cudart().cudaStreamSynchronize(stream), "cudaStreamSynchronize")


def copy_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    if nbytes:
        check(cudart().cudaMemcpyAsync(dst, src, nbytes, MEMCPY_DEFAULT, stream),
              "cudaMemcpyAsync")


def memset_async(ptr: int, value: int, nbytes: int, stream: int) -> None:
    check(cudart().cudaMemsetAsync(ptr, value, nbytes, stream), "cudaMemsetAsync")


class Event:
    """A CUDA event: elapsed GPU time between two recorded on one stream."""

    def __init__(self) -> None:
        handle = ctypes.c_void_p()
        check(cudart().cudaEventCreate(ctypes.byref(handle)), "cudaEventCreate")
        self.handle = handle

    def record(self, stream: int) -> None:
        check(cudart().cudaEventRecord(self.handle, stream), "cudaEventRecord")

    def seconds_since(self, start: Event) -> float:
        """GPU seconds from `start` to this event (waits for this one)."""
        check(cudart().cudaEventSynchronize(self.handle), "cudaEventSynchronize")
        ms = ctypes.c_float()
        check(cudart().cudaEventElapsedTime(ctypes.byref(ms), start.handle, self.handle),
              "cudaEventElapsedTime")
        return ms.value / 1e3

    def __del__(self) -> None:
        try:
            cudart().cudaEventDestroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Graph:
    """A CUDA graph captured from `record()` (which launches kernels on TVM's stream)."""

    def __init__(self, device: Any, record: Any) -> None:
        lib = cudart()
        self._stream = new_stream()
        graph, graph_exec = ctypes.c_void_p(), ctypes.c_void_p()
        check(lib.cudaStreamBeginCapture(self._stream, CAPTURE_MODE_RELAXED),
              "cudaStreamBeginCapture")
        device.set_raw_stream(self._stream)
        try:
            record()
        finally:
            device.set_raw_stream(0)
            ended = lib.cudaStreamEndCapture(self._stream, ctypes.byref(graph))
        check(ended, "cudaStreamEndCapture")
        check(lib.cudaGraphInstantiate(ctypes.byref(graph_exec), graph, 0),
              "cudaGraphInstantiate")
        self._graph, self._exec = graph, graph_exec

    def launch(self, stream: int) -> None:
        check(cudart().cudaGraphLaunch(self._exec, stream), "cudaGraphLaunch")

    def __del__(self) -> None:
        try:
            lib = cudart()
            lib.cudaGraphExecDestroy(self._exec)
            lib.cudaGraphDestroy(self._graph)
            lib.cudaStreamDestroy(self._stream)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
