"""What eager's NaN semantics cost: each model compiled twice in one process, with
tecc's NaN-keeping max/min (relu, relu6, clamp, maximum, max_pool2d, ...) and with
plain max/min (what LLVM gives: relu(NaN) = 0), timed in interleaved rounds.

    python benchmarks/nan_cost.py [--models resnet18,mobilenet_v2]

Writes results/nan_cost.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc.frontend.op_defs.elementwise as elementwise  # noqa: E402
import tecc.frontend.op_defs.nn as nn_ops  # noqa: E402
from tvm import te, tirx  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import host_line, interleaved_ms, write_table  # noqa: E402
from benchmarks.models_factory import mobilenet_v2, resnet18  # noqa: E402

MODELS = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2}
RECORDS = Path(__file__).resolve().parents[1] / "tuning_logs"


@contextlib.contextmanager
def plain_max_min() -> Iterator[None]:
    """Computes built inside use TVM's max and min (NaN-dropping)."""
    saved = (elementwise.nan_max, elementwise.nan_min, elementwise.nan_clamp,
             nn_ops.nan_max_reduce)
    elementwise.nan_max, elementwise.nan_min = tirx.max, tirx.min
    elementwise.nan_clamp = lambda x, lo, hi: tirx.min(tirx.max(x, lo), hi)
    nn_ops.nan_max_reduce = te.max
    try:
        yield
    finally:
        (elementwise.nan_max, elementwise.nan_min, elementwise.nan_clamp,
         nn_ops.nan_max_reduce) = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18,mobilenet_v2")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        model, inputs = MODELS[name]()
        model = model.eval()
        kept = tecc.compile(model, inputs, records=str(RECORDS))
        with plain_max_min():
            plain = tecc.compile(model, inputs, records=str(RECORDS))
        x = tuple(t.clone() for t in inputs)
        x[0].view(-1)[:7] = float("nan")
        with torch.no_grad():
            eager_nan = bool(torch.isnan(model(*x)).any())
        arrays = [t.numpy() for t in inputs]
        ms = interleaved_ms({"kept": lambda: kept(*arrays),  # noqa: B023
                             "plain": lambda: plain(*arrays)}, rounds=args.rounds)  # noqa: B023
        rows.append([name, f"{ms['plain']:.3f}", f"{ms['kept']:.3f}",
                     f"{(ms['kept'] / ms['plain'] - 1) * 100:+.1f}%",
                     f"{bool(torch.isnan(kept(*x)).any())} / {eager_nan}",
                     str(bool(torch.isnan(plain(*x)).any()))])
    write_table("nan_cost", "Eager's NaN semantics: latency with and without, CPU, batch 1",
                ["model", "plain max/min ms", "NaN-keeping ms", "cost", "NaN input -> NaN "
                 "output (tecc / eager)", "plain max/min: NaN output"], rows,
                [f"Host: {host_line()}; shipped records (tuning_logs/). Medians over "
                 f"{args.rounds} interleaved rounds. Command: `python benchmarks/nan_cost.py`."])


if __name__ == "__main__":
    main()
