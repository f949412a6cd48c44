"""Relay-style text form of a Function, so a person can read what each pass did:

    fn (%x: Tensor[(1, 3), float32]) {
      %0 = nn.dense(%x, meta[0]) /* ty=Tensor[(1, 4), float32] */;
      relu(%0) /* ty=Tensor[(1, 4), float32] */
    }
"""

from __future__ import annotations

from tecc.frontend.ir import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var, post_order


def _format_attr(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_format_attr(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def astext(func: Function, show_types: bool = True) -> str:
    names: dict[int, str] = {}
    constants: dict[int, int] = {}
    lines: list[str] = []

    def ref(node: Expr) -> str:
        if isinstance(node, Var):
            return f"%{node.name}"
        if isinstance(node, Constant):
            if node.tensor_type.size == 1:
                return f"{node.data.reshape(-1)[0].item()!r}"
            return f"meta[{constants.setdefault(id(node), len(constants))}]"
        return names[id(node)]

    body_nodes = [n for n in post_order(func.body) if not isinstance(n, Var | Constant)]
    for node in body_nodes:
        if isinstance(node, Call):
            args = [ref(a) for a in node.args]
            args += [f"{k}={_format_attr(v)}" for k, v in node.attrs.items()]
            if isinstance(node.op, Function):
                inner = astext(node.op, show_types=False).replace("\n", "\n  ")
                text = f"({inner})({', '.join(args)})"
            else:
                text = f"{node.op}({', '.join(args)})"
        elif isinstance(node, Tuple):
            text = "(" + ", ".join(ref(f) for f in node.fields) + ")"
        elif isinstance(node, TupleGetItem):
            text = f"{ref(node.tuple_value)}.{node.index}"
        elif isinstance(node, Function):
            inner = astext(node, show_types).replace("\n", "\n  ")
            text = inner
        else:
            raise TypeError(type(node).__name__)
        if show_types:
            text += f" /* ty={node.ty} */"
        if node is func.body:
            lines.append(f"  {text}")
        else:
            names[id(node)] = f"%{len(names)}"
            lines.append(f"  {names[id(node)]} = {text};")
    if not body_nodes:
        lines.append(f"  {ref(func.body)}")
    params = ", ".join(f"%{p.name}: {p.ty}" for p in func.params)
    attrs = "".join(f", {k}={_format_attr(v)}" for k, v in func.attrs.items())
    header = f"fn ({params}{attrs})"
    return header + " {\n" + "\n".join(lines) + "\n}"
