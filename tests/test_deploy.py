"""Python deployment packages: a model's wheel installs offline into a fresh virtual
environment that holds numpy and apache-tvm-ffi only, and runs there, where torch,
tecc and the apache-tvm wheel cannot be imported, matching torch eager; plus the
package checks a wheel and `tecc.load` share (tampered archives, bad manifests) and
`tecc run`'s one-line errors."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import zipfile

import numpy as np
import pytest
import torch
from tecc.runtime import PackageError

import tecc
from tecc.cli import main
from tecc.deploy import RUNTIME_DEPENDENCIES as ALLOWED
from tecc.deploy import run_in_venv, runtime_venv, write_python_package
from tests.models import MLP


@pytest.fixture(scope="module")
def mlp_package(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deploy")
    model = MLP().eval()
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    compiled = tecc.compile(model, (x,))
    with torch.no_grad():
        expected = model(x).numpy()
    compiled.export(tmp / "mlp.tar")
    return compiled, x.numpy(), expected, tmp


def test_wheel_installs_offline_and_runs_without_torch_or_tecc(mlp_package):
    compiled, x, expected, tmp = mlp_package
    wheel = compiled.export_python_package(tmp / "dist", "mlp_deployed", "0.3")
    assert wheel.name == f"mlp_deployed-0.3-py3-none-linux_{os.uname().machine}.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read("mlp_deployed-0.3.dist-info/METADATA").decode()
    assert "mlp_deployed/_runtime/libtvm_runtime.so" in names
    assert "mlp_deployed/_runtime/LICENSE.tvm" in names
    assert not any("compiler" in n for n in names)
    requires = [line.split(": ", 1)[1] for line in metadata.splitlines()
                if line.startswith("Requires-Dist")]
    assert [re.split(r"[=<> ]", r)[0] for r in requires] == list(ALLOWED)

    # pip resolves the wheel's requirements from what the venv has: nothing fetched
    python, holds = runtime_venv(tmp / "venv", wheel, offline=True)
    assert set(holds) <= {"numpy", "apache-tvm-ffi", "typing-extensions"}, holds
    np.savez(tmp / "x.npz", x=x)
    result = run_in_venv(python, "mlp_deployed", tmp / "x.npz", tmp / "y.npz", repeat=3)
    assert result["importable"] == [] and result["imported"] == []
    info = result["info"]
    assert info["target"]["kind"] == "llvm" and info["tecc"] == tecc.__version__
    assert [i["shape"] for i in info["inputs"]] == [[3, 64]]
    with np.load(tmp / "y.npz") as y:
        np.testing.assert_allclose(y["arr_0"], expected, rtol=1e-4, atol=1e-5)


def test_tecc_export_writes_the_wheel_and_checks_its_arguments(mlp_package, tmp_path, capsys):
    _, _, _, tmp = mlp_package
    assert main(["export", str(tmp / "mlp.tar"), "--python-package", str(tmp_path),
                 "--name", "mlp_cli"]) == 0
    assert (tmp_path / f"mlp_cli-1.0-py3-none-linux_{os.uname().machine}.whl").is_file()
    assert "import mlp_cli" in capsys.readouterr().out
    for bad in ("MLP", "my-model", "import", "torch"):
        with pytest.raises(SystemExit, match="lower-case Python identifier"):
            main(["export", str(tmp / "mlp.tar"), "--python-package", str(tmp_path),
                  "--name", bad])
    with pytest.raises(SystemExit, match="not a version"):
        main(["export", str(tmp / "mlp.tar"), "--python-package", str(tmp_path), "--name",
              "ok_name", "--version", "one"])


def _retar(src, dst, extra=None, manifest=None):
    """A copy of package `src` with an extra member or another manifest."""
    with tarfile.open(src) as tf, tarfile.open(dst, "w") as out:
        for member in tf.getmembers():
            data = tf.extractfile(member).read()
            if member.name == "manifest.json" and manifest is not None:
                data = manifest
                member.size = len(data)
            out.addfile(member, io.BytesIO(data))
        if extra is not None:
            info = tarfile.TarInfo(extra)
            info.size = 2
            out.addfile(info, io.BytesIO(b"hi"))


@pytest.mark.parametrize("member", ["notes.txt", "../escape.so", "/abs/lib.so",
                                    "sub/lib.so"])
def test_a_tar_with_foreign_members_is_refused(mlp_package, tmp_path, member):
    _, _, _, tmp = mlp_package
    _retar(tmp / "mlp.tar", tmp_path / "bad.tar", extra=member)
    with pytest.raises(PackageError, match=r"bad\.tar: the archive holds member"):
        tecc.load(tmp_path / "bad.tar")
    with pytest.raises(PackageError, match="holds member"):
        write_python_package(tmp_path / "bad.tar", tmp_path, "bad_pkg")


def test_errors_of_a_tar_name_the_users_file(mlp_package, tmp_path):
    _, _, _, tmp = mlp_package
    manifest = json.loads(tarfile.open(tmp / "mlp.tar").extractfile("manifest.json").read())
    manifest["files"]["plan.json"] = "0" * 64
    _retar(tmp / "mlp.tar", tmp_path / "changed.tar", manifest=json.dumps(manifest).encode())
    with pytest.raises(PackageError, match=rf"^{re.escape(str(tmp_path / 'changed.tar'))}: "
                                           r"plan\.json was changed"):
        tecc.load(tmp_path / "changed.tar")


def test_a_manifest_that_is_no_object_is_a_package_error(mlp_package, tmp_path):
    _, _, _, tmp = mlp_package
    _retar(tmp / "mlp.tar", tmp_path / "list.tar", manifest=b"[1, 2]")
    with pytest.raises(PackageError, match="JSON list, not an object"):
        tecc.load(tmp_path / "list.tar")


def test_tecc_run_says_what_is_wrong_in_one_line(mlp_package, tmp_path):
    _, x, _, tmp = mlp_package
    np.savez(tmp_path / "bad.npz", x=x[:, :10])
    with pytest.raises(SystemExit, match=r"^tecc run: input 'x' \(#0\): expected shape"):
        main(["run", str(tmp / "mlp.tar"), "--inputs", str(tmp_path / "bad.npz")])
    with pytest.raises(SystemExit, match="--repeat must be at least 1"):
        main(["run", str(tmp / "mlp.tar"), "--print-time", "--repeat", "0"])
    with pytest.raises(SystemExit, match="^tecc run: .*no such package"):
        main(["run", str(tmp_path / "missing.tar")])
