"""Records of another machine, retargeted here: how much of a full local tuning's
speedup a retarget run of a few minutes recovers, for ResNet-18 and MobileNetV2.

Per model, in one run: latency with no records (the fallback configs), with the
full local records (--local; the column is skipped when the file is absent), and
with the foreign records (--foreign) retargeted here into a fresh temporary file
(the retarget run timed), and with --their-target (a target this host runs, e.g. the
foreign records' own: llvm:core-avx2) the fallback and the foreign records as they
are, compiled for that target; with --as-host the foreign records of this kind of
target relabelled with this host's target, so that compile applies them as they are
to the code it generates here; medians over interleaved rounds. "share of full tuning's
speedup" = (fallback / retargeted - 1) / (fallback / full - 1).

    python benchmarks/retarget.py [--models resnet18,mobilenet_v2]
        [--local tuning_logs/llvm_emeraldrapids.jsonl]
        [--foreign tuning_logs/llvm_core-avx2.jsonl] [--time-budget 180]
        [--their-target llvm:core-avx2] [--as-host]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tecc.autotune.records import RETARGET_BUDGET_S, RETARGET_K  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import host_line, interleaved_ms, sources, write_table  # noqa: E402
from tecc.target import resolve_target, target_to_json  # noqa: E402
from tests.models import example_models  # noqa: E402
from tests.util import max_rel_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def share(fallback_ms: float, tuned_ms: float, full_ms: float) -> float:
    """The part of the full tuning's speedup over the fallback that `tuned_ms` has."""
    return (fallback_ms / tuned_ms - 1) / (fallback_ms / full_ms - 1)


def _shown(path: str) -> str:
    """`path` relative to the repository when it lies inside it."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def relabelled_for_host(foreign: str, out: Path) -> Path:
    """The records of `foreign` (a file) whose target is an llvm one, written to `out`
    with this host's target in place of theirs."""
    host = target_to_json(resolve_target("llvm"))
    with open(foreign) as src, open(out, "w") as dst:
        for line in src:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("target", {}).get("kind") == "llvm":
                dst.write(json.dumps(dict(record, target=host)) + "\n")
    return out


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
    parser.add_argument("--their-target", default="",
                        help="also compile the fallback and the foreign records as they are "
                             "for this target (one this host runs)")
    parser.add_argument("--as-host", action="store_true",
                        help="also apply the foreign records as they are, relabelled with "
                             "this host's target")
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
    as_host = relabelled_for_host(args.foreign, work / "as_host.jsonl") if args.as_host else None
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
            if as_host:
                compiled["as host"] = tecc.compile(model, inputs, records=as_host)
            if args.their_target:
                compiled["their fallback"] = tecc.compile(model, inputs, target=args.their_target)
                compiled["their"] = tecc.compile(model, inputs, target=args.their_target,
                                                 records=args.foreign)
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
        theirs = ([f"{times['as host']:.3f}", sources(compiled["as host"])] if as_host else [])
        theirs += ([f"{times['their fallback']:.3f}", f"{times['their']:.3f}",
                   sources(compiled["their"])] if args.their_target else [])
        rows.append([name, f"{fallback:.3f}", f"{full:.3f}" if full else "-",
                     f"{retargeted:.3f}", f"{retarget_s:.0f}",
                     f"{share(fallback, retargeted, full):.0%}" if full else "-",
                     sources(compiled["retargeted"]), *theirs])
        print(rows[-1], flush=True)
    write_table(
        args.output, "Foreign records retargeted here: latency, CPU, batch 1 (median ms)",
        ["model", "fallback ms", "full ms", "retargeted ms", "retarget wall s",
         "share of full tuning's speedup", "retargeted configs",
         *(["foreign relabelled for this host ms", "their configs relabelled"]
           if as_host else []),
         *([f"fallback for {args.their_target} ms", f"foreign for {args.their_target} ms",
            f"their configs for {args.their_target}"] if args.their_target else [])],
        rows,
        [f"Host: {host_line()}; {args.threads} threads.",
         f"Foreign records: {_shown(args.foreign)}; full local records: "
         f"{_shown(args.local) if have_local else 'none (column skipped)'}; retarget budget "
         f"{args.time_budget:.0f} s, k = {args.k}.",
         *(["relabelled: the foreign records written with this host's target, applied "
            "as they are (as compile adopts records of this chip)."] if as_host else []),
         *([f"for {args.their_target}: compiled for that target, the fallback and the "
            "foreign records as they are."] if args.their_target else []),
         "share = (fallback / retargeted - 1) / (fallback / full - 1). Medians over "
         f"{args.rounds} interleaved rounds. Command: `python benchmarks/retarget.py"
         + "".join(f" {_shown(arg)}" for arg in sys.argv[1:]) + "`."],
    )


if __name__ == "__main__":
    main()
