"""Evaluate op calls on numpy arrays, to fold constants at compile time.

Each op's evaluator is defined with the op (frontend/op_defs/), with the semantics of
its TE compute (which follows torch): integer division truncates, `take` wraps
negative indices and clamps, casts to bool test for non-zero, and so on. Every
result is cast to the dtype of the call's checked type, so a folded constant has
exactly the type of the call it replaces. Ops without an evaluator (pools, softmax,
normalizations) are simply not folded.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from tecc.frontend.ir import (
    Attrs,
    Call,
    Constant,
    Function,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    post_order,
)
from tecc.frontend.ops import OPS, Evaluator, NotFoldable

__all__ = ["EVALUATORS", "Evaluator", "NotFoldable", "evaluate_call", "evaluate_function",
           "has_evaluator"]

# op name -> evaluator, for every op that has one
EVALUATORS: Mapping[str, Evaluator] = MappingProxyType({
    name: OPS.get(name).evaluate for name in OPS.names() if OPS.get(name).evaluate is not None})


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


def evaluate_function(func: Function, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    """The outputs of `func` on `inputs`, evaluated op by op with the ops'
    evaluators; None when one of its ops has no evaluator."""
    env: dict[int, Any] = {id(p): np.asarray(x) for p, x in zip(func.params, inputs,
                                                                   strict=True)}
    for node in post_order(func.body):
        if id(node) in env:
            continue
        if isinstance(node, Constant):
            env[id(node)] = node.data
        elif isinstance(node, Call) and isinstance(node.op, str):
            value = evaluate_call(node.op, [env[id(a)] for a in node.args], node.attrs, node.ty)
            if value is None:
                return None
            env[id(node)] = value
        elif isinstance(node, Tuple):
            env[id(node)] = [env[id(f)] for f in node.fields]
        elif isinstance(node, TupleGetItem):
            env[id(node)] = env[id(node.tuple_value)][node.index]
        else:
            return None
    result = env[id(func.body)]
    return list(result) if isinstance(result, list) else [result]
