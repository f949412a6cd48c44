"""Python deployment packages: a wheel per model that runs with numpy and apache-tvm-ffi
alone (never torch, tecc or the apache-tvm wheel with its compiler).

    tecc export model.tar --python-package dist/ --name resnet_tuned --version 1.0
    pip install dist/resnet_tuned-1.0-py3-none-linux_x86_64.whl
    python -c "import resnet_tuned; m = resnet_tuned.load(); print(resnet_tuned.info())"

The wheel holds, under the package NAME:
- model/: the tecc package (lib.so, plan.json, params.npz, manifest.json) as written
  by CompiledModel.export; loading checks its digests and target (CPU features, GPU
  arch) before any kernel runs, as tecc.load does;
- _runtime/: a copy of tecc.runtime (the executor and the package checks), whose TVM
  calls go to tvm_ffi and the libtvm_runtime.so it carries (runtime/_tvm_bundled.py),
  with TVM's license;
- __init__.py: load() and info().
The wheel is written directly (a zip with its dist-info), so exporting needs no build
backend and no network. Its tag names this platform (the libraries are native code).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import keyword
import os
import platform
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from tecc.runtime.package import MANIFEST, PAYLOAD, open_package

# Modules of tecc.runtime the deployed loader needs (cuda.py for GPU packages).
RUNTIME_MODULES = ("__init__.py", "executor.py", "package.py", "cpu.py", "threads.py",
                   "cuda.py")
RESERVED_NAMES = {"tecc", "tvm", "tvm_ffi", "numpy", "torch", "test", "tests"}

LOADER = '''"""{name} {version}: a model compiled by tecc {tecc} for {target}.

    import {name}
    model = {name}.load()        # checks the package against this machine first
    outputs = model(*inputs)     # numpy arrays in and out
    {name}.info()                # target, inputs, outputs, versions, records digest
"""

import json as _json
from pathlib import Path as _Path

__version__ = "{version}"
_MODEL = _Path(__file__).with_name("model")


def load(check_target: bool = True):
    """The model, after checking its files and that this machine can run its code
    (CPU features or GPU arch); check_target=False skips the machine check."""
    from ._runtime import load_package

    return load_package(_MODEL, check_target=check_target)


def info() -> dict:
    """What the package was built for and takes."""
    manifest = _json.loads((_MODEL / "manifest.json").read_text())
    return {{key: manifest.get(key) for key in
            ("target", "inputs", "outputs", "tecc", "tvm", "records_digest")}}
'''


def _check_name(name: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name) or name != name.lower() \
            or name in RESERVED_NAMES:
        raise ValueError(f"package name {name!r} must be a lower-case Python identifier "
                         f"(e.g. resnet18_tuned), not a keyword or one of "
                         f"{sorted(RESERVED_NAMES)}")


def _check_version(version: str) -> None:
    if not re.fullmatch(r"\d+(\.\d+)*([ab]|rc)?\d*(\.post\d+)?(\.dev\d+)?", version):
        raise ValueError(f"version {version!r} is not a version pip accepts (e.g. 1.0, 2.1.3)")


def _tvm_runtime_files() -> tuple[Path, Path | None, str]:
    """libtvm_runtime.so of the installed apache-tvm, its license, and its version."""
    import tvm

    lib = Path(tvm.__file__).parent / "lib" / "libtvm_runtime.so"
    if not lib.is_file():
        raise FileNotFoundError(f"TVM's runtime library is not at {lib}; reinstall apache-tvm")
    license_path = None
    try:
        dist = importlib.metadata.distribution("apache-tvm")
        for f in dist.files or []:
            if f.name == "LICENSE":
                license_path = Path(str(dist.locate_file(f)))
                break
    except importlib.metadata.PackageNotFoundError:
        pass
    return lib, license_path, tvm.__version__


def _ffi_requirement() -> str:
    """The apache-tvm-ffi this TVM runtime was built against, pinned: its ABI."""
    return f"apache-tvm-ffi=={importlib.metadata.version('apache-tvm-ffi')}"


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def write_python_package(package: str | os.PathLike, out_dir: str | os.PathLike, name: str,
                         version: str = "1.0") -> Path:
    """A wheel of the tecc package `package` (a directory or .tar written by
    CompiledModel.export) named `name`, in `out_dir`; returns its path."""
    _check_name(name)
    _check_version(version)
    root, manifest, tmp = open_package(package)
    try:
        return _write_wheel(root, manifest, Path(out_dir), name, version)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _write_wheel(root: Path, manifest: dict, out_dir: Path, name: str, version: str) -> Path:
    import tecc.runtime
    from tecc import __version__ as tecc_version

    runtime_lib, tvm_license, tvm_version = _tvm_runtime_files()
    runtime_src = Path(tecc.runtime.__file__).resolve().parent
    target = manifest.get("target", {})
    files: dict[str, bytes] = {}
    for member in (MANIFEST, *PAYLOAD):
        files[f"{name}/model/{member}"] = (root / member).read_bytes()
    for module in RUNTIME_MODULES:
        files[f"{name}/_runtime/{module}"] = (runtime_src / module).read_bytes()
    bundled = (runtime_src / "_tvm_bundled.py").read_text()
    files[f"{name}/_runtime/_tvm.py"] = bundled.replace("@TVM_VERSION@", tvm_version).encode()
    files[f"{name}/_runtime/libtvm_runtime.so"] = runtime_lib.read_bytes()
    if target.get("kind") == "cuda":
        cuda_lib = runtime_lib.with_name("libtvm_runtime_cuda.so")
        files[f"{name}/_runtime/libtvm_runtime_cuda.so"] = cuda_lib.read_bytes()
    if tvm_license is not None:
        files[f"{name}/_runtime/LICENSE.tvm"] = tvm_license.read_bytes()
    described = json.dumps({k: v for k, v in target.items() if k != "features"},
                           sort_keys=True)
    files[f"{name}/__init__.py"] = LOADER.format(name=name, version=version, tecc=tecc_version,
                                                 target=described).encode()
    dist_info = f"{name}-{version}.dist-info"
    machine = platform.machine().lower() or "x86_64"
    tag = f"py3-none-linux_{machine}"
    files[f"{dist_info}/METADATA"] = "\n".join([
        "Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
        f"Summary: {name}: a model compiled by tecc {tecc_version} for {described}",
        "Requires-Python: >=3.9", "Requires-Dist: numpy", f"Requires-Dist: {_ffi_requirement()}",
        "License: Apache-2.0 (the bundled TVM runtime); the model is the exporter's", "",
    ]).encode()
    files[f"{dist_info}/WHEEL"] = "\n".join([
        "Wheel-Version: 1.0", f"Generator: tecc {tecc_version}", "Root-Is-Purelib: false",
        f"Tag: {tag}", "",
    ]).encode()
    files[f"{dist_info}/top_level.txt"] = f"{name}\n".encode()
    record = f"{dist_info}/RECORD"
    lines = [_record_line(arc, data) for arc, data in files.items()] + [f"{record},,"]
    files[record] = ("\n".join(lines) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{version}-{tag}.whl"
    with tempfile.NamedTemporaryFile(dir=out_dir, suffix=".whl.tmp", delete=False) as f:
        partial = Path(f.name)
    try:
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for arcname, data in files.items():
                info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
                info.external_attr = (0o755 if arcname.endswith(".so") else 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        shutil.move(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


# ------------------------------------------------------------- checking a wheel in a venv

def _link_distribution(name: str, site: Path, seen: set[str]) -> None:
    """Symlink an installed distribution and its requirements into `site`."""
    key = name.lower().replace("_", "-")
    if key in seen:
        return
    seen.add(key)
    dist = importlib.metadata.distribution(name)
    for top in {f.parts[0] for f in dist.files or []}:
        source, target = Path(str(dist.locate_file(top))), site / top
        if source.exists() and not target.exists():
            target.symlink_to(source)
    for requirement in dist.requires or []:
        if "extra ==" not in requirement:
            _link_distribution(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0], site,
                               seen)


RUNTIME_DEPENDENCIES = ("numpy", "apache-tvm-ffi")


def runtime_venv(path: str | os.PathLike, wheel: str | os.PathLike, offline: bool = True
                 ) -> tuple[Path, list[str]]:
    """A fresh virtual environment at `path` with `wheel` installed: its python and the
    distributions it holds besides pip. `offline`: the wheel's requirements are linked
    from this environment's numpy and apache-tvm-ffi (with their own requirements)
    instead of fetched, and pip may not reach an index."""
    import subprocess
    import sys

    path = Path(path)
    # A Python without ensurepip (some distributions' system Python) makes a venv
    # without pip: the wheel is then installed into it by this environment's pip.
    with_pip = subprocess.run([sys.executable, "-m", "venv", str(path)],
                              capture_output=True).returncode == 0
    if not with_pip:
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], check=True, capture_output=True,
                               text=True).stdout.strip())
    seen: set[str] = set()
    if offline:
        for name in RUNTIME_DEPENDENCIES:
            _link_distribution(name, site, seen)
    installer = [str(python), "-m", "pip"] if with_pip else [sys.executable, "-m", "pip"]
    target = [] if with_pip else ["--no-deps", "--target", str(site)]
    subprocess.run([*installer, "install", "-q", "--disable-pip-version-check", *target,
                    *(["--no-index"] if offline else []), str(wheel)], check=True)
    return python, sorted(seen)


VENV_RUN = """
import importlib.util, json, statistics, sys, time
t0 = time.perf_counter()
import numpy as np
name, inputs, outputs, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
found = [m for m in ("torch", "tecc", "tvm") if importlib.util.find_spec(m)]
package = __import__(name)
model = package.load()
with np.load(inputs) as data:
    arrays = [data[s.name] for s in model.input_specs]
flat = model.run_flat(*arrays)
first_s = time.perf_counter() - t0
times = []
for _ in range(repeat):
    start = time.perf_counter()
    model.run_flat(*arrays)
    times.append(time.perf_counter() - start)
np.savez(outputs, *flat)
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "tecc", "tvm"})
print(json.dumps({"import_and_first_call_s": first_s, "median_ms":
                  statistics.median(times) * 1e3 if times else None,
                  "importable": found, "imported": loaded, "info": package.info()}))
"""


def run_in_venv(python: str | os.PathLike, name: str, inputs: str | os.PathLike,
                outputs: str | os.PathLike, repeat: int = 20) -> dict:
    """Import package `name` in the venv of `python` (from a neutral folder, without
    PYTHONPATH), run it on the arrays of `inputs` (an .npz keyed by input name), time
    the import with the first call and the median of `repeat` more calls, and save the
    outputs to `outputs` (.npz, arr_0...). Returns those figures, which of torch, tecc
    and tvm the venv could import (none, for a deployment), and the package's info()."""
    import subprocess

    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    with tempfile.TemporaryDirectory() as neutral:
        done = subprocess.run([str(python), "-c", VENV_RUN, name, str(inputs), str(outputs),
                               str(repeat)], cwd=neutral, env=environ, capture_output=True,
                              text=True)
    if done.returncode != 0:
        raise RuntimeError(f"package {name} failed in its venv:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
