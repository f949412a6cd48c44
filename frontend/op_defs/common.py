"""What the op families share: type-relation building blocks, TE compute helpers
(the anchor annotation among them) and numpy evaluator helpers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tvm
from tecc.frontend.ops import Compute, Evaluator, TypeRel
from tecc.frontend.types import Attrs, IRTypeError, TensorType, Type
from tvm import te, topi
from tvm.tirx import const

# The block annotation of an anchor (a conv's, a dense's, a reduction's main block):
# the default schedule and the templates dispatch on its value, the anchor kind.
ANCHOR_ATTR = "tecc.anchor"
# The block annotation of an intermediate the op's template places itself (a packing,
# a row buffer read by several passes): the CPU schedule does not inline it first.
KEEP_ATTR = "tecc.keep"

# ---------------------------------------------------------------- type relations


def tensor_arg(ty: Type, what: str = "argument") -> TensorType:
    if not isinstance(ty, TensorType):
        raise IRTypeError(f"{what} must be a tensor, got {ty}")
    return ty


def arity(types: Sequence[Type], n: int) -> list[TensorType]:
    if len(types) != n:
        raise IRTypeError(f"expected {n} arguments, got {len(types)}")
    return [tensor_arg(t) for t in types]


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        dims = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise IRTypeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def same_type(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    return x


def bool_result(rel: TypeRel) -> TypeRel:
    def bool_rel(types: list[Type], attrs: Attrs) -> Type:
        return TensorType(tensor_arg(rel(types, attrs)).shape, "bool")

    return bool_rel


def broadcast_rel(n: int) -> TypeRel:
    def rel(types: list[Type], attrs: Attrs) -> Type:
        tensors = arity(types, n)
        value_types = tensors[1:] if n == 3 else tensors  # where(cond, x, y)
        dtypes = {t.dtype for t in value_types}
        if len(dtypes) != 1:
            raise IRTypeError(f"operand dtypes differ: {sorted(dtypes)}")
        return TensorType(broadcast_shapes(*(t.shape for t in tensors)), dtypes.pop())

    return rel


# ---------------------------------------------------------------- TE computes


def out_tensor(ty: Type) -> TensorType:
    assert isinstance(ty, TensorType), ty
    return ty


def is_float_dtype(dtype: object) -> bool:
    return str(dtype).startswith(("float", "bfloat"))


def te_shape(t: te.Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def bcast_index(t: te.Tensor, idx: Sequence[tvm.tirx.PrimExpr],
                out_shape: Sequence[int] | None = None) -> list:
    """Index into `t` for output index `idx` under numpy broadcasting (right-aligned;
    a size-1 dim reads element 0 only where the output dim is larger, so that an
    elementwise read stays an identity read, which the schedule relies on)."""
    shape = te_shape(t)
    lead = len(idx) - len(shape)
    return [0 if d == 1 and (out_shape is None or out_shape[lead + i] != 1) else idx[lead + i]
            for i, d in enumerate(shape)]


def read_broadcast(t: te.Tensor, idx: Sequence, out_shape: Sequence[int] | None = None
                   ) -> tvm.tirx.PrimExpr:
    return t[tuple(bcast_index(t, idx, out_shape))] if t.ndim else t()


def elemwise(args: list[te.Tensor], out_type: Type, fn: Callable, name: str) -> te.Tensor:
    out = out_tensor(out_type)
    return te.compute(out.shape, lambda *i: fn(*[read_broadcast(a, i, out.shape) for a in args]),
                      name=name)


def elemwise_compute(fn: Callable[..., tvm.tirx.PrimExpr], name: str) -> Compute:
    """The compute of an op applying `fn` to its (broadcast) operands' elements."""
    return lambda args, attrs, out_type: elemwise(args, out_type, fn, name.replace(".", "_"))


def scalar_constant(value: float | int | bool, dtype: str, shape: Sequence[int]) -> te.Tensor:
    """A size-1 IR Constant as an immediate: a block the schedule inlines away."""
    v = const(bool(value) if dtype == "bool" else value, dtype)
    return te.compute(tuple(shape), lambda *_: v, name="scalar_const")


def typed_const(v: float, dtype: str) -> tvm.tirx.PrimExpr:
    """`v` in `dtype` (truncated to an integer for integer dtypes)."""
    return const(v if is_float_dtype(dtype) else int(v), dtype)


def as_bool(x: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    return x if str(x.dtype) == "bool" else x != const(0, x.dtype)


# erf, exp and tanh as polynomials (topi.fast_erf, fast_exp, fast_tanh: within 3.3e-7
# relative error of float64 over [-20, 20] in float32, see the README): they
# vectorize, where tirx.erf / exp / tanh are a scalar libm call per element (half of
# a BERT intermediate dense layer's time went to its gelu epilogue, a fifth of a
# MobileNet's to its silu epilogues; 113K elements on 2 AVX2 cores: exp 283 us libm,
# 50 fast; tanh 656 and 44; relu 27). fast_exp keeps inf above log(FLT_MAX) and NaN.
FAST_MATH_DTYPES = ("float32",)


def unless_nan(x: Any, value: Any) -> tvm.tirx.PrimExpr:
    """`value`, or x where the float x is NaN: select(x >= -inf, value, x), the one
    ordered compare that fails for NaN alone. TVM's isnan builtin stops its vectorizer
    (the loop became a gather and scatter per lane: a NaN-keeping max pool ran
    scalar), and it folds x != x, or not(x >= -inf), to false."""
    x = x.asobject() if hasattr(x, "asobject") else x
    if not is_float_dtype(prim_dtype(x)):
        return value
    return tvm.tirx.Select(x >= const(-np.inf, prim_dtype(x)), value, x)


def _keep_nan(x: te.Tensor, y: te.Tensor, name: str) -> te.Tensor:
    """y, NaN where x is NaN: topi's fast_erf and fast_tanh clamp x first, and the
    clamp turns NaN into a bound on CUDA (its min / max return the other operand)
    and for erf on the CPU too."""
    return te.compute(x.shape, lambda *i: unless_nan(x[i], y[i]),
                      name=name)


def erf_of(x: te.Tensor) -> te.Tensor:
    if x.dtype in FAST_MATH_DTYPES:
        return _keep_nan(x, topi.fast_erf(x), "erf")
    return te.compute(x.shape, lambda *i: tvm.tirx.erf(x[i]), name="erf")


# topi.fast_exp's float32 polynomial (its constants): 2^n * p(f), x = n ln 2 + f
_EXP_CLAMP = (88.3762626647950, -88.3762626647949)
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)


def fast_exp(x: te.Tensor) -> te.Tensor:
    """topi.fast_exp with NaN kept on every target. topi ends in max(2^n * p(f), x),
    which keeps a NaN x on LLVM (a compare and select that returns x when the compare
    fails) but not on CUDA, whose max returns the other operand: softmax over a row
    holding NaN then gave numbers. The same compare and select, written out, costs
    the same on the CPU."""
    dtype = x.dtype

    def element(*i: Any) -> tvm.tirx.PrimExpr:
        v = x[i]
        clamped = tvm.tirx.max(tvm.tirx.min(v, const(_EXP_CLAMP[0], dtype)),
                               const(_EXP_CLAMP[1], dtype))
        n = tvm.tirx.floor(clamped * const(1.44269504088896341, dtype) + const(0.5, dtype))
        f = clamped - n * const(0.6931471805599453, dtype)
        y = const(_EXP_POLY[0], dtype)
        for c in _EXP_POLY[1:]:
            y = y * f + const(c, dtype)
        y = y * f * f + f + const(1.0, dtype)
        two_n = tvm.tirx.reinterpret(dtype, tvm.tirx.Cast("int32", n + const(127.0, dtype))
                                     << 23)
        r = two_n * y
        return tvm.tirx.Select(r > v, r, v)

    return te.compute(x.shape, element, name="T_fast_exp", tag="elemwise")


def exp_of(x: te.Tensor) -> te.Tensor:
    if x.dtype in FAST_MATH_DTYPES:
        return fast_exp(x)
    return te.compute(x.shape, lambda *i: tvm.tirx.exp(x[i]), name="exp")


def tanh_of(x: te.Tensor) -> te.Tensor:
    if x.dtype in FAST_MATH_DTYPES:
        return _keep_nan(x, topi.fast_tanh(x), "tanh")
    return te.compute(x.shape, lambda *i: tvm.tirx.tanh(x[i]), name="tanh")


def sigmoid_of(x: te.Tensor, name: str) -> te.Tensor:
    if x.dtype not in FAST_MATH_DTYPES:
        return te.compute(x.shape, lambda *i: tvm.tirx.sigmoid(x[i]), name=name)
    one = const(1.0, x.dtype)
    exp = exp_of(te.compute(x.shape, lambda *i: -x[i], name=f"{name}_neg"))
    return te.compute(x.shape, lambda *i: one / (one + exp[i]), name=name)


def pads4(padding: Sequence[int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from a 2- or 4-element padding attribute."""
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    return tuple(padding)  # type: ignore[return-value]


# ---------------------------------------------------------------- numpy evaluators


def np_is_float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def np_as_bool(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.bool_ else a != 0


def np_elemwise(fn: Callable[..., np.ndarray]) -> Evaluator:
    """The evaluator of an op applying `fn` to its operands (in their own dtype, as
    the kernel computes: float32 stays float32)."""
    return lambda args, attrs, ty: fn(*args)


# -- eager's NaN semantics: torch's max/min-based ops keep NaN (relu(NaN) = NaN, a pool
# window holding NaN gives NaN); LLVM's and CUDA's max/min return the other operand.

def prim_dtype(x: Any) -> str:
    """The dtype of an element expression: a tensor element (te's TensorSlice) or any
    PrimExpr (a call, a cast, an immediate)."""
    return str(x.dtype) if isinstance(x, te.tensor.TensorSlice) else str(x.ty.dtype)


def _is_float(x: tvm.tirx.PrimExpr) -> bool:
    return is_float_dtype(prim_dtype(x))


def _is_const(x: tvm.tirx.PrimExpr) -> bool:
    return isinstance(x, tvm.tirx.IntImm | tvm.tirx.FloatImm)


def _operands(a: tvm.tirx.PrimExpr, b: tvm.tirx.PrimExpr
              ) -> tuple[tvm.tirx.PrimExpr, tvm.tirx.PrimExpr]:
    return tuple(x.asobject() if hasattr(x, "asobject") else x for x in (a, b))  # te slices


def _nan_wins(a: tvm.tirx.PrimExpr, b: tvm.tirx.PrimExpr, larger: bool) -> tvm.tirx.PrimExpr:
    """max (`larger`) or min of a and b, NaN if either is NaN. Against a constant it is
    one compare and select that keeps the variable when the compare fails, as it does
    for NaN: LLVM makes that a single vmaxps / vminps with the operands in the order
    that returns the NaN, so relu, relu6 and clamp cost nothing more. Two variables
    need a NaN test each."""
    a, b = _operands(a, b)
    plain = tvm.tirx.max(a, b) if larger else tvm.tirx.min(a, b)
    if not _is_float(a):
        return plain
    if _is_const(a) and not _is_const(b):
        a, b = b, a
    if _is_const(b):
        return tvm.tirx.Select(b > a, b, a) if larger else tvm.tirx.Select(a > b, b, a)
    return unless_nan(a, unless_nan(b, plain))


def nan_max(a: tvm.tirx.PrimExpr, b: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """max(a, b) as torch computes it: NaN if either is NaN."""
    return _nan_wins(a, b, larger=True)


def nan_min(a: tvm.tirx.PrimExpr, b: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """min(a, b) as torch computes it: NaN if either is NaN."""
    return _nan_wins(a, b, larger=False)


def nan_clamp(x: tvm.tirx.PrimExpr, low: tvm.tirx.PrimExpr, high: tvm.tirx.PrimExpr
              ) -> tvm.tirx.PrimExpr:
    """min(max(x, low), high) as torch computes it, for constant bounds: NaN stays NaN."""
    return nan_min(nan_max(x, low), high)


# te.max / te.min over axes with torch's NaN semantics (max_pool2d's window; amax and amin
# reduce with plain ones and a NaN count instead, op_defs/reduce.py). rfactor
# does not know them (registering a Python combiner with TVM's reducer registry corrupts
# the heap at interpreter exit): a schedule that would rfactor them is refused, and the
# next one (or the generic schedule) is used.
nan_max_reduce = te.comm_reducer(nan_max, lambda t: tvm.tirx.min_value(t), name="nan_max")
nan_min_reduce = te.comm_reducer(nan_min, lambda t: tvm.tirx.max_value(t), name="nan_min")

