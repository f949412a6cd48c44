"""Tunable templates: dense / matmul / batch_matmul / conv2d (NCHW and NCHWc) /
depthwise / Winograd / injective groups.

For each template and several workloads (odd sizes too), the fallback config and 10
random configs per target are built (one library per workload and target) for an
8-lane and a 16-lane target and compared with numpy where the host runs them; spaces
are checked (neighbours, index <-> config round trip, every config schedules); and
compile(records=...) applies a record whose config differs from the fallback.
"""

from __future__ import annotations

import json
import random
import re
import warnings

import numpy as np
import pytest
import torch
import tvm
from tecc.frontend.ir import Call, Function, TensorType, Var
from tecc.graph_opt.layout import convert_layout_nchwc
from tecc.graph_opt.pass_manager import PassContext, TuningCallbacks
from tecc.schedules.lower import lower_primitive
from tecc.schedules.tasks import Task, extract_tasks, task_from_workload
from tecc.schedules.template import (
    TEMPLATES,
    Template,
    get_template,
    register_template,
    templates_for,
)
from tecc.schedules.templates_conv import Conv2dNCHWcTemplate

import tecc
from tecc.target import target_to_json
from tests.util import VECTOR_TARGETS, runs_on_host

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2})
# 8 and 16 float32 lanes, 2 cores each: the config spaces and fallbacks differ
TARGETS = [tvm.target.Target({"kind": "llvm", "mcpu": t.partition(":")[2], "num-cores": 2})
           for t in VECTOR_TARGETS]
DEV = tvm.cpu()
SAMPLES = 10  # random configs per workload and target (besides the fallback)


def _target_id(target) -> str:
    return str(target.attrs["mcpu"])


def _mm(template: str, a: list[int], b: list[int], tb: bool = False) -> dict:
    wl = {"template": template, "inputs": [[a, "float32"], [b, "float32"]], "attrs": {}}
    if template != "dense":
        wl["attrs"] = {"transpose_a": False, "transpose_b": tb}
    return wl


def _conv(c: int, hw: int, o: int, k: int, s: int, p: int, n: int = 1, dw: bool = False,
          w: int | None = None) -> dict:
    g = c if dw else 1
    return {"template": "depthwise_conv2d_NCHWc" if dw else "conv2d_NCHWc",
            "data": [n, c, hw, w or hw], "kernel": [o, c // g, k, k], "dtype": "float32",
            "strides": [s, s], "padding": [p, p, p, p], "dilation": [1, 1], "groups": g}


def _wino(c: int, h: int, o: int, p: int, n: int = 1, w: int | None = None,
          tile: int = 4) -> dict:
    return {**_conv(c, h, o, 3, 1, p, n=n, w=w), "template": "conv2d_winograd_NCHWc",
            "winograd_tile": tile}


WORKLOADS = {
    "dense_a": _mm("dense", [33, 40], [48, 40]),
    "dense_b": _mm("dense", [1, 64], [10, 64]),
    "dense_c": _mm("dense", [2, 7, 37], [24, 37]),
    "matmul_a": _mm("matmul", [17, 29], [29, 40]),
    "matmul_b": _mm("matmul", [64, 32], [32, 64]),
    "matmul_nt": _mm("matmul", [9, 24], [16, 24], tb=True),
    "bmm_a": _mm("batch_matmul", [3, 7, 37], [3, 37, 24]),
    "bmm_b": _mm("batch_matmul", [2, 16, 32], [2, 32, 32]),
    "bmm_nt": _mm("batch_matmul", [2, 3, 5, 16], [2, 3, 8, 16], tb=True),
    "conv_a": _conv(16, 13, 24, 3, 1, 1),
    "conv_b": _conv(3, 15, 16, 3, 2, 1, n=2),
    "conv_c": _conv(32, 7, 32, 1, 1, 0, w=9),
    "conv_d": _conv(8, 10, 16, 5, 2, 2),
    # plain NCHW (a graph without the layout pass, e.g. opt_level 0)
    "conv_nchw": {**_conv(16, 13, 24, 3, 1, 1), "template": "conv2d"},
    "dw_a": _conv(24, 9, 24, 3, 1, 1, n=2, dw=True),
    "dw_b": _conv(32, 14, 32, 3, 2, 1, dw=True),
    "dw_c": _conv(16, 11, 16, 5, 1, 2, dw=True, w=7),
    # Winograd F(4x4, 3x3): partial tiles at the border, two images, no padding
    "wino_a": _wino(16, 13, 24, 1, n=2),
    "wino_b": _wino(32, 9, 16, 0, w=11),
    "wino_c": _wino(16, 7, 32, 1, tile=2),  # F(2x2, 3x3)
}


def _task(name: str, target=TARGET) -> Task:
    return task_from_workload(WORKLOADS[name], target, name)


def test_templates_registered():
    for kind in ("dense", "dense_pack", "matmul", "matmul_nt", "batch_matmul",
                 "batch_matmul_nt", "conv2d", "conv2d_NCHWc", "depthwise_conv2d_NCHWc",
                 "conv2d_winograd_NCHWc", "injective"):
        assert kind in templates_for("llvm")


def test_registry_is_per_target_kind():
    """A template is registered for one target kind; one (target kind, anchor kind)
    takes one template."""
    class GpuDense(Template):
        name = "dense_registry_probe"
        target_kind = "cuda"

    probe = register_template(GpuDense())
    try:
        assert get_template("dense_registry_probe", "cuda") is probe
        assert get_template("dense_registry_probe") is None
        assert "dense_registry_probe" not in templates_for("llvm")
        with pytest.raises(ValueError, match="already registered"):
            register_template(GpuDense())
        with pytest.raises(ValueError, match="already registered"):
            register_template(type("Again", (Template,), {"name": "dense"})())
    finally:
        TEMPLATES.pop(("cuda", "dense_registry_probe"))


def _injective_model() -> Function:
    """One kernel of injective ops only: a transpose, a broadcast add and a sigmoid."""
    x = Var("x", TensorType((6, 40), "float32"))
    b = Var("b", TensorType((6,), "float32"))
    t = Call("transpose", [x], {"axes": (1, 0)})
    return Function([x, b], Call("sigmoid", [Call("add", [t, b])]))


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
def test_injective_group_is_a_task(target):
    """A group without an anchor is a tuning task (template "injective", keyed by its
    input and output shapes and dtypes), and every config of its space computes it
    (sampled on the second target)."""
    func = _injective_model()
    (task,) = extract_tasks(func, target)
    assert task.template == "injective"
    assert task.workload == {"template": "injective",
                             "inputs": [[[6, 40], "float32"], [[6], "float32"]],
                             "outputs": [[[40, 6], "float32"]]}
    inputs = task.reference_inputs(0)
    want = torch.sigmoid(torch.from_numpy(inputs[0]).T + torch.from_numpy(inputs[1]))
    np.testing.assert_allclose(task.reference_outputs(inputs)[0], want.numpy(), rtol=1e-6,
                               atol=1e-6)
    assert len(task.space) > 1
    # every config on the 8-lane target; samples on the 16-lane one (suite time)
    configs = list(task.space) if target is TARGETS[0] else task.space.sample(
        random.Random(0), SAMPLES)
    _check_configs(task, [task.fallback_config(), *configs])
    # compile uses the fallback of the same template: what the kernel got is the task
    _, info = lower_primitive(func, "k", target, return_info=True)
    assert [(a.template, a.source, a.workload) for a in info] == [
        ("injective", "fallback", task.workload)]
    assert info[0].config == task.fallback_config().to_json()


def _se_scale_model() -> Function:
    """RegNet's squeeze-excitation scale in blocks of 8 channels on a 16-lane target:
    a per-channel scale computed in 16-channel blocks, reshaped to 8-channel ones and
    multiplied into the activation."""
    x = Var("x", TensorType((1, 4, 6, 5, 8), "float32"))
    s = Var("s", TensorType((1, 2, 1, 1, 16), "float32"))
    scale = Call("layout_transform", [s], {"src_layout": "NCHW16c", "dst_layout": "NCHW8c"})
    return Function([x, s], Call("multiply", [x, scale]))


def _block_change_model() -> Function:
    x = Var("x", TensorType((1, 2, 6, 5, 16), "float32"))
    return Function([x], Call("layout_transform", [x], {"src_layout": "NCHW16c",
                                                         "dst_layout": "NCHW8c"}))


@pytest.mark.parametrize("case", ["block_change", "se_scale", "elementwise", "transpose"])
def test_injective_fallback_vectors_follow_the_runs_its_inputs_read(case):
    """On 16 lanes, a group whose inputs are read in runs of 8 along the flat output
    (a 16- to 8-channel layout_transform, a per-channel scale in 8-channel blocks) gets
    vectors of 8 along the last axis instead of 16 gathered across runs; a plain
    elementwise group keeps its 16 lanes, and a transpose (read strided,
    no run) its 16 lanes. Every fallback matches numpy."""
    x = Var("x", TensorType((3, 5, 16), "float32"))
    func = {"block_change": _block_change_model, "se_scale": _se_scale_model,
            "elementwise": lambda: Function([x], Call("sigmoid", [Call("add", [x, x])])),
            "transpose": _injective_model}[case]()
    (task,) = extract_tasks(func, TARGETS[1])
    fallback = task.fallback_config().to_json()
    want = {"block_change": ("inner", 8), "se_scale": ("inner", 8),
            "elementwise": ("inner", 16), "transpose": ("all", 16)}[case]
    assert (fallback["fuse"], fallback["vec"]) == want, fallback
    _check_configs(task, [task.fallback_config()])


def test_injective_concatenate_computes_each_branch_in_its_own_loop():
    """A concatenate along an outer axis of two computed inputs: the fallback's fused
    parallel loop is partitioned at the inputs' bound (TIR's LoopPartition), so no
    if_then_else is left to compute both branches for every vector; it matches numpy."""
    a = Var("a", TensorType((1, 3, 5, 6, 16), "float32"))
    b = Var("b", TensorType((1, 2, 5, 6, 16), "float32"))
    func = Function([a, b], Call("concatenate", [Call("exp", [a]), Call("sigmoid", [b])],
                                 {"axis": 1}))
    (task,) = extract_tasks(func, TARGETS[1])
    (prim,) = _check_configs(task, [task.fallback_config()]).values()
    lowered = tvm.ir.transform.Sequential([
        tvm.s_tir.transform.ConvertBlocksToOpaque(), tvm.s_tir.transform.LowerOpaqueBlock(),
        tvm.s_tir.transform.LoopPartition(), tvm.tirx.transform.StmtSimplify(),
    ])(tvm.IRModule({"k": prim}))["k"].script()
    assert "if_then_else" not in lowered, lowered
    assert lowered.count("T.vectorized") == 2


def test_injective_ragged_last_axis_tests_only_its_tail():
    """A last axis no step divides (60 = 3 x 16 + 12 on 8 lanes, unroll 2) keeps its
    step loop out of the parallel fuse, and after TIR's LoopPartition only the partial
    step tests its index; every such config matches numpy."""
    x = Var("x", TensorType((4, 5, 60), "float32"))
    (task,) = extract_tasks(Function([x], Call("exp", [Call("multiply", [x, x])])),
                            TARGETS[0])
    config = task.space.from_json({"fuse": "inner", "vec": 8, "unroll": 2, "chunks": -1})
    prims = _check_configs(task, [config, task.space.from_json({**config.to_json(),
                                                               "chunks": 2})])
    lowered = tvm.ir.transform.Sequential([
        tvm.s_tir.transform.ConvertBlocksToOpaque(), tvm.s_tir.transform.LowerOpaqueBlock(),
        tvm.s_tir.transform.LoopPartition(), tvm.tirx.transform.StmtSimplify(),
    ])(tvm.IRModule({"k": prims["k0"]}))["k"].script()
    assert "pragma_loop_partition_hint" in prims["k0"].script()
    checks = [line.strip() for line in lowered.splitlines()
              if line.strip().startswith("if ") or "T.likely" in line]
    assert len(checks) <= 1, checks  # the tail step's lanes only


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_random_configs_match_numpy(name, target):
    task = _task(name, target)
    space = task.space
    print(f"{name}: {space.describe()}")
    _check_configs(task, [task.fallback_config(), *space.sample(random.Random(name), SAMPLES)])


def _check_configs(task: Task, configs: list) -> dict:
    """Build `configs` of `task` into one module, run each on the task's reference
    inputs (outputs start as NaN) and compare where the host runs the task's target;
    returns the scheduled PrimFuncs."""
    prims = {f"k{i}": task.build_primfunc(c).with_attr("global_symbol", f"k{i}")
             for i, c in enumerate(configs)}
    ex = tvm.compile(tvm.IRModule(prims), target=task.tvm_target)
    if not runs_on_host(task.tvm_target):
        return prims
    inputs = task.reference_inputs(1)
    expected = task.reference_outputs(inputs)
    for i, cfg in enumerate(configs):
        k_in, k_out = task.adapt_io(cfg, inputs, expected)
        outs = [tvm.runtime.tensor(np.full(o.shape, np.nan, o.dtype), DEV) for o in k_out]
        ex[f"k{i}"](*[tvm.runtime.tensor(a, DEV) for a in k_in], *outs)
        for got, want in zip(outs, k_out, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{task.name} config {cfg.to_json()}")
    return prims


@pytest.mark.parametrize("name", ["conv_a", "dw_c"])
def test_conv_column_tiles_need_not_divide_the_width(name):
    """Every tile_ow, dividing the width or not, computes the conv; with a tail, the
    full tiles are partitioned from it and carry no bounds check."""
    task = _task(name)
    fallback = task.fallback_config().to_json()
    tiles = next(k for k in task.space.knobs if k.name == "tile_ow").options
    width = 13 if name == "conv_a" else 7  # output columns
    assert list(tiles) == list(range(1, width + 1))
    prims = _check_configs(task, [task.space.from_json({**fallback, "tile_ow": t})
                                  for t in tiles])

    tail = width % 4 if width % 4 else width % 5  # a tile leaving a tail of `tail` columns
    tile = 4 if width % 4 else 5
    lowered = tvm.ir.transform.Sequential([
        tvm.s_tir.transform.ConvertBlocksToOpaque(), tvm.s_tir.transform.LowerOpaqueBlock(),
        tvm.s_tir.transform.LoopPartition(), tvm.tirx.transform.StmtSimplify(),
    ])(tvm.IRModule({"k": prims[f"k{tile - 1}"]}))["k"].script()
    checks = [line.strip() for line in lowered.splitlines() if line.strip().startswith("if ")]
    # only the tail tile tests its column index, against the tail's width
    assert checks and all(c.endswith(f"< {tail}:") for c in checks), checks


@pytest.mark.parametrize("name", ["dw_a", "dw_b", "dw_c"])
def test_depthwise_padding_modes(name):
    """Each place the zero padding can be produced computes the conv (stride 1 and 2,
    batch 2, a 5x5 window); "rows" produces it under the parallel task's loop and
    "inline" leaves no padded buffer at all."""
    task = _task(name)
    fallback = task.fallback_config().to_json()
    assert fallback["pad"] == "inline"
    modes = next(k for k in task.space.knobs if k.name == "pad").options
    prims = _check_configs(task, [task.space.from_json({**fallback, "pad": m}) for m in modes])
    scripts = {m: prims[f"k{i}"].script() for i, m in enumerate(modes)}
    assert "conv_pad = T.sblock_alloc_buffer" in scripts["root"]
    assert "conv_pad" not in scripts["inline"]

    def top_loops(script: str) -> int:
        return sum(line.startswith("    for ") for line in script.splitlines())

    # root: a loop nest of its own before the conv's; rows: inside the conv's nest
    assert top_loops(scripts["root"]) == 2
    assert top_loops(scripts["rows"]) == top_loops(scripts["inline"]) == 1
    assert 'T.sblock("conv_pad")' in scripts["rows"]


def test_winograd_kernel_structure():
    """Three parallel nests: the input transform (per tile and input chunk), the GEMMs
    (tile rows in registers, the last partial block of rows partitioned off), and the
    output transform computed tile by tile inside the output's own loop."""
    task = _task("wino_a")  # 2 images x 4 x 4 tiles: 32 tile rows
    config = task.space.from_json({**task.fallback_config().to_json(), "tile_p": 6})
    script = task.build_primfunc(config).script()
    top = [line.strip() for line in script.splitlines() if line.startswith("    for ")]
    assert len(top) == 3 and all("T.parallel" in line for line in top), top
    assert script.count("pragma_loop_partition_hint") == 1  # 32 rows = 5 x 6 + 2
    assert script.index('T.sblock("winograd_output")') > script.index(top[2])


@pytest.mark.parametrize("name, rows_first", [("conv_b", True), ("conv_c", True),
                                              ("dw_a", True), ("conv_a", True),
                                              ("conv_d", False)])
def test_conv_threads_split_the_larger_operand(name, rows_first):
    """The parallel loop runs over (image, output row band, channel block) when the
    input is at least as large as the kernel (each core reads its band of the input,
    and consecutive layers keep each band on one core), else over (image, channel
    block, row band) so that each core reads its share of the kernel."""
    task = _task(name)
    script = task.build_primfunc(task.fallback_config()).script()
    fused = re.findall(r"for (\w+)_fused in T\.parallel", script)
    assert len(fused) == 1, fused
    parts = fused[0].split("_")
    channel = "cc" if name.startswith("dw") else "o"
    expected = ["b", "y", "0", channel] if rows_first else ["b", channel, "y", "0"]
    assert parts == expected, parts


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
@pytest.mark.parametrize("name", ["dense_c", "matmul_a", "bmm_nt", "conv_a", "conv_c",
                                  "dw_a", "dw_c", "wino_a"])
def test_every_config_schedules(name, target):
    """Every config of the space applies (schedule only; small spaces in full, larger
    ones on 75 samples per target)."""
    task = _task(name, target)
    space = task.space
    configs = list(space) if len(space) <= 75 else space.sample(random.Random(0), 75)
    for cfg in configs:
        task.build_primfunc(cfg)


@pytest.mark.parametrize("name", ["dense_a", "bmm_a", "conv_a", "dw_b"])
def test_space_sanity(name):
    task = _task(name)
    space = task.space
    assert len(space) > 1
    print(f"{name}: {len(space)} configs")
    rng = random.Random(3)
    for cfg in space.sample(rng, 10):
        assert space.get(cfg.index) == cfg
        assert space.from_json(json.loads(space.dumps(cfg))).index == cfg.index
        for nb in space.neighbours(cfg)[:20]:
            assert sum(nb[k] != cfg[k] for k in cfg) == 1
    fb = task.fallback_config()
    assert space.from_json(fb.to_json()) == fb


def test_fallback_reads_target():
    wl = WORKLOADS["matmul_b"]
    avx2 = task_from_workload(wl, TARGET).fallback_config()
    avx512 = task_from_workload(wl, tvm.target.Target(
        {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})).fallback_config()
    assert avx2["tile_n"] % 8 == 0 and avx512["tile_n"] % 16 == 0


def test_stem_conv_fallback_halves_its_column_tile():
    """A conv reading one input channel per step with overlapping kw taps (the RGB
    stem) keeps half the accumulators in its fallback tile where half is enough to
    fill the FMA pipes; a 1x1 conv on the same channels, and a conv of wider input
    blocks, keep the full budget."""
    template = Conv2dNCHWcTemplate()
    lanes = 16
    stem = template.fallback_values(_conv(3, 224, 64, 7, 2, 3), lanes, (1, 16))
    pointwise = template.fallback_values(_conv(3, 112, 64, 1, 1, 0), lanes, (1, 16))
    blocked = template.fallback_values(_conv(16, 112, 64, 7, 2, 3), lanes, (16, 16))
    assert pointwise["tile_ow"] == blocked["tile_ow"] == 28
    assert stem["tile_ow"] == 14
    # on 8 lanes the half tile would leave too few FMAs in flight: the full tile
    avx2 = template.fallback_values(_conv(3, 224, 64, 7, 2, 3), 8, (1, 16))
    assert avx2["tile_ow"] == template.fallback_values(
        _conv(3, 112, 64, 1, 1, 0), 8, (1, 16))["tile_ow"]
    # the halved tile still computes the conv
    task = _task("conv_b")
    assert task.fallback_config()["ic_bn"] == 1
    _check_configs(task, [task.fallback_config()])


def test_lower_primitive_config_and_info():
    x = Var("x", TensorType((6, 16), "float32"))
    w = Var("w", TensorType((2, 16, 8), "float32"))
    func = Function([x, w], Call("relu", [Call("nn.dense_pack", [x, w])]))
    _, info = lower_primitive(func, "k", TARGET, return_info=True)
    assert [a.source for a in info] == ["fallback"] and info[0].template == "dense"
    assert info[0].workload["inputs"][1][0] == [16, 16]  # unpacked terms: W[N, K]
    cfg = dict(info[0].config, tile_m=1, order="k_mn")
    _, info2 = lower_primitive(func, "k", TARGET, cfg, return_info=True)
    assert info2[0].source == "given" and info2[0].config == cfg
    # a config for another packing block is refused: the fallback reads the real one
    _, info3 = lower_primitive(func, "k", TARGET, lambda wl, space: (dict(cfg, tile_n=16), "exact"),
                               return_info=True)
    assert info3[0].source == "fallback" and info3[0].config["tile_n"] == 8


def test_layout_pass_honours_conv_blocks():
    from tecc.frontend.ir import Constant
    from tecc.graph_opt.evaluate import evaluate_call  # noqa: F401 - registers evaluators

    rng = np.random.default_rng(0)
    x = Var("x", TensorType((1, 16, 8, 8), "float32"))
    w1 = Constant(rng.standard_normal((16, 16, 3, 3)).astype("float32"))
    w2 = Constant(rng.standard_normal((16, 16, 3, 3)).astype("float32"))
    c1 = Call("nn.conv2d", [x, w1], {"padding": (1, 1, 1, 1)})
    c2 = Call("nn.conv2d", [c1, w2], {"padding": (1, 1, 1, 1)})
    func = Function([x], c2)
    wanted = {id(c1): (8, 16), id(c2): (4, 8)}
    with PassContext(target=TARGET, tuning=TuningCallbacks(
            conv_blocks=lambda call, xb, tile: wanted.get(id(call)))):
        out = convert_layout_nchwc(func)
    convs = [n for n in _calls(out) if n.op == "nn.conv2d_NCHWc"]
    assert [(c.attrs["data_layout"], c.attrs["out_layout"]) for c in convs] == [
        ("NCHW8c", "NCHW16c"), ("NCHW4c", "NCHW8c")]
    assert any(n.op == "layout_transform" and n.attrs["src_layout"] == "NCHW16c"
               and n.attrs["dst_layout"] == "NCHW4c" for n in _calls(out))


def _calls(func):
    from tecc.frontend.ir import post_order

    return [n for n in post_order(func.body) if isinstance(n, Call) and isinstance(n.op, str)]


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.dw = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.fc = torch.nn.Linear(32 * 7 * 7, 24)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y))
        y = self.dw(y) + y
        return self.fc(y.flatten(1))


def _changed(t: dict) -> dict:
    cfg = dict(t["config"])
    if t["template"] == "conv2d_NCHWc":
        cfg.update(oc_bn=8 if cfg["oc_bn"] != 8 else 16, tile_ow=1)
    elif t["template"] == "depthwise_conv2d_NCHWc":
        cfg.update(c_bn=16 if cfg["c_bn"] != 16 else 8, unroll_kw=not cfg["unroll_kw"])
    elif t["template"] == "dense":
        cfg.update(tile_n=8 if cfg["tile_n"] != 8 else 24, tile_m=1, order="k_mn")
    return cfg


def _anchor_tasks(cm) -> list[dict]:
    """cm.tasks() less the injective groups (the layout transforms around the convs)."""
    return [t for t in cm.tasks() if t["template"] != "injective"]


def test_compile_with_records(tmp_path):
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(2, 3, 14, 14)
    want = model(x).detach().numpy()
    cm = tecc.compile(model, [x])
    assert {t["template"] for t in cm.tasks()} == {"conv2d_NCHWc", "depthwise_conv2d_NCHWc",
                                                   "dense", "injective"}
    assert all(t["source"] == "fallback" and t["space_size"] > 1 for t in cm.tasks())
    tasks = _anchor_tasks(cm)
    np.testing.assert_allclose(cm(x).numpy(), want, rtol=1e-4, atol=1e-4)

    target = target_to_json(cm.target)
    tuned, untuned = tasks[:-1], tasks[-1]
    path = tmp_path / "records.jsonl"
    with open(path, "w") as f:
        for t in tuned:
            f.write(json.dumps({"version": 1, "target": target, "workload": t["workload"],
                                "config": _changed(t), "costs_s": [1e-3], "error": None}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm2 = tecc.compile(model, [x], records=[path])
    summary = [w for w in caught if "no tuning record" in str(w.message)]
    assert len(summary) == 1 and untuned["workload_key"] in str(summary[0].message)
    by_key = {t["workload_key"]: t for t in cm2.tasks()}
    for t in tuned:
        got = by_key[t["workload_key"]]
        assert got["source"] == "exact"
        assert got["config"] == _changed(t) != t["config"]
    assert by_key[untuned["workload_key"]]["source"] == "fallback"
    np.testing.assert_allclose(cm2(x).numpy(), want, rtol=1e-4, atol=1e-4)
    assert cm2.records_digest is not None


def test_extract_tasks_from_compiled_model():
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(2, 3, 14, 14)
    cm = tecc.compile(model, [x])
    tasks = extract_tasks(cm.ir, cm.target)
    assert sorted(t.template for t in tasks) == sorted(t["template"] for t in cm.tasks())
    keys = {t["workload_key"] for t in cm.tasks()}
    assert {json.dumps(t.workload, sort_keys=True, separators=(",", ":")) for t in tasks} == keys
    dense = next(t for t in tasks if t.template == "dense")
    assert dense.kind == "dense_pack" and dense.func.body.op == "nn.dense"
    # a task pickles (the tuner's build workers get it)
    import pickle

    again = pickle.loads(pickle.dumps(dense))
    assert again.workload == dense.workload and len(again.space) == len(dense.space)


class _SameConvTwice(torch.nn.Module):
    """Two direct convs of one workload (16 -> 16, 5x5 on 12x12), after producers that
    emit different channel blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c1 = torch.nn.Conv2d(16, 16, 5, padding=2)
        self.c2 = torch.nn.Conv2d(16, 16, 5, padding=2)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(torch.relu(self.stem(x)))))


def test_one_workload_after_producers_of_different_blocks(tmp_path):
    """Each kernel of a repeated workload gets the record that fits its input block
    (where it is not slower than the best by more than a transform costs)."""
    torch.manual_seed(0)
    model = _SameConvTwice().eval()
    x = torch.randn(1, 3, 12, 12)
    cm = tecc.compile(model, [x])
    target = target_to_json(cm.target)
    stem, conv = sorted((t for t in cm.tasks() if t["template"] == "conv2d_NCHWc"),
                        key=lambda t: t["workload"]["data"][1])
    # c1 reads the stem's 8-blocks with a config slower than the best by less than the
    # transform into 16-blocks costs (16 x 12 x 12 floats: about 1.2 us)
    lines = [(stem, {"ic_bn": 1, "oc_bn": 8}, 1e-3),        # the stem emits 8-blocks
             (conv, {"ic_bn": 8, "oc_bn": 16}, 1.0005e-3),  # c1 reads them, emits 16
             (conv, {"ic_bn": 16, "oc_bn": 16}, 1e-3)]      # c2 reads 16-blocks
    # the layout transforms around the convs: their fallback configs, recorded
    lines += [(t, {}, 1e-3) for t in cm.tasks() if t["template"] == "injective"]
    path = tmp_path / "records.jsonl"
    with open(path, "w") as f:
        for t, blocks, cost in lines:
            extra = {"tile_ow": 4} if blocks else {}
            f.write(json.dumps({"version": 1, "target": target, "workload": t["workload"],
                                "config": {**t["config"], **blocks, **extra},
                                "costs_s": [cost], "error": None}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned = tecc.compile(model, [x], records=[path])
    assert not [w for w in caught if "no tuning record" in str(w.message)]
    blocks = sorted((a.config["ic_bn"], a.config["oc_bn"], a.source)
                    for k in tuned.build_result.kernels.values() for a in k.templates
                    if a.template == "conv2d_NCHWc")
    assert blocks == [(1, 8, "exact"), (8, 16, "exact"), (16, 16, "exact")]
    np.testing.assert_allclose(tuned(x).numpy(), model(x).detach().numpy(),
                               rtol=1e-4, atol=1e-4)


def test_records_choose_between_winograd_and_direct(tmp_path):
    """A 3x3 layer takes Winograd by default; with records of both algorithms, the one
    measured faster; with records of the direct conv only, Winograd stays."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 16, 12, 12)
    want = model(x).detach().numpy()
    (task,) = _anchor_tasks(tecc.compile(model, [x]))
    assert task["template"] == "conv2d_winograd_NCHWc" and task["source"] == "fallback"
    wino_wl = task["workload"]
    direct_wl = {k: v for k, v in wino_wl.items() if k != "winograd_tile"}
    direct_wl["template"] = "conv2d_NCHWc"
    target = target_to_json(TARGET)

    def compiled_with(costs: dict[str, float]) -> dict:
        path = tmp_path / f"records_{len(list(tmp_path.iterdir()))}.jsonl"
        with open(path, "w") as f:
            for wl in (wino_wl, direct_wl):
                if wl["template"] not in costs:
                    continue
                config = task_from_workload(wl, TARGET).fallback_config().to_json()
                f.write(json.dumps({"version": 1, "target": target, "workload": wl,
                                    "config": config, "costs_s": [costs[wl["template"]]],
                                    "error": None}) + "\n")
        cm = tecc.compile(model, [x], target=TARGET, records=[path])
        np.testing.assert_allclose(cm(x).numpy(), want, rtol=1e-4, atol=1e-4)
        (chosen,) = _anchor_tasks(cm)
        return chosen

    assert compiled_with({"conv2d_NCHWc": 1e-3, "conv2d_winograd_NCHWc": 2e-3})[
        "template"] == "conv2d_NCHWc"
    chosen = compiled_with({"conv2d_NCHWc": 2e-3, "conv2d_winograd_NCHWc": 1e-3})
    assert (chosen["template"], chosen["source"]) == ("conv2d_winograd_NCHWc", "exact")
    assert compiled_with({"conv2d_NCHWc": 1e-3})["template"] == "conv2d_winograd_NCHWc"


def test_winograd_can_be_turned_off():
    """winograd=False: every conv direct, and the kernels' weights a quarter the size."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 16, 12, 12)
    on, off = tecc.compile(model, [x]), tecc.compile(model, [x], winograd=False)
    assert [t["template"] for t in _anchor_tasks(on)] == ["conv2d_winograd_NCHWc"]
    assert [t["template"] for t in _anchor_tasks(off)] == ["conv2d_NCHWc"]
    size = {name: sum(v.nbytes for v in cm.build_result.params.values())
            for name, cm in (("on", on), ("off", off))}
    bias = 32 * 4
    assert size["on"] - bias == 4 * (size["off"] - bias)  # 6 x 6 points against 3 x 3
    want = model(x).detach().numpy()
    for cm in (on, off):
        np.testing.assert_allclose(cm(x).numpy(), want, rtol=1e-4, atol=1e-4)


class _Scalars(torch.nn.Module):
    def forward(self, x):
        return x.mean(), x.sum(), x.amax()


@pytest.mark.parametrize("shape", [(4, 8), (3, 5, 7), (3, 197)])
def test_a_reduction_to_a_scalar_takes_the_reduce_template(shape):
    """mean to a scalar: the division is a root block without loops, where TVM's
    rfactor failed and the generic schedule stood in."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    compiled = tecc.compile(_Scalars(), (x,))
    reduce = [t for t in compiled.tasks() if t["template"] == "reduce"]
    assert reduce and all(t["source"] == "fallback" and t["error"] is None for t in reduce), \
        compiled.tasks()
    for got, expected in zip(compiled(x), _Scalars()(x), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
