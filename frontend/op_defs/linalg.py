"""Matrix products: dense (torch's linear), dense with a packed weight, and the
(batched) matmul."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from tecc.frontend.op_defs.common import ANCHOR_ATTR, arity, broadcast_shapes, out_tensor, te_shape
from tecc.frontend.ops import OPS, Pattern
from tecc.frontend.types import Attrs, IRTypeError, TensorType, Type
from tvm import te

if TYPE_CHECKING:
    from tecc.frontend.importer import ImportContext


# ---------------------------------------------------------------- nn.dense


def _dense_rel(types: list[Type], attrs: Attrs) -> Type:
    x, w = arity(types, 2)
    if w.ndim != 2 or x.shape[-1] != w.shape[1]:
        raise IRTypeError(f"dense: input {x.shape} and weight {w.shape} (N, K) do not match")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


def _dense_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, w = args
    out = out_tensor(out_type)
    k = te.reduce_axis((0, te_shape(w)[1]), name="k")
    return te.compute(out.shape, lambda *i: te.sum(x[i[:-1] + (k,)] * w[i[-1], k], axis=k),
                      name="dense", attrs={ANCHOR_ATTR: "dense"})


OPS.register("nn.dense", _dense_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
             compute=_dense_compute, evaluate=lambda args, attrs, ty: np.matmul(args[0], args[1].T),
             doc="x @ w.T with w of shape (N, K), as torch's linear")


# ---------------------------------------------------------------- nn.dense_pack


def _dense_pack_units(w_shape: Sequence[int], attrs: Attrs) -> int:
    """N, the output features: "units" when the packed weight has zero rows padding N
    to whole blocks, else N/nb * nb."""
    return int(attrs["units"]) or int(w_shape[0]) * int(w_shape[2])


def _dense_pack_rel(types: list[Type], attrs: Attrs) -> Type:
    x, w = arity(types, 2)
    if w.ndim != 3 or x.shape[-1] != w.shape[1]:
        raise IRTypeError(f"dense_pack: input {x.shape} and packed weight {w.shape} "
                          "(N/nb, K, nb) do not match")
    units = _dense_pack_units(w.shape, attrs)
    if not (w.shape[0] - 1) * w.shape[2] < units <= w.shape[0] * w.shape[2]:
        raise IRTypeError(f"dense_pack: {units} units do not fill the packed weight "
                          f"{w.shape}'s last block")
    return TensorType(x.shape[:-1] + (units,), x.dtype)


def _dense_pack_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """x[..., K] x w[N/nb, K, nb] (packed at compile time) -> [..., N]. A weight padded
    to whole blocks is multiplied whole (the anchor's columns are whole tiles) and the
    result sliced to N."""
    x, w = args
    out = out_tensor(out_type)
    nc, kdim, nb = te_shape(w)
    k = te.reduce_axis((0, kdim), name="k")
    full = te.compute(
        (*out.shape[:-1], nc * nb),
        lambda *i: te.sum(x[i[:-1] + (k,)] * w[i[-1] // nb, k, i[-1] % nb], axis=k),
        name="dense_pack", attrs={ANCHOR_ATTR: "dense_pack"})
    if nc * nb == out.shape[-1]:
        return full
    return te.compute(out.shape, lambda *i: full[i], name="dense_pack_slice")


def _dense_pack_evaluate(args, attrs, ty):
    x, wp = args
    nc, k, nb = wp.shape
    full = np.matmul(x, wp.transpose(0, 2, 1).reshape(nc * nb, k).T)
    return full[..., :_dense_pack_units(wp.shape, attrs)]


OPS.register("nn.dense_pack", _dense_pack_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
             attrs={"units": 0},
             compute=_dense_pack_compute, evaluate=_dense_pack_evaluate,
             doc="dense with its weight packed at compile time: w[N/nb, K, nb], N rounded "
                 "up to whole blocks with zero rows when attribute units (N) is given")


# ---------------------------------------------------------------- nn.matmul


def _matmul_rel(types: list[Type], attrs: Attrs) -> Type:
    a, b = arity(types, 2)
    if a.ndim < 2 or b.ndim < 2:
        raise IRTypeError(f"matmul needs rank >= 2, got {a.shape} and {b.shape}")
    m, k = (a.shape[-1], a.shape[-2]) if attrs["transpose_a"] else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if attrs["transpose_b"] else b.shape[-2:]
    if k != k2:
        raise IRTypeError(f"matmul: inner dimensions differ ({a.shape} @ {b.shape})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (m, n), a.dtype)


def _matmul_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    a, b = args
    out = out_tensor(out_type)
    ta, tb = attrs["transpose_a"], attrs["transpose_b"]
    kdim = te_shape(a)[-2] if ta else te_shape(a)[-1]
    k = te.reduce_axis((0, kdim), name="k")
    nb = len(out.shape) - 2

    def batch_idx(t: te.Tensor, bidx: Sequence) -> list:
        tb_shape = te_shape(t)[:-2]
        lead = nb - len(tb_shape)
        return [0 if d == 1 else bidx[lead + i] for i, d in enumerate(tb_shape)]

    def body(*i):
        bidx, m, n = i[:nb], i[nb], i[nb + 1]
        ai = batch_idx(a, bidx) + ([k, m] if ta else [m, k])
        bi = batch_idx(b, bidx) + ([n, k] if tb else [k, n])
        return te.sum(a[tuple(ai)] * b[tuple(bi)], axis=k)

    kind = "batch_matmul" if nb else "matmul"
    return te.compute(out.shape, body, name="matmul",
                      attrs={ANCHOR_ATTR: kind + "_nt" if tb else kind})


def _matmul_evaluate(args, attrs, ty):
    a, b = args
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


OPS.register("nn.matmul", _matmul_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
             attrs={"transpose_a": False, "transpose_b": False},
             compute=_matmul_compute, evaluate=_matmul_evaluate,
             doc="(batched) matrix product with numpy broadcasting of the batch dimensions")


# aten.linear and aten.matmul are left to torch's decompositions: they flatten the
# leading dimensions into the 2-D mm / addmm (and bmm) the dense and matmul templates
# are written for.
@OPS.converter("aten.addmm.default")
def _convert_addmm(ctx: ImportContext, node, args, kwargs):
    bias, a, b = args[:3]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    product = ctx.call("nn.matmul", a, b)
    if alpha != 1:
        product = ctx.call("multiply", product, ctx.const(alpha, product.dtype))
    bias = ctx.expr(bias, like=product)
    if beta != 1:
        bias = ctx.call("multiply", bias, ctx.const(beta, product.dtype))
    return ctx.call("add", product, bias)


@OPS.converter("aten.mm.default", "aten.bmm.default")
def _convert_mm(ctx: ImportContext, node, args, kwargs):
    return ctx.call("nn.matmul", args[0], args[1])
