"""TE computes for every registered op, by op name.

A compute is `fn(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor |
list[te.Tensor]`; `out_type` is the type the op's type relation inferred, so shapes
are never re-derived here. Semantics follow torch eager (the reference the tests
compare with). Anchor ops (conv2d, dense, matmul) write their reduction block with a
"tecc.anchor" annotation, which the default schedule dispatches on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import tvm
from tecc.frontend.ir import Attrs, TensorType, TupleType, Type
from tecc.frontend.ops import (
    is_depthwise_nchwc,
    nchwc_block,
    normalize_axis,
    reduce_axes,
    winograd_tile,
)
from tecc.graph_opt.layout import WINOGRAD_MATRICES
from tvm import te, topi
from tvm.tirx import const

Compute = Callable[[list[te.Tensor], Attrs, Type], "te.Tensor | list[te.Tensor]"]
_COMPUTES: dict[str, Compute] = {}

ANCHOR_ATTR = "tecc.anchor"


def register_compute(op_name: str) -> Callable[[Compute], Compute]:
    def deco(fn: Compute) -> Compute:
        if op_name in _COMPUTES:
            raise ValueError(f"compute for {op_name!r} registered twice")
        _COMPUTES[op_name] = fn
        return fn

    return deco


def get_compute(op_name: str) -> Compute:
    try:
        return _COMPUTES[op_name]
    except KeyError:
        raise KeyError(f"no TE compute registered for op {op_name!r}") from None


def registered_computes() -> list[str]:
    return sorted(_COMPUTES)


# ---------------------------------------------------------------- helpers


def _out(ty: Type) -> TensorType:
    assert isinstance(ty, TensorType), ty
    return ty


def _is_float(dtype) -> bool:
    return str(dtype).startswith(("float", "bfloat"))


def _shape(t: te.Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _bcast_index(t: te.Tensor, idx: Sequence[tvm.tirx.PrimExpr],
                 out_shape: Sequence[int] | None = None) -> list:
    """Index into `t` for output index `idx` under numpy broadcasting (right-aligned;
    a size-1 dim reads element 0 only where the output dim is larger, so that an
    elementwise read stays an identity read, which the schedule relies on)."""
    shape = _shape(t)
    lead = len(idx) - len(shape)
    return [0 if d == 1 and (out_shape is None or out_shape[lead + i] != 1) else idx[lead + i]
            for i, d in enumerate(shape)]


def _read(t: te.Tensor, idx: Sequence, out_shape: Sequence[int] | None = None
          ) -> tvm.tirx.PrimExpr:
    return t[tuple(_bcast_index(t, idx, out_shape))] if t.ndim else t()


def _elemwise(args: list[te.Tensor], out_type: Type, fn: Callable, name: str) -> te.Tensor:
    out = _out(out_type)
    return te.compute(out.shape, lambda *i: fn(*[_read(a, i, out.shape) for a in args]),
                      name=name)


def scalar_constant(value: float | int | bool, dtype: str, shape: Sequence[int]) -> te.Tensor:
    """A size-1 IR Constant as an immediate: a block the schedule inlines away."""
    v = const(bool(value) if dtype == "bool" else value, dtype)
    return te.compute(tuple(shape), lambda *_: v, name="scalar_const")


# ---------------------------------------------------------------- unary elementwise


def _unary(op_name: str, fn: Callable[[tvm.tirx.PrimExpr, str], tvm.tirx.PrimExpr]) -> None:
    @register_compute(op_name)
    def _compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        dtype = _out(out_type).dtype
        return _elemwise(args, out_type, lambda x: fn(x, dtype), op_name.replace(".", "_"))


def _c(v: float, dtype: str) -> tvm.tirx.PrimExpr:
    return const(v, dtype)


# erf, exp and tanh as polynomials (topi.fast_erf, fast_exp, fast_tanh: within 3.3e-7
# relative error of float64 over [-20, 20] in float32, see the README): they
# vectorize, where tirx.erf / exp / tanh are a scalar libm call per element (half of
# a BERT intermediate dense layer's time went to its gelu epilogue, a fifth of a
# MobileNet's to its silu epilogues; 113K elements on 2 AVX2 cores: exp 283 us libm,
# 50 fast; tanh 656 and 44; relu 27). fast_exp keeps inf above log(FLT_MAX) and NaN.
FAST_MATH_DTYPES = ("float32",)


def _erf_of(x: te.Tensor) -> te.Tensor:
    if x.dtype in FAST_MATH_DTYPES:
        return topi.fast_erf(x)
    return te.compute(x.shape, lambda *i: tvm.tirx.erf(x[i]), name="erf")


def _exp_of(x: te.Tensor) -> te.Tensor:
    if x.dtype in FAST_MATH_DTYPES:
        return topi.fast_exp(x)
    return te.compute(x.shape, lambda *i: tvm.tirx.exp(x[i]), name="exp")


def _tanh_of(x: te.Tensor) -> te.Tensor:
    if x.dtype in FAST_MATH_DTYPES:
        return topi.fast_tanh(x)
    return te.compute(x.shape, lambda *i: tvm.tirx.tanh(x[i]), name="tanh")


def _sigmoid_of(x: te.Tensor, name: str) -> te.Tensor:
    if x.dtype not in FAST_MATH_DTYPES:
        return te.compute(x.shape, lambda *i: tvm.tirx.sigmoid(x[i]), name=name)
    one = _c(1.0, x.dtype)
    exp = _exp_of(te.compute(x.shape, lambda *i: -x[i], name=f"{name}_neg"))
    return te.compute(x.shape, lambda *i: one / (one + exp[i]), name=name)


@register_compute("sigmoid")
def _sigmoid(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _sigmoid_of(args[0], "sigmoid")


@register_compute("silu")
def _silu(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x = args[0]
    sig = _sigmoid_of(x, "silu_sigmoid")
    return te.compute(x.shape, lambda *i: x[i] * sig[i], name="silu")


_unary("negative", lambda x, d: -x)
_unary("abs", lambda x, d: tvm.tirx.abs(x))
_unary("log", lambda x, d: tvm.tirx.log(x))
_unary("sqrt", lambda x, d: tvm.tirx.sqrt(x))
_unary("rsqrt", lambda x, d: _c(1.0, d) / tvm.tirx.sqrt(x))


@register_compute("exp")
def _exp(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _exp_of(args[0])


@register_compute("tanh")
def _tanh(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _tanh_of(args[0])


@register_compute("erf")
def _erf(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _erf_of(args[0])


_unary("relu", lambda x, d: tvm.tirx.max(x, _c(0, d)))
_unary("reciprocal", lambda x, d: _c(1.0, d) / x)
_unary("hardswish", lambda x, d: x * tvm.tirx.min(tvm.tirx.max(x + _c(3, d), _c(0, d)),
                                                   _c(6, d)) / _c(6, d))
_unary("hardsigmoid", lambda x, d: tvm.tirx.min(tvm.tirx.max(x / _c(6, d) + _c(0.5, d),
                                                             _c(0, d)), _c(1, d)))
_unary("copy", lambda x, d: x)
_unary("logical_not", lambda x, d: tvm.tirx.Not(x if str(x.dtype) == "bool" else x != _c(0, x.dtype)))


@register_compute("gelu")
def _gelu(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    d = _out(out_type).dtype
    x = args[0]
    if attrs["approximate"] == "tanh":
        k = _c(math.sqrt(2.0 / math.pi), d)
        inner = te.compute(x.shape, lambda *i: k * (x[i] + _c(0.044715, d) * x[i] * x[i] * x[i]),
                           name="gelu_inner")
        tanh = _tanh_of(inner)
        return te.compute(x.shape, lambda *i: _c(0.5, d) * x[i] * (_c(1.0, d) + tanh[i]),
                          name="gelu")
    scaled = te.compute(x.shape, lambda *i: x[i] * _c(1 / math.sqrt(2.0), d), name="gelu_scaled")
    erf = _erf_of(scaled)
    return te.compute(x.shape, lambda *i: _c(0.5, d) * x[i] * (_c(1.0, d) + erf[i]), name="gelu")


def _typed_scalar(v: float, dtype: str) -> tvm.tirx.PrimExpr:
    return const(v if _is_float(dtype) else int(v), dtype)


@register_compute("clip")
def _clip(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    d = _out(out_type).dtype
    lo, hi = _typed_scalar(attrs["a_min"], d), _typed_scalar(attrs["a_max"], d)
    return _elemwise(args, out_type, lambda x: tvm.tirx.min(tvm.tirx.max(x, lo), hi), "clip")


@register_compute("leaky_relu")
def _leaky_relu(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    d = _out(out_type).dtype
    alpha = _c(attrs["alpha"], d)
    return _elemwise(args, out_type,
                     lambda x: tvm.tirx.Select(x > _c(0, d), x, x * alpha), "leaky_relu")


@register_compute("cast")
def _cast(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    d = _out(out_type).dtype
    src = args[0].dtype
    if d == "bool" and src != "bool":
        # torch: nonzero -> True; a plain conversion would truncate 0.5 to False.
        return _elemwise(args, out_type, lambda x: x != const(0, src), "cast")
    return _elemwise(args, out_type, lambda x: x.astype(d), "cast")


# ---------------------------------------------------------------- binary broadcast


def _binary(op_name: str, fn: Callable) -> None:
    @register_compute(op_name)
    def _compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        return _elemwise(args, out_type, fn, op_name)


def _divide(a, b):
    return a / b if _is_float(a.dtype) else tvm.tirx.truncdiv(a, b)


def _floor_divide(a, b):
    return tvm.tirx.floor(a / b) if _is_float(a.dtype) else tvm.tirx.floordiv(a, b)


def _power(a, b):
    if _is_float(a.dtype):
        return tvm.tirx.power(a, b)
    # integer powers through float64: exact for the small values models use
    return tvm.tirx.round(tvm.tirx.power(a.astype("float64"), b.astype("float64"))).astype(
        a.dtype)


def _as_bool(x):
    return x if str(x.dtype) == "bool" else x != const(0, x.dtype)


_binary("add", lambda a, b: a + b)
_binary("subtract", lambda a, b: a - b)
_binary("multiply", lambda a, b: a * b)
_binary("divide", _divide)
_binary("power", _power)
_binary("maximum", tvm.tirx.max)
_binary("minimum", tvm.tirx.min)
_binary("floor_divide", _floor_divide)
_binary("equal", lambda a, b: a == b)
_binary("not_equal", lambda a, b: a != b)
_binary("less", lambda a, b: a < b)
_binary("less_equal", lambda a, b: a <= b)
_binary("greater", lambda a, b: a > b)
_binary("greater_equal", lambda a, b: a >= b)
_binary("logical_and", lambda a, b: tvm.tirx.And(_as_bool(a), _as_bool(b)))
_binary("logical_or", lambda a, b: tvm.tirx.Or(_as_bool(a), _as_bool(b)))
_binary("where", lambda c, x, y: tvm.tirx.Select(_as_bool(c), x, y))


@register_compute("nn.bias_add")
def _bias_add(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, b = args
    out = _out(out_type)
    axis = normalize_axis(attrs["axis"], x.ndim)
    return te.compute(out.shape, lambda *i: x[i] + b[i[axis]], name="bias_add")


# ---------------------------------------------------------------- reductions


def _reduce_compute(x: te.Tensor, axes: tuple[int, ...], keepdims: bool,
                    combine: Callable, name: str, anchor: str | None = None) -> te.Tensor:
    """out[kept...] = combine(x[...], axis=reduce_axes). Spatial axes keep their
    order, which keeps the reduce axes innermost in the generated loop nest."""
    shape = _shape(x)
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


def _reduction(op_name: str, combine: Callable) -> None:
    @register_compute(op_name)
    def _compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        (x,) = args
        axes = reduce_axes(attrs, x.ndim)
        if not axes:  # nothing to reduce: torch returns the input
            return te.compute(_out(out_type).shape, lambda *i: x[i], name=op_name)
        return _reduce_compute(x, axes, attrs["keepdims"], combine, op_name, anchor="reduce")


_prod = te.comm_reducer(lambda a, b: a * b, lambda t: const(1, t), name="prod")
_reduction("sum", te.sum)
_reduction("max", te.max)
_reduction("min", te.min)
_reduction("prod", _prod)


def _count(x: te.Tensor, axes: Sequence[int]) -> int:
    return int(math.prod(_shape(x)[a] for a in axes))


@register_compute("mean")
def _mean(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    axes = reduce_axes(attrs, x.ndim)
    if not axes:
        return te.compute(_out(out_type).shape, lambda *i: x[i], name="mean")
    s = _reduce_compute(x, axes, attrs["keepdims"], te.sum, "mean_sum", anchor="reduce")
    n = const(float(_count(x, axes)), x.dtype)
    return te.compute(s.shape, lambda *i: s[i] / n, name="mean")


@register_compute("variance")
def _variance(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    axes = reduce_axes(attrs, x.ndim)
    d = x.dtype
    n = _count(x, axes)
    # two passes (mean, then squared deviations) for precision, as torch does
    mean = _reduce_compute(x, axes, True, te.sum, "var_sum", anchor="variance")
    dev = te.compute(x.shape, lambda *i: x[i] - mean[tuple(_bcast_index(mean, i))] / _c(n, d),
                     name="var_dev")
    sq = _reduce_compute(te.compute(x.shape, lambda *i: dev[i] * dev[i], name="var_sq"),
                         axes, attrs["keepdims"], te.sum, "var_sqsum")
    denom = max(n - attrs["correction"], 0)
    # torch gives inf/nan when n <= correction; dividing by 0.0 reproduces that.
    return te.compute(sq.shape, lambda *i: sq[i] / _c(float(denom), d), name="variance")


# ---------------------------------------------------------------- nn anchors


@register_compute("nn.conv2d")
def _conv2d(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """NCHW x OIHW, any groups (depthwise is groups == C): one reduction block so one
    schedule template covers all three."""
    data, weight = args
    out = _out(out_type)
    n, c, h, w = _shape(data)
    o, ipg, kh, kw = _shape(weight)
    groups = attrs["groups"]
    opg = o // groups
    pad = attrs["padding"]
    pt, pl, pb, pr = (pad[0], pad[1], pad[0], pad[1]) if len(pad) == 2 else pad
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    if pt or pl or pb or pr:
        data = topi.nn.pad(data, [0, 0, pt, pl], [0, 0, pb, pr], name="conv_pad")
    ric = te.reduce_axis((0, ipg), name="ric")
    rkh = te.reduce_axis((0, kh), name="rkh")
    rkw = te.reduce_axis((0, kw), name="rkw")

    def body(b, oc, y, x):
        ic = ric if groups == 1 else (oc // opg) * ipg + ric
        return te.sum(data[b, ic, y * sh + rkh * dh, x * sw + rkw * dw].astype(out.dtype)
                      * weight[oc, ric, rkh, rkw].astype(out.dtype), axis=[ric, rkh, rkw])

    return te.compute(out.shape, body, name="conv2d", attrs={ANCHOR_ATTR: "conv2d"})


@register_compute("nn.dense")
def _dense(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, w = args
    out = _out(out_type)
    k = te.reduce_axis((0, _shape(w)[1]), name="k")
    return te.compute(out.shape, lambda *i: te.sum(x[i[:-1] + (k,)] * w[i[-1], k], axis=k),
                      name="dense", attrs={ANCHOR_ATTR: "dense"})


@register_compute("nn.dense_pack")
def _dense_pack(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """x[..., K] x w[N/nb, K, nb] (packed at compile time) -> [..., N]."""
    x, w = args
    out = _out(out_type)
    nb = _shape(w)[2]
    k = te.reduce_axis((0, _shape(w)[1]), name="k")
    return te.compute(
        out.shape,
        lambda *i: te.sum(x[i[:-1] + (k,)] * w[i[-1] // nb, k, i[-1] % nb], axis=k),
        name="dense_pack", attrs={ANCHOR_ATTR: "dense_pack"})


@register_compute("nn.matmul")
def _matmul(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    a, b = args
    out = _out(out_type)
    ta, tb = attrs["transpose_a"], attrs["transpose_b"]
    kdim = _shape(a)[-2] if ta else _shape(a)[-1]
    k = te.reduce_axis((0, kdim), name="k")
    nb = len(out.shape) - 2

    def batch_idx(t: te.Tensor, bidx: Sequence) -> list:
        tb_shape = _shape(t)[:-2]
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


def _pool_geometry(x: te.Tensor, attrs: Attrs, out: TensorType):
    pad = attrs["padding"]
    pt, pl, pb, pr = (pad[0], pad[1], pad[0], pad[1]) if len(pad) == 2 else pad
    kh, kw = attrs["pool_size"]
    sh, sw = attrs["strides"]
    dh, dw = attrs.get("dilation", (1, 1))
    h, w = _shape(x)[2:4]
    oh, ow = out.shape[2], out.shape[3]
    # ceil_mode windows may run past the bottom/right padding: pad far enough that every
    # window reads inside the padded buffer.
    need_h = (oh - 1) * sh + dh * (kh - 1) + 1
    need_w = (ow - 1) * sw + dw * (kw - 1) + 1
    eb = max(pb, need_h - h - pt)
    er = max(pr, need_w - w - pl)
    return (pt, pl, pb, pr), (eb, er), (kh, kw), (sh, sw), (dh, dw), (h, w)


def _spatial_pad(x: te.Tensor, before: Sequence[int], after: Sequence[int], name: str,
                 pad_value: float = 0.0) -> te.Tensor:
    """Pad dims 2 and 3 (H, W) of an NCHW or NCHW{c}c tensor."""
    rest = [0] * (x.ndim - 4)
    return topi.nn.pad(x, [0, 0, *before, *rest], [0, 0, *after, *rest], pad_value=pad_value,
                       name=name)


@register_compute("nn.max_pool2d")
def _max_pool2d(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    out = _out(out_type)
    (pt, pl, _, _), (eb, er), (kh, kw), (sh, sw), (dh, dw), _ = _pool_geometry(x, attrs, out)
    lowest = tvm.tirx.min_value(x.dtype)
    if pt or pl or eb or er:
        x = _spatial_pad(x, [pt, pl], [eb, er], "pool_pad", pad_value=lowest)
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    return te.compute(
        out.shape,
        lambda *i: te.max(x[(i[0], i[1], i[2] * sh + rh * dh, i[3] * sw + rw * dw, *i[4:])],
                          axis=[rh, rw]),
        name="max_pool2d", attrs={ANCHOR_ATTR: "pool"})


@register_compute("nn.avg_pool2d")
def _avg_pool2d(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    out = _out(out_type)
    (pt, pl, pb, pr), (eb, er), (kh, kw), (sh, sw), _, (h, w) = _pool_geometry(x, attrs, out)
    d = x.dtype
    if pt or pl or eb or er:
        x = _spatial_pad(x, [pt, pl], [eb, er], "pool_pad")
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    s = te.compute(out.shape,
                   lambda *i: te.sum(x[(i[0], i[1], i[2] * sh + rh, i[3] * sw + rw, *i[4:])],
                                     axis=[rh, rw]),
                   name="avg_pool_sum", attrs={ANCHOR_ATTR: "pool"})
    include_pad = attrs["count_include_pad"]
    tmin, tmax = tvm.tirx.min, tvm.tirx.max

    def divisor(y, xx):
        # torch's avg_pool2d: the window clipped to the padded input, then (unless
        # count_include_pad) to the input itself.
        hs, ws = y * sh - pt, xx * sw - pl
        he, we = tmin(hs + kh, h + pb), tmin(ws + kw, w + pr)
        if not include_pad:
            hs, ws, he, we = tmax(hs, 0), tmax(ws, 0), tmin(he, h), tmin(we, w)
        return ((he - hs) * (we - ws)).astype(d)

    return te.compute(out.shape, lambda *i: s[i] / divisor(i[2], i[3]), name="avg_pool2d")


@register_compute("nn.adaptive_avg_pool2d")
def _adaptive_avg_pool2d(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    out = _out(out_type)
    h, w = _shape(x)[2:4]
    oh, ow = out.shape[2], out.shape[3]
    if h % oh or w % ow:  # windows of varying size: topi's compute, generic schedule
        return topi.nn.adaptive_pool(x, tuple(attrs["output_size"]), "avg", attrs["layout"])
    # Equal windows (global pooling among them): a plain window sum, as topi computes
    # it, tagged so that the pool template schedules it.
    kh, kw = h // oh, w // ow
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    s = te.compute(out.shape,
                   lambda *i: te.sum(x[(i[0], i[1], i[2] * kh + rh, i[3] * kw + rw, *i[4:])],
                                     axis=[rh, rw]),
                   name="adaptive_pool_sum", attrs={ANCHOR_ATTR: "pool"})
    n = const(float(kh * kw), x.dtype)
    return te.compute(out.shape, lambda *i: s[i] / n, name="adaptive_pool_avg")


# ---------------------------------------------------------------- blocked (NCHW{c}c) layout


@register_compute("layout_transform")
def _layout_transform(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """NCHW <-> NCHW{c}c and between blocks, by index arithmetic (one gather)."""
    (x,) = args
    src, dst = nchwc_block(attrs["src_layout"]), nchwc_block(attrs["dst_layout"])

    def read(n, ch, y, xx):  # ch: the channel in NCHW numbering
        if src is None:
            return x[n, ch, y, xx]
        return x[n, tvm.tirx.floordiv(ch, src), y, xx, tvm.tirx.floormod(ch, src)]

    if dst is None:
        body = read
    else:
        def body(n, cc, y, xx, cb):
            return read(n, cc * dst + cb, y, xx)
    return te.compute(_out(out_type).shape, body, name="layout_transform")


@register_compute("nn.conv2d_NCHWc")
def _conv2d_nchwc(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """data [N, C/ic, H, W, ic] x kernel [OC/oc, IPG/ic, KH, KW, ic, oc] (any groups
    whose group boundaries fall on block boundaries), or the depthwise kernel
    [C/c, 1, KH, KW, 1, c]. One reduction block over (ic_chunk, kh, kw, ic)."""
    data, kernel = args
    out = _out(out_type)
    groups = attrs["groups"]
    occ, ipc, kh, kw, ic, oc = _shape(kernel)
    pad = attrs["padding"]
    pt, pl, pb, pr = (pad[0], pad[1], pad[0], pad[1]) if len(pad) == 2 else pad
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    depthwise = is_depthwise_nchwc(_shape(data), _shape(kernel), groups)
    tile = winograd_tile(attrs)
    if tile:
        return _winograd_nchwc(data, kernel, (pt, pl), tile, out)
    if pt or pl or pb or pr:
        data = _spatial_pad(data, [pt, pl], [pb, pr], "conv_pad")
    rkh = te.reduce_axis((0, kh), name="rkh")
    rkw = te.reduce_axis((0, kw), name="rkw")
    d = out.dtype
    if depthwise:
        def dw_body(b, cc, y, x, cb):
            return te.sum(data[b, cc, y * sh + rkh * dh, x * sw + rkw * dw, cb].astype(d)
                          * kernel[cc, 0, rkh, rkw, 0, cb].astype(d), axis=[rkh, rkw])

        return te.compute(out.shape, dw_body, name="depthwise_conv2d_NCHWc",
                          attrs={ANCHOR_ATTR: "depthwise_conv2d_NCHWc"})
    ricc = te.reduce_axis((0, ipc), name="ricc")
    ric = te.reduce_axis((0, ic), name="ric")
    opg_chunks = occ // groups  # output chunks per group

    def body(b, o, y, x, ob):
        icc = ricc if groups == 1 else tvm.tirx.floordiv(o, opg_chunks) * ipc + ricc
        return te.sum(data[b, icc, y * sh + rkh * dh, x * sw + rkw * dw, ric].astype(d)
                      * kernel[o, ricc, rkh, rkw, ric, ob].astype(d), axis=[ricc, rkh, rkw, ric])

    return te.compute(out.shape, body, name="conv2d_NCHWc", attrs={ANCHOR_ATTR: "conv2d_NCHWc"})


def _winograd_nchwc(data: te.Tensor, kernel: te.Tensor, pad_before: tuple[int, int],
                    tile: int, out: te.Tensor) -> te.Tensor:
    """Winograd F(m x m, 3 x 3) on NCHW{c}c data with the kernel transformed at compile
    time (graph_opt.layout.pack_winograd_weight), in five blocks over P = N x tile rows
    x tile columns (an m x m output tile each):
      winograd_input_rows [P, C/ic, alpha, alpha, ic]  d B, one input tile at a time
      winograd_input      [alpha, alpha, P, C/ic, ic]  B^T d B
      winograd_gemm       [alpha, alpha, P, OC/oc, oc] alpha^2 GEMMs over C (the anchor)
      winograd_output_rows, winograd_output [P, OC/oc, m, m, oc]  A^T M A
    then the output, [N, OC/oc, OH, OW, oc], gathered from the tiles. The transforms
    are separable: two passes of alpha-point sums instead of alpha^2-point ones."""
    from tvm.topi.nn.winograd_util import const_matrix

    a_np, b_np, _ = WINOGRAD_MATRICES[tile]
    alpha = tile + 2
    n, _, h, w, _ = _shape(data)
    _, _, occ, icc, ic, oc = _shape(kernel)
    _, _, oh, ow, _ = _shape(out)
    th, tw = -(-oh // tile), -(-ow // tile)
    pt, pl = pad_before
    # zeros around the input, as far as the last (partly outside) tile reaches
    data = _spatial_pad(data, [pt, pl], [th * tile + 2 - h - pt, tw * tile + 2 - w - pl],
                        "conv_pad")
    d = out.dtype
    mat_a = const_matrix(a_np.astype(d), "winograd_A")
    mat_b = const_matrix(b_np.astype(d), "winograd_B")
    ra = te.reduce_axis((0, alpha), name="ra")
    rb = te.reduce_axis((0, alpha), name="rb")

    def input_rows(p, c, a, nu, cb):
        img, y, x = p // (th * tw), p % (th * tw) // tw, p % tw
        return te.sum(data[img, c, y * tile + a, x * tile + rb, cb].astype(d) * mat_b[rb, nu],
                      axis=rb)

    rows = te.compute((n * th * tw, icc, alpha, alpha, ic), input_rows,
                      name="winograd_input_rows")
    v = te.compute((alpha, alpha, n * th * tw, icc, ic),
                   lambda e, nu, p, c, cb: te.sum(mat_b[ra, e] * rows[p, c, ra, nu, cb], axis=ra),
                   name="winograd_input")
    rcc = te.reduce_axis((0, icc), name="rcc")
    rc = te.reduce_axis((0, ic), name="rc")
    gemm = te.compute(
        (alpha, alpha, n * th * tw, occ, oc),
        lambda e, nu, p, o, ob: te.sum(v[e, nu, p, rcc, rc] * kernel[e, nu, o, rcc, rc, ob]
                                       .astype(d), axis=[rcc, rc]),
        name="winograd_gemm", attrs={ANCHOR_ATTR: "conv2d_winograd_NCHWc"})
    sa = te.reduce_axis((0, alpha), name="sa")
    sb = te.reduce_axis((0, alpha), name="sb")
    out_rows = te.compute(
        (n * th * tw, occ, alpha, tile, oc),
        lambda p, o, a, x, ob: te.sum(gemm[a, sb, p, o, ob] * mat_a[sb, x], axis=sb),
        name="winograd_output_rows")
    tiles = te.compute(
        (n * th * tw, occ, tile, tile, oc),
        lambda p, o, y, x, ob: te.sum(mat_a[sa, y] * out_rows[p, o, sa, x, ob], axis=sa),
        name="winograd_output")
    return te.compute(
        out.shape,
        lambda b, o, y, x, ob: tiles[b * th * tw + y // tile * tw + x // tile, o, y % tile,
                                     x % tile, ob],
        name="winograd_gather")


def _softmax_parts(x: te.Tensor, axis: int, anchor: str):
    shape = _shape(x)
    k1 = te.reduce_axis((0, shape[axis]), name="k1")
    k2 = te.reduce_axis((0, shape[axis]), name="k2")
    red_shape = shape[:axis] + shape[axis + 1:]

    def at(i, k):
        return x[tuple(i[:axis]) + (k,) + tuple(i[axis:])]

    mx = te.compute(red_shape, lambda *i: te.max(at(i, k1), axis=k1), name="softmax_max",
                    attrs={ANCHOR_ATTR: anchor})

    def red(i):
        return tuple(i[:axis]) + tuple(i[axis + 1:])

    # exp(x - max) as a tensor the schedule inlines into the sum and the normalize;
    # x - max <= 0: fast_exp never overflows there
    e = _exp_of(te.compute(x.shape, lambda *i: x[i] - mx[red(i)], name="softmax_shifted"))

    def e_at(i, k):
        return e[tuple(i[:axis]) + (k,) + tuple(i[axis:])]

    es = te.compute(red_shape, lambda *i: te.sum(e_at(i, k2), axis=k2), name="softmax_expsum")
    return mx, es, red, e


@register_compute("nn.softmax")
def _softmax(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    _, es, red, e = _softmax_parts(x, axis, "softmax")
    return te.compute(x.shape, lambda *i: e[i] / es[red(i)], name="softmax")


@register_compute("nn.log_softmax")
def _log_softmax(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    mx, es, red, _ = _softmax_parts(x, axis, "log_softmax")
    return te.compute(x.shape, lambda *i: x[i] - mx[red(i)] - tvm.tirx.log(es[red(i)]),
                      name="log_softmax")


@register_compute("nn.layer_norm")
def _layer_norm(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, gamma, beta = args
    d = x.dtype
    axis = x.ndim - 1
    n = _shape(x)[axis]
    s = _reduce_compute(x, (axis,), False, te.sum, "ln_sum", anchor="layer_norm")
    mean = te.compute(s.shape, lambda *i: s[i] / _c(float(n), d), name="ln_mean")
    k = te.reduce_axis((0, n), name="kv")
    var = te.compute(
        s.shape,
        lambda *i: te.sum((x[i + (k,)] - mean[i]) * (x[i + (k,)] - mean[i]), axis=k),
        name="ln_varsum")
    eps = _c(attrs["epsilon"], d)
    return te.compute(
        x.shape,
        lambda *i: (x[i] - mean[i[:-1]])
        * tvm.tirx.rsqrt(var[i[:-1]] / _c(float(n), d) + eps) * gamma[i[-1]] + beta[i[-1]],
        name="layer_norm")


@register_compute("nn.batch_norm")
def _batch_norm(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, gamma, beta, mean, var = args
    eps = _c(attrs["epsilon"], x.dtype)
    return te.compute(
        x.shape,
        lambda *i: (x[i] - mean[i[1]]) / tvm.tirx.sqrt(var[i[1]] + eps) * gamma[i[1]]
        + beta[i[1]],
        name="batch_norm")


# ---------------------------------------------------------------- injective


@register_compute("take")
def _take(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    data, indices = args
    out = _out(out_type)
    axis = normalize_axis(attrs["axis"], data.ndim)
    dim = _shape(data)[axis]
    ni = indices.ndim

    def body(*i):
        idx = indices[tuple(i[axis:axis + ni])] if ni else indices()
        idx = idx.astype("int64")
        # python-style negative indices, then clamp: never read out of bounds
        idx = tvm.tirx.Select(idx < 0, idx + dim, idx)
        idx = tvm.tirx.min(tvm.tirx.max(idx, const(0, "int64")), const(dim - 1, "int64"))
        return data[tuple(i[:axis]) + (idx,) + tuple(i[axis + ni:])]

    return te.compute(out.shape, body, name="take")


@register_compute("reshape")
def _reshape(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return topi.reshape(args[0], _out(out_type).shape)


@register_compute("transpose")
def _transpose(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return topi.transpose(args[0], [normalize_axis(a, args[0].ndim) for a in attrs["axes"]])


@register_compute("broadcast_to")
def _broadcast_to(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    shape = _out(out_type).shape
    return te.compute(shape, lambda *i: _read(x, i, shape), name="broadcast_to")


@register_compute("strided_slice")
def _strided_slice(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    shape = _shape(x)
    starts = [0] * x.ndim
    steps = [1] * x.ndim
    for axis, begin, end, step in zip(attrs["axes"], attrs["begin"], attrs["end"],
                                      attrs["strides"], strict=True):
        axis = normalize_axis(axis, x.ndim)
        starts[axis], _, _ = slice(begin, end, step).indices(shape[axis])
        steps[axis] = step
    return te.compute(
        _out(out_type).shape,
        lambda *i: x[tuple(starts[a] + i[a] * steps[a] for a in range(x.ndim))],
        name="strided_slice")


@register_compute("concatenate")
def _concatenate(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    axis = normalize_axis(attrs["axis"], args[0].ndim)
    return topi.concatenate(list(args), axis)


def _shifted(x: te.Tensor, axis: int, offset: int) -> Callable:
    # a closure per field: te.compute rejects keyword-default arguments
    def body(*i):
        return x[tuple(i[:axis]) + (i[axis] + offset,) + tuple(i[axis + 1:])]

    return body


@register_compute("split")
def _split(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> list[te.Tensor]:
    (x,) = args
    assert isinstance(out_type, TupleType)
    axis = normalize_axis(attrs["axis"], x.ndim)
    outs = []
    offset = 0
    for j, field_ty in enumerate(out_type.fields):
        outs.append(te.compute(_out(field_ty).shape, _shifted(x, axis, offset), name=f"split{j}"))
        offset += _out(field_ty).shape[axis]
    return outs
