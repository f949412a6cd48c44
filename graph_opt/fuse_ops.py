"""Turn each group of ops that becomes one kernel into a primitive Function.

`primitive_per_op` makes one kernel per op (opt_level 0). Calls become
`Call(Function(params, body, Primitive=1), args)`; size-1 constants stay inside the
kernel as immediates, every other input becomes a kernel parameter.
"""

from __future__ import annotations

from frontend.ir import Call, Constant, Expr, Function, Var, rewrite


def is_primitive_call(expr: Expr) -> bool:
    return isinstance(expr, Call) and isinstance(expr.op, Function) and bool(
        expr.op.attrs.get("Primitive"))


def inlined_as_immediate(arg: Expr) -> bool:
    return isinstance(arg, Constant) and arg.tensor_type.size == 1


def primitive_per_op(func: Function) -> Function:
    """Every op call becomes its own kernel."""

    def visit(node: Expr, new_children: tuple[Expr, ...]) -> Expr | None:
        if not isinstance(node, Call) or not isinstance(node.op, str):
            return None
        inputs = [a for a in new_children if not inlined_as_immediate(a)]
        unique_inputs = list({id(a): a for a in inputs}.values())
        params = [Var(f"p{i}", a.ty) for i, a in enumerate(unique_inputs)]
        by_id = {id(a): p for a, p in zip(unique_inputs, params, strict=True)}
        inner = Call(node.op, [by_id.get(id(a), a) for a in new_children], node.attrs, node.span)
        prim = Function(params, inner, {"Primitive": 1, "name_hint": node.op.replace(".", "_")})
        return Call(prim, unique_inputs, span=node.span)

    return rewrite(func, visit)
