"""fuse_attention: attention's matmul, softmax, matmul as one nn.attention op on a CPU.

The importer gives scaled dot-product attention (torch's SDPA decomposition, or the
explicit form a model writes) as

    S = nn.matmul(Q, K^T)            [..., M, N] (or nn.matmul(Q, K, transpose_b))
    S = reshape / multiply or divide by scalars (the scale; SDPA scales Q and K by
        its root)
    S = add(S, mask)                 optional additive mask
    P = nn.softmax(S) | nn.safe_softmax(S)   over the last axis
    O = nn.matmul(reshape(P), V)

with reshapes between them where batch and heads are merged, and scalar multiplies
on Q and K (through reshapes). This pass rewrites it into
`nn.attention(q, k, v[, mask], scale=..., k_transposed=..., safe_softmax=...)` whose
CPU template (schedules/templates_attention.py) keeps a block of query rows' scores
in L2 instead of writing the [M, N] scores, reading them in the softmax and again in
P V. The scores and probabilities must have no other use (an attention-weights
output keeps the unfused form).

Where (PassContext's target; without one the IR stays as it is), float32:
- CPU (llvm): at least MIN_KEYS keys, and a value size Dv of whole vectors (or a
  divisor of one);
- CUDA: where the GPU template (schedules/gpu_attention.py) keeps a block's logits and
  probabilities in shared memory: at most MAX_GPU_KEYS keys, query rows in blocks of
  GPU_ROW_BLOCK, Dv in whole GPU_COLUMN_BLOCKs (see gpu_fits).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from tecc.frontend.ir import Call, Constant, Expr, Function, rewrite
from tecc.frontend.ops import normalize_axis
from tecc.graph_opt.pass_manager import PassContext, register_pass
from tecc.graph_opt.patterns import is_op, reshaped, scalar_value, use_counts

# Fewest keys where the fused kernel replaces the three. Measured on 2 AVX-512 cores
# (benchmarks/attention_cpu.py, untuned, kernels' sums): fused against unfused 0.019
# against 0.032 ms at 4 heads x 32 x 32, 0.096 / 0.191 at 12 x 64 x 64, 0.36 / 0.55
# at BERT's 12 x 128 x 64, 0.96 / 1.37 at ViT's 12 x 197 x 64, 20 / 35 at Whisper's
# 6 x 1500 x 64: it pays from 32 keys on; shorter sequences were not measured.
MIN_KEYS = 32
# The GPU template's limits: its smallest block (8 query rows) holds the logits and
# probabilities of every key in shared memory (2 x 8 x 512 floats: 32 KB of the 48 KB
# a block may have), and splits M and Dv into whole thread tiles.
MAX_GPU_KEYS = 512
GPU_ROW_BLOCK = 8
GPU_COLUMN_BLOCK = 8


@dataclass
class AttentionMatch:
    """The parts of one attention chain: the new graph's q, k, v and mask, and what
    the op computes with them."""

    q: Expr
    k: Expr
    v: Expr
    mask: Expr | None
    scale: float
    k_transposed: bool
    safe_softmax: bool
    scores_shape: tuple[int, ...]  # the softmax's input: [batch..., M, N]


def _finite_scalar(expr: Expr) -> float | None:
    value = scalar_value(expr)
    if value is None or isinstance(value, bool) or not np.isfinite(value):
        return None
    return float(value)


def _scalar_factor(call: Call) -> tuple[int, float] | None:
    """(index of the tensor operand, the factor) of a multiply by a scalar constant,
    or of a division by one (S / sqrt(d), as MobileViT and SegFormer write it)."""
    sides = (0,) if call.op == "divide" else (0, 1)
    for i in sides:
        value = _finite_scalar(call.args[1 - i])
        if value is not None and call.args[i].shape == call.shape:
            if call.op != "divide":
                return i, value
            return (0, 1.0 / value) if value != 0 else None
    return None


def _peel_scale(new: Expr) -> tuple[Expr, float]:
    """Q or K without the scalar multiplies (through reshapes) on it: (the tensor the
    multiplies read, their product); the operand itself where there are none."""
    scale, node = 1.0, new
    while isinstance(node, Call) and is_op(node, "reshape", "multiply", "divide"):
        if node.op != "reshape":
            factor = _scalar_factor(node)
            if factor is None:
                break
            scale *= factor[1]
            node = node.args[factor[0]]
        else:
            node = node.args[0]
    return (node, scale) if scale != 1.0 else (new, 1.0)


def match_attention(old: Call, new: Call, uses: Counter[int]) -> AttentionMatch | None:
    """The attention chain ending in the P V matmul `old` (`new`: the same call in the
    graph being rebuilt, whose operands are the rewritten ones), or None. The chain's
    inner nodes are walked in both graphs in step: single use is judged on the old."""
    if not is_op(old, "nn.matmul") or old.attrs["transpose_a"] or old.attrs["transpose_b"]:
        return None
    v = new.args[1]
    p_old, p_new = old.args[0], new.args[0]
    while is_op(p_old, "reshape") and uses[id(p_old)] == 1:
        p_old, p_new = p_old.args[0], p_new.args[0]
    if not is_op(p_old, "nn.softmax", "nn.safe_softmax") or uses[id(p_old)] != 1:
        return None
    scores_shape = p_old.args[0].shape
    if normalize_axis(p_old.attrs["axis"], len(scores_shape)) != len(scores_shape) - 1:
        return None
    s_old, s_new = p_old.args[0], p_new.args[0]
    scale, mask = 1.0, None
    # scales between the mask add and the softmax, (S + mask) * c: they scale the mask
    # too, S * c + mask * c
    mask_scale = 1.0
    while uses[id(s_old)] == 1 and not is_op(s_old, "nn.matmul"):
        if is_op(s_old, "reshape") and s_old.shape[-2:] == s_old.args[0].shape[-2:]:
            pass
        elif is_op(s_old, "multiply", "divide") and (factor := _scalar_factor(s_old)) is not None:
            scale *= factor[1]
            if mask is None:
                mask_scale *= factor[1]
            s_old, s_new = s_old.args[factor[0]], s_new.args[factor[0]]
            continue
        elif is_op(s_old, "add") and mask is None and s_old.shape == scores_shape:
            side = next((i for i in (0, 1) if s_old.args[i].shape == scores_shape
                         and s_old.args[1 - i].dtype == s_old.dtype
                         and scalar_value(s_old.args[1 - i]) is None), None)
            if side is None:
                return None
            mask = s_new.args[1 - side]
            s_old, s_new = s_old.args[side], s_new.args[side]
            continue
        else:
            return None
        s_old, s_new = s_old.args[0], s_new.args[0]
    if not is_op(s_old, "nn.matmul") or uses[id(s_old)] != 1 or s_old.attrs["transpose_a"]:
        return None
    q_old, k_old = s_old.args
    if q_old.shape[:-2] != k_old.shape[:-2] or p_old.shape[:-2] != scores_shape[:-2] \
            or old.args[0].shape[:-2] != old.args[1].shape[:-2]:
        return None  # a batch broadcast (nn.matmul's) the op does not do
    if mask is not None and mask_scale != 1.0:
        mask = Call("multiply", (mask, Constant(np.array(mask_scale, mask.dtype))))
    q, q_scale = _peel_scale(s_new.args[0])
    k, k_scale = _peel_scale(s_new.args[1])
    return AttentionMatch(q, k, v, mask, scale * q_scale * k_scale,
                          not s_old.attrs["transpose_b"], p_old.op == "nn.safe_softmax",
                          tuple(scores_shape))


def attention_call(match: AttentionMatch, out: Call) -> Expr:
    """nn.attention over the scores' batch shape, reshaped to the P V matmul's `out`."""
    *batch, m, n = match.scores_shape
    d, dv = match.q.shape[-1], match.v.shape[-1]
    span = out.span
    q = reshaped(match.q, (*batch, m, d), span)
    k = reshaped(match.k, (*batch, d, n) if match.k_transposed else (*batch, n, d), span)
    v = reshaped(match.v, (*batch, n, dv), span)
    args = (q, k, v) if match.mask is None else (q, k, v, match.mask)
    attrs = {"scale": match.scale, "k_transposed": match.k_transposed,
             "safe_softmax": match.safe_softmax}
    return reshaped(Call("nn.attention", args, attrs, span=span), tuple(out.shape), span)


def _sizes_fit(match: AttentionMatch) -> bool:
    """The peeled Q and K still hold [batch..., M, D] and [batch..., N, D] elements."""
    *batch, m, n = match.scores_shape
    rows = int(np.prod(batch, dtype=np.int64))
    d = match.q.shape[-1]
    return (match.q.tensor_type.size == rows * m * d and match.k.tensor_type.size == rows * n * d
            and match.v.tensor_type.size == rows * n * match.v.shape[-1]
            and match.q.shape[-1] == (match.k.shape[-2] if match.k_transposed
                                      else match.k.shape[-1]))


def gpu_fits(match: AttentionMatch) -> bool:
    """Whether the GPU template takes the attention (module docstring)."""
    *_, m, n = match.scores_shape
    dv = match.v.shape[-1]
    return (n <= MAX_GPU_KEYS and m % GPU_ROW_BLOCK == 0 and dv % GPU_COLUMN_BLOCK == 0
            and match.q.shape[-1] % 4 == 0)


@register_pass("fuse_attention", opt_level=3)
def fuse_attention(func: Function) -> Function:
    """`func` with its attention chains as nn.attention where the target's template
    takes them (see the module docstring); no target leaves it as it is."""
    info = PassContext.current().target
    if info is None or not (info.is_cpu or info.is_gpu):
        return func
    uses = use_counts(func)
    lanes = info.vector_lanes("float32") if info.is_cpu else 0

    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        if not is_op(node, "nn.matmul") or node.dtype != "float32":
            return None
        assert isinstance(node, Call)
        new = Call(node.op, kids, node.attrs, node.span) if kids != node.args else node
        match = match_attention(node, new, uses)
        if match is None or not _sizes_fit(match):
            return None
        if info.is_gpu:
            return attention_call(match, node) if gpu_fits(match) else None
        if match.scores_shape[-1] < MIN_KEYS:
            return None
        dv = match.v.shape[-1]
        if dv % lanes and lanes % dv:
            # P V's tile runs along Dv in whole vectors: MobileViT's Dv = 36 on 16 lanes
            # took 4.8 ms fused against 1.7 unfused (Dv = 32: 1.0 against 1.4)
            return None
        return attention_call(match, node)

    return rewrite(func, visit)
