"""A numpy evaluator for op calls, used to fold constants at compile time.

One function per op name, with the semantics of the op's TE compute in
schedules/computes.py (which follows torch): integer division truncates, `take`
wraps negative indices and clamps, casts to bool test for non-zero, and so on.
Every result is cast to the dtype of the call's checked type, so a folded constant
has exactly the type of the call it replaces. Ops without an evaluator here (conv2d,
pools, softmax, normalizations) are simply not folded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from tecc.frontend.ir import Attrs, TensorType, TupleType, Type
from tecc.frontend.ops import normalize_axis, reduce_axes

# args, attrs, checked output type -> result (a list of arrays for tuple results)
Evaluator = Callable[[list[np.ndarray], Attrs, Type], "np.ndarray | list[np.ndarray]"]
EVALUATORS: dict[str, Evaluator] = {}


class NotFoldable(Exception):
    """The evaluator declines (e.g. integer division by zero): leave the call as is."""


def evaluator(*names: str) -> Callable[[Evaluator], Evaluator]:
    def register(fn: Evaluator) -> Evaluator:
        for name in names:
            EVALUATORS[name] = fn
        return fn

    return register


def has_evaluator(op: str) -> bool:
    return op in EVALUATORS


def evaluate_call(op: str, args: list[np.ndarray], attrs: Attrs, out_type: Type
                  ) -> np.ndarray | list[np.ndarray] | None:
    """The value of `op(*args)`, with exactly `out_type`'s dtype and shape; None when
    the op has no evaluator or declines."""
    fn = EVALUATORS.get(op)
    if fn is None:
        return None
    try:
        with np.errstate(all="ignore"):  # inf/nan are legitimate constant values
            result = fn(args, attrs, out_type)
    except (NotFoldable, OverflowError):  # e.g. clip of an int tensor to +-inf
        return None
    if isinstance(out_type, TupleType):
        assert isinstance(result, list)
        return [_conform(r, t) for r, t in zip(result, out_type.fields, strict=True)]
    assert isinstance(out_type, TensorType)
    return _conform(np.asarray(result), out_type)


def _conform(value: np.ndarray, ty: Type) -> np.ndarray:
    assert isinstance(ty, TensorType)
    value = np.asarray(value)
    if value.dtype != np.dtype(ty.dtype):
        value = value.astype(ty.dtype)
    if value.shape != ty.shape:  # e.g. a 0-d numpy scalar for a (1,) type
        value = np.broadcast_to(value, ty.shape)
    return np.array(value, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)


def _is_float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def _out_dtype(ty: Type) -> np.dtype:
    assert isinstance(ty, TensorType)
    return np.dtype(ty.dtype)


def _as_bool(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.bool_ else a != 0


# ---------------------------------------------------------------- elementwise


def _unary(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    # Evaluated in the input's own dtype (float32 stays float32), as the kernel does.
    evaluator(name)(lambda args, attrs, ty: fn(args[0]))


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; constants are small, so a vectorized math.erf is enough.
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    one = x.dtype.type(1)
    return one / (one + np.exp(-x))


_unary("negative", np.negative)
_unary("abs", np.abs)
_unary("exp", np.exp)
_unary("log", np.log)
_unary("sqrt", np.sqrt)
_unary("rsqrt", lambda x: x.dtype.type(1) / np.sqrt(x))
_unary("sigmoid", _sigmoid)
_unary("tanh", np.tanh)
_unary("erf", _erf)
_unary("relu", lambda x: np.maximum(x, x.dtype.type(0)))
_unary("reciprocal", lambda x: x.dtype.type(1) / x)
_unary("silu", lambda x: x * _sigmoid(x))
_unary("hardswish", lambda x: x * np.clip(x + 3, 0, 6) / 6)
_unary("hardsigmoid", lambda x: np.clip(x / 6 + 0.5, 0, 1))
_unary("copy", lambda x: x)
_unary("logical_not", lambda x: ~_as_bool(x))


@evaluator("gelu")
def _gelu(args, attrs, ty):
    (x,) = args
    x64 = x.astype(np.float64)
    if attrs["approximate"] == "tanh":
        k = math.sqrt(2.0 / math.pi)
        return 0.5 * x64 * (1.0 + np.tanh(k * (x64 + 0.044715 * x64 ** 3)))
    return 0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))


@evaluator("clip")
def _clip(args, attrs, ty):
    (x,) = args
    lo, hi = attrs["a_min"], attrs["a_max"]
    if not _is_float(x):
        lo, hi = int(lo), int(hi)
    return np.minimum(np.maximum(x, x.dtype.type(lo)), x.dtype.type(hi))


@evaluator("leaky_relu")
def _leaky_relu(args, attrs, ty):
    (x,) = args
    return np.where(x > 0, x, x * x.dtype.type(attrs["alpha"]))


@evaluator("cast")
def _cast(args, attrs, ty):
    (x,) = args
    if attrs["dtype"] == "bool":
        return x != 0  # torch: non-zero is True (0.5 -> True, not truncated)
    return x.astype(attrs["dtype"])


def _binary(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    evaluator(name)(lambda args, attrs, ty: fn(args[0], args[1]))


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if _is_float(a):
        return a / b
    if np.any(b == 0):
        raise NotFoldable("integer division by zero")
    q = np.abs(a) // np.abs(b)  # truncating division, as C and TVM's truncdiv
    return np.where((a < 0) != (b < 0), -q, q)


def _floor_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if _is_float(a):
        return np.floor(a / b)
    if np.any(b == 0):
        raise NotFoldable("integer division by zero")
    return np.floor_divide(a, b)


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if _is_float(a):
        return np.power(a, b)
    # integer powers through float64, rounded, as the kernel computes them
    return np.round(np.power(a.astype(np.float64), b.astype(np.float64)))


_binary("add", np.add)
_binary("subtract", np.subtract)
_binary("multiply", np.multiply)
_binary("divide", _divide)
_binary("power", _power)
_binary("maximum", np.maximum)
_binary("minimum", np.minimum)
_binary("floor_divide", _floor_divide)
_binary("equal", np.equal)
_binary("not_equal", np.not_equal)
_binary("less", np.less)
_binary("less_equal", np.less_equal)
_binary("greater", np.greater)
_binary("greater_equal", np.greater_equal)
_binary("logical_and", lambda a, b: _as_bool(a) & _as_bool(b))
_binary("logical_or", lambda a, b: _as_bool(a) | _as_bool(b))


@evaluator("where")
def _where(args, attrs, ty):
    cond, x, y = args
    return np.where(_as_bool(cond), x, y)


@evaluator("layout_transform")
def _layout_transform(args, attrs, ty):
    from tecc.graph_opt.layout import layout_transform_numpy  # layout imports the registry

    return layout_transform_numpy(args[0], attrs["src_layout"], attrs["dst_layout"])


@evaluator("nn.bias_add")
def _bias_add(args, attrs, ty):
    x, b = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    shape = [1] * x.ndim
    shape[axis] = b.shape[0]
    return x + b.reshape(shape)


@evaluator("nn.dense")
def _dense(args, attrs, ty):
    x, w = args
    return np.matmul(x, w.T)


@evaluator("nn.dense_pack")
def _dense_pack(args, attrs, ty):
    x, wp = args
    nc, k, nb = wp.shape
    return np.matmul(x, wp.transpose(0, 2, 1).reshape(nc * nb, k).T)


@evaluator("nn.matmul")
def _matmul(args, attrs, ty):
    a, b = args
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


# ---------------------------------------------------------------- reductions


def _reduction(name: str, fn: Callable[..., np.ndarray]) -> None:
    @evaluator(name)
    def _reduce(args, attrs, ty):
        (x,) = args
        axes = reduce_axes(attrs, x.ndim)
        if not axes:  # nothing to reduce: the input, as torch and the kernel do
            return x
        if _is_float(x) and name in ("sum", "mean", "prod"):
            x = x.astype(np.float64)  # accumulate precisely, round once at the end
        return fn(x, axis=axes, keepdims=attrs["keepdims"])


_reduction("sum", np.sum)
_reduction("mean", np.mean)
_reduction("max", np.max)
_reduction("min", np.min)
_reduction("prod", np.prod)


@evaluator("variance")
def _variance(args, attrs, ty):
    (x,) = args
    axes = reduce_axes(attrs, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    x64 = x.astype(np.float64)
    mean = np.mean(x64, axis=axes, keepdims=True)
    sq = np.sum((x64 - mean) ** 2, axis=axes, keepdims=attrs["keepdims"])
    denom = max(n - attrs["correction"], 0)
    return sq / np.float64(denom)  # 0.0 gives inf/nan as torch does


# ---------------------------------------------------------------- injective


@evaluator("take")
def _take(args, attrs, ty):
    data, indices = args
    axis = normalize_axis(attrs["axis"], data.ndim)
    dim = data.shape[axis]
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)  # python-style negative indices...
    idx = np.clip(idx, 0, dim - 1)  # ...then clamp, as the kernel: never out of bounds
    return np.take(data, idx, axis=axis)


@evaluator("reshape")
def _reshape(args, attrs, ty):
    return args[0].reshape(tuple(attrs["newshape"]))


@evaluator("transpose")
def _transpose(args, attrs, ty):
    (x,) = args
    return np.transpose(x, [normalize_axis(a, x.ndim) for a in attrs["axes"]])


@evaluator("broadcast_to")
def _broadcast_to(args, attrs, ty):
    return np.broadcast_to(args[0], tuple(attrs["shape"]))


@evaluator("strided_slice")
def _strided_slice(args, attrs, ty):
    (x,) = args
    index = [slice(None)] * x.ndim
    for axis, begin, end, step in zip(attrs["axes"], attrs["begin"], attrs["end"],
                                      attrs["strides"], strict=True):
        index[normalize_axis(axis, x.ndim)] = slice(begin, end, step)
    return x[tuple(index)]


@evaluator("concatenate")
def _concatenate(args, attrs, ty):
    return np.concatenate(args, axis=normalize_axis(attrs["axis"], args[0].ndim))


@evaluator("split")
def _split(args, attrs, ty):
    (x,) = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    bounds = np.cumsum(attrs["sizes"])[:-1]
    return list(np.split(x, bounds, axis=axis))
