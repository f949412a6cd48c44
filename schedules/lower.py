"""Lower a primitive IR Function (one kernel's worth of ops) to a scheduled TIR PrimFunc.

Interface (used by tecc/build.py):
    lower_primitive(func, name, target) -> tvm.tirx.PrimFunc
`func.params` are the kernel inputs in order; the body is Calls (and Tuple /
TupleGetItem) over those params and size-1 Constants (scalars, inlined as immediates).
The PrimFunc's arguments are the params followed by the outputs (one, or one per
field when the body is a Tuple), and its "global_symbol" is `name`.
"""

from __future__ import annotations

import tvm
from tvm import te
from tvm.s_tir.schedule import Schedule

from frontend.ir import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var, post_order
from schedules.computes import get_compute, scalar_constant
from schedules.default import default_schedule

TensorOrTuple = te.Tensor | list[te.Tensor]


def build_te(func: Function, target: tvm.target.Target) -> tuple[list[te.Tensor],
                                                                   list[te.Tensor]]:
    """The TE graph of `func`: (placeholders in param order, output tensors)."""
    placeholders = [te.placeholder(p.shape, p.dtype, name=f"p{i}_{_safe(p.name)}")
                    for i, p in enumerate(func.params)]
    env: dict[int, TensorOrTuple] = {id(p): t for p, t in zip(func.params, placeholders,
                                                               strict=True)}
    with target:  # topi computes consult the target
        for node in post_order(func.body):
            if id(node) in env:
                continue
            env[id(node)] = _lower_node(node, env)
    result = env[id(func.body)]
    outputs = list(result) if isinstance(result, list) else [result]
    return placeholders, _distinct_outputs(outputs, placeholders)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)[:32]


def _lower_node(node: Expr, env: dict[int, TensorOrTuple]) -> TensorOrTuple:
    if isinstance(node, Var):
        raise ValueError(f"free variable %{node.name} is not a parameter of the function")
    if isinstance(node, Constant):
        if node.ty.size != 1:
            raise ValueError(f"only size-1 constants can be inlined, got {node.ty}; "
                             "pass larger ones as parameters")
        return scalar_constant(node.data.reshape(-1)[0].item(), node.dtype, node.shape)
    if isinstance(node, Call):
        args = []
        for a in node.args:
            t = env[id(a)]
            if isinstance(t, list):
                raise ValueError(f"{node.op}: a tuple argument needs a TupleGetItem")
            args.append(t)
        return get_compute(node.op)(args, node.attrs, node.ty)
    if isinstance(node, Tuple):
        fields: list[te.Tensor] = []
        for f in node.fields:
            t = env[id(f)]
            if isinstance(t, list):
                raise ValueError("nested tuples are not supported in a primitive function")
            fields.append(t)
        return fields
    if isinstance(node, TupleGetItem):
        t = env[id(node.tuple_value)]
        assert isinstance(t, list)
        return t[node.index]
    raise TypeError(f"cannot lower {type(node).__name__}")


def _distinct_outputs(outputs: list[te.Tensor], inputs: list[te.Tensor]) -> list[te.Tensor]:
    """Every output must be its own buffer: an output that is an input, or that
    appears twice, gets a copy."""
    seen: set = set(inputs)
    result = []
    for t in outputs:
        if t in seen:
            t = _copy(t)
        seen.add(t)
        result.append(t)
    return result


def lower_primitive(func: Function, name: str, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    placeholders, outputs = build_te(func, target)
    prim = te.create_prim_func(placeholders + outputs)
    sch = Schedule(tvm.IRModule({"main": prim}))
    sch = default_schedule(sch, target)
    return sch.mod["main"].with_attr("global_symbol", name)


def _copy(src: te.Tensor) -> te.Tensor:
    if src.ndim == 0:
        return te.compute((), lambda: src(), name="out_copy")
    return te.compute(src.shape, lambda *i: src[i], name="out_copy")
