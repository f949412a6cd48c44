"""Odd shapes against even ones on this CPU: tecc untuned (each template's fallback
config) and torch eager on extents that are prime or have few divisors (197, 77, 50,
1000) next to even neighbours, in one run, timed in interleaved rounds.

    python benchmarks/odd_shapes.py [--rounds 15] [--only dense_197,bmm]

Writes results/odd_shapes.md: median milliseconds and GFLOP/s per shape, and the
197 / 196 dense ratio (the goal: within 10%).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc  # noqa: E402
from benchmarks.common import host_line, interleaved_ms, write_table  # noqa: E402


@dataclass
class Case:
    name: str
    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    flops: int


class BatchMatmul(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.matmul(q, k)


def dense(m: int, k: int, n: int) -> Case:
    """x[m, k] @ w[n, k].T + bias, as torch's linear."""
    return Case(f"dense_{m}x{k}x{n}", torch.nn.Linear(k, n), (torch.randn(m, k),),
                2 * m * k * n)


def attention_scores(heads: int, seq: int, dim: int) -> Case:
    """q[heads, seq, dim] @ k[heads, dim, seq]: a ViT-B/16 layer's attention scores."""
    return Case(f"bmm_{heads}x{seq}x{dim}x{seq}", BatchMatmul(),
                (torch.randn(heads, seq, dim), torch.randn(heads, dim, seq)),
                2 * heads * seq * dim * seq)


def patch_embedding(size: int = 224, patch: int = 16, dim: int = 768) -> Case:
    """ViT-B/16's patch embedding: a 16x16 stride-16 conv, 3 -> 768 channels, 14x14."""
    out = size // patch
    return Case(f"conv_patch{patch}_{size}_{dim}",
                torch.nn.Conv2d(3, dim, patch, stride=patch),
                (torch.randn(1, 3, size, size),), 2 * dim * out * out * 3 * patch * patch)


CASES: list[Callable[[], Case]] = [
    lambda: dense(196, 768, 3072), lambda: dense(197, 768, 3072),
    lambda: dense(80, 768, 768), lambda: dense(77, 768, 768),
    lambda: dense(48, 768, 1024), lambda: dense(50, 768, 1000),
    lambda: attention_scores(12, 192, 64), lambda: attention_scores(12, 197, 64),
    lambda: patch_embedding(),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.25, help="per function per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated name prefixes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = [make() for make in CASES]
    cases = [c for c in cases if not args.only or any(
        c.name.startswith(p) for p in args.only.split(","))]
    fns: dict[str, Callable[[], object]] = {}
    configs: dict[str, str] = {}
    for case in cases:
        model = case.model.eval()
        compiled = tecc.compile(model, case.inputs)
        with torch.no_grad():
            expected = model(*case.inputs).numpy()
        got = np.asarray(compiled(*case.inputs))
        error = float(np.abs(got - expected).max() / np.abs(expected).max())
        if error > 1e-4:
            raise RuntimeError(f"{case.name}: tecc differs from eager (rel. error {error:.1e})")
        anchors = [t for t in compiled.tasks() if t["template"] != "injective"]
        configs[case.name] = ", ".join(f"{k}={v}" for t in anchors
                                       for k, v in t["config"].items())
        fns[f"tecc {case.name}"] = lambda c=compiled, i=case.inputs: c(*i)
        fns[f"torch {case.name}"] = lambda m=model, i=case.inputs: m(*i)
    with torch.no_grad():
        ms = interleaved_ms(fns, rounds=args.rounds, seconds_per_round=args.seconds)
    rows, gflops = [], {}
    for case in cases:
        t_ms, e_ms = ms[f"tecc {case.name}"], ms[f"torch {case.name}"]
        gflops[case.name] = case.flops / t_ms / 1e6
        rows.append([case.name, f"{t_ms:.3f}", f"{gflops[case.name]:.1f}", f"{e_ms:.3f}",
                     f"{case.flops / e_ms / 1e6:.1f}", f"{e_ms / t_ms:.2f}",
                     configs[case.name]])
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    notes = [f"Host: {host_line()}; {args.threads} threads; torch {torch.__version__}; "
             f"load average after the run {load} (a shared machine).",
             f"tecc untuned (the fallback configs), whole compiled model per call (input "
             f"conversion included), against torch eager: medians over {args.rounds} "
             f"interleaved rounds of {args.seconds} s each.",
             "Command: `python benchmarks/odd_shapes.py`."]
    pairs = [("dense_197x768x3072", "dense_196x768x3072"),
             ("dense_77x768x768", "dense_80x768x768"),
             ("dense_50x768x1000", "dense_48x768x1024"),
             ("bmm_12x197x64x197", "bmm_12x192x64x192")]
    for odd, even in pairs:
        if odd in gflops and even in gflops:
            notes.append(f"{odd} / {even}: {gflops[odd] / gflops[even]:.2f} of the GFLOP/s.")
    write_table("odd_shapes", "Odd shapes, CPU: tecc untuned against torch eager",
                ["shape", "tecc ms", "tecc GFLOP/s", "torch ms", "torch GFLOP/s",
                 "tecc speedup", "tecc config"], rows, notes)


if __name__ == "__main__":
    main()
