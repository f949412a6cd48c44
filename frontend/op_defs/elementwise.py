"""Elementwise ops: unary math and activations, casts, broadcast binary arithmetic,
comparisons, logical ops and `where`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tecc.frontend.ir import Constant, Expr
from tecc.frontend.op_defs.common import (
    arity,
    as_bool,
    bool_result,
    broadcast_rel,
    elemwise,
    elemwise_compute,
    erf_of,
    exp_of,
    is_float_dtype,
    nan_clamp,
    nan_max,
    nan_min,
    np_as_bool,
    np_elemwise,
    np_is_float,
    out_tensor,
    prim_dtype,
    same_type,
    sigmoid_of,
    tanh_of,
    typed_const,
)
from tecc.frontend.ops import OPS, REQUIRED, Converter, NotFoldable, Pattern
from tecc.frontend.types import Attrs, TensorType, Type
from tvm import te
from tvm.tirx import const

if TYPE_CHECKING:
    from tecc.frontend.importer import ImportContext

tir = tvm.tirx


def _c(v: float, dtype: str) -> tvm.tirx.PrimExpr:
    return const(v, dtype)


# ---------------------------------------------------------------- numpy helpers


def _erf_np(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; constants are small, so a vectorized math.erf is enough.
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


def _sigmoid_np(x: np.ndarray) -> np.ndarray:
    one = x.dtype.type(1)
    return one / (one + np.exp(-x))


# ---------------------------------------------------------------- unary


def _unary_converter(op: str) -> Converter:
    return lambda ctx, node, args, kwargs: ctx.call(op, ctx.cast(args[0], ctx.out_dtype()))


def _unary(name: str, aten: str | None, compute: Callable, evaluate: Callable) -> None:
    """An op of one tensor to a tensor of its type, converted from `aten.<aten>`."""
    OPS.register(name, same_type, Pattern.ELEMWISE, 1, compute=compute,
                 evaluate=np_elemwise(evaluate))
    if aten is not None:
        OPS.converter(f"aten.{aten}.default")(_unary_converter(name))


def _per_element(fn: Callable[[tir.PrimExpr, str], tir.PrimExpr], name: str) -> Callable:
    def compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        dtype = out_tensor(out_type).dtype
        return elemwise(args, out_type, lambda x: fn(x, dtype), name)

    return compute


def _on_tensor(fn: Callable[[te.Tensor], te.Tensor]) -> Callable:
    return lambda args, attrs, out_type: fn(args[0])


def _silu(x: te.Tensor) -> te.Tensor:
    sig = sigmoid_of(x, "silu_sigmoid")
    return te.compute(x.shape, lambda *i: x[i] * sig[i], name="silu")


def _hardswish(x: tir.PrimExpr, d: str) -> tir.PrimExpr:
    return x * nan_clamp(x + _c(3, d), _c(0, d), _c(6, d)) / _c(6, d)


def _hardsigmoid(x: tir.PrimExpr, d: str) -> tir.PrimExpr:
    return nan_clamp(x / _c(6, d) + _c(0.5, d), _c(0, d), _c(1, d))


# name, ATen name, TE compute, numpy evaluator
_UNARY: list[tuple[str, str | None, Callable, Callable]] = [
    ("negative", "neg", _per_element(lambda x, d: -x, "negative"), np.negative),
    ("abs", "abs", _per_element(lambda x, d: tir.abs(x), "abs"), np.abs),
    ("exp", "exp", _on_tensor(exp_of), np.exp),
    ("log", "log", _per_element(lambda x, d: tir.log(x), "log"), np.log),
    # log(1 + x) loses every digit of x below float epsilon; libm's log1p keeps them
    ("log1p", "log1p", _per_element(lambda x, d: tir.log1p(x), "log1p"), np.log1p),
    ("sqrt", "sqrt", _per_element(lambda x, d: tir.sqrt(x), "sqrt"), np.sqrt),
    ("rsqrt", "rsqrt", _per_element(lambda x, d: _c(1.0, d) / tir.sqrt(x), "rsqrt"),
     lambda x: x.dtype.type(1) / np.sqrt(x)),
    ("sigmoid", "sigmoid", _on_tensor(lambda x: sigmoid_of(x, "sigmoid")), _sigmoid_np),
    ("tanh", "tanh", _on_tensor(tanh_of), np.tanh),
    ("erf", "erf", _on_tensor(erf_of), _erf_np),
    ("relu", "relu", _per_element(lambda x, d: nan_max(x, _c(0, d)), "relu"),
     lambda x: np.maximum(x, x.dtype.type(0))),
    ("reciprocal", "reciprocal", _per_element(lambda x, d: _c(1.0, d) / x, "reciprocal"),
     lambda x: x.dtype.type(1) / x),
    ("silu", "silu", _on_tensor(_silu), lambda x: x * _sigmoid_np(x)),
    ("hardswish", "hardswish", _per_element(_hardswish, "hardswish"),
     lambda x: x * np.clip(x + 3, 0, 6) / 6),
    ("hardsigmoid", "hardsigmoid", _per_element(_hardsigmoid, "hardsigmoid"),
     lambda x: np.clip(x / 6 + 0.5, 0, 1)),
    ("copy", None, _per_element(lambda x, d: x, "copy"), lambda x: x),
]
for _name, _aten, _compute, _evaluate in _UNARY:
    _unary(_name, _aten, _compute, _evaluate)


def _logical_not_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return elemwise(args, out_type, lambda x: tir.Not(as_bool(x)), "logical_not")


OPS.register("logical_not", bool_result(same_type), Pattern.ELEMWISE, 1,
             compute=_logical_not_compute, evaluate=np_elemwise(lambda x: ~np_as_bool(x)))


@OPS.converter("aten.logical_not.default", "aten.bitwise_not.default")
def _convert_logical_not(ctx: ImportContext, node, args, kwargs):
    return ctx.call("logical_not", ctx.cast(args[0], "bool"))


# ---------------------------------------------------------------- with attributes


def _gelu_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    d = out_tensor(out_type).dtype
    x = args[0]
    if attrs["approximate"] == "tanh":
        k = _c(math.sqrt(2.0 / math.pi), d)
        inner = te.compute(x.shape, lambda *i: k * (x[i] + _c(0.044715, d) * x[i] * x[i] * x[i]),
                           name="gelu_inner")
        tanh = tanh_of(inner)
        return te.compute(x.shape, lambda *i: _c(0.5, d) * x[i] * (_c(1.0, d) + tanh[i]),
                          name="gelu")
    scaled = te.compute(x.shape, lambda *i: x[i] * _c(1 / math.sqrt(2.0), d), name="gelu_scaled")
    erf = erf_of(scaled)
    return te.compute(x.shape, lambda *i: _c(0.5, d) * x[i] * (_c(1.0, d) + erf[i]), name="gelu")


def _gelu_evaluate(args, attrs, ty):
    (x,) = args
    x64 = x.astype(np.float64)
    if attrs["approximate"] == "tanh":
        k = math.sqrt(2.0 / math.pi)
        return 0.5 * x64 * (1.0 + np.tanh(k * (x64 + 0.044715 * x64 ** 3)))
    return 0.5 * x64 * (1.0 + _erf_np(x64 / math.sqrt(2.0)))


OPS.register("gelu", same_type, Pattern.ELEMWISE, 1, attrs={"approximate": "none"},
             compute=_gelu_compute, evaluate=_gelu_evaluate)


@OPS.converter("aten.gelu.default")
def _convert_gelu(ctx: ImportContext, node, args, kwargs):
    return ctx.call("gelu", args[0], approximate=kwargs.get("approximate", "none"))


def _clip_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    d = out_tensor(out_type).dtype
    lo, hi = typed_const(attrs["a_min"], d), typed_const(attrs["a_max"], d)
    return elemwise(args, out_type, lambda x: nan_clamp(x, lo, hi), "clip")


def _clip_evaluate(args, attrs, ty):
    (x,) = args
    lo, hi = attrs["a_min"], attrs["a_max"]
    if not np_is_float(x):
        lo, hi = int(lo), int(hi)
    return np.minimum(np.maximum(x, x.dtype.type(lo)), x.dtype.type(hi))


OPS.register("clip", same_type, Pattern.ELEMWISE, 1,
             attrs={"a_min": REQUIRED, "a_max": REQUIRED},
             compute=_clip_compute, evaluate=_clip_evaluate)


@OPS.converter("aten.hardtanh.default")
def _convert_hardtanh(ctx: ImportContext, node, args, kwargs):
    lo = args[1] if len(args) > 1 else -1.0
    hi = args[2] if len(args) > 2 else 1.0
    return ctx.call("clip", args[0], a_min=float(lo), a_max=float(hi))


@OPS.converter("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default")
def _convert_clamp(ctx: ImportContext, node, args, kwargs):
    x = ctx.cast(args[0], ctx.out_dtype())
    name = str(node.target)
    lo = args[1] if len(args) > 1 and "clamp_max" not in name else kwargs.get("min")
    hi = (args[2] if len(args) > 2 else kwargs.get("max")) if "clamp_max" not in name else args[1]
    if "clamp_min" in name:
        hi = None
    if lo is not None and hi is not None:
        return ctx.call("clip", x, a_min=float(lo), a_max=float(hi))
    if lo is not None:
        x = ctx.call("maximum", x, ctx.expr(lo, like=x))
    if hi is not None:
        x = ctx.call("minimum", x, ctx.expr(hi, like=x))
    return x


def _leaky_relu_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    d = out_tensor(out_type).dtype
    alpha = _c(attrs["alpha"], d)
    return elemwise(args, out_type, lambda x: tir.Select(x > _c(0, d), x, x * alpha),
                    "leaky_relu")


OPS.register("leaky_relu", same_type, Pattern.ELEMWISE, 1, attrs={"alpha": 0.01},
             compute=_leaky_relu_compute,
             evaluate=lambda args, attrs, ty: np.where(
                 args[0] > 0, args[0], args[0] * args[0].dtype.type(attrs["alpha"])))


@OPS.converter("aten.leaky_relu.default")
def _convert_leaky_relu(ctx: ImportContext, node, args, kwargs):
    return ctx.call("leaky_relu", args[0], alpha=float(args[1]) if len(args) > 1 else 0.01)


def _cast_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    return TensorType(x.shape, attrs["dtype"])


def _cast_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    d = out_tensor(out_type).dtype
    src = args[0].dtype
    if d == "bool" and src != "bool":
        # torch: nonzero -> True; a plain conversion would truncate 0.5 to False.
        return elemwise(args, out_type, lambda x: x != const(0, src), "cast")
    return elemwise(args, out_type, lambda x: x.astype(d), "cast")


def _cast_evaluate(args, attrs, ty):
    (x,) = args
    if attrs["dtype"] == "bool":
        return x != 0  # torch: non-zero is True (0.5 -> True, not truncated)
    return x.astype(attrs["dtype"])


OPS.register("cast", _cast_rel, Pattern.ELEMWISE, 1, attrs={"dtype": REQUIRED},
             compute=_cast_compute, evaluate=_cast_evaluate)


@OPS.converter("aten._to_copy.default", "aten.to.dtype")
def _convert_to_copy(ctx: ImportContext, node, args, kwargs):
    return ctx.cast(args[0], ctx.out_dtype())


# ---------------------------------------------------------------- binary


def _divide(a, b):
    return a / b if is_float_dtype(prim_dtype(a)) else tir.truncdiv(a, b)


def _floor_divide(a, b):
    return tir.floor(a / b) if is_float_dtype(prim_dtype(a)) else tir.floordiv(a, b)


def _power(a, b):
    if is_float_dtype(prim_dtype(a)):
        return tir.power(a, b)
    # integer powers through float64: exact for the small values models use
    return tir.round(tir.power(a.astype("float64"), b.astype("float64"))).astype(prim_dtype(a))


def _divide_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np_is_float(a):
        return a / b
    if np.any(b == 0):
        raise NotFoldable("integer division by zero")
    q = np.abs(a) // np.abs(b)  # truncating division, as C and TVM's truncdiv
    return np.where((a < 0) != (b < 0), -q, q)


def _floor_divide_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np_is_float(a):
        return np.floor(a / b)
    if np.any(b == 0):
        raise NotFoldable("integer division by zero")
    return np.floor_divide(a, b)


def _power_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np_is_float(a):
        return np.power(a, b)
    # integer powers through float64, rounded, as the kernel computes them
    return np.round(np.power(a.astype(np.float64), b.astype(np.float64)))


def _binary_converter(op: str, result_is_bool: bool = False) -> Converter:
    def convert(ctx: ImportContext, node, args, kwargs):
        a, b = args[0], args[1]
        dtype = ctx.promoted_dtype(a, b) if result_is_bool else ctx.out_dtype()
        a = ctx.cast(ctx.expr(a, dtype=dtype), dtype)
        b = ctx.cast(ctx.expr(b, dtype=dtype), dtype)
        alpha = kwargs.get("alpha", 1)
        if alpha != 1:
            b = ctx.call("multiply", b, ctx.const(alpha, dtype))
        return ctx.call(op, a, b)

    return convert


def _convert_power(ctx: ImportContext, node, args, kwargs):
    """x ** c for the constant exponents torch's own pow kernel special-cases, as
    multiplications, sqrt and divisions (gelu's tanh form cubes its input: a powf call
    per element was 60% of an ALBERT's time); any other exponent is a power."""
    base, exponent = args[0], args[1]
    if isinstance(exponent, bool) or not isinstance(exponent, int | float) \
            or not isinstance(base, Expr) or not is_float_dtype(ctx.out_dtype()):
        return _binary_converter("power")(ctx, node, args, kwargs)
    x = ctx.cast(base, ctx.out_dtype())
    if exponent in (0.5, -0.5):
        return ctx.call("sqrt" if exponent > 0 else "rsqrt", x)
    if exponent not in (1, 2, 3, 4, -1, -2):
        return _binary_converter("power")(ctx, node, args, kwargs)
    power = x  # x ** |exponent| by multiplications: x, x * x, (x * x) * x, (x * x) ** 2
    if abs(exponent) > 1:
        power = ctx.call("multiply", x, x)
    if abs(exponent) == 3:
        power = ctx.call("multiply", power, x)
    elif abs(exponent) == 4:
        power = ctx.call("multiply", power, power)
    if exponent < 0:
        return ctx.call("divide", ctx.const(1.0, ctx.out_dtype()), power)
    return power


_OVERLOADS = ("Tensor", "Scalar", "Tensor_Scalar", "Tensor_Tensor", "default")
# name, ATen names (all their overloads), TE compute of the elements, numpy
_ARITHMETIC: list[tuple[str, tuple[str, ...], Callable, Callable]] = [
    ("add", ("add",), lambda a, b: a + b, np.add),
    ("subtract", ("sub",), lambda a, b: a - b, np.subtract),
    ("multiply", ("mul",), lambda a, b: a * b, np.multiply),
    ("divide", (), _divide, _divide_np),
    ("power", ("pow",), _power, _power_np),
    ("maximum", ("maximum",), nan_max, np.maximum),
    ("minimum", ("minimum",), nan_min, np.minimum),
    ("floor_divide", (), _floor_divide, _floor_divide_np),
]
for _name, _atens, _fn, _np_fn in _ARITHMETIC:
    OPS.register(_name, broadcast_rel(2), Pattern.BROADCAST, 2,
                 compute=elemwise_compute(_fn, _name), evaluate=np_elemwise(_np_fn))
    for _aten in _atens:
        convert = _convert_power if _name == "power" else _binary_converter(_name)
        OPS.converter(*(f"aten.{_aten}.{o}" for o in _OVERLOADS))(convert)

_COMPARISONS: list[tuple[str, str, Callable, Callable]] = [
    ("equal", "eq", lambda a, b: a == b, np.equal),
    ("not_equal", "ne", lambda a, b: a != b, np.not_equal),
    ("less", "lt", lambda a, b: a < b, np.less),
    ("less_equal", "le", lambda a, b: a <= b, np.less_equal),
    ("greater", "gt", lambda a, b: a > b, np.greater),
    ("greater_equal", "ge", lambda a, b: a >= b, np.greater_equal),
]
for _name, _aten, _fn, _np_fn in _COMPARISONS:
    OPS.register(_name, bool_result(broadcast_rel(2)), Pattern.BROADCAST, 2,
                 compute=elemwise_compute(_fn, _name), evaluate=np_elemwise(_np_fn))
    OPS.converter(f"aten.{_aten}.Tensor", f"aten.{_aten}.Scalar")(
        _binary_converter(_name, result_is_bool=True))


@OPS.converter("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _convert_div(ctx: ImportContext, node, args, kwargs):
    mode = kwargs.get("rounding_mode")
    if mode is None:
        return _binary_converter("divide")(ctx, node, args, {})
    if mode == "floor":
        return _binary_converter("floor_divide")(ctx, node, args, {})
    raise ctx.error(f"division with rounding_mode={mode!r} is not supported")


@OPS.converter("aten.rsub.Scalar", "aten.rsub.Tensor")
def _convert_rsub(ctx: ImportContext, node, args, kwargs):
    return _binary_converter("subtract")(ctx, node, [args[1], args[0]], kwargs)


def _logical_converter(op: str) -> Converter:
    def convert(ctx: ImportContext, node, args, kwargs):
        if ctx.out_dtype() != "bool":
            raise ctx.error(f"{node.target} on {ctx.out_dtype()} tensors is not supported")
        a = ctx.cast(ctx.expr(args[0], dtype="bool"), "bool")
        b = ctx.cast(ctx.expr(args[1], dtype="bool"), "bool")
        return ctx.call(op, a, b)

    return convert


_LOGICAL: list[tuple[str, str, Callable, Callable]] = [
    ("logical_and", "and", tir.And, lambda a, b: a & b),
    ("logical_or", "or", tir.Or, lambda a, b: a | b),
]
for _name, _aten, _fn, _np_fn in _LOGICAL:
    OPS.register(_name, bool_result(broadcast_rel(2)), Pattern.BROADCAST, 2,
                 compute=elemwise_compute(
                     lambda a, b, fn=_fn: fn(as_bool(a), as_bool(b)), _name),
                 evaluate=np_elemwise(
                     lambda a, b, fn=_np_fn: fn(np_as_bool(a), np_as_bool(b))))
    OPS.converter(f"aten.bitwise_{_aten}.Tensor", f"aten.logical_{_aten}.default")(
        _logical_converter(_name))


OPS.register("where", broadcast_rel(3), Pattern.BROADCAST, 3,
             compute=elemwise_compute(lambda c, x, y: tir.Select(as_bool(c), x, y), "where"),
             evaluate=np_elemwise(lambda c, x, y: np.where(np_as_bool(c), x, y)))


@OPS.converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
               "aten.where.Scalar")
def _convert_where(ctx: ImportContext, node, args, kwargs):
    dtype = ctx.out_dtype()
    cond = ctx.cast(args[0], "bool")
    x = ctx.cast(ctx.expr(args[1], dtype=dtype), dtype)
    y = ctx.cast(ctx.expr(args[2], dtype=dtype), dtype)
    return ctx.call("where", cond, x, y)


@OPS.converter("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default")
def _convert_full_like(ctx: ImportContext, node, args, kwargs) -> Any:
    # Only the shape of the input matters: the result is a constant.
    value = {"aten.zeros_like.default": 0, "aten.ones_like.default": 1}.get(
        str(node.target), args[1] if len(args) > 1 else None)
    return Constant(np.full(ctx.out_shape(), value, dtype=ctx.out_dtype()))
