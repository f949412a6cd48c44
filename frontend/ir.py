"""The tecc graph IR: an immutable, typed dataflow language in the style of Relay.

Nodes are compared by identity (they are graph vertices); `structural_equal` and
`structural_hash` compare them by content. Every expression carries its type,
computed when it is built from the op's type relation, so a well-formed graph is
always type-checked. The types themselves are in frontend/types.py (exported here
too); an op is looked up by name in the registry (frontend/ops.py), which the op
definitions (frontend/op_defs/) fill when the package is imported.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tecc.frontend.ops import get_op
from tecc.frontend.types import Attrs, IRTypeError, Shape, TensorType, TupleType, Type

__all__ = ["Attrs", "Call", "Constant", "Expr", "Function", "IRTypeError", "Shape", "TensorType",
           "Tuple", "TupleGetItem", "TupleType", "Type", "Var", "children", "free_vars",
           "post_order", "rewrite", "structural_digest", "structural_equal", "structural_hash",
           "with_children"]


class Expr:
    """Base of all IR expressions. `ty` is the checked type."""

    ty: Type
    span: str | None = None

    # Identity semantics: an expression is a vertex of the dataflow graph.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    @property
    def tensor_type(self) -> TensorType:
        if not isinstance(self.ty, TensorType):
            raise IRTypeError(f"expected a tensor, got {self.ty}")
        return self.ty

    @property
    def shape(self) -> Shape:
        return self.tensor_type.shape

    @property
    def dtype(self) -> str:
        return self.tensor_type.dtype


@dataclass(eq=False, frozen=True)
class Var(Expr):
    name: str
    ty: Type

    def __repr__(self) -> str:
        return f"Var(%{self.name}: {self.ty})"


@dataclass(eq=False, frozen=True)
class Constant(Expr):
    data: np.ndarray
    ty: Type = field(init=False)

    def __post_init__(self) -> None:
        data = self.data
        if not isinstance(data, np.ndarray) or data.flags.writeable or not data.flags.c_contiguous:
            # A private read-only copy: constants are shared by rewritten graphs.
            data = np.array(data, order="C")
            data.setflags(write=False)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "ty", TensorType(data.shape, str(data.dtype)))

    def __repr__(self) -> str:
        return f"Constant({self.ty})"


@dataclass(eq=False, frozen=True)
class Call(Expr):
    """A call of a registered op (by name) or, after fusion, of a primitive Function
    (one kernel: its body is the fused group, Relay's convention)."""

    op: str | Function
    args: tuple[Expr, ...]
    attrs: Attrs = field(default_factory=Attrs)
    span: str | None = None
    ty: Type = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))
        if isinstance(self.op, Function):
            given = [a.ty for a in self.args]
            expected = [p.ty for p in self.op.params]
            if given != expected:
                raise IRTypeError(f"call of a function with {[str(t) for t in given]}, "
                                  f"expected {[str(t) for t in expected]}")
            object.__setattr__(self, "ty", self.op.ret_type)
            return
        opdef = get_op(self.op)
        attrs = opdef.check_attrs(self.attrs)
        object.__setattr__(self, "attrs", attrs)
        if opdef.num_inputs is not None and len(self.args) != opdef.num_inputs:
            raise IRTypeError(f"{self.op} takes {opdef.num_inputs} inputs, got {len(self.args)}")
        try:
            ty = opdef.type_rel([a.ty for a in self.args], attrs)
        except IRTypeError as err:
            where = f" at {self.span}" if self.span else ""
            raise IRTypeError(f"{self.op}{where}: {err}") from None
        object.__setattr__(self, "ty", ty)

    @property
    def op_name(self) -> str:
        return self.op if isinstance(self.op, str) else "fn"

    def __repr__(self) -> str:
        return f"Call({self.op_name}, {self.ty})"


@dataclass(eq=False, frozen=True)
class Tuple(Expr):
    fields: tuple[Expr, ...]
    ty: Type = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        object.__setattr__(self, "ty", TupleType(tuple(f.ty for f in self.fields)))


@dataclass(eq=False, frozen=True)
class TupleGetItem(Expr):
    tuple_value: Expr
    index: int
    ty: Type = field(init=False)

    def __post_init__(self) -> None:
        tt = self.tuple_value.ty
        if not isinstance(tt, TupleType) or not 0 <= self.index < len(tt.fields):
            raise IRTypeError(f"TupleGetItem index {self.index} out of range for {tt}")
        object.__setattr__(self, "ty", tt.fields[self.index])


@dataclass(eq=False, frozen=True)
class Function(Expr):
    params: tuple[Var, ...]
    body: Expr
    attrs: Attrs = field(default_factory=Attrs)
    ty: Type = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))
        object.__setattr__(self, "ty", self.body.ty)

    @property
    def ret_type(self) -> Type:
        return self.body.ty

    def with_attrs(self, **updates: Any) -> Function:
        return Function(self.params, self.body, self.attrs.with_(**updates))


# ---------------------------------------------------------------- traversal


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Call):
        return expr.args
    if isinstance(expr, Tuple):
        return expr.fields
    if isinstance(expr, TupleGetItem):
        return (expr.tuple_value,)
    return ()


def post_order(root: Expr) -> list[Expr]:
    """All expressions reachable from `root` (not entering nested Functions), each
    once, producers before consumers. Iterative: real models are deep."""
    order: list[Expr] = []
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for child in reversed(children(node)):
            if id(child) not in seen:
                stack.append((child, False))
    return order


def rewrite(func: Function, visit: Callable[[Expr, tuple[Expr, ...]], Expr | None]) -> Function:
    """Rebuild `func` bottom-up. `visit(old, new_children)` returns a replacement or
    None to keep the node (rebuilt only if its children changed)."""
    memo: dict[int, Expr] = {}
    for node in post_order(func.body):
        new_children = tuple(memo[id(c)] for c in children(node))
        replaced = visit(node, new_children)
        if replaced is None:
            replaced = with_children(node, new_children)
        memo[id(node)] = replaced
    return Function(func.params, memo[id(func.body)], func.attrs)


def with_children(node: Expr, new_children: tuple[Expr, ...]) -> Expr:
    """`node` with its children replaced; the same object if nothing changed."""
    old = children(node)
    if all(a is b for a, b in zip(old, new_children, strict=True)):
        return node
    if isinstance(node, Call):
        return Call(node.op, new_children, node.attrs, node.span)
    if isinstance(node, Tuple):
        return Tuple(new_children)
    if isinstance(node, TupleGetItem):
        return TupleGetItem(new_children[0], node.index)
    raise TypeError(f"cannot rebuild {type(node).__name__}")


def free_vars(expr: Expr) -> list[Var]:
    return [n for n in post_order(expr) if isinstance(n, Var)]


# ---------------------------------------------------------------- structural equality


def _digest(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def structural_digest(expr: Expr, var_index: dict[int, int] | None = None) -> str:
    """A content digest equal for structurally equal expressions: bound variables
    matched by position of first use, constants by value, shared subexpressions
    hashed once (so deep DAGs stay linear)."""
    var_index = {} if var_index is None else var_index
    if isinstance(expr, Function):
        for p in expr.params:
            var_index.setdefault(id(p), len(var_index))
        params = tuple((var_index[id(p)], str(p.ty)) for p in expr.params)
        return _digest("fn", expr.attrs, params, structural_digest(expr.body, var_index))
    digests: dict[int, str] = {}
    for node in post_order(expr):
        kids = tuple(digests[id(c)] for c in children(node))
        if isinstance(node, Var):
            key = ("var", var_index.setdefault(id(node), len(var_index)), str(node.ty))
        elif isinstance(node, Constant):
            key = ("const", str(node.ty), hashlib.sha256(node.data.tobytes()).hexdigest())
        elif isinstance(node, Call):
            op = node.op if isinstance(node.op, str) else structural_digest(node.op)
            key = ("call", op, node.attrs, kids)
        elif isinstance(node, Tuple):
            key = ("tuple", kids)
        elif isinstance(node, TupleGetItem):
            key = ("getitem", node.index, kids)
        elif isinstance(node, Function):
            key = ("fn", structural_digest(node, var_index))
        else:
            raise TypeError(type(node).__name__)
        digests[id(node)] = _digest(*key)
    return digests[id(expr)]


def structural_equal(a: Expr, b: Expr) -> bool:
    return structural_digest(a) == structural_digest(b)


def structural_hash(expr: Expr) -> int:
    return int(structural_digest(expr)[:16], 16)
