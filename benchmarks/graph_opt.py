"""What graph optimization buys, per model: kernel calls before and after fusion,
planned intermediate memory against one buffer per tensor, and untuned latency at
opt_level 0 and 3, with torch eager as the reference, in one run.

    python benchmarks/graph_opt.py [--models resnet18,mlp] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc  # noqa: E402
from benchmarks.common import (  # noqa: E402
    add_model_args,
    example_model_runs,
    host_line,
    interleaved_ms,
    write_table,
)
from tests.util import max_rel_error  # noqa: E402


def mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_model_args(parser, "graph_opt")
    args = parser.parse_args()
    rows = []
    for name, model, inputs in example_model_runs(args):
        with torch.no_grad():
            expected = model(*inputs)
        np_inputs = [x.numpy() for x in inputs]
        compiled, summaries, errors = {}, {}, {}
        for level in (0, 3):
            compiled[level] = tecc.compile(model, inputs, opt_level=level)
            summaries[level] = compiled[level].summary()
            errors[level] = max_rel_error(compiled[level](*inputs), expected)
        with torch.no_grad():
            times = interleaved_ms({"eager": lambda: model(*inputs),  # noqa: B023
                                    "opt0": lambda: compiled[0](*np_inputs),  # noqa: B023
                                    "opt3": lambda: compiled[3](*np_inputs)})  # noqa: B023
        eager, t0, t3 = times["eager"], times["opt0"], times["opt3"]
        (s0, e0), (s3, e3) = (summaries[0], errors[0]), (summaries[3], errors[3])
        rows.append([name, str(s0.kernel_calls), str(s3.kernel_calls),
                     mib(s0.memory["naive_bytes"]), mib(s3.memory["planned_bytes"]),
                     f"{eager:.3f}", f"{t0:.3f}", f"{t3:.3f}", f"{t0 / t3:.2f}x",
                     f"{eager / t3:.2f}x", f"{max(e0, e3):.1e}"])
        print(rows[-1], flush=True)
    write_table(
        args.output, "Graph optimization: kernels, memory and latency (CPU, batch 1)",
        ["model", "kernel calls opt0", "kernel calls opt3", "intermediates MiB naive",
         "intermediates MiB planned", "torch eager ms", "tecc opt0 ms", "tecc opt3 ms",
         "opt3 vs opt0", "opt3 vs eager", "max rel err"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads.",
         "opt0: one kernel per op, one buffer per tensor. opt3: simplify, batch-norm and "
         "constant folding, CSE, CPU layout, fusion, memory planning. Untuned schedules.",
         "Naive memory is the sum of all intermediate tensors at opt0; planned is the "
         "pool the opt3 plan allocates. Command: `python benchmarks/graph_opt.py`."],
    )


if __name__ == "__main__":
    main()
