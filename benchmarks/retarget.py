"""Records of another machine, retargeted here: how much of a full local tuning's
speedup a retarget run of a few minutes recovers, for ResNet-18 and MobileNetV2.

Per model, in one run: latency with no records (the fallback configs), with the
full local records (--local; the column is skipped when the file is absent), and
with the foreign records (--foreign) retargeted here into a fresh temporary file
(the retarget run timed); medians over interleaved rounds. "share of full tuning's
speedup" = (fallback / retargeted - 1) / (fallback / full - 1).

    python benchmarks/retarget.py [--models resnet18,mobilenet_v2]
        [--local tuning_logs/llvm_emeraldrapids.jsonl]
        [--foreign tuning_logs/llvm_core-avx2.jsonl] [--time-budget 180]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tecc.autotune.records import RETARGET_BUDGET_S, RETARGET_K  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import host_line, interleaved_ms, write_table  # noqa: E402
from tests.models import example_models  # noqa: E402
from tests.util import max_rel_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def sources(cm) -> str:
    """How the compiled model's workloads got their configs, e.g. "12 retargeted, 4
    fallback"."""
    counts: dict[str, int] = {}
    for t in cm.tasks():
        counts[t["source"]] = counts.get(t["source"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def share(fallback_ms: float, tuned_ms: float, full_ms: float) -> float:
    """The part of the full tuning's speedup over the fallback that `tuned_ms` has."""
    return (fallback_ms / tuned_ms - 1) / (fallback_ms / full_ms - 1)


def _shown(path: str) -> str:
    """`path` relative to the repository when it lies inside it."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,mobilenet_v2")
    parser.add_argument("--local", default=str(ROOT / "tuning_logs/llvm_emeraldrapids.jsonl"),
                        help="records of a full tuning on this machine")
    parser.add_argument("--foreign", default=str(ROOT / "tuning_logs/llvm_core-avx2.jsonl"),
                        help="records of another machine, to retarget here")
    parser.add_argument("--time-budget", type=float, default=RETARGET_BUDGET_S,
                        help="seconds for each model's retarget run")
    parser.add_argument("--k", type=int, default=RETARGET_K)
    parser.add_argument("--rounds", type=int, default=21, help="latency rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default="retarget")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    have_local = Path(args.local).exists()
    if not have_local:
        print(f"{args.local} does not exist: the full-tuning column is skipped")
    models = example_models(batch=1)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="tecc-retarget-"))
    for name in args.models.split(","):
        model, inputs = models[name]
        print(f"== {name}", flush=True)
        records = work / f"{name}.jsonl"
        start = time.perf_counter()
        tecc.retarget(model, inputs, foreign=args.foreign, records=records, k=args.k,
                      time_budget=args.time_budget)
        retarget_s = time.perf_counter() - start
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the untuned workloads are listed below
            compiled = {"fallback": tecc.compile(model, inputs),
                        "retargeted": tecc.compile(model, inputs, records=records)}
            if have_local:
                compiled["full"] = tecc.compile(model, inputs, records=args.local)
        with torch.no_grad():
            expected = model(*inputs)
        for label, cm in compiled.items():
            error = max_rel_error(cm(*inputs), expected)
            print(f"{label}: {sources(cm)}; max rel err {error:.1e}")
        np_inputs = [x.numpy() for x in inputs]
        times = interleaved_ms({label: (lambda cm=cm, xs=np_inputs: cm(*xs))
                                for label, cm in compiled.items()}, rounds=args.rounds)
        fallback, retargeted = times["fallback"], times["retargeted"]
        full = times.get("full")
        rows.append([name, f"{fallback:.3f}", f"{full:.3f}" if full else "-",
                     f"{retargeted:.3f}", f"{retarget_s:.0f}",
                     f"{share(fallback, retargeted, full):.0%}" if full else "-",
                     sources(compiled["retargeted"])])
        print(rows[-1], flush=True)
    write_table(
        args.output, "Foreign records retargeted here: latency, CPU, batch 1 (median ms)",
        ["model", "fallback ms", "full ms", "retargeted ms", "retarget wall s",
         "share of full tuning's speedup", "retargeted configs"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads.",
         f"Foreign records: {_shown(args.foreign)}; full local records: "
         f"{_shown(args.local) if have_local else 'none (column skipped)'}; retarget budget "
         f"{args.time_budget:.0f} s, k = {args.k}.",
         "share = (fallback / retargeted - 1) / (fallback / full - 1). Medians over "
         f"{args.rounds} interleaved rounds. Command: `python benchmarks/retarget.py"
         + "".join(f" {_shown(arg)}" for arg in sys.argv[1:]) + "`."],
    )


if __name__ == "__main__":
    main()
