"""A compiled model exported as a package and run with the runtime alone."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tecc
from tests.models import resnet18

REPO = Path(__file__).resolve().parents[1]

RUNTIME_ONLY = r"""
import sys

class NoTorch:
    # A deployment host without torch (tvm_ffi imports it when it is installed).
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'")

sys.meta_path.insert(0, NoTorch())
import numpy as np
import tecc

model = tecc.load(sys.argv[1])
np.save(sys.argv[3], model(np.load(sys.argv[2])))
assert "libtvm_compiler" not in open("/proc/self/maps").read()
compiler = [m for m in sys.modules if m.split(".")[0] == "torch" or m == "tecc.api"
            or m.split(".")[:2] in (["tecc", "frontend"], ["tecc", "graph_opt"],
                                    ["tecc", "schedules"], ["tecc", "autotune"])]
assert not compiler, compiler
print("OK")
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval()
    x = torch.randn(1, 3, 40, 40)
    path = tmp_path_factory.mktemp("pkg") / "resnet.tar"
    tecc.compile(model, (x,)).export(path)
    return model, path


def test_package_runs_without_torch_or_compiler(exported, tmp_path):
    model, path = exported
    x = np.random.default_rng(3).standard_normal((1, 3, 40, 40)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, str(path), str(tmp_path / "x.npy"),
         str(tmp_path / "y.npy")],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TVM_USE_RUNTIME_LIB": "1"},
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-3, atol=1e-4)


def test_manifest_describes_the_package(exported, tmp_path):
    _, path = exported
    loaded = tecc.load(path)
    manifest = loaded.manifest
    assert manifest["tecc"] == tecc.__version__
    assert manifest["target"]["kind"] == "llvm"
    assert [tuple(s["shape"]) for s in manifest["inputs"]] == [(1, 3, 40, 40)]
    assert set(manifest["files"]) >= {"lib.so", "plan.json", "params.npz"}
    plan = json.loads(json.dumps(loaded.executor.plan))
    assert plan["kernels"], "the plan lists kernel calls"


def test_manifest_lists_the_isa_features_and_a_host_lacking_one_is_refused(exported,
                                                                          monkeypatch):
    from tecc.runtime import PackageError, cpu

    from tecc.target import target_info

    _, path = exported
    features = tecc.load(path).manifest["target"]["features"]
    host = target_info("llvm")
    assert features == sorted(host.features) and "avx2" in features
    # the same package on a host like this one but without AVX2
    flags = {cpu.LLVM_TO_CPUINFO[f] for f in features} - {"avx2"}
    monkeypatch.setattr(cpu, "host_cpuinfo_flags", lambda: frozenset(flags))
    with pytest.raises(PackageError, match=f"{host.cpu}.*lacks avx2\\. Recompile"):
        tecc.load(path)


def test_wrong_input_names_expected_and_given(exported):
    _, path = exported
    loaded = tecc.load(path)
    with pytest.raises(ValueError, match=r"input 'x' \(#0\): expected shape \(1, 3, 40, 40\) "
                                         r"float32, got \(1, 3, 32, 32\) float32"):
        loaded(np.ones((1, 3, 32, 32), "float32"))
    with pytest.raises(ValueError, match="expected 1 input"):
        loaded()
    with pytest.raises(ValueError, match="got \\(1, 3, 40, 40\\) float64"):
        loaded(np.ones((1, 3, 40, 40)))
