"""Reductions over axes: sum, mean, max, min, prod and variance."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tecc.frontend.op_defs.common import (
    ANCHOR_ATTR,
    arity,
    bcast_index,
    is_float_dtype,
    out_tensor,
    te_shape,
    unless_nan,
)
from tecc.frontend.ops import OPS, Converter, Pattern, reduce_axes
from tecc.frontend.types import Attrs, TensorType, Type
from tvm import te
from tvm.tirx import const

if TYPE_CHECKING:
    from tecc.frontend.importer import ImportContext


def _reduce_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    axes = reduce_axes(attrs, x.ndim)
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return TensorType(shape, x.dtype)


def reduce_compute(x: te.Tensor, axes: tuple[int, ...], keepdims: bool,
                   combine: Callable, name: str, anchor: str | None = None) -> te.Tensor:
    """out[kept...] = combine(x[...], axis=reduce_axes). Spatial axes keep their
    order, which keeps the reduce axes innermost in the generated loop nest."""
    shape = te_shape(x)
    rvars = {a: te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes}
    out_shape = [1 if i in axes else d for i, d in enumerate(shape)] if keepdims else [
        d for i, d in enumerate(shape) if i not in axes]

    def body(*idx):
        it = iter(idx)
        full = []
        for i in range(len(shape)):
            if i in axes:
                full.append(rvars[i])
                if keepdims:
                    next(it)
            else:
                full.append(next(it))
        return combine(x[tuple(full)], axis=list(rvars.values()))

    return te.compute(tuple(out_shape), body, name=name,
                      attrs={ANCHOR_ATTR: anchor} if anchor else None)


def _count(x: te.Tensor, axes: Sequence[int]) -> int:
    return int(math.prod(te_shape(x)[a] for a in axes))


def _identity(x: te.Tensor, out_type: Type, name: str) -> te.Tensor:
    # nothing to reduce: torch returns the input
    return te.compute(out_tensor(out_type).shape, lambda *i: x[i], name=name)


def _combine_compute(name: str, combine: Callable) -> Callable:
    def compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        (x,) = args
        axes = reduce_axes(attrs, x.ndim)
        if not axes:
            return _identity(x, out_type, name)
        return reduce_compute(x, axes, attrs["keepdims"], combine, name, anchor="reduce")

    return compute


def _nan_keeping_compute(name: str, larger: bool) -> Callable:
    """amax (`larger`) / amin with torch's semantics as two reductions every schedule
    knows: the plain max (or min), whose identity is the lowest (highest) finite
    float, and a sum that counts the elements other than -inf (+inf) and is NaN where
    the row holds a NaN. The result is the plain one where the count is positive,
    -inf (+inf) where it is 0 (a row of -inf, where the plain max would give its
    identity), NaN where it is NaN. A NaN-keeping combiner (common.nan_max_reduce) is
    unknown to rfactor and to TVM's cross-thread reductions: its reductions ran scalar
    on the CPU and took dlight's rules on CUDA."""
    def compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        (x,) = args
        axes = reduce_axes(attrs, x.ndim)
        if not axes:
            return _identity(x, out_type, name)
        keep = attrs["keepdims"]
        plain = te.max if larger else te.min
        if not is_float_dtype(x.dtype):
            return reduce_compute(x, axes, keep, plain, name, anchor="reduce")
        best = reduce_compute(x, axes, keep, plain, f"{name}_plain", anchor="reduce")
        zero, one = const(0, x.dtype), const(1, x.dtype)
        bound = const(-np.inf if larger else np.inf, x.dtype)

        def counted(*i: Any) -> Any:
            v = x[i]
            # 1 past the bound, 0 at it, the NaN itself (summed into the count)
            return tvm.tirx.Select(v > bound if larger else v < bound, one,
                                   unless_nan(v, zero))

        count = reduce_compute(te.compute(x.shape, counted, name=f"{name}_counted"), axes,
                               keep, te.sum, f"{name}_count")
        return te.compute(best.shape, lambda *i: tvm.tirx.Select(
            count[i] > zero, best[i], tvm.tirx.Select(count[i] == zero, bound, count[i])),
            name=name)

    return compute


def _mean_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    axes = reduce_axes(attrs, x.ndim)
    if not axes:
        return _identity(x, out_type, "mean")
    s = reduce_compute(x, axes, attrs["keepdims"], te.sum, "mean_sum", anchor="reduce")
    n = const(float(_count(x, axes)), x.dtype)
    return te.compute(s.shape, lambda *i: s[i] / n, name="mean")


def _numpy_reduction(name: str, fn: Callable[..., np.ndarray]) -> Callable:
    def evaluate(args, attrs, ty):
        (x,) = args
        axes = reduce_axes(attrs, x.ndim)
        if not axes:  # nothing to reduce: the input, as torch and the kernel do
            return x
        if np.issubdtype(x.dtype, np.floating) and name in ("sum", "mean", "prod"):
            x = x.astype(np.float64)  # accumulate precisely, round once at the end
        return fn(x, axis=axes, keepdims=attrs["keepdims"])

    return evaluate


def _reduction_converter(op: str) -> Converter:
    def convert(ctx: ImportContext, node, args, kwargs):
        x = args[0]
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if isinstance(dims, int):
            dims = [dims]
        axis = None if dims is None or len(dims) == 0 else tuple(dims)
        return ctx.call(op, ctx.cast(x, ctx.out_dtype()), axis=axis, keepdims=bool(keepdim))

    return convert


_REDUCE_ATTRS = {"axis": None, "keepdims": False}
_prod = te.comm_reducer(lambda a, b: a * b, lambda t: const(1, t), name="prod")
# name, TE compute, numpy, ATen targets, keeps NCHWc blocks over (H, W)
_REDUCTIONS: list[tuple[str, Callable, Callable, tuple[str, ...], bool]] = [
    ("sum", _combine_compute("sum", te.sum), np.sum,
     ("aten.sum.dim_IntList", "aten.sum.default"), True),
    ("mean", _mean_compute, np.mean, ("aten.mean.dim", "aten.mean.default"), True),
    ("max", _nan_keeping_compute("max", True), np.max, ("aten.amax.default", "aten.max.default"),
     True),
    ("min", _nan_keeping_compute("min", False), np.min, ("aten.amin.default", "aten.min.default"),
     True),
    ("prod", _combine_compute("prod", _prod), np.prod,
     ("aten.prod.dim_int", "aten.prod.default"), False),
]
for _name, _compute, _np_fn, _atens, _blocked in _REDUCTIONS:
    OPS.register(_name, _reduce_rel, Pattern.COMM_REDUCE, 1, attrs=_REDUCE_ATTRS,
                 compute=_compute, evaluate=_numpy_reduction(_name, _np_fn),
                 blocked_layout=_blocked)
    OPS.converter(*_atens)(_reduction_converter(_name))


@OPS.converter("aten.any.dim", "aten.any.dims", "aten.any.default")
def _convert_any(ctx: ImportContext, node, args, kwargs):
    as_int = ctx.cast(args[0], "int32")
    dims = args[1] if len(args) > 1 else None
    if isinstance(dims, int):
        dims = [dims]
    keepdim = bool(args[2]) if len(args) > 2 else False
    axis = None if not dims else tuple(dims)
    reduced = ctx.call("max", as_int, axis=axis, keepdims=keepdim)
    return ctx.call("not_equal", reduced, ctx.const(0, "int32"))


# ---------------------------------------------------------------- variance


def _variance_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    axes = reduce_axes(attrs, x.ndim)
    d = x.dtype
    n = _count(x, axes)
    # two passes (mean, then squared deviations) for precision, as torch does
    mean = reduce_compute(x, axes, True, te.sum, "var_sum", anchor="variance")
    dev = te.compute(x.shape, lambda *i: x[i] - mean[tuple(bcast_index(mean, i))] / const(n, d),
                     name="var_dev")
    sq = reduce_compute(te.compute(x.shape, lambda *i: dev[i] * dev[i], name="var_sq"),
                        axes, attrs["keepdims"], te.sum, "var_sqsum")
    denom = max(n - attrs["correction"], 0)
    # torch gives inf/nan when n <= correction; dividing by 0.0 reproduces that.
    return te.compute(sq.shape, lambda *i: sq[i] / const(float(denom), d), name="variance")


def _variance_evaluate(args, attrs, ty):
    (x,) = args
    axes = reduce_axes(attrs, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    x64 = x.astype(np.float64)
    mean = np.mean(x64, axis=axes, keepdims=True)
    sq = np.sum((x64 - mean) ** 2, axis=axes, keepdims=attrs["keepdims"])
    denom = max(n - attrs["correction"], 0)
    return sq / np.float64(denom)  # 0.0 gives inf/nan as torch does


OPS.register("variance", _reduce_rel, Pattern.COMM_REDUCE, 1,
             attrs={**_REDUCE_ATTRS, "correction": 0},
             compute=_variance_compute, evaluate=_variance_evaluate)


# aten.var.dim (unbiased as a flag) is decomposed to var.correction by torch.export.
@OPS.converter("aten.var.correction")
def _convert_var(ctx: ImportContext, node, args, kwargs):
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    correction = kwargs.get("correction", 1)
    if correction is None:
        correction = 1
    keepdim = kwargs.get("keepdim", False)
    axis = None if not dims else tuple(dims)
    return ctx.call("variance", args[0], axis=axis, keepdims=keepdim, correction=int(correction))


@OPS.converter("aten.var_mean.correction")
def _convert_var_mean(ctx: ImportContext, node, args, kwargs):
    variance = _convert_var(ctx, node, args, kwargs)
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    mean = ctx.call("mean", ctx.expr(args[0]), axis=None if not dims else tuple(dims),
                    keepdims=kwargs.get("keepdim", False))
    return (variance, mean)


@OPS.converter("aten.argmax.default", "aten.argmin.default")
def _convert_arg_extreme(ctx: ImportContext, node, args, kwargs):
    """argmax / argmin as reductions every schedule knows: the row's max (min), then
    the lowest index holding it, a min over the indices where the row equals it and
    the row's length elsewhere. A NaN counts as the largest value and the smallest, as
    in torch: the max of a row with one is NaN, which only the NaN positions match."""
    x = ctx.expr(args[0])
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if dim is None:  # over the flattened tensor
        x = ctx.call("reshape", x, newshape=(x.tensor_type.size,))
        dim = 0
    dim %= max(len(x.shape), 1)
    if not x.shape:
        return ctx.const(0, "int64")
    extreme = ctx.call("max" if "argmax" in str(node.target) else "min", x, axis=(dim,),
                       keepdims=True)
    hit = ctx.call("equal", x, extreme)
    if is_float_dtype(x.dtype):
        # a NaN hits (x >= -inf fails for NaN alone; TVM folds x != x to false)
        hit = ctx.call("where", ctx.call("greater_equal", x, ctx.const(-np.inf, x.dtype)),
                       hit, ctx.const(True, "bool"))
    n = x.shape[dim]
    index = np.arange(n, dtype="int64").reshape((n,) + (1,) * (len(x.shape) - dim - 1))
    candidates = ctx.call("where", hit, ctx.const(index, "int64"), ctx.const(n, "int64"))
    out = ctx.call("min", candidates, axis=(dim,), keepdims=keepdim)
    return out if len(ctx.out_shape()) == len(out.shape) else ctx.call(
        "reshape", out, newshape=ctx.out_shape())


@OPS.converter("aten.cumsum.default")
def _convert_cumsum(ctx: ImportContext, node, args, kwargs):
    """cumsum along `dim` of extent n as a sum over a masked copy: out[i] = sum over k
    of x[k] * (k <= i), the (n, n) lower-triangular mask a constant. n^2 work, which
    is nothing for the sequence lengths models take cumulative sums over (position
    ids from an attention mask), and exact for integers."""
    x, dim = args[0], args[1]
    dtype = ctx.out_dtype()
    x = ctx.cast(ctx.expr(x), dtype)
    ndim = len(x.shape)
    dim = dim % max(ndim, 1)
    if ndim == 0:
        return x
    n = x.shape[dim]
    rows = ctx.call("reshape", x, newshape=(*x.shape[:dim], 1, *x.shape[dim:]))
    mask = np.tril(np.ones((n, n), dtype=dtype)).reshape((n, n) + (1,) * (ndim - dim - 1))
    masked = ctx.call("multiply", rows, ctx.const(mask, dtype))
    return ctx.call("sum", masked, axis=(dim + 1,), keepdims=False)
