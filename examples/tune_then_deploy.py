"""Tune, compile, and deploy a model as a pip-installable package, in one command:

    python examples/tune_then_deploy.py [--model benchmarks.models_factory:resnet18]
        [--records tuning_logs/] [--retarget] [--trials 0] [--out deploy_out]

1. Tuning records: the shipped ones (--records, a file or folder) where they apply to
   this machine; with --retarget, records of other machines are first measured here
   (about 3 minutes); with --trials N > 0, the model is tuned here for N trials,
   continuing from those records.
2. Compile with the records, export the Python package (a wheel).
3. Make a fresh virtual environment without torch or tecc, install the wheel there
   (--online: fetch numpy and apache-tvm-ffi from the index; by default they are
   linked from this environment), and run it on the saved inputs.
4. Print the outputs' max error against torch eager and the latency against eager.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # benchmarks.models_factory

import tecc  # noqa: E402
from tecc.cli import load_model_spec  # noqa: E402
from tecc.deploy import run_in_venv, runtime_venv  # noqa: E402


def eager_ms(model: torch.nn.Module, inputs: tuple, repeat: int) -> float:
    with torch.no_grad():
        model(*inputs)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            model(*inputs)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="benchmarks.models_factory:resnet18",
                        help="module:function returning (model, example inputs), or a .pt2")
    parser.add_argument("--records", default="tuning_logs",
                        help="tuning records to use (file or folder; '' for none)")
    parser.add_argument("--retarget", action="store_true",
                        help="measure the records of other machines here first")
    parser.add_argument("--trials", type=int, default=0, help="tune here for this many trials")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--name", default=None, help="package name (default: from the model)")
    parser.add_argument("--out", default="deploy_out", help="folder for everything written")
    parser.add_argument("--online", action="store_true",
                        help="install the wheel's requirements from the package index")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model, inputs = load_model_spec(args.model)
    model = model.eval()
    name = args.name or args.model.rsplit(":", 1)[-1].replace(".", "_").lower() + "_tecc"
    local = out / "tuning.jsonl"
    records: list[str] = [str(local)] if args.records == "" else [args.records, str(local)]
    if args.retarget and args.records:
        print("== retarget the shipped records to this machine")
        tecc.retarget(model, inputs, foreign=args.records, records=str(local),
                      target=args.target)
    if args.trials > 0:
        print(f"== tune for {args.trials} trials")
        tecc.tune(model, inputs, target=args.target, records=str(local), trials=args.trials,
                  transfer=[args.records] if args.records else True)
    print("== compile and export")
    compiled = tecc.compile(model, inputs, target=args.target,
                            records=[r for r in records if Path(r).exists()] or None)
    sources: dict[str, int] = {}
    for task in compiled.tasks():
        sources[task["source"]] = sources.get(task["source"], 0) + 1
    print(f"configs by source: {sources}")
    wheel = compiled.export_python_package(out / "dist", name)
    print(f"wheel: {wheel} ({wheel.stat().st_size / 1e6:.1f} MB)")

    print("== install into a fresh virtual environment and run there")
    python, holds = runtime_venv(out / "venv", wheel, offline=not args.online)
    arrays = {spec["name"]: x.numpy() for spec, x in zip(compiled.input_specs, inputs,
                                                      strict=True)}
    np.savez(out / "inputs.npz", **arrays)
    result = run_in_venv(python, name, out / "inputs.npz", out / "outputs.npz", args.repeat)
    with torch.no_grad():
        expected = model(*inputs)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    with np.load(out / "outputs.npz") as got:
        errors = [float(np.max(np.abs(got[f"arr_{i}"] - e.numpy())) / max(
            float(np.max(np.abs(e.numpy()))), 1e-12)) for i, e in enumerate(expected)]
    torch_ms = eager_ms(model, inputs, args.repeat)
    print(f"venv holds {', '.join(holds) or 'the wheel only'} (torch importable: "
          f"{'torch' in result['importable']})")
    print(f"max relative error against torch eager: {max(errors):.2e}")
    print(f"import + first call: {result['import_and_first_call_s']:.3f} s")
    print(f"latency: deployed {result['median_ms']:.3f} ms, torch eager {torch_ms:.3f} ms "
          f"({torch_ms / result['median_ms']:.2f}x)")


if __name__ == "__main__":
    main()
