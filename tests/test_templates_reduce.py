"""Templates of pools, reductions, normalizations and injective groups: every sampled
config (and the fallback) builds and matches torch eager, for an 8-lane and a 16-lane
target (built for both; run where the host can); the spaces are sane."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import tvm
from tecc.frontend.ir import Attrs, TensorType
from tecc.schedules.blocks import ANCHOR_ATTR, injective_anchor, inline_injective
from tecc.schedules.computes import get_compute
from tecc.schedules.default import default_schedule
from tecc.schedules.in_output import store_in_outputs
from tecc.schedules.template import ScheduleContext, get_template, templates_for
from tvm import te
from tvm.s_tir.schedule import Schedule

from tecc.target import resolve_target
from tests.util import VECTOR_TARGETS, runs_on_host

TARGETS = [resolve_target(t) for t in VECTOR_TARGETS]
TARGET = TARGETS[0]
# Sampled configs per workload and target (besides the fallback): two targets at 10
# cost what one did at 20.
SAMPLES = 10


def _nchwc(f: Callable, c: int = 8) -> Callable:
    """torch reference for NCHW{c}c data: unblock, apply, block again."""
    def g(x):
        n, cc, h, w, cb = x.shape
        y = f(x.permute(0, 1, 4, 2, 3).reshape(n, cc * cb, h, w))
        return y.reshape(n, cc, cb, *y.shape[2:]).permute(0, 1, 3, 4, 2).contiguous()
    return g


def _red(**kw):
    return {"keepdims": False, **kw}


POOL = {"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "ceil_mode": False,
        "layout": "NCHW"}
LN = {"epsilon": 1e-5}

# (template, op, input shapes, attrs, output shape, torch reference, input range)
WORKLOADS = [
    ("softmax", "nn.softmax", [(7, 33)], {"axis": -1}, (7, 33),
     lambda x: torch.softmax(x, -1), (-2, 2)),
    ("softmax", "nn.softmax", [(128, 128)], {"axis": -1}, (128, 128),
     lambda x: torch.softmax(x, -1), (-2, 2)),
    ("softmax", "nn.softmax", [(2, 4, 50)], {"axis": -1}, (2, 4, 50),
     lambda x: torch.softmax(x, -1), (-2, 2)),
    ("softmax", "nn.softmax", [(2, 4, 50)], {"axis": 1}, (2, 4, 50),
     lambda x: torch.softmax(x, 1), (-2, 2)),
    # rows no vector width divides (ViT's 197 tokens, 1500 audio frames): ragged splits
    ("softmax", "nn.safe_softmax", [(2, 3, 197)], {"axis": -1}, (2, 3, 197),
     lambda x: torch.ops.aten._safe_softmax(x, -1), (-4, 4)),
    ("softmax", "nn.softmax", [(4, 1500)], {"axis": -1}, (4, 1500),
     lambda x: torch.softmax(x, -1), (-4, 4)),
    ("log_softmax", "nn.log_softmax", [(3, 1000)], {"axis": -1}, (3, 1000),
     lambda x: torch.log_softmax(x, -1), (-2, 2)),
    ("log_softmax", "nn.log_softmax", [(9, 17)], {"axis": -1}, (9, 17),
     lambda x: torch.log_softmax(x, -1), (-2, 2)),
    ("log_softmax", "nn.log_softmax", [(5, 12, 3)], {"axis": 1}, (5, 12, 3),
     lambda x: torch.log_softmax(x, 1), (-2, 2)),
    ("layer_norm", "nn.layer_norm", [(1, 64), (64,), (64,)], LN, (1, 64),
     lambda x, g, b: F.layer_norm(x, (64,), g, b), (-2, 2)),
    ("layer_norm", "nn.layer_norm", [(17, 100), (100,), (100,)], LN, (17, 100),
     lambda x, g, b: F.layer_norm(x, (100,), g, b), (-2, 2)),
    ("layer_norm", "nn.layer_norm", [(256, 768), (768,), (768,)], LN, (256, 768),
     lambda x, g, b: F.layer_norm(x, (768,), g, b), (-2, 2)),
    ("reduce", "sum", [(64, 300)], _red(axis=[1]), (64,), lambda x: x.sum(1), (-2, 2)),
    ("reduce", "mean", [(1, 512, 7, 7)], _red(axis=[2, 3], keepdims=True), (1, 512, 1, 1),
     lambda x: x.mean((2, 3), keepdim=True), (-2, 2)),
    ("reduce", "max", [(64, 128)], _red(axis=[0]), (128,), lambda x: x.amax(0), (-2, 2)),
    ("reduce", "min", [(3, 33, 5)], _red(axis=[1]), (3, 5), lambda x: x.amin(1), (-2, 2)),
    ("reduce", "sum", [(100000,)], _red(axis=None), (), lambda x: x.sum(), (0.5, 1.5)),
    ("reduce", "prod", [(16, 12)], _red(axis=[1]), (16,), lambda x: x.prod(1), (0.5, 1.5)),
    ("variance", "variance", [(17, 300)], _red(axis=[1], correction=1), (17,),
     lambda x: x.var(1), (-2, 2)),
    ("variance", "variance", [(8, 30, 16)], _red(axis=[1], keepdims=True, correction=0), (8, 1, 16),
     lambda x: x.var(1, correction=0, keepdim=True), (-2, 2)),
    ("variance", "variance", [(4, 6, 10)], _red(axis=[0, 2], correction=0), (6,),
     lambda x: x.var((0, 2), correction=0), (-2, 2)),
    ("pool", "nn.max_pool2d", [(1, 64, 56, 56)],
     {**POOL, "pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1)}, (1, 64, 28, 28),
     lambda x: F.max_pool2d(x, 3, 2, 1), (-2, 2)),
    ("pool", "nn.max_pool2d", [(2, 3, 13, 11)],
     {**POOL, "pool_size": (2, 2), "strides": (2, 2), "ceil_mode": True}, (2, 3, 7, 6),
     lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True), (-2, 2)),
    ("pool", "nn.avg_pool2d", [(1, 16, 15, 15)],
     {**POOL, "pool_size": (3, 3), "padding": (1, 1, 1, 1), "count_include_pad": False},
     (1, 16, 15, 15), lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False), (-2, 2)),
    ("pool", "nn.max_pool2d", [(1, 4, 56, 56, 8)],
     {**POOL, "pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1),
      "layout": "NCHW8c"}, (1, 4, 28, 28, 8), _nchwc(lambda x: F.max_pool2d(x, 3, 2, 1)),
     (-2, 2)),
    ("pool", "nn.avg_pool2d", [(1, 2, 9, 9, 8)],
     {**POOL, "pool_size": (2, 2), "strides": (2, 2), "count_include_pad": True,
      "layout": "NCHW8c"}, (1, 2, 4, 4, 8), _nchwc(lambda x: F.avg_pool2d(x, 2, 2)), (-2, 2)),
    ("pool", "nn.adaptive_avg_pool2d", [(1, 512, 7, 7)], {"output_size": (1, 1),
     "layout": "NCHW"}, (1, 512, 1, 1), lambda x: F.adaptive_avg_pool2d(x, 1), (-2, 2)),
    ("pool", "nn.adaptive_avg_pool2d", [(2, 4, 7, 7, 8)], {"output_size": (1, 1),
     "layout": "NCHW8c"}, (2, 4, 1, 1, 8), _nchwc(lambda x: F.adaptive_avg_pool2d(x, 1)),
     (-2, 2)),
    ("pool", "nn.adaptive_avg_pool2d", [(1, 32, 14, 12)], {"output_size": (7, 3),
     "layout": "NCHW"}, (1, 32, 7, 3), lambda x: F.adaptive_avg_pool2d(x, (7, 3)), (-2, 2)),
]


def _ids(w) -> str:
    return f"{w[1]}-{'x'.join(map(str, w[2][0]))}-{w[3].get('axis', w[3].get('layout', ''))}"


def _target_id(t) -> str:
    return str(t.attrs["mcpu"])


def _module(op: str, shapes, attrs, out_shape, target=TARGET) -> tvm.IRModule:
    xs = [te.placeholder(s, name=f"x{i}") for i, s in enumerate(shapes)]
    with target:
        y = get_compute(op)(xs, Attrs(attrs), TensorType(out_shape, "float32"))
    return tvm.IRModule({"main": te.create_prim_func([*xs, y])})


def _anchor(sch: Schedule):
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        kind = sch.get(block).annotations.get(ANCHOR_ATTR)
        if kind is not None:
            return block, str(kind)
    raise AssertionError("no anchor block")


def _inputs(shapes, lo_hi, seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(*lo_hi, size=s).astype("float32") for s in shapes]


def _run(mod: tvm.IRModule, inputs: list[np.ndarray], out_shape, target=TARGET
         ) -> np.ndarray | None:
    """The kernel's output; None (built only) where the host cannot run `target`."""
    ex = tvm.compile(mod, target=target)
    if not runs_on_host(target):
        return None
    out = tvm.runtime.tensor(np.zeros(out_shape, "float32"))
    ex["main"](*[tvm.runtime.tensor(a) for a in inputs], out)
    return out.numpy()


def _configs(space, fallback):
    return [fallback, *[c for c in space.sample(random.Random(0), SAMPLES) if c != fallback]]


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
@pytest.mark.parametrize("workload", WORKLOADS, ids=_ids)
def test_every_config_matches_torch(workload, target):
    name, op, shapes, attrs, out_shape, ref, lo_hi = workload
    mod = _module(op, shapes, attrs, out_shape, target)
    sch = Schedule(mod)
    block, kind = _anchor(sch)
    assert kind == name
    template = get_template(kind)
    ctx = ScheduleContext.create(sch, block, target)
    space = template.define_space(ctx)
    fallback = template.fallback(space, ctx)
    inputs = _inputs(shapes, lo_hi)
    want = ref(*[torch.from_numpy(a) for a in inputs]).numpy()
    for config in _configs(space, fallback):
        trial = Schedule(mod)
        block, _ = _anchor(trial)
        template.apply(ScheduleContext.create(trial, block, target), config)
        got = _run(trial.mod, inputs, out_shape, target)
        if got is not None:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{kind} {shapes} config {config}")


def _check_space(space, fallback) -> None:
    print(space.describe(), "fallback", json.dumps(fallback.to_json()))
    assert len(space) >= 1
    assert space.get(fallback.index) == fallback
    for config in _configs(space, fallback):
        assert space.get(config.index) == config
        assert space.from_json(json.loads(space.dumps(config))).index == config.index
        for other in space.neighbours(config):
            assert sum(config[k] != other[k] for k in config) == 1


@pytest.mark.parametrize("workload", WORKLOADS, ids=_ids)
def test_space_sanity(workload):
    _, op, shapes, attrs, out_shape, _, _ = workload
    sch = Schedule(_module(op, shapes, attrs, out_shape))
    block, kind = _anchor(sch)
    template = get_template(kind)
    ctx = ScheduleContext.create(sch, block, TARGET)
    space = template.define_space(ctx)
    _check_space(space, template.fallback(space, ctx))


# ---------------------------------------------------------------- injective groups


def _injective_group(case: str):
    """(module, inputs, torch result) of an anchor-less fused group."""
    if case == "bias_relu_3d":
        x, b = te.placeholder((3, 5, 7), name="x"), te.placeholder((7,), name="b")
        s = te.compute(x.shape, lambda i, j, k: x[i, j, k] + b[k], name="add")
        y = te.compute(x.shape, lambda *i: tvm.tirx.max(s[i], tvm.tirx.const(0.0)), name="relu")
        args, ref = [x, b, y], lambda a, c: torch.relu(a + c)
    elif case == "transpose_mul":
        x = te.placeholder((64, 96), name="x")
        t = te.compute((96, 64), lambda i, j: x[j, i], name="transpose")
        y = te.compute((96, 64), lambda i, j: t[i, j] * tvm.tirx.const(2.0), name="mul")
        args, ref = [x, y], lambda a: (a.T * 2.0).contiguous()
    elif case == "sigmoid_flat":
        x = te.placeholder((1, 3, 224, 223), name="x")
        y = te.compute(x.shape, lambda *i: tvm.tirx.sigmoid(x[i]), name="sigmoid")
        args, ref = [x, y], torch.sigmoid
    elif case == "split_two_outputs":
        x = te.placeholder((4, 10), name="x")
        y0 = te.compute((4, 3), lambda i, j: x[i, j], name="split0")
        y1 = te.compute((4, 7), lambda i, j: x[i, j + 3], name="split1")
        args, ref = [x, y0, y1], lambda a: (a[:, :3].contiguous(), a[:, 3:].contiguous())
    else:
        raise KeyError(case)
    n_in = {"bias_relu_3d": 2, "transpose_mul": 1, "sigmoid_flat": 1, "split_two_outputs": 1}[case]
    mod = tvm.IRModule({"main": te.create_prim_func(args)})
    inputs = _inputs([tuple(int(d) for d in a.shape) for a in args[:n_in]], (-3, 3))
    want = ref(*[torch.from_numpy(a) for a in inputs])
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    return mod, inputs, want


INJECTIVE = ["bias_relu_3d", "transpose_mul", "sigmoid_flat", "split_two_outputs"]


def _injective_context(sch: Schedule, target) -> ScheduleContext:
    inline_injective(sch)
    return ScheduleContext.create(sch, injective_anchor(sch), target, "injective")


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
@pytest.mark.parametrize("case", INJECTIVE)
def test_injective_group_every_config(case, target):
    """The group goes through default_schedule's dispatch: the chosen config is the
    one applied, and without a chooser, the fallback."""
    mod, inputs, want = _injective_group(case)
    template = get_template("injective")
    ctx = _injective_context(Schedule(mod), target)
    space = template.define_space(ctx)
    fallback = template.fallback(space, ctx)
    _check_space(space, fallback)
    for config in _configs(space, fallback):
        applied = []
        trial = default_schedule(Schedule(mod), target,
                                 lambda c, t, s, config=config: (config, "given"),
                                 applied=applied)
        assert [(a.template, a.source, a.config) for a in applied] == [
            ("injective", "given", config.to_json())]
        ex = tvm.compile(trial.mod, target=target)
        if not runs_on_host(target):
            continue
        outs = [tvm.runtime.tensor(np.zeros(w.shape, "float32")) for w in want]
        ex["main"](*[tvm.runtime.tensor(a) for a in inputs], *outs)
        for o, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{case} config {config}")
    # without a config: the fallback
    applied = []
    default_schedule(Schedule(mod), target, applied=applied)
    assert [(a.source, a.config) for a in applied] == [("fallback", fallback.to_json())]


def test_templates_registered():
    for name in ("pool", "reduce", "variance", "softmax", "log_softmax", "layer_norm",
                 "injective"):
        assert name in templates_for("llvm")


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
def test_fallback_vectorizes_rows_no_width_divides(target):
    """197 is prime: the fallback splits each row into whole vectors and a partial
    last chunk (not 197 scalar steps), and every pass still runs under one row loop."""
    mod = _module("nn.softmax", [(512, 197)], {"axis": -1}, (512, 197), target)
    sch = Schedule(mod)
    block, kind = _anchor(sch)
    template = get_template(kind)
    ctx = ScheduleContext.create(sch, block, target)
    fallback = template.fallback(template.define_space(ctx), ctx)
    assert fallback["k_split"] == (1, -(-197 // ctx.lanes), ctx.lanes)
    template.apply(ctx, fallback)
    text = sch.mod.script()
    assert text.count("T.parallel") == 1 and f"T.vectorized({ctx.lanes})" in text
    inputs = _inputs([(512, 197)], (-4, 4))
    got = _run(sch.mod, inputs, (512, 197), target)
    if got is not None:
        np.testing.assert_allclose(got, torch.softmax(torch.from_numpy(inputs[0]), -1).numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_fallback_schedules_are_parallel_and_vectorized():
    mod = _module("nn.softmax", [(128, 1024)], {"axis": -1}, (128, 1024))
    sch = Schedule(mod)
    block, kind = _anchor(sch)
    template = get_template(kind)
    ctx = ScheduleContext.create(sch, block, TARGET)
    template.apply(ctx, template.fallback(template.define_space(ctx), ctx))
    text = sch.mod.script()
    assert "T.parallel" in text and "T.vectorized" in text
    # one anchor per group: the rf blocks do not inherit the annotation
    assert text.count(ANCHOR_ATTR) == 1


def _lowered_buffers(mod: tvm.IRModule) -> dict[str, tuple[int, ...]]:
    """The buffers of a scheduled module after TVM places and compacts them."""
    from tvm.s_tir import transform as passes

    for lower in (passes.LowerInitBlock(), passes.PlanAndUpdateBufferAllocationLocation(),
                  passes.ConvertBlocksToOpaque(), passes.CompactBufferAllocation()):
        mod = lower(mod)
    found = re.findall(r"(\w+) = T\.(?:sblock_)?alloc_buffer\(\(([^)]*)\)", mod.script())
    return {name: tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
            for name, dims in found}


@pytest.mark.parametrize("keys, where", [(128, "row"), (197, "row"), (1500, "output"),
                                         (1024, "output")])
def test_softmax_computes_its_exp_once(keys, where):
    """The exp that the exp-sum and the normalize both read is computed once per
    element (one exp block, not inlined into both): into a one-row buffer where the row
    is under 1 KB, else into the output buffer, which the normalize rescales in place
    (a longer row buffer would be a workspace allocation per row). NaN stays NaN."""
    shape = (12, keys)
    mod = _module("nn.softmax", [shape], {"axis": -1}, shape)
    sch = Schedule(mod)
    block, kind = _anchor(sch)
    ctx = ScheduleContext.create(sch, block, TARGET)
    template = get_template(kind)
    config = template.fallback(template.define_space(ctx), ctx)
    assert config["k_split"][0] == 1, config
    template.apply(ctx, config)
    func = store_in_outputs(sch.mod["main"])
    assert func.script().count('T.sblock("T_fast_exp")') == 1
    buffers = _lowered_buffers(tvm.IRModule({"main": func}))
    if where == "row":
        assert buffers.get("T_fast_exp") == (1, keys), buffers
    else:
        assert "T_fast_exp" not in buffers, buffers
    inputs = _inputs([shape], (-4, 4))
    inputs[0][3, 5] = np.nan
    got = _run(tvm.IRModule({"main": func}), inputs, shape)
    if got is not None:
        want = torch.softmax(torch.from_numpy(inputs[0]), -1).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
