"""Tuning tasks: one per distinct workload of a model (DESIGN.md, "Tasks and workload
keys"), each able to build its anchor alone with any config of its space.

    tasks = extract_tasks(fused_func, target)    # a fused model or one primitive Function
    t = tasks[0]
    t.workload, t.template, t.space, t.fallback_config()
    prim = t.build_primfunc(config)              # anchor-only kernel, scheduled by config
    inputs = t.reference_inputs(seed)            # canonical layout (NCHW, W[N, K])
    expected = t.reference_outputs(inputs)       # numpy
    k_in, k_out = t.adapt_io(config, inputs, expected)   # in the config's layout

A task's `func` is the anchor alone in canonical terms: its params are Vars for the
anchor's inputs (weights included) in NCHW / unpacked layouts. Where a template has
layout knobs (a conv's ic_bn/oc_bn, a dense's packing block tile_n) the kernel a
config builds takes its inputs in that config's layout; `adapt_io` converts the
canonical reference arrays to it (numpy), so every candidate is checked against one
reference. A group of injective ops only (no anchor: layout transforms, elementwise
chains) is a task of the "injective" template: its `func` is the group's primitive
Function, keyed by its input and output shapes and dtypes (the first group of a key
stands for all). Tasks satisfy autotune.task.TunableTask and pickle (IR, dicts and a
target JSON dict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tecc.frontend.ir import (
    Call,
    Function,
    TensorType,
    Var,
    post_order,
)
from tecc.graph_opt.dense_pack import dense_pack_attrs, pack_dense_weight
from tecc.graph_opt.evaluate import evaluate_call, evaluate_function
from tecc.graph_opt.layout import (
    layout_name,
    pack_conv_weight,
    pack_depthwise_weight,
    pack_winograd_weight,
    to_nchwc,
)
from tecc.graph_opt.patterns import is_reshape_only
from tecc.schedules.blocks import anchor_kind, inline_injective, shared_exp
from tecc.schedules.lower import anchor_workloads, build_te, lower_primitive
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import INJECTIVE_KIND, ScheduleContext, Template, templates_for
from tecc.schedules.templates_conv import conv_blocks
from tecc.schedules.templates_dense import dense_pack_block
from tvm import te
from tvm.s_tir.schedule import Schedule

from tecc.canonical import canonical_json
from tecc.target import resolve_target, target_info, target_to_json

# Templates whose kernel takes NCHW{c}c data (a config's blocks pick the layout).
CONV_TEMPLATES = ("conv2d_NCHWc", "depthwise_conv2d_NCHWc", "conv2d_winograd_NCHWc")
# Templates whose workload is in NCHW conv terms (templates_conv.conv_workload).
CONV_WORKLOAD_TEMPLATES = ("conv2d", *CONV_TEMPLATES)


def workload_json(workload: dict[str, Any]) -> str:
    """Canonical JSON of a workload (the same as autotune.records.workload_key)."""
    return canonical_json(workload)


def _as_target(target: Any) -> tvm.target.Target:
    if isinstance(target, tvm.target.Target):
        return target
    return tvm.target.Target(dict(target))


@dataclass
class Task:
    name: str
    workload: dict[str, Any]
    template: str
    kind: str  # the anchor kind the template serves (e.g. dense_pack, matmul_nt)
    func: Function  # the anchor alone, canonical layout
    target: dict[str, Any]
    _space: ConfigSpace | None = field(default=None, repr=False, compare=False)

    # -- what the template sees
    @property
    def tvm_target(self) -> tvm.target.Target:
        return _as_target(self.target)

    @property
    def template_obj(self) -> Template:
        return templates_for(self.tvm_target.kind.name)[self.template]

    def _context(self, func: Function) -> ScheduleContext:
        target = self.tvm_target
        anchors: dict[str, tuple[Call, str]] = {}
        placeholders, outputs = build_te(func, target, anchors)
        sch = Schedule(tvm.IRModule({"main": te.create_prim_func(placeholders + outputs)}))
        workloads = anchor_workloads(sch, anchors, func, target.kind.name)
        # as schedules/default.py does for the CPU
        inline_injective(sch, keep=shared_exp if target.kind.name == "llvm" else None)
        for name, wl in workloads.items():
            block = sch.get_sblock(name)
            kind = anchor_kind(sch, block) or INJECTIVE_KIND
            return ScheduleContext.create(sch, block, target, kind, wl)
        raise ValueError(f"task {self.name}: no anchor block with a template")

    @property
    def space(self) -> ConfigSpace:
        if self._space is None:
            ctx = self._context(self.kernel_func(None))
            self._space = self.template_obj.define_space(ctx)
        return self._space

    def fallback_config(self) -> Config:
        ctx = self._context(self.kernel_func(None))
        return self.space.from_json(self.template_obj.fallback(self.space, ctx).to_json())

    def config(self, value: Config | dict[str, Any] | None) -> Config:
        if value is None:
            return self.fallback_config()
        if isinstance(value, Config) and value.space is self.space:
            return value
        return self.space.from_json(dict(value))

    # -- the kernel for a config
    def kernel_func(self, config: Config | dict[str, Any] | None) -> Function:
        """The anchor-only Function in the layout `config` wants (None: the default
        layout, which the fallback config has)."""
        if self.template not in CONV_TEMPLATES and self.kind != "dense_pack":
            return self.func
        call = self.func.body
        assert isinstance(call, Call)
        wl = self.workload
        info = target_info(self.tvm_target)
        lanes = info.vector_lanes("float32")
        if self.template in CONV_TEMPLATES:
            blocks = conv_blocks(wl, dict(config), lanes) if config is not None else None
            if blocks is None:
                blocks = conv_blocks(wl, self.template_obj.fallback_values(wl, lanes), lanes)
            return _conv_nchwc_func(call, wl, blocks)
        if self.kind == "dense_pack":
            nb = dense_pack_block(wl, None if config is None else dict(config), lanes,
                                  info.cores)
            x, w = self.func.params
            n, k = w.shape
            xv = Var(x.name, x.ty)
            wv = Var(w.name + "_packed", TensorType((-(-n // nb), k, nb), w.dtype))
            return Function([xv, wv], Call("nn.dense_pack", [xv, wv], dense_pack_attrs(n, nb)))
        return self.func

    def build_primfunc(self, config: Config | dict[str, Any]) -> tvm.tirx.PrimFunc:
        """The anchor scheduled with `config` (raises if the template refuses it)."""
        cfg = self.config(config)
        prim, applied = lower_primitive(self.kernel_func(cfg), self.name, self.tvm_target,
                                        cfg.to_json(), return_info=True)
        used = [a for a in applied if a.template == self.template]
        if not used or used[0].source != "given":
            error = used[0].error if used else "no anchor"
            raise RuntimeError(f"template {self.template} refused config {cfg.to_json()}: "
                               f"{error}")
        return prim

    # -- reference data
    def reference_inputs(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        out = []
        for p in self.func.params:
            if str(p.dtype).startswith("float"):
                out.append(rng.uniform(-1.0, 1.0, size=p.shape).astype(p.dtype))
            else:
                out.append(rng.integers(1, 5, size=p.shape).astype(p.dtype))
        return out

    def reference_outputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.template == INJECTIVE_KIND:
            value = evaluate_function(self.func, inputs)
            return value if value is not None else self._run_fallback(inputs)
        call = self.func.body
        assert isinstance(call, Call)
        value = evaluate_call(call.op, [np.asarray(x) for x in inputs], call.attrs, call.ty)
        if value is not None:
            return value if isinstance(value, list) else [value]
        return self._run_fallback(inputs)

    def _run_fallback(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Outputs of the fallback config's kernel (for ops numpy cannot evaluate), on
        the CPU: a GPU task's reference must not need the GPU under test."""
        target = self.tvm_target
        if target.kind.name != "llvm":
            target = resolve_target("llvm")
        prim = lower_primitive(self.func, "ref", target)
        ex = tvm.compile(tvm.IRModule({"ref": prim}), target=target)
        dev = tvm.cpu()
        ty = self.func.ret_type
        fields = getattr(ty, "fields", None) or (ty,)
        outs = [tvm.runtime.tensor(np.zeros(t.shape, t.dtype), dev) for t in fields]
        ex["ref"](*[tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs], *outs)
        return [o.numpy() for o in outs]

    def adapt_io(self, config: Config | dict[str, Any], inputs: list[np.ndarray],
                 expected: list[np.ndarray] | None
                 ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """Canonical reference inputs/outputs in the layout of `config`'s kernel."""
        cfg = self.config(config)
        kernel = self.kernel_func(cfg)
        if kernel is self.func:
            return inputs, expected
        if self.kind == "dense_pack":
            nb = kernel.params[1].shape[2]
            return [inputs[0], pack_dense_weight(inputs[1], nb)], expected
        call = kernel.body
        ic = kernel.params[0].shape[4]
        oc = call.ty.shape[4]
        if self.template == "depthwise_conv2d_NCHWc":
            weight = pack_depthwise_weight(inputs[1], oc)
        elif "winograd_tile" in self.workload:
            weight = pack_winograd_weight(inputs[1], ic, oc, self.workload["winograd_tile"])
        else:
            weight = pack_conv_weight(inputs[1], ic, oc)
        new_inputs = [to_nchwc(inputs[0], ic), weight]
        new_expected = None if expected is None else [to_nchwc(expected[0], oc)]
        return new_inputs, new_expected

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "template": self.template, "workload": self.workload,
                "space_size": len(self.space)}


def _conv_nchwc_func(call: Call, wl: dict[str, Any], blocks: tuple[int, int]) -> Function:
    ic, oc = blocks
    n, c, h, w = wl["data"]
    o, ipg, kh, kw = wl["kernel"]
    dtype = wl["dtype"]
    depthwise = wl["template"] == "depthwise_conv2d_NCHWc"
    data = Var("data", TensorType((n, c // ic, h, w, ic), dtype))
    tile = wl.get("winograd_tile", 0)
    if depthwise:
        kshape = (c // oc, 1, kh, kw, 1, oc)
    elif tile:
        alpha = tile + kh - 1
        kshape = (alpha, alpha, o // oc, ipg // ic, ic, oc)
    else:
        kshape = (o // oc, ipg // ic, kh, kw, ic, oc)
    kernel = Var("kernel", TensorType(kshape, dtype))
    attrs = dict(call.attrs)
    attrs.update(data_layout=layout_name(ic), out_layout=layout_name(oc), winograd_tile=tile)
    return Function([data, kernel], Call("nn.conv2d_NCHWc", [data, kernel], attrs))


def _canonical_anchor(call: Call, template: str, workload: dict[str, Any]) -> Function:
    """The anchor alone, inputs as Vars, in canonical layout (NCHW conv, W[N, K]); for
    an injective group (`call` of its primitive Function), the group itself."""
    if template == INJECTIVE_KIND:
        assert isinstance(call.op, Function)
        return call.op
    if template in CONV_WORKLOAD_TEMPLATES:
        attrs = {k: v for k, v in dict(call.attrs).items()
                 if k not in ("data_layout", "out_layout", "winograd_tile")}
        data = Var("data", TensorType(tuple(workload["data"]), workload["dtype"]))
        weight = Var("weight", TensorType(tuple(workload["kernel"]), workload["dtype"]))
        return Function([data, weight], Call("nn.conv2d", [data, weight], attrs))
    if call.op == "nn.dense_pack":
        (x_shape, x_dtype), (w_shape, w_dtype) = workload["inputs"]
        x = Var("x", TensorType(tuple(x_shape), x_dtype))
        w = Var("weight", TensorType(tuple(w_shape), w_dtype))
        return Function([x, w], Call("nn.dense", [x, w]))
    params = [Var(f"in{i}", a.ty) for i, a in enumerate(call.args)]
    return Function(params, Call(call.op, params, call.attrs))


def anchors_of(prim: Function, target: tvm.target.Target) -> list[tuple[Call, str, Template]]:
    """The anchor IR calls of a primitive Function that have a template; a group of
    injective ops only gives one pseudo-anchor: the call of `prim` on its params,
    kind "injective"."""
    templates = templates_for(target.kind.name)
    anchors: dict[str, tuple[Call, str]] = {}
    placeholders, outputs = build_te(prim, target, anchors)
    found = [(call, kind, templates[kind]) for call, kind in anchors.values()
             if kind in templates]
    if not anchors and INJECTIVE_KIND in templates:
        sch = Schedule(tvm.IRModule({"main": te.create_prim_func(placeholders + outputs)}))
        wl = anchor_workloads(sch, {}, prim, target.kind.name)
        if wl:
            found.append((Call(prim, prim.params), INJECTIVE_KIND, templates[INJECTIVE_KIND]))
    return found


def extract_tasks(func: Function, target: Any) -> list[Task]:
    """One Task per distinct workload of `func`: a fused model Function (calls of
    primitive Functions) or a single primitive Function."""
    tgt = resolve(target)
    prims = [n.op for n in post_order(func.body) if isinstance(n, Call)
             and isinstance(n.op, Function)]
    if not prims:
        prims = [func]
    tasks: dict[str, Task] = {}
    seen: set[int] = set()
    for prim in prims:
        if id(prim) in seen:
            continue
        seen.add(id(prim))
        if is_reshape_only(prim):  # a view, no kernel
            continue
        for call, kind, template in anchors_of(prim, tgt):
            wl = template.workload(call, kind)
            key = workload_json(wl)
            if key in tasks or not template.tunable(wl):
                continue
            # a dense on a constant weight is packed at compile time (dense_pack)
            task_kind = "dense_pack" if kind in ("dense", "dense_pack") and (
                call.op == "nn.dense_pack") else kind
            tasks[key] = Task(f"{template.name}_{len(tasks)}", wl, template.name, task_kind,
                              _canonical_anchor(call, template.name, wl),
                              target_to_json(tgt))
    return list(tasks.values())


def task_from_workload(workload: dict[str, Any], target: Any, name: str | None = None) -> Task:
    """A Task for a workload dict of the dense, matmul, batch_matmul or conv templates
    (e.g. read back from a tuning record)."""
    tgt = resolve(target)
    template = workload["template"]
    name = name or template
    if template == INJECTIVE_KIND:
        raise ValueError("an injective workload names shapes, not ops: its task comes from "
                         "the model (extract_tasks), not from the workload alone")
    if template in CONV_WORKLOAD_TEMPLATES:
        d = Var("data", TensorType(tuple(workload["data"]), workload["dtype"]))
        w = Var("weight", TensorType(tuple(workload["kernel"]), workload["dtype"]))
        attrs = {"strides": tuple(workload["strides"]), "padding": tuple(workload["padding"]),
                 "dilation": tuple(workload["dilation"]), "groups": workload["groups"]}
        func = Function([d, w], Call("nn.conv2d", [d, w], attrs))
        return Task(name, workload, template, template, func, target_to_json(tgt))
    (a_shape, a_dtype), (b_shape, b_dtype) = workload["inputs"]
    a = Var("in0", TensorType(tuple(a_shape), a_dtype))
    b = Var("in1", TensorType(tuple(b_shape), b_dtype))
    if template == "dense":
        # a CPU dense packs its constant weight at compile time; a GPU one does not
        kind = "dense_pack" if tgt.kind.name == "llvm" else "dense"
        func = Function([a, b], Call("nn.dense", [a, b]))
        return Task(name, workload, template, kind, func, target_to_json(tgt))
    attrs = workload.get("attrs", {})
    func = Function([a, b], Call("nn.matmul", [a, b], attrs))
    kind = template + ("_nt" if attrs.get("transpose_b") else "")
    return Task(name, workload, template, kind, func, target_to_json(tgt))


def resolve(target: Any) -> tvm.target.Target:
    if isinstance(target, str):
        return resolve_target(target)
    return _as_target(target)


