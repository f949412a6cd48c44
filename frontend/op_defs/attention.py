"""Fused attention: softmax(Q K^T * scale [+ mask]) V per batch (and head) in one op.

No ATen converter makes it: the importer gives the matmul, softmax, matmul chain
torch exports, and the graph pass `fuse_attention` (graph_opt/attention.py) rewrites
that chain into this op where a CPU target's template (schedules/templates_attention.py)
beats the three kernels. Semantics are eager's: a NaN in a row's scores makes the
row NaN, a NaN in V its column; a row whose scores are all -inf gives NaN as
`nn.softmax` does, or 0 with `safe_softmax` as `nn.safe_softmax` does (torch's
_safe_softmax, which SDPA with a mask exports).
"""

from __future__ import annotations

import numpy as np
import tvm
from tecc.frontend.op_defs.common import (
    ANCHOR_ATTR,
    KEEP_ATTR,
    broadcast_shapes,
    exp_of,
    is_float_dtype,
    read_broadcast,
    te_shape,
    tensor_arg,
)
from tecc.frontend.ops import OPS, Pattern
from tecc.frontend.types import Attrs, IRTypeError, TensorType, Type
from tvm import te
from tvm.tirx import const

# Keys are padded to a multiple of this in the kernel (zero keys, -inf scores, so the
# padded probabilities are exactly 0): the score tile is then whole vectors (two
# AVX-512 vectors, four AVX2 ones) and the row max and exp-sum exact vector splits.
KEY_BLOCK = 32


# Query rows are padded to a multiple of this (copies of the last row, their results
# dropped): a prime count (ViT's 197 tokens) still splits into blocks and register
# tiles of several rows.
ROW_BLOCK = 4


def padded_keys(n: int) -> int:
    """The key count the kernel computes scores for: `n` up to whole KEY_BLOCKs."""
    return -(-n // KEY_BLOCK) * KEY_BLOCK


def padded_rows(m: int) -> int:
    """The query rows the kernel computes: `m` up to whole ROW_BLOCKs."""
    return -(-m // ROW_BLOCK) * ROW_BLOCK


def attention_dims(types: list[Type], attrs: Attrs) -> tuple[tuple[int, ...], int, int, int, int]:
    """(batch shape, M queries, N keys, D head size, Dv value size) of a call's argument
    types; raises IRTypeError where they do not fit together."""
    if len(types) not in (3, 4):
        raise IRTypeError(f"nn.attention takes q, k, v and an optional mask, got {len(types)}")
    q, k, v = (tensor_arg(t) for t in types[:3])
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise IRTypeError(f"nn.attention: q {q.shape}, k {k.shape}, v {v.shape} need one rank >= 2")
    batch, (m, d) = q.shape[:-2], q.shape[-2:]
    n, kd = (k.shape[-1], k.shape[-2]) if attrs["k_transposed"] else k.shape[-2:]
    if k.shape[:-2] != batch or v.shape[:-2] != batch or kd != d or v.shape[-2] != n:
        raise IRTypeError(f"nn.attention: q {q.shape}, k {k.shape} (transposed: "
                          f"{attrs['k_transposed']}), v {v.shape} do not match")
    if len({q.dtype, k.dtype, v.dtype}) != 1 or not is_float_dtype(q.dtype):
        raise IRTypeError(f"nn.attention needs one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if len(types) == 4:
        mask = tensor_arg(types[3], "mask")
        scores = (*batch, m, n)
        if mask.dtype != q.dtype or mask.ndim > len(scores) or broadcast_shapes(
                mask.shape, scores) != scores:
            raise IRTypeError(f"nn.attention: mask {mask.shape} {mask.dtype} does not "
                              f"broadcast to the scores {scores} {q.dtype}")
    return batch, m, n, d, v.shape[-1]


def _attention_rel(types: list[Type], attrs: Attrs) -> Type:
    batch, m, _, _, dv = attention_dims(types, attrs)
    return TensorType((*batch, m, dv), types[0].dtype)


def _attention_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """Blocks, in order (the template places them; schedules/templates_attention.py):
    attention_queries Q with M padded to whole ROW_BLOCKs, where it is not (inlined)
    attention_keys   K^T with N padded to whole KEY_BLOCKs by zero keys (kept)
    attention_scores Q K^T over the padded keys
    attention_logits scores * scale + mask, -inf on the padded keys (kept)
    softmax_max, the exp (kept, blocks.shared_exp), softmax_expsum over the padded keys
    attention        sum over the N keys of exp * V (the anchor)
    attention_out    times the row's reciprocal exp-sum (0 for a row all -inf when safe)
                     (kept), and the M rows of it (where M was padded)
    """
    q, k, v = args[:3]
    mask = args[3] if len(args) == 4 else None
    *batch, m, d = te_shape(q)
    n, dv = te_shape(v)[-2:]
    nb, npad, mpad, dtype = len(batch), padded_keys(n), padded_rows(m), q.dtype
    if mpad != m:  # the padded rows repeat the last one: finite, and never read back
        q0 = q
        q = te.compute((*batch, mpad, d), lambda *i: q0[(*i[:nb], tvm.tirx.min(i[nb], m - 1),
                                                         i[-1])],
                       name="attention_queries")
    zero, minus_inf = const(0, dtype), const(-np.inf, dtype)
    transposed = attrs["k_transposed"]

    def key(*i):  # [*batch, d, j]
        b, dd, j = tuple(i[:nb]), i[nb], i[nb + 1]
        value = k[(*b, dd, j)] if transposed else k[(*b, j, dd)]
        return tvm.tirx.if_then_else(j < n, value, zero) if npad != n else value

    keys = te.compute((*batch, d, npad), key, name="attention_keys", attrs={KEEP_ATTR: 1})
    rd = te.reduce_axis((0, d), name="rd")
    scores = te.compute(
        (*batch, mpad, npad),
        lambda *i: te.sum(q[(*i[:nb], i[nb], rd)] * keys[(*i[:nb], rd, i[nb + 1])], axis=rd),
        name="attention_scores")
    scale = float(attrs["scale"])
    score_shape = (*batch, m, n)

    def logit(*i):
        s = scores[i]
        if scale != 1.0:
            s = s * const(scale, dtype)
        if mask is not None:
            row = tvm.tirx.min(i[nb], m - 1) if mpad != m else i[nb]
            s = s + read_broadcast(mask, (*i[:nb], row, i[-1]), score_shape)
        # if_then_else: the mask is not read past its row (the padded keys' tail is
        # partitioned off by the template, the full vectors have no test)
        return tvm.tirx.if_then_else(i[-1] < n, s, minus_inf) if npad != n else s

    logits = te.compute((*batch, mpad, npad), logit, name="attention_logits",
                        attrs={KEEP_ATTR: 1})
    k1 = te.reduce_axis((0, npad), name="k1")
    k2 = te.reduce_axis((0, npad), name="k2")
    mx = te.compute((*batch, mpad), lambda *i: te.max(logits[(*i, k1)], axis=k1),
                    name="softmax_max")
    # logits - max <= 0 (or -inf, or NaN): fast_exp never overflows
    e = exp_of(te.compute(logits.shape, lambda *i: logits[i] - mx[i[:-1]],
                          name="softmax_shifted"))
    es = te.compute((*batch, mpad), lambda *i: te.sum(e[(*i, k2)], axis=k2), name="softmax_expsum")
    rj = te.reduce_axis((0, n), name="rj")
    acc = te.compute((*batch, mpad, dv),
                     lambda *i: te.sum(e[(*i[:-1], rj)] * v[(*i[:nb], rj, i[-1])], axis=rj),
                     name="attention", attrs={ANCHOR_ATTR: "attention"})
    one = const(1, dtype)
    if attrs["safe_softmax"]:
        # a row all -inf, and only it, has an exp-sum of 0 (see nn.safe_softmax): its
        # probabilities are 0 and P V is its sum of 0 * V (0, NaN where V holds one,
        # as the unfused matmul gives); if_then_else: one test per row in a
        # vectorized store
        def normalized(*i):
            return acc[i] * tvm.tirx.if_then_else(es[i[:-1]] == zero, one, one / es[i[:-1]])
    else:
        def normalized(*i):
            return acc[i] * (one / es[i[:-1]])
    out = te.compute(acc.shape, normalized, name="attention_out", attrs={KEEP_ATTR: 1})
    if mpad == m:
        return out
    return te.compute((*batch, m, dv), lambda *i: out[i], name="attention_rows")


def _attention_evaluate(args: list[np.ndarray], attrs: Attrs, out_type: Type) -> np.ndarray:
    q, k, v = (a.astype(np.float64) for a in args[:3])
    kt = k if attrs["k_transposed"] else np.swapaxes(k, -1, -2)
    s = np.matmul(q, kt) * attrs["scale"]
    if len(args) == 4:
        s = s + args[3].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))  # a row all -inf: NaN, as softmax
        p = e / e.sum(axis=-1, keepdims=True)
    if attrs["safe_softmax"]:
        p = np.where(np.all(s == -np.inf, axis=-1, keepdims=True), 0.0, p)
    return np.matmul(p, v).astype(args[0].dtype)


OPS.register("nn.attention", _attention_rel, Pattern.OPAQUE, None,
             attrs={"scale": 1.0, "k_transposed": False, "safe_softmax": False},
             compute=_attention_compute, evaluate=_attention_evaluate,
             doc="softmax(q @ k^T * scale [+ mask]) @ v over the last two axes: q [..., M, D], "
                 "k [..., N, D] ([..., D, N] when k_transposed), v [..., N, Dv], an additive "
                 "mask broadcasting to [..., M, N]; safe_softmax: a row all -inf gives 0 "
                 "(torch's _safe_softmax), else NaN (softmax)")
