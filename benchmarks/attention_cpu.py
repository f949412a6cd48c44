"""Attention on this CPU: tecc's fused nn.attention against the three kernels it
replaces (Q K^T, the softmax, P V), torch eager's SDPA and the explicit torch form
(softmax(q @ k^T * scale) @ v), in one run, interleaved rounds.

    python benchmarks/attention_cpu.py [--rounds 9] [--shapes 1x6x1500x64,...]

Both tecc builds compile the explicit form; the unfused one with the fusion pass's
key threshold out of reach (graph_opt.attention.MIN_KEYS), so its kernels are what
tecc built before the pass. tecc's times are its kernels' (the executor's profile:
no input or output copies), the median of 5 calls a round; torch's the call's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.graph_opt import attention as attention_pass  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import host_line, write_table  # noqa: E402

# (batch, heads, sequence, head size): Whisper's encoder (1500 frames), a mid-length
# encoder, BERT-base at sequence 128
SHAPES = [(1, 6, 1500, 64), (1, 8, 512, 64), (1, 12, 128, 64)]


class Explicit(torch.nn.Module):
    """Attention as a model writes it out: its matmul, softmax, matmul."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return torch.softmax(scores, -1) @ v


class Sdpa(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def build(inputs: tuple[torch.Tensor, ...], fused: bool) -> tecc.CompiledModel:
    saved = attention_pass.MIN_KEYS
    attention_pass.MIN_KEYS = 1 if fused else 1 << 62
    try:
        return tecc.compile(Explicit(), inputs)
    finally:
        attention_pass.MIN_KEYS = saved


def kernel_ops(compiled: tecc.CompiledModel) -> list[str]:
    return sorted({t["template"] for t in compiled.tasks()})


def per_call(fn: Callable[[], object], calls: int = 5) -> float:
    """The median seconds of `calls` calls of `fn`."""
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    args = parser.parse_args()
    torch.set_num_threads(2)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for shape in shapes:
        gen = torch.Generator().manual_seed(0)
        inputs = tuple(torch.randn(*shape, generator=gen) for _ in range(3))
        np_inputs = [x.numpy() for x in inputs]
        with torch.no_grad():
            want = Sdpa()(*inputs).numpy()
        built = {"fused": build(inputs, True), "unfused": build(inputs, False)}
        for name, compiled in built.items():
            got = compiled(*np_inputs)
            if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                raise AssertionError(f"{shape} tecc {name}: differs from torch")
        if "attention" not in kernel_ops(built["fused"]) or "attention" in kernel_ops(
                built["unfused"]):
            raise AssertionError(f"{shape}: the fused build must have the attention kernel, "
                                 "the unfused one not")
        torch_fns = {"sdpa": Sdpa(), "explicit": Explicit()}
        times: dict[str, list[float]] = {k: [] for k in (*built, *torch_fns)}
        for _ in range(args.rounds):
            for name, compiled in built.items():
                profile = compiled._executor.profile(*np_inputs, repeat=5)
                times[name].append(sum(t for _, t in profile))
            for name, module in torch_fns.items():
                with torch.no_grad():
                    times[name].append(per_call(lambda m=module, x=inputs: m(*x)))
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        b, h, n, d = shape
        gflop = 4 * b * h * n * n * d / 1e9
        print(f"{shape}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)
        rows.append(["x".join(map(str, shape)), f"{ms['fused']:.2f}", f"{ms['unfused']:.2f}",
                     f"{ms['sdpa']:.2f}", f"{ms['explicit']:.2f}",
                     f"{gflop / ms['fused'] * 1e3:.0f}",
                     f"{ms['unfused'] / ms['fused']:.2f}x", f"{ms['sdpa'] / ms['fused']:.2f}x",
                     f"{ms['explicit'] / ms['fused']:.2f}x"])
    write_table("attention_cpu", "Attention, CPU (median ms)",
                ["batch x heads x sequence x head", "tecc fused", "tecc unfused (3 kernels)",
                 "torch SDPA", "torch explicit", "fused GFLOP/s", "fused vs unfused",
                 "fused vs SDPA", "fused vs explicit"], rows,
                [host_line() + "; 2 threads for torch.",
                 "tecc untuned (fallback configs); its times are the kernels' sums (no "
                 "input or output copies), torch's the call's; medians over interleaved "
                 "rounds of 5 calls each. Ratios above 1: the fused kernel is faster.",
                 f"Command: `python benchmarks/attention_cpu.py --rounds {args.rounds}`"])


if __name__ == "__main__":
    main()
