"""Lower a primitive IR Function (one kernel's worth of ops) to a scheduled TIR PrimFunc.

Interface (used by tecc/build.py):
    lower_primitive(func, name, target, config=None) -> tvm.tirx.PrimFunc
    lower_primitive(func, name, target, config, return_info=True)
        -> (PrimFunc, [AppliedTemplate: block, kind, template, workload, space size,
                       config JSON, source])
`config` picks the anchor's schedule config: None (the template's fallback), a
Config or its JSON dict (for the kernel's one anchor), or a callback
`(workload dict, config space) -> config JSON | (config JSON, source) | list of
(config JSON, source) | None`, given the kernel's template config space so that it
picks only configs of it.
`func.params` are the kernel inputs in order; the body is Calls (and Tuple /
TupleGetItem) over those params and size-1 Constants (scalars, inlined as immediates).
The PrimFunc's arguments are the params followed by the outputs (one, or one per
field when the body is a Tuple), and its "global_symbol" is `name`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
from tecc.frontend.ir import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var, post_order
from tecc.schedules.blocks import anchor_kind, block_name, injective_anchor, root_blocks
from tecc.schedules.computes import ANCHOR_ATTR, get_compute, scalar_constant
from tecc.schedules.default import AppliedTemplate, default_schedule
from tecc.schedules.in_output import store_in_outputs
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import INJECTIVE_KIND, ScheduleContext, Template, templates_for
from tvm import te
from tvm.s_tir.schedule import Schedule

ConfigArg = Config | dict | Callable[[dict], Any] | None

TensorOrTuple = te.Tensor | list[te.Tensor]


def build_te(func: Function, target: tvm.target.Target,
             anchors: dict[str, tuple[Call, str]] | None = None
             ) -> tuple[list[te.Tensor], list[te.Tensor]]:
    """The TE graph of `func`: (placeholders in param order, output tensors).
    `anchors`, when given, receives anchor op name -> (IR call, anchor kind)."""
    placeholders = [te.placeholder(p.shape, p.dtype, name=f"p{i}_{_safe(p.name)}")
                    for i, p in enumerate(func.params)]
    env: dict[int, TensorOrTuple] = {id(p): t for p, t in zip(func.params, placeholders,
                                                               strict=True)}
    with target:  # topi computes consult the target
        for node in post_order(func.body):
            if id(node) in env:
                continue
            env[id(node)] = _lower_node(node, env)
            if anchors is not None and isinstance(node, Call):
                _note_anchors(node, env, anchors)
    result = env[id(func.body)]
    outputs = list(result) if isinstance(result, list) else [result]
    return placeholders, _distinct_outputs(outputs, placeholders)


def _note_anchors(node: Call, env: dict[int, TensorOrTuple],
                  anchors: dict[str, tuple[Call, str]]) -> None:
    """Record the anchor ops `node`'s compute created (walking back to its inputs)."""
    result = env[id(node)]
    stack = list(result) if isinstance(result, list) else [result]
    stop = set()
    for a in node.args:
        t = env.get(id(a))
        if isinstance(t, te.Tensor):
            stop.add(t.op)
    seen = set()
    while stack:
        t = stack.pop()
        op = t.op
        if op in seen or op in stop:
            continue
        seen.add(op)
        attrs = getattr(op, "attrs", None)
        if attrs is not None and ANCHOR_ATTR in attrs:
            anchors.setdefault(op.name, (node, str(attrs[ANCHOR_ATTR])))
        stack.extend(op.input_tensors)


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


def lower_primitive(func: Function, name: str, target: tvm.target.Target,
                    config: ConfigArg = None, return_info: bool = False):
    """The scheduled PrimFunc of `func` (see the module docstring); with
    `return_info`, also the list of AppliedTemplate (which config each anchor used)."""
    anchors: dict[str, tuple[Call, str]] = {}
    placeholders, outputs = build_te(func, target, anchors)
    prim = te.create_prim_func(placeholders + outputs)
    sch = Schedule(tvm.IRModule({"main": prim}))
    workloads = anchor_workloads(sch, anchors, func, target.kind.name)
    applied: list[AppliedTemplate] = []
    sch = default_schedule(sch, target, make_chooser(config), workloads, applied)
    prim = store_in_outputs(sch.mod["main"]).with_attr("global_symbol", name)
    return (prim, applied) if return_info else prim


def anchor_workloads(sch: Schedule, anchors: dict[str, tuple[Call, str]],
                     func: Function | None = None, target_kind: str = "llvm"
                     ) -> dict[str, dict[str, Any]]:
    """Block name -> workload dict for every anchor block with a template; for a group
    of injective ops only (given its Function `func`), its last output block -> the
    injective template's workload."""
    templates = templates_for(target_kind)
    by_kind: dict[str, list[Call]] = {}
    for call, kind in anchors.values():
        by_kind.setdefault(kind, []).append(call)
    result = {}
    group = injective_anchor(sch)
    if group is not None and func is not None and INJECTIVE_KIND in templates:
        call = Call(func, func.params)
        result[block_name(sch, group)] = templates[INJECTIVE_KIND].workload(call, INJECTIVE_KIND)
    for block in root_blocks(sch):
        stmt = sch.get(block)
        kind = anchor_kind(sch, block)
        template = None if kind is None else templates.get(kind)
        if template is None:
            continue
        found = anchors.get(stmt.name_hint)
        if found is None and len(by_kind.get(kind, [])) == 1:
            found = (by_kind[kind][0], kind)
        if found is not None:
            result[stmt.name_hint] = template.workload(found[0], kind)
    return result


def make_chooser(config: ConfigArg):
    """The default_schedule chooser for lower_primitive's `config` argument."""
    if config is None:
        return None

    def as_config(value: Any, space: ConfigSpace) -> Config:
        if isinstance(value, Config) and value.space is space:
            return value
        return space.from_json(dict(value))

    def choose(ctx: ScheduleContext, template: Template, space: ConfigSpace):
        value = config
        source = "given"
        if callable(value) and not isinstance(value, dict):
            if ctx.workload is None:
                return None, "fallback"
            value = value(ctx.workload, space)
            if isinstance(value, list):
                # candidates: the first whose layout this kernel has (a workload that
                # occurs after producers of different blocks got one choice per block)
                picked = [(as_config(v, space), s) for v, s in value]
                return next(((c, s) for c, s in picked if template.accepts(ctx, c)),
                            picked[0] if picked else (None, "fallback"))
            if isinstance(value, tuple):
                value, source = value
        if value is None:
            return None, "fallback"
        return as_config(value, space), source

    return choose


def _copy(src: te.Tensor) -> te.Tensor:
    if src.ndim == 0:
        return te.compute((), lambda: src(), name="out_copy")
    return te.compute(src.shape, lambda *i: src[i], name="out_copy")
