"""Attention's softmax on this CPU: torch against tecc's row-reduction schedule with
the exp kept (computed once per element: a row buffer under 1 KB, else stored in the
output buffer) and with it inlined into the exp-sum and the normalize (computed
twice), in one run, interleaved rounds.

    python benchmarks/softmax_cpu.py [--rounds 15]

The inlined variant is the same template with nothing kept (no row buffer is small
enough, STACK_BUFFER_BYTES = 0, and no exp is stored in the output). tecc's times are its kernels' (the executor's profile:
no input or output copies), the median of 5 calls a round; torch's the op's call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.schedules import templates_reduce  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import host_line, write_table  # noqa: E402

# (batch, heads, queries, keys): BERT-base at sequence 128, ViT-S/16, Whisper's encoder
SHAPES = [(1, 12, 128, 128), (1, 6, 197, 197), (1, 6, 1500, 1500)]


class Softmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)


class SafeSoftmax(torch.nn.Module):
    """What SDPA decomposes to under torch.export (rows of -inf give 0)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._safe_softmax.default(x, -1)


def build(module: torch.nn.Module, x: torch.Tensor, keep: bool) -> tecc.CompiledModel:
    saved = templates_reduce.STACK_BUFFER_BYTES, templates_reduce._exp_for_output
    if not keep:
        templates_reduce.STACK_BUFFER_BYTES = 0
        templates_reduce._exp_for_output = lambda sch, block: False
    try:
        return tecc.compile(module, (x,))
    finally:
        templates_reduce.STACK_BUFFER_BYTES, templates_reduce._exp_for_output = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = []
    for shape in SHAPES:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(*shape, generator=gen) * 3
        x[0, 0, 1, :] = -float("inf")  # a fully masked row
        xn = x.numpy()
        for op, module in (("softmax", Softmax()), ("_safe_softmax", SafeSoftmax())):
            with torch.no_grad():
                want = module(x).numpy()
            built = {"kept": build(module, x, True), "inlined": build(module, x, False)}
            for name, compiled in built.items():
                got = compiled(xn)
                if not np.allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True):
                    raise AssertionError(f"{op} {shape} {name}: differs from torch")
            times: dict[str, list[float]] = {"torch": [], **{k: [] for k in built}}
            # each round: 5 calls of each (the median), so that a thread pool woken
            # after another framework's is not what is measured
            for _ in range(args.rounds):
                calls = []
                for _ in range(5):
                    start = time.perf_counter()
                    with torch.no_grad():
                        module(x)
                    calls.append(time.perf_counter() - start)
                times["torch"].append(statistics.median(calls))
                for name, compiled in built.items():
                    profile = compiled._executor.profile(xn, repeat=5)
                    times[name].append(sum(t for _, t in profile))
            ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            print(f"{op} {shape}: torch {ms['torch']:.3f} ms, kept {ms['kept']:.3f}, "
                  f"inlined {ms['inlined']:.3f}", flush=True)
            rows.append([op, "x".join(map(str, shape)), f"{ms['torch']:.3f}",
                         f"{ms['kept']:.3f}", f"{ms['inlined']:.3f}",
                         f"{ms['inlined'] / ms['kept']:.2f}x", f"{ms['torch'] / ms['kept']:.2f}x"])
    write_table("softmax_cpu", "Attention softmax, CPU (median ms)",
                ["op", "shape", "torch", "tecc, exp kept", "tecc, exp inlined",
                 "kept vs inlined", "tecc vs torch"], rows,
                [host_line(), "Kept: a one-row buffer under 1 KB (128, 197 keys); rows of more "
                 "(1500 keys) store the exp in the output buffer, which the normalize "
                 "rescales in place (a row buffer would come from the workspace pool once "
                 "per row).",
                 f"Command: `python benchmarks/softmax_cpu.py --rounds {args.rounds}`"])


if __name__ == "__main__":
    main()
