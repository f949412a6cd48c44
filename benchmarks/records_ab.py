"""Whether a records file makes models faster on this machine: per model, tecc
untuned, a second untuned build (the same code: its spread from the first is this
run's noise floor) and the build with the records, against torch eager, all in one
set of interleaved rounds in one process.

With --per-workload, also one build per tuned workload with that workload's records
alone, in the same rounds, and a second table of each one's ratio to the untuned
build: which records a model gains from and which it loses by (a config faster alone
than its fallback can be slower between the model's other kernels).

    python benchmarks/records_ab.py --records tuning_logs/llvm_znver3.jsonl
        [--models resnet18,mobilenet_v2] [--rounds 41] [--per-workload] [--output records_ab]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.autotune.records import load_records  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import (  # noqa: E402
    add_model_args,
    against_eager,
    example_model_runs,
    host_line,
    sources,
    write_table,
)
from tecc.canonical import canonical_json  # noqa: E402


def records_of_each_workload(records: str, keys: list[str], folder: Path) -> list[Path]:
    """Per workload key of `keys`, a file in `folder` with the records of `records`
    of that workload only (loaded as compile loads them: broken lines skipped)."""
    loaded = load_records(records)[0]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, key in enumerate(keys):
        paths.append(folder / f"workload_{i}.jsonl")
        paths[-1].write_text("".join(canonical_json(r.to_json()) + "\n"
                                     for r in loaded if r.key == key))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", required=True)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--per-workload", action="store_true",
                        help="also time each tuned workload's records alone")
    add_model_args(parser, "records_ab")
    args = parser.parse_args()
    rows, workload_rows = [], []
    folder = Path(tempfile.mkdtemp(prefix="tecc-records-ab-"))
    for name, model, inputs in example_model_runs(args):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the untuned builds' warning
            builds = {"untuned": tecc.compile(model, inputs),
                      "untuned again": tecc.compile(model, inputs),
                      "records": tecc.compile(model, inputs, records=args.records)}
            tuned = [t for t in builds["records"].tasks() if t["source"] != "fallback"]
            alone = {}
            if args.per_workload:
                paths = records_of_each_workload(
                    args.records, [t["workload_key"] for t in tuned], folder / name)
                for task, path in zip(tuned, paths, strict=True):
                    alone[task["workload_key"]] = f"only {len(alone)}"
                    builds[alone[task["workload_key"]]] = tecc.compile(model, inputs,
                                                                       records=path)
        ms, err = against_eager(model, inputs, builds, rounds=args.rounds)
        called = [k["name"] for k in builds["records"].plan["kernels"]]
        for task in tuned if args.per_workload else []:
            ratio = ms["untuned"] / ms[alone[task["workload_key"]]]
            calls = sum(called.count(kernel) for kernel in task["kernels"])
            workload_rows.append([name, task["template"], task["workload_key"], str(calls),
                                  task["source"],
                                  f"{ms[alone[task['workload_key']]]:.3f}", f"{ratio:.3f}x"])
        rows.append([name, f"{ms['eager']:.3f}", f"{ms['untuned']:.3f}",
                     f"{ms['untuned again']:.3f}", f"{ms['records']:.3f}",
                     f"{ms['untuned'] / ms['untuned again']:.3f}x",
                     f"{ms['untuned'] / ms['records']:.3f}x", sources(builds["records"]),
                     f"{err:.1e}"])
        print(rows[-1], flush=True)
    write_table(
        args.output, "Tuning records against the untuned build, CPU, batch 1 (median ms)",
        ["model", "torch eager", "tecc untuned", "tecc untuned again", "tecc with records",
         "untuned / again (noise)", "untuned / with records", "configs with records",
         "max rel err"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads. Records: {args.records}.",
         f"Medians over {args.rounds} interleaved rounds, one process; 'untuned again' is a "
         "second build of the same code, so its ratio to the first is this run's noise. "
         "Command: `python benchmarks/records_ab.py" + "".join(f" {a}" for a in sys.argv[1:])
         + "`."])
    if workload_rows:
        write_table(
            f"{args.output}_workloads", "Each workload's records alone against the untuned "
            "build, CPU, batch 1 (median ms)",
            ["model", "template", "workload", "calls", "source", "tecc with its records",
             "untuned / with its records"],
            workload_rows,
            [f"Host: {host_line()}; {args.threads} threads. Records: {args.records}. The "
             f"same run and rounds as `{args.output}.md` (its untuned column and noise).",
             "Command: `python benchmarks/records_ab.py" + "".join(f" {a}" for a in sys.argv[1:])
             + "`."])


if __name__ == "__main__":
    main()
