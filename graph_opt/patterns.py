"""Small pattern helpers shared by the graph passes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from tecc.frontend.ir import Call, Constant, Expr, Function, children, post_order


def is_op(expr: Expr, *names: str) -> bool:
    """`expr` is a call of one of the registered ops `names`."""
    return isinstance(expr, Call) and isinstance(expr.op, str) and expr.op in names


def scalar_value(expr: Expr) -> float | int | bool | None:
    """The value of a size-1 Constant (any rank), else None."""
    if isinstance(expr, Constant) and expr.tensor_type.size == 1:
        return expr.data.reshape(-1)[0].item()
    return None


def is_scalar(expr: Expr, value: float) -> bool:
    v = scalar_value(expr)
    return v is not None and not isinstance(v, bool) and v == value


def use_counts(func: Function) -> Counter[int]:
    """id(node) -> how many edges consume it; the function's result counts as a use,
    so an output is never treated as used only by its one consumer."""
    counts: Counter[int] = Counter()
    for node in post_order(func.body):
        for child in children(node):
            counts[id(child)] += 1
    counts[id(func.body)] += 1
    return counts


def const_array(expr: Expr) -> np.ndarray | None:
    return expr.data if isinstance(expr, Constant) else None


def is_reshape_only(prim: Function) -> bool:
    """A primitive function that only reshapes its one param: a view of its input's
    bytes, never a kernel (the build aliases it; it is no tuning task)."""
    body = prim.body
    return (isinstance(body, Call) and body.op == "reshape" and len(prim.params) == 1
            and body.args[0] is prim.params[0])


def reshaped(expr: Expr, shape: Sequence[int], span: str | None = None) -> Expr:
    """`expr` as `shape`: the tensor a reshape chain views, itself where it has that
    shape, a constant's data reshaped, else one reshape of it."""
    shape = tuple(shape)
    while is_op(expr, "reshape") and tuple(expr.shape) != shape:
        expr = expr.args[0]
    if tuple(expr.shape) == shape:
        return expr
    if isinstance(expr, Constant):
        return Constant(expr.data.reshape(shape))
    return Call("reshape", [expr], {"newshape": shape}, span=span)
