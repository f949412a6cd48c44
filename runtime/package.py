"""Deployment package: lib.so + plan.json + params.npz + manifest.json, a directory or a .tar.

Loading checks the manifest (file digests, target against this host) before any
machine code is loaded, so a changed or foreign package is refused with a clear
message instead of crashing inside a kernel. A CPU package's manifest lists the LLVM
instruction-set features its code was compiled for (target "features"); the host
must have every one (tecc.runtime.cpu maps them onto /proc/cpuinfo's flags).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import _tvm, cpu
from .executor import Executor, PlanError, TensorSpec, make_executor

FORMAT_VERSION = 1
LIB, PLAN, PARAMS, MANIFEST = "lib.so", "plan.json", "params.npz", "manifest.json"
PAYLOAD = (LIB, PLAN, PARAMS)


class PackageError(RuntimeError):
    """A package that cannot be run here: changed on disk, foreign target, malformed."""


# ---------------------------------------------------------------------------- writing


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _plan_specs(plan: Mapping[str, Any], role: str) -> list[dict[str, Any]]:
    tensors = {t["id"]: t for t in plan["tensors"]}
    specs = []
    for entry in plan.get(role, []):
        t = tensors.get(entry["tensor"])
        if t is None:
            raise PlanError(f"{role} {entry['name']!r}: tensor {entry['tensor']!r} not in the plan")
        specs.append({"name": entry["name"], "shape": list(t["shape"]), "dtype": t["dtype"]})
    return specs


def _write_npz(path: Path, params: Mapping[str, np.ndarray]) -> None:
    # An .npz is a zip of .npy files; written by hand (stored, not compressed) because
    # np.savez(file, **params) breaks on a param named "file" or "allow_pickle".
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in params.items():
            arr = np.asarray(value)
            if arr.dtype.hasobject:
                raise ValueError(f"param {name!r} has dtype object; params must be plain arrays")
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            zf.writestr(name + ".npy", buf.getvalue())


def _check_params(plan: Mapping[str, Any], params: Mapping[str, np.ndarray]) -> None:
    tensors = {t["id"]: t for t in plan["tensors"]}
    for entry in plan.get("params", []):
        name = entry["name"]
        if name not in params:
            raise PlanError(f"param {name!r} named by the plan is missing from params")
        t, value = tensors[entry["tensor"]], np.asarray(params[name])
        if value.shape != tuple(t["shape"]) or value.dtype != np.dtype(t["dtype"]):
            raise PlanError(
                f"param {name!r}: the plan expects {tuple(t['shape'])} {t['dtype']}, "
                f"got {value.shape} {value.dtype}"
            )


def _target_json(target: Any) -> dict[str, Any]:
    if isinstance(target, Mapping):
        return dict(target)
    if hasattr(target, "export"):  # a tvm.target.Target
        return dict(target.export())
    raise ValueError(f"manifest_extra['target'] must be a dict like {{'kind': 'llvm'}}, got {target!r}")


def write_package(
    path: str | os.PathLike[str],
    lib_path_or_module: str | os.PathLike[str] | Any,
    plan: Mapping[str, Any],
    params: Mapping[str, np.ndarray],
    manifest_extra: Mapping[str, Any],
) -> None:
    """Write a deployment package: a directory, or a .tar when ``path`` ends with .tar.

    lib_path_or_module: a path to an exported .so, or an object with ``export_library``.
    manifest_extra: needs "target" (dict; for a CPU target with "features", the LLVM
    instruction-set features the library was compiled for, tecc.target.TargetInfo's);
    "tecc" (version) and "records_digest" are recorded too, and any other keys are
    kept in the manifest.
    """
    if "target" not in manifest_extra:
        raise ValueError("manifest_extra needs 'target', the target the library was built for")
    target = _target_json(manifest_extra["target"])
    if target.get("kind") == "llvm" and not isinstance(target.get("features"), list):
        raise ValueError("manifest_extra['target'] of a CPU package needs 'features': the LLVM "
                         "instruction-set features the library was compiled for "
                         "(tecc.target.TargetInfo.features), which loading checks")
    _check_params(plan, params)
    path = Path(path)
    as_tar = path.suffix == ".tar"
    with tempfile.TemporaryDirectory(prefix="tecc-pkg-") as tmp:
        out = Path(tmp) if as_tar else path
        out.mkdir(parents=True, exist_ok=True)
        if isinstance(lib_path_or_module, (str, os.PathLike)):
            shutil.copyfile(lib_path_or_module, out / LIB)
        elif hasattr(lib_path_or_module, "export_library"):
            lib_path_or_module.export_library(str(out / LIB))
        else:
            raise TypeError(
                "lib_path_or_module must be a path to an exported .so or an object with "
                f"export_library(path), got {type(lib_path_or_module).__name__}"
            )
        (out / PLAN).write_text(json.dumps(plan, indent=1))
        _write_npz(out / PARAMS, params)

        manifest: dict[str, Any] = {
            k: v for k, v in manifest_extra.items() if k not in ("target",)
        }
        manifest.update(
            format_version=FORMAT_VERSION,
            tecc=manifest_extra.get("tecc"),
            tvm=_tvm.VERSION,
            target=target,
            inputs=_plan_specs(plan, "inputs"),
            outputs=_plan_specs(plan, "outputs"),
            files={name: _sha256(out / name) for name in PAYLOAD},
            records_digest=manifest_extra.get("records_digest"),
        )
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1))

        if as_tar:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(path, "w") as tf:
                for name in (MANIFEST, *PAYLOAD):
                    tf.add(out / name, arcname=name)


# ---------------------------------------------------------------------------- checking

def _check_target(target: Mapping[str, Any]) -> None:
    kind = target.get("kind")
    built_for = json.dumps({k: v for k, v in target.items() if k != "features"}, sort_keys=True)
    if kind == "llvm":
        machine = cpu.host_machine()
        triple = str(target.get("mtriple", "") or "")
        if triple and cpu.normalize_machine(triple.split("-")[0]) != machine:
            raise PackageError(
                f"this package was built for {built_for} (triple {triple}); this host is "
                f"{machine}. Recompile the model for this host."
            )
        features = target.get("features")
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise PackageError(
                f"this package was built for {built_for}, but its manifest does not list "
                f"the instruction-set features its code needs (written by an older tecc?). "
                f"Recompile and re-export the model, or load with check_target=False at your "
                f"own risk."
            )
        unknown = sorted(set(features) - set(cpu.LLVM_TO_CPUINFO))
        if unknown:
            raise PackageError(
                f"this package was built for {built_for} and needs CPU features this "
                f"runtime cannot check: {', '.join(unknown)}. Load it with a tecc runtime "
                f"that knows them, or with check_target=False at your own risk."
            )
        have = cpu.host_cpuinfo_flags()
        if have is None:
            warnings.warn(
                f"cannot read this host's CPU features; running a package built for "
                f"{built_for} unchecked",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        missing = cpu.missing_on_host(features, have)
        if missing:
            raise PackageError(
                f"this package was built for {built_for}, but this host's CPU lacks "
                f"{', '.join(missing)}. Recompile the model for this host "
                f"(e.g. target llvm, which detects the host CPU)."
            )
    elif kind == "cuda":
        from . import cuda

        try:
            cuda.cuda_device(0)
            here = cuda.device_arch(0)
        except cuda.CudaError as exc:
            raise PackageError(
                f"this package was built for {built_for}, but no CUDA device is usable "
                f"here ({exc}). Run it on a machine with an NVIDIA GPU, or recompile for llvm."
            ) from exc
        if str(target.get("arch", "")) != here:
            raise PackageError(
                f"this package was built for {built_for}, but this GPU is {here}. "
                f"Recompile the model with target cuda:{here}."
            )
    else:
        raise PackageError(f"this package was built for {built_for}; target kind {kind!r} is not supported")


def _verify_files(root: Path, manifest: Mapping[str, Any], shown: Path) -> None:
    """The payload files under `root` against the manifest's digests; errors name
    `shown`, the user's package (a .tar is checked in the folder it was extracted to)."""
    files = manifest.get("files")
    if not isinstance(files, Mapping):
        raise PackageError(f"{shown}: manifest.json has no 'files' digests; re-export the package")
    for name in PAYLOAD:
        if name not in files:
            raise PackageError(f"{shown}: manifest.json lists no digest for {name}; re-export the package")
    for name, digest in files.items():
        p = root / name
        if Path(name).name != name:
            raise PackageError(f"{shown}: manifest names a file outside the package: {name!r}")
        if not p.is_file():
            raise PackageError(f"{shown}: {name} is missing from the package; re-export the package")
        if _sha256(p) != digest:
            raise PackageError(
                f"{shown}: {name} was changed after export (its sha256 does not match the "
                f"manifest); re-export the package from the compiled model"
            )


# ---------------------------------------------------------------------------- loading


class Package:
    """A loaded package: call it like the model (numpy in, numpy out, structured)."""

    def __init__(
        self,
        executor: Executor,
        manifest: dict[str, Any],
        path: Path,
        tmpdir: tempfile.TemporaryDirectory[str] | None = None,
    ) -> None:
        self.executor = executor
        self.manifest = manifest
        self.path = path
        # Keeps the extracted .tar (and the loaded lib.so in it) alive with this object.
        self._tmpdir = tmpdir

    @property
    def input_specs(self) -> list[TensorSpec]:
        return self.executor.input_specs

    @property
    def output_specs(self) -> list[TensorSpec]:
        return self.executor.output_specs

    def run_flat(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return self.executor.run_flat(*inputs)

    def __call__(self, *inputs: np.ndarray) -> Any:
        return self.executor.run(*inputs)

    run = __call__

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.describe()}" for s in self.input_specs)
        return f"<tecc Package {self.path} target={self.manifest.get('target')} inputs=({ins})>"


def _extract_tar(path: Path) -> tempfile.TemporaryDirectory[str]:
    """The package's files extracted to a temporary folder. A member that is not one
    of the package's files (another name, a folder, a link, an absolute or `../` path)
    means the archive was not written by export: it is refused, not skipped."""
    tmp = tempfile.TemporaryDirectory(prefix="tecc-pkg-")
    try:
        with tarfile.open(path, "r") as tf:
            members = tf.getmembers()
            foreign = [m.name for m in members
                       if not m.isfile() or m.name not in (MANIFEST, *PAYLOAD)]
            if foreign:
                raise PackageError(f"{path}: the archive holds member(s) a tecc package does "
                                   f"not have: {foreign[:5]}; it was changed after export. "
                                   "Re-export the package")
            if hasattr(tarfile, "data_filter"):
                tf.extractall(tmp.name, members=members, filter="data")
            else:  # Python without extraction filters: members are already plain top-level files
                tf.extractall(tmp.name, members=members)
    except tarfile.TarError as exc:
        tmp.cleanup()
        raise PackageError(f"{path}: not a readable .tar package ({exc}); re-export it") from exc
    except PackageError:
        tmp.cleanup()
        raise
    return tmp


def open_package(path: str | os.PathLike[str]
                 ) -> tuple[Path, dict[str, Any], tempfile.TemporaryDirectory[str] | None]:
    """A package's folder (a .tar extracted to a temporary one, returned to keep it
    alive) and its manifest, after checking the manifest's form, the format version
    and every file's digest; errors name `path`."""
    path = Path(path)
    tmpdir = None
    if path.is_file():
        tmpdir = _extract_tar(path)
        root = Path(tmpdir.name)
    elif path.is_dir():
        root = path
    else:
        raise PackageError(f"{path}: no such package (expected a directory or a .tar)")
    try:
        manifest_path = root / MANIFEST
        if not manifest_path.is_file():
            raise PackageError(f"{path}: no manifest.json, not a tecc package")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PackageError(f"{path}: manifest.json is not valid JSON ({exc}); "
                               "re-export it") from exc
        if not isinstance(manifest, dict):
            raise PackageError(f"{path}: manifest.json holds a JSON {type(manifest).__name__}, "
                               "not an object; re-export the package")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise PackageError(
                f"{path}: package format_version {manifest.get('format_version')!r}; this "
                f"runtime reads version {FORMAT_VERSION}. Re-export with a matching tecc.")
        _verify_files(root, manifest, path)
    except PackageError:
        if tmpdir is not None:
            tmpdir.cleanup()
        raise
    return root, manifest, tmpdir


def load_package(
    path: str | os.PathLike[str], device: Any = None, check_target: bool = True
) -> Package:
    """Load a package (directory or .tar) after checking its manifest against this host.

    device: None or a CPU device (the executor runs on host memory).
    check_target: False skips the host CPU check (for a target this runtime cannot judge).
    """
    path = Path(path)
    # All checks before any machine code is loaded.
    root, manifest, tmpdir = open_package(path)
    target = manifest.get("target")
    if not isinstance(target, Mapping):
        raise PackageError(f"{path}: manifest.json has no target; re-export the package")
    if check_target:
        _check_target(target)
    device_kind = "cuda" if target.get("kind") == "cuda" else "cpu"
    if target.get("kind") not in ("llvm", "cuda"):
        raise PackageError(
            f"{path}: built for target kind {target.get('kind')!r}; this executor runs "
            f"llvm (CPU) and cuda packages only"
        )
    if device is not None and str(device).split(":")[0] != device_kind:
        raise PackageError(f"{path}: a {target.get('kind')} package runs on {device_kind}, "
                           f"not on {device}")
    if manifest.get("tvm") != _tvm.VERSION:
        warnings.warn(
            f"{path}: package built with TVM {manifest.get('tvm')}, this runtime is TVM "
            f"{_tvm.VERSION}; re-export if it misbehaves",
            RuntimeWarning,
            stacklevel=2,
        )

    plan = json.loads((root / PLAN).read_text())
    with np.load(root / PARAMS, allow_pickle=False) as npz:
        params = {name: npz[name] for name in npz.files}
    if device_kind == "cuda":
        from .cuda import ensure_tvm_cuda_runtime

        ensure_tvm_cuda_runtime()  # TVM_USE_RUNTIME_LIB=1 loads no CUDA runtime
    module = _tvm.load_module(str(root / LIB))
    try:
        executor = make_executor(module, plan, params, device_kind)
    except PlanError as exc:
        raise PackageError(f"{path}: the package is inconsistent: {exc}. Re-export it.") from exc
    return Package(executor, manifest, path, tmpdir)
