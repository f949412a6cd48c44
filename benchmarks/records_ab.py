"""Whether a records file makes models faster on this machine: per model, tecc
untuned, a second untuned build (the same code: its spread from the first is this
run's noise floor) and the build with the records, against torch eager, all in one
set of interleaved rounds in one process.

    python benchmarks/records_ab.py --records tuning_logs/llvm_znver3.jsonl
        [--models resnet18,mobilenet_v2] [--rounds 41] [--output records_ab]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc  # noqa: E402
from benchmarks.common import (  # noqa: E402
    add_model_args,
    against_eager,
    example_model_runs,
    host_line,
    sources,
    write_table,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", required=True)
    parser.add_argument("--rounds", type=int, default=41)
    add_model_args(parser, "records_ab")
    args = parser.parse_args()
    rows = []
    for name, model, inputs in example_model_runs(args):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the untuned builds' warning
            builds = {"untuned": tecc.compile(model, inputs),
                      "untuned again": tecc.compile(model, inputs),
                      "records": tecc.compile(model, inputs, records=args.records)}
        ms, err = against_eager(model, inputs, builds, rounds=args.rounds)
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


if __name__ == "__main__":
    main()
