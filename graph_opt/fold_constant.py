"""fold_constants: evaluate at compile time every op call whose inputs are all
constants (graph_opt/evaluate.py), so that weight transforms, masks and tables cost
nothing at run time.
"""

from __future__ import annotations

import numpy as np
from tecc.frontend.ir import Call, Constant, Expr, Function, Tuple, TupleGetItem, TupleType, rewrite
from tecc.graph_opt.evaluate import evaluate_call, has_evaluator
from tecc.graph_opt.pass_manager import register_pass

# A folded result this much larger than its inputs, and above MAX_BLOWUP_BYTES, is
# left as a kernel: broadcasting a scalar to a big tensor is cheaper to compute than
# to store in the parameters and read back.
BLOWUP_FACTOR = 4
MAX_BLOWUP_BYTES = 1 << 20


def _too_big(node: Call, args: tuple[Constant, ...]) -> bool:
    types = node.ty.fields if isinstance(node.ty, TupleType) else (node.ty,)
    out_bytes = sum(t.nbytes for t in types)
    in_bytes = sum(a.tensor_type.nbytes for a in args)
    return out_bytes > BLOWUP_FACTOR * in_bytes and out_bytes > MAX_BLOWUP_BYTES


def _constant(value: np.ndarray) -> Expr:
    # Constant stores its data with np.ascontiguousarray, which turns a 0-d array
    # into shape (1,); a 0-d result (a full reduction) keeps its type as a reshape.
    if value.ndim == 0:
        return Call("reshape", (Constant(value.reshape(1)),), {"newshape": ()})
    return Constant(value)


@register_pass("fold_constants", opt_level=2)
def fold_constants(func: Function) -> Function:
    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        if isinstance(node, TupleGetItem):
            if isinstance(kids[0], Tuple):  # a folded split: take the field directly
                return kids[0].fields[node.index]
            return None
        if not isinstance(node, Call) or not isinstance(node.op, str):
            return None
        if not kids or not all(isinstance(k, Constant) for k in kids):
            return None
        if not has_evaluator(node.op) or _too_big(node, kids):  # type: ignore[arg-type]
            return None
        value = evaluate_call(node.op, [k.data for k in kids], node.attrs, node.ty)  # type: ignore[union-attr]
        if value is None:
            return None
        if isinstance(value, list):  # a tuple-valued op (split)
            return Tuple([_constant(v) for v in value])
        return _constant(value)

    return rewrite(func, visit)
