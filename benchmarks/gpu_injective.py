"""Injective kernels on a CUDA GPU (fp32): the GPU injective template
(schedules/gpu_injective.py: vectorized lanes, threads per block from the grid)
against dlight's fallback schedule of the same group and against torch, CUDA-event
medians in interleaved rounds; each kernel's result is checked against torch first.
Writes results/gpu_injective.md.

    python benchmarks/gpu_injective.py [--batches 1,16] [--dry-run]

Groups: BERT-base's attention layout kernels (sequence 128, hidden 768, 12 heads:
the query's head split with its scale, the heads merged back, the mask added to the
scores) and a ResNet residual add with relu. --dry-run builds every kernel it would
time (no GPU needed) and stops.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_reduce import compare_schedules  # noqa: E402

SEQ, HIDDEN, HEADS = 128, 768, 12
HEAD = HIDDEN // HEADS


def groups(batch: int) -> list[tuple[str, Callable, list[torch.Tensor], Callable]]:
    """(name, IR function maker, inputs, torch reference)."""
    from tecc.frontend.ir import Call, Constant, Function, TensorType, Var

    gen = torch.Generator().manual_seed(batch)
    qkv = torch.randn(batch * SEQ, 3 * HIDDEN, generator=gen)
    context = torch.randn(batch * HEADS, SEQ, HEAD, generator=gen)
    scores = torch.randn(batch * HEADS, SEQ, SEQ, generator=gen)
    mask = torch.randn(batch, 1, 1, SEQ, generator=gen)
    a = torch.randn(batch, 64, 56, 56, generator=gen)
    b = torch.randn(batch, 64, 56, 56, generator=gen)

    def var(name: str, t: torch.Tensor) -> Var:
        return Var(name, TensorType(tuple(t.shape), "float32"))

    def query_heads() -> Function:
        x = var("qkv", qkv)
        q = Call("strided_slice", [x], {"begin": (0,), "end": (HIDDEN,), "strides": (1,),
                                       "axes": (1,)})
        q = Call("reshape", [q], {"newshape": (batch, SEQ, HEADS, HEAD)})
        q = Call("transpose", [q], {"axes": (0, 2, 1, 3)})
        return Function([x], Call("multiply", [q, Constant(np.float32(HEAD ** -0.5))]))

    def merge_heads() -> Function:
        x = var("context", context)
        y = Call("reshape", [x], {"newshape": (batch, HEADS, SEQ, HEAD)})
        y = Call("transpose", [y], {"axes": (0, 2, 1, 3)})
        return Function([x], Call("reshape", [y], {"newshape": (batch, SEQ, HIDDEN)}))

    def mask_add() -> Function:
        s, m = var("scores", scores), var("mask", mask)
        shaped = Call("reshape", [s], {"newshape": (batch, HEADS, SEQ, SEQ)})
        return Function([s, m], Call("add", [shaped, m]))

    def add_relu() -> Function:
        x, y = var("a", a), var("b", b)
        return Function([x, y], Call("relu", [Call("add", [x, y])]))

    return [
        ("query_heads", query_heads, [qkv],
         lambda t: t[:, :HIDDEN].reshape(batch, SEQ, HEADS, HEAD).transpose(1, 2) * HEAD ** -0.5),
        ("merge_heads", merge_heads, [context],
         lambda t: t.reshape(batch, HEADS, SEQ, HEAD).transpose(1, 2).reshape(batch, SEQ, HIDDEN)),
        ("mask_add", mask_add, [scores, mask],
         lambda s, m: s.reshape(batch, HEADS, SEQ, SEQ) + m),
        ("add_relu", add_relu, [a, b], lambda x, y: torch.relu(x + y)),
    ]


def main() -> None:
    compare_schedules(groups, "gpu_injective", "Injective kernels on the GPU (fp32, ms per call)",
                      "torch runs the same ops eagerly (views where it can, then one kernel "
                      "per op that writes)")


if __name__ == "__main__":
    main()
