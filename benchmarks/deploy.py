"""The Python deployment package against tecc.load and torch eager, in one run: the
wheel's size, the installed size of a fresh venv holding only the wheel and its
requirements (against torch's installed CPU build), import + first call in that venv,
and steady latency in rounds that alternate the venv (a process per round), tecc.load
in this process and eager.

    python benchmarks/deploy.py [--models resnet18,mlp] [--rounds 5]

Writes results/deploy.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc  # noqa: E402
from benchmarks.common import host_line, write_table  # noqa: E402
from benchmarks.models_factory import mlp, resnet18  # noqa: E402
from tecc.deploy import run_in_venv, runtime_venv  # noqa: E402

MODELS = {"resnet18": resnet18, "mlp": mlp}
RECORDS = Path(__file__).resolve().parents[1] / "tuning_logs"


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path`, following symlinks (linked dependencies count)."""
    total = 0
    for root, _, files in os.walk(path, followlinks=True):
        for f in files:
            p = os.path.join(root, f)
            if os.path.isfile(p):
                total += os.path.getsize(p)
    return total


def installed_bytes(distribution: str) -> int:
    dist = importlib.metadata.distribution(distribution)
    return sum(os.path.getsize(dist.locate_file(f)) for f in dist.files or []
               if os.path.isfile(dist.locate_file(f)))


def calls_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(name: str, rounds: int, repeat: int, work: Path) -> list[str]:
    model, inputs = MODELS[name]()
    model = model.eval()
    compiled = tecc.compile(model, inputs, records=str(RECORDS))
    compiled.export(work / f"{name}.tar")
    wheel = compiled.export_python_package(work / "dist", f"{name}_bench")
    python, _ = runtime_venv(work / f"venv_{name}", wheel, offline=True)
    site = next((work / f"venv_{name}" / "lib").glob("python*/site-packages"))
    runtime_only = sum(tree_bytes(site / top) for top in os.listdir(site)
                       if not top.startswith(("pip", "setuptools", "_distutils", "pkg_resources",
                                              "distutils")))
    arrays = [x.numpy() for x in inputs]
    np.savez(work / "in.npz", **{s["name"]: a for s, a in zip(compiled.input_specs, arrays,
                                                              strict=True)})
    loaded = tecc.load(work / f"{name}.tar")
    firsts, venv_ms, load_ms, eager_ms = [], [], [], []
    for _ in range(rounds):  # alternating, so a slow phase of the machine hits all three
        result = run_in_venv(python, f"{name}_bench", work / "in.npz", work / "out.npz", repeat)
        assert result["imported"] == [], result["imported"]
        firsts.append(result["import_and_first_call_s"])
        venv_ms.append(result["median_ms"])
        with torch.no_grad():
            eager_ms.append(calls_ms(lambda: model(*inputs), repeat))  # noqa: B023
        load_ms.append(calls_ms(lambda: loaded(*arrays), repeat))  # noqa: B023
        time.sleep(1.0)  # TVM's pool threads spin a while after a run: let them park
    with np.load(work / "out.npz") as got, torch.no_grad():
        expected = model(*inputs).numpy()
        error = float(np.max(np.abs(got["arr_0"] - expected)) / np.max(np.abs(expected)))
    venv, tl, eager = (statistics.median(v) for v in (venv_ms, load_ms, eager_ms))
    return [name, f"{wheel.stat().st_size / 1e6:.1f}", f"{runtime_only / 1e6:.0f}",
            f"{tree_bytes(site) / 1e6:.0f}", f"{statistics.median(firsts):.2f}",
            f"{venv:.3f}", f"{tl:.3f}", f"{eager:.3f}", f"{eager / venv:.2f}x",
            f"{error:.1e}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18,mlp")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(m, args.rounds, args.repeat, Path(tmp)) for m in args.models.split(",")]
    torch_mb = installed_bytes("torch") / 1e6
    write_table(
        "deploy", "Python deployment package: size, start-up and latency, CPU, batch 1",
        ["model", "wheel MB", "installed MB (wheel + numpy + apache-tvm-ffi)",
         "venv MB (with pip)", "import + first call s", "deployed ms", "tecc.load ms",
         "torch eager ms", "deployed vs eager", "max rel err"], rows,
        [f"Host: {host_line()}. The wheel (tecc export --python-package) installed with "
         "its requirements linked from this environment into a fresh venv that cannot "
         "import torch, tecc or tvm; compiled with the shipped records (tuning_logs/).",
         f"For comparison, torch's installed CPU build alone is {torch_mb:.0f} MB.",
         f"Medians over {args.rounds} alternating rounds of {args.repeat} calls (the "
         "deployed package in a new process each round). Command: `python "
         "benchmarks/deploy.py`."])


if __name__ == "__main__":
    main()
