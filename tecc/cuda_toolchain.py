"""The CUDA toolchain for building: nvcc, and TVM's CUDA runtime loaded even where no
GPU driver is installed, so that cubins are compiled and embedded at build time.

Compiling for CUDA needs nvcc, not a GPU. TVM compiles CUDA kernels to a cubin only
when its CUDA runtime library (libtvm_runtime_cuda.so) is loaded; that library
links against the driver (libcuda.so.1), so on a machine without a driver `import
tvm` skips it silently and `tvm.compile` would return a module holding only CUDA
source (which the GPU machine would then need the whole compiler to load). Where
no driver is present, `ensure_cuda_build()` builds a stub libcuda.so.1 (each driver
symbol returns CUDA_ERROR_NO_DEVICE) into a cache folder and dlopens it with
RTLD_GLOBAL; the dynamic loader then satisfies libtvm_runtime_cuda.so's DT_NEEDED
entry for that soname with the loaded stub, so LD_LIBRARY_PATH at process start is
not needed, and the CUDA runtime is loaded in-process.

Math flags: kernels are compiled by nvcc with `-O3` and IEEE math: TVM's default
`--use_fast_math` is turned off (TVM_CUDA_NVCC_NO_FAST_MATH), because its powf is
exp2(y * log2(x)), NaN for a negative base (x ** 2 of negative x came out NaN), and it
flushes denormals to zero. `TECC_CUDA_FAST_MATH=1` turns it back on.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The driver symbols libtvm_runtime_cuda.so imports (nm -D --undefined-only), and those
# a CUDA runtime or framework probes first; each answers "no device".
STUB_SYMBOLS = (
    "cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString",
    "cuLaunchKernelEx", "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload",
    "cuTensorMapEncodeTiled", "cuInit", "cuDriverGetVersion", "cuDeviceGetCount",
    "cuDeviceGet", "cuGetProcAddress", "cuGetProcAddress_v2", "cuCtxGetCurrent",
)
CUDA_ERROR_NO_DEVICE = 100
FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)  # a fatbin's header, as nvcc writes it


DEFAULT_CUDA_ROOTS = ("/usr/local/cuda",)


class CudaToolchainError(RuntimeError):
    """nvcc or the pieces of the CUDA build are missing."""


def find_nvcc() -> str:
    """The nvcc to compile with: $PATH, then $CUDA_HOME / $CUDA_PATH, then /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *DEFAULT_CUDA_ROOTS):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    raise CudaToolchainError(
        "compiling for target cuda needs nvcc (the CUDA toolkit), and none was found on "
        "PATH, in $CUDA_HOME or $CUDA_PATH, or at /usr/local/cuda/bin/nvcc. Install the "
        "CUDA toolkit (no GPU or driver is needed to compile) or put its bin/ on PATH.")


def _cache_dir() -> Path:
    root = os.environ.get("TECC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tecc")
    return Path(root) / "cuda-stub"


def _stub_source() -> str:
    lines = ["/* libcuda.so.1 stand-in for building without a GPU driver: no device. */"]
    lines += [f"int {name}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}" for name in STUB_SYMBOLS]
    return "\n".join(lines) + "\n"


def build_stub_driver(folder: Path | None = None) -> Path:
    """Build (once, cached by its source) the stub libcuda.so.1 with the C compiler."""
    source = _stub_source()
    folder = folder or _cache_dir() / hashlib.sha256(source.encode()).hexdigest()[:12]
    lib = folder / "libcuda.so.1"
    if lib.is_file():
        return lib
    compiler = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if compiler is None:
        raise CudaToolchainError(
            "building for cuda without a GPU driver needs a C compiler (gcc or cc) to make a "
            "stand-in libcuda.so.1; none was found. Install gcc, or build on a machine "
            "with the NVIDIA driver.")
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "cuda_stub.c"
    src.write_text(source)
    tmp = folder / f"libcuda.so.1.{os.getpid()}"
    proc = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1",
                           "-o", str(tmp), str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CudaToolchainError(f"building the stand-in libcuda.so.1 failed:\n{proc.stderr}")
    os.replace(tmp, lib)  # atomic: parallel builds never see a half-written library
    return lib


def has_driver() -> bool:
    """Whether a real libcuda.so.1 can be loaded (a GPU machine, or a driver installed)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@functools.cache
def _load_cuda_runtime() -> str:
    """Load TVM's CUDA runtime into this process (the stub driver first where no
    real one exists); returns how: "driver" or the stub's path."""
    import tvm

    from tecc.runtime.cuda import CudaError, ensure_tvm_cuda_runtime

    how = "driver"
    if not has_driver():
        stub = build_stub_driver()
        ctypes.CDLL(str(stub), mode=ctypes.RTLD_GLOBAL)
        how = str(stub)
    try:
        ensure_tvm_cuda_runtime()
    except CudaError as err:
        raise CudaToolchainError(str(err)) from err
    if tvm.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        raise CudaToolchainError("TVM's CUDA runtime loaded but registered no CUDA module; "
                                 "this TVM build lacks CUDA support")
    return how


@contextlib.contextmanager
def cuda_build_env() -> Iterator[str]:
    """Inside: tvm.compile for a cuda target makes cubins with nvcc. Yields nvcc's path."""
    nvcc = find_nvcc()
    _load_cuda_runtime()
    saved = {k: os.environ.get(k) for k in ("PATH", "TVM_CUDA_COMPILE_MODE",
                                             "TVM_CUDA_NVCC_NO_FAST_MATH")}
    # TVM runs "nvcc" from PATH; nvrtc (TVM's default) would need the cuda-bindings package.
    os.environ["PATH"] = os.path.dirname(nvcc) + os.pathsep + os.environ.get("PATH", "")
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
    if os.environ.get("TECC_CUDA_FAST_MATH") == "1":
        os.environ.pop("TVM_CUDA_NVCC_NO_FAST_MATH", None)
    else:
        os.environ["TVM_CUDA_NVCC_NO_FAST_MATH"] = "1"
    try:
        yield nvcc
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def compile_cuda(mod: Any, target: Any) -> Any:
    """tvm.compile for a CUDA target: every kernel bound to blocks and threads
    (checked first), cubins built with nvcc and embedded in the library."""
    import tvm

    from tecc.schedules.gpu_default import check_bound

    for gvar, func in mod.functions_items():
        check_bound(func, gvar.name_hint)
    with cuda_build_env(), target:
        return tvm.compile(mod, target=target)


def embedded_cuda_archs(library: bytes) -> list[tuple[str, int]]:
    """The device code an exported library embeds: ("elf" | "ptx", sm number) for each
    entry of each CUDA fatbin in `library`'s bytes."""
    found = []
    start = library.find(FATBIN_MAGIC)
    while start >= 0:
        _, header_size, fat_size = struct.unpack_from("<HHQ", library, start + 4)
        entry, end = start + header_size, start + header_size + fat_size
        while entry + 32 <= min(end, len(library)):
            kind, _, entry_header, size = struct.unpack_from("<HHIQ", library, entry)
            arch = struct.unpack_from("<I", library, entry + 28)[0]
            found.append(({1: "ptx", 2: "elf"}.get(kind, str(kind)), int(arch)))
            if entry_header == 0:
                break
            entry += entry_header + size
        start = library.find(FATBIN_MAGIC, max(end, start + 4))
    return found
