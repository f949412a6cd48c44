"""The command line: compile a model, run the package from npz files."""

import subprocess
import sys

import numpy as np
import torch

from tecc.cli import main
from tests.models import mlp_example


def test_compile_and_run_round_trip(tmp_path, capsys):
    package = tmp_path / "mlp.tar"
    assert main(["compile", "tests.models:mlp_example", "-o", str(package)]) == 0
    assert package.exists()
    model, (x,) = mlp_example()
    x = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    np.savez(tmp_path / "in.npz", x=x.numpy())
    out = tmp_path / "out.npz"
    assert main(["run", str(package), "--inputs", str(tmp_path / "in.npz"), "--outputs",
                 str(out), "--print-time", "--repeat", "3"]) == 0
    assert "median (ms)" in capsys.readouterr().out
    with np.load(out) as result:
        np.testing.assert_allclose(result["output0"], model(x).detach().numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_pt2_file_compiles(tmp_path):
    model, inputs = mlp_example()
    pt2 = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, inputs), str(pt2))
    package = tmp_path / "pkg"
    assert main(["compile", str(pt2), "-o", str(package)]) == 0
    assert (package / "manifest.json").exists() and (package / "lib.so").exists()


def test_run_names_missing_inputs(tmp_path):
    package = tmp_path / "mlp.tar"
    main(["compile", "tests.models:mlp_example", "-o", str(package)])
    np.savez(tmp_path / "bad.npz", y=np.ones((2, 64), "float32"))
    proc = subprocess.run([sys.executable, "-m", "tecc.cli", "run", str(package), "--inputs",
                           str(tmp_path / "bad.npz")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "lacks input(s) ['x']" in proc.stderr
