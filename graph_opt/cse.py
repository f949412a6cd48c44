"""eliminate_common_subexpr and eliminate_dead_code.

CSE: two calls of the same op with the same attributes on the same (already merged)
arguments compute the same value, so the second is replaced by the first. Small
constants are merged by value first, so `where(m, 0.0, -inf)` built twice by the
importer (each with its own scalar constants) is still recognized as one. The ops
are pure, so merging is always safe.

DCE: the IR is built from the function body, so nodes nothing reaches are already
gone once the function is rebuilt; what remains is to forward tuple items of
explicit tuples, which leaves unused tuple fields (and the tuple) unreachable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

from tecc.frontend.ir import Call, Constant, Expr, Function, Tuple, TupleGetItem, rewrite
from tecc.graph_opt.pass_manager import register_pass

# Constants up to this size are compared by value (hashing weights would cost time
# for no gain: two distinct weight tensors are practically never equal).
MAX_MERGED_CONSTANT_BYTES = 4096


def _key(node: Expr, kids: tuple[Expr, ...]) -> Hashable | None:
    if isinstance(node, Call):
        op = node.op if isinstance(node.op, str) else id(node.op)
        return ("call", op, node.attrs, tuple(id(k) for k in kids))
    if isinstance(node, Tuple):
        return ("tuple", tuple(id(k) for k in kids))
    if isinstance(node, TupleGetItem):
        return ("getitem", node.index, id(kids[0]))
    if isinstance(node, Constant) and node.tensor_type.nbytes <= MAX_MERGED_CONSTANT_BYTES:
        digest = hashlib.sha256(node.data.tobytes()).hexdigest()
        return ("const", node.shape, node.dtype, digest)
    return None  # Vars, large constants, functions: identity is the only equality


@register_pass("eliminate_common_subexpr", opt_level=2)
def eliminate_common_subexpr(func: Function) -> Function:
    # Keys hold ids of nodes kept alive by `seen` (and the rewrite memo), so an id is
    # never reused for a different node during the pass.
    seen: dict[Hashable, Expr] = {}

    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        key = _key(node, kids)
        if key is None:
            return None
        if key in seen:
            return seen[key]
        if isinstance(node, Call):
            rebuilt: Expr = node if all(a is b for a, b in zip(node.args, kids, strict=True)) \
                else Call(node.op, kids, node.attrs, node.span)
        elif isinstance(node, Tuple):
            rebuilt = node if all(a is b for a, b in zip(node.fields, kids, strict=True)) \
                else Tuple(kids)
        elif isinstance(node, TupleGetItem):
            rebuilt = node if node.tuple_value is kids[0] else TupleGetItem(kids[0], node.index)
        else:
            rebuilt = node
        seen[key] = rebuilt
        return rebuilt

    return rewrite(func, visit)


@register_pass("eliminate_dead_code", opt_level=0)
def eliminate_dead_code(func: Function) -> Function:
    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        # (a, b).0 -> a: the tuple stays only if something else still uses it, in
        # particular the function's own output tuple is never touched.
        if isinstance(node, TupleGetItem) and isinstance(kids[0], Tuple):
            return kids[0].fields[node.index]
        return None

    # Rebuilt from the body: unreachable nodes vanish. Parameters are the function's
    # interface, so unused ones stay.
    return rewrite(func, visit)
