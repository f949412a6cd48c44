"""convert_layout_nchwc: blocked NCHW{c}c convolutions, packed weights, and layout
transforms only where the layout must change; the blocked kernels and their code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tecc.frontend.ir import Call, Constant, Expr, Function, TensorType, Var, post_order
from tecc.frontend.ops import get_op
from tecc.graph_opt.fuse_ops import fuse_ops
from tecc.graph_opt.layout import (
    WINOGRAD_MATRICES,
    convert_layout_nchwc,
    default_winograd_tile,
    layout_transform_numpy,
    pack_conv_weight,
    pack_depthwise_weight,
    to_nchwc,
)
from tecc.graph_opt.pass_manager import PassContext, TuningCallbacks
from tecc.graph_opt.pipeline import optimize
from tecc.schedules.lower import lower_primitive

import tecc
from tecc import runtime
from tecc.build import build
from tests.util import runs_on_host

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})


def rand(shape, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype("float32")


def const(shape, seed: int, scale: float = 0.2) -> Constant:
    return Constant(rand(shape, seed, scale))


def conv(x: Expr, cout: int, seed: int, k: int = 3, stride: int = 1, groups: int = 1) -> Call:
    cin = x.shape[1] // groups
    p = k // 2
    return Call("nn.conv2d", [x, const((cout, cin, k, k), seed)],
                {"strides": (stride, stride), "padding": (p, p, p, p), "groups": groups})


def convert(func: Function, target=TARGET, **callbacks) -> Function:
    """The layout pass for `target` (AVX2: 8 lanes), with the tuning `callbacks` given."""
    with PassContext(target=target, tuning=TuningCallbacks(**callbacks)):
        return convert_layout_nchwc(func)


def ops(func: Function) -> list[str]:
    return [n.op for n in post_order(func.body) if isinstance(n, Call) and isinstance(n.op, str)]


def calls(func: Function, op: str) -> list[Call]:
    return [n for n in post_order(func.body) if isinstance(n, Call) and n.op == op]


def run(func: Function, inputs: list[np.ndarray]) -> np.ndarray:
    fused = fuse_ops(func)
    result = build(fused, TARGET, [p.name for p in func.params], ["out"], {})
    ex = runtime.Executor(result.executable, result.plan, result.params)
    return ex.run_flat(*inputs)[0]


def residual_net(cin: int = 16) -> Function:
    """conv -> bias_add -> relu -> conv -> bias_add -> add(residual) -> flatten -> dense."""
    x = Var("x", TensorType((1, cin, 8, 8), "float32"))
    a = Call("relu", [Call("nn.bias_add", [conv(x, 32, 1), const((32,), 2)], {"axis": 1})])
    b = Call("nn.bias_add", [conv(a, 32, 3), const((32,), 4)], {"axis": 1})
    r = Call("add", [b, a])
    flat = Call("reshape", [r], {"newshape": (1, 32 * 8 * 8)})
    out = Call("nn.dense", [flat, const((10, 32 * 8 * 8), 5, 0.05)])
    return Function([x], out)


# ---------------------------------------------------------------- the pass on small IR


def test_residual_net_has_only_the_needed_transforms():
    func = residual_net()
    new = convert(func, winograd_tile=lambda conv, lanes: 0)  # direct convs
    transforms = calls(new, "layout_transform")
    # one into the blocked layout at the input, one back before the flatten
    assert [(t.attrs["src_layout"], t.attrs["dst_layout"]) for t in transforms] == [
        ("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    assert transforms[0].args[0] is func.params[0]
    assert any(c.op == "reshape" and c.args[0] is transforms[1] for c in calls(new, "reshape"))
    convs = calls(new, "nn.conv2d_NCHWc")
    assert len(convs) == 2 and not calls(new, "nn.conv2d") and not calls(new, "nn.bias_add")
    for c, in_chunks in zip(convs, (1, 2), strict=True):
        weight = c.args[1]
        assert isinstance(weight, Constant) and weight.shape == (2, in_chunks, 3, 3, 16, 16)
        assert c.shape == (1, 2, 8, 8, 16)
    # the biases became blocked constants of a broadcast add
    bias_adds = [c for c in calls(new, "add") if isinstance(c.args[1], Constant)]
    assert len(bias_adds) == 2 and all(c.args[1].shape == (2, 1, 1, 16) for c in bias_adds)
    # the packed weight is the original one, reordered
    w = calls(func, "nn.conv2d")[0].args[1]
    assert isinstance(w, Constant)
    np.testing.assert_array_equal(convs[0].args[1].data, pack_conv_weight(w.data, 16, 16))


def test_residual_net_matches_the_unconverted_graph():
    func = residual_net()
    x = rand((1, 16, 8, 8), 9)
    np.testing.assert_allclose(run(convert(func), [x]), run(func, [x]),
                               rtol=1e-4, atol=1e-4)


def test_consecutive_convs_keep_the_layout_and_odd_channels_stay_nchw():
    x = Var("x", TensorType((1, 3, 16, 16), "float32"))
    y = conv(conv(conv(x, 16, 1, stride=2), 24, 2), 3, 3)  # 3 -> 16 -> 24 -> 3
    func = Function([x], Call("sigmoid", [y]))
    new = convert(func)
    assert ops(new).count("nn.conv2d_NCHWc") == 2
    (last,) = calls(new, "nn.conv2d")  # 3 output channels: no vector block
    assert last.args[0].op == "layout_transform"
    first, second = calls(new, "nn.conv2d_NCHWc")
    # RGB input: blocks of 1 channel, the NCHW input read in place (a reshape, no
    # transform into the blocked layout); 16 -> 24 reads 16c as is
    assert first.attrs["data_layout"] == "NCHW1c" and first.attrs["out_layout"] == "NCHW16c"
    assert first.args[0].op == "reshape" and first.args[0].args[0] is x
    assert second.attrs["data_layout"] == "NCHW16c" and second.attrs["out_layout"] == "NCHW8c"
    assert second.args[0] is first
    assert len(calls(new, "layout_transform")) == 1
    xv = rand((1, 3, 16, 16), 4)
    np.testing.assert_allclose(run(new, [xv]), run(func, [xv]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k", [1, 3])
def test_odd_output_channels_run_blocked_on_padded_filters(k):
    """150 output channels (SegFormer's classes) on AVX-512: no block of 32, 16 or 8
    divides them, 160 wastes 7%: the conv runs in blocks of 32 on 160 filters, the
    last ten zero, and the transform back to NCHW slices them off, bias add included.
    A small plane stays in NCHW."""
    x = Var("x", TensorType((1, 32, 10, 10), "float32"))
    y = Call("nn.bias_add", [conv(x, 150, 6, k=k), const((150,), 7)], {"axis": 1})
    func = Function([x], Call("relu", [y]))
    new = convert(func, target=AVX512, winograd_tile=lambda conv, lanes: 0)
    (blocked,) = calls(new, "nn.conv2d_NCHWc")
    assert blocked.shape == (1, 5, 10, 10, 32) and not calls(new, "nn.conv2d")
    assert np.all(blocked.args[1].data[-1, ..., -10:] == 0)
    (sliced,) = calls(new, "strided_slice")
    assert sliced.shape == (1, 150, 10, 10) and sliced.args[0].op == "layout_transform"
    xv = rand((1, 32, 10, 10), 8)
    np.testing.assert_allclose(run(new, [xv]), run(func, [xv]), rtol=1e-4, atol=1e-5)
    s = Var("s", TensorType((1, 32, 7, 7), "float32"))
    assert not calls(convert(Function([s], conv(s, 150, 6, k=k)), target=AVX512),
                     "nn.conv2d_NCHWc")


def test_a_segmentation_head_on_padded_filters_matches_eager():
    model = torch.nn.Sequential(torch.nn.Conv2d(48, 150, 1), torch.nn.Sigmoid()).eval()
    x = torch.randn(1, 48, 16, 16)
    compiled = tecc.compile(model, (x,), target="llvm:skylake-avx512")
    assert "strided_slice" in " ".join(k["name"] for k in compiled.plan["kernels"])
    if runs_on_host(AVX512):
        with torch.no_grad():
            np.testing.assert_allclose(compiled(x), model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_rgb_input_read_in_place_with_a_one_channel_block():
    # a config with ic_bn 1 reads the NCHW input as NCHW1c: a reshape, no kernel
    x = Var("x", TensorType((1, 3, 32, 32), "float32"))
    func = Function([x], Call("relu", [conv(conv(x, 16, 1, stride=2), 16, 2)]))
    new = convert(func, conv_blocks=lambda c, xb, tile: (1, 16)
                  if c.args[0].shape[1] == 3 else None)
    assert not calls(new, "layout_transform")[:-1]  # only the output's, back to NCHW
    first = calls(new, "nn.conv2d_NCHWc")[0]
    assert first.attrs["data_layout"] == "NCHW1c"
    assert first.args[0].op == "reshape" and first.args[0].args[0] is x
    xv = rand((1, 3, 32, 32), 6)
    np.testing.assert_allclose(run(new, [xv]), run(func, [xv]), rtol=1e-4, atol=1e-5)
    fused = fuse_ops(new)
    result = build(fused, TARGET, ["x"], ["out"], {})
    kernels = [k["name"] for k in result.plan["kernels"]]
    assert len(kernels) == 3 and not any("reshape" in k for k in kernels), kernels


def test_differing_blocks_get_one_transform():
    x = Var("x", TensorType((1, 16, 8, 8), "float32"))
    a, b = conv(x, 32, 1), conv(x, 32, 2, k=1)
    func = Function([x], Call("relu", [Call("add", [a, b])]))
    # the tuning hook: another output block per layer (here by kernel size)
    new = convert(func, conv_blocks=lambda c, xb, tile: (16, 8 if c.args[1].shape[2] == 1
                                                         else 16))
    transforms = [(t.attrs["src_layout"], t.attrs["dst_layout"])
                  for t in calls(new, "layout_transform")]
    assert sorted(transforms) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW"),
                                  ("NCHW8c", "NCHW16c")]
    xv = rand((1, 16, 8, 8), 5)
    np.testing.assert_allclose(run(new, [xv]), run(func, [xv]), rtol=1e-4, atol=1e-5)


def test_pools_reductions_and_channel_broadcasts_stay_blocked():
    x = Var("x", TensorType((2, 8, 12, 12), "float32"))
    s = Var("s", TensorType((2, 16, 1, 1), "float32"))
    y = Call("clip", [conv(x, 16, 1)], {"a_min": 0.0, "a_max": 6.0})
    y = Call("nn.max_pool2d", [y], {"pool_size": (3, 3), "strides": (2, 2),
                                    "padding": (1, 1, 1, 1)})
    y = Call("multiply", [y, const((16, 1, 1), 2)])  # per-channel constant
    y = Call("add", [y, Call("sigmoid", [s])])  # per-channel tensor (an SE-style gate)
    y = Call("nn.avg_pool2d", [y], {"pool_size": (2, 2), "strides": (2, 2)})
    y = Call("add", [y, const((1,), 3)])  # scalar
    m = Call("mean", [y], {"axis": (-1, -2), "keepdims": False})
    func = Function([x, s], m)
    new = convert(func)
    assert [(t.attrs["src_layout"], t.attrs["dst_layout"])
            for t in calls(new, "layout_transform")] == [("NCHW", "NCHW8c")]
    assert {p.attrs["layout"] for p in calls(new, "nn.max_pool2d") + calls(new, "nn.avg_pool2d")
            } == {"NCHW16c"}
    assert new.body.op == "reshape" and new.body.args[0].op == "mean"  # [N, C/c, c] = [N, C]
    inputs = [rand((2, 8, 12, 12), 6), rand((2, 16, 1, 1), 7)]
    np.testing.assert_allclose(run(new, inputs), run(func, inputs), rtol=1e-4, atol=1e-5)


def test_a_gate_pooled_from_a_blocked_tensor_multiplies_it_blocked():
    # squeeze-and-excitation: mean -> 1x1 conv -> sigmoid, times the activation; the
    # gate is [N, C/c, 1, 1, c] already and needs no transform through NCHW
    x = Var("x", TensorType((1, 16, 10, 10), "float32"))
    h = Call("silu", [conv(x, 32, 1)])
    pooled = Call("mean", [h], {"axis": (2, 3), "keepdims": True})
    gate = Call("sigmoid", [conv(pooled, 32, 2, k=1)])
    func = Function([x], conv(Call("multiply", [h, gate]), 16, 3, k=1))
    new = convert(func)
    assert [(t.attrs["src_layout"], t.attrs["dst_layout"])
            for t in calls(new, "layout_transform")] == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    (mul,) = calls(new, "multiply")
    assert mul.args[1].shape == (1, 2, 1, 1, 16)
    xv = rand((1, 16, 10, 10), 8)
    np.testing.assert_allclose(run(new, [xv]), run(func, [xv]), rtol=1e-4, atol=1e-5)


def test_depthwise_and_grouped_convs():
    x = Var("x", TensorType((1, 32, 10, 10), "float32"))
    y = Call("relu", [conv(x, 32, 1, groups=32)])  # depthwise
    y = conv(y, 64, 2, k=1, groups=2)  # grouped 1x1
    y = Call("nn.adaptive_avg_pool2d", [y], {"output_size": (1, 1)})
    func = Function([x], y)
    new = convert(func)
    dw, grouped = calls(new, "nn.conv2d_NCHWc")
    assert dw.args[1].shape == (2, 1, 3, 3, 1, 16)  # topi's depthwise NCHWc kernel layout
    np.testing.assert_array_equal(dw.args[1].data, pack_depthwise_weight(
        calls(func, "nn.conv2d")[0].args[1].data, 16))
    assert grouped.attrs["groups"] == 2 and grouped.args[0] is not dw  # relu in between
    assert calls(new, "nn.adaptive_avg_pool2d")[0].attrs["layout"].startswith("NCHW")
    xv = rand((1, 32, 10, 10), 8)
    np.testing.assert_allclose(run(new, [xv]), run(func, [xv]), rtol=1e-4, atol=1e-5)


def test_the_pass_is_registered_and_can_be_disabled():
    from tecc.graph_opt.pass_manager import get_pass

    p = get_pass("convert_layout_nchwc")
    assert p.opt_level == 3
    func = residual_net()
    with PassContext():  # no target
        assert p(func) is func
    with PassContext(target="cuda"):  # not a CPU
        assert p(func) is func
    with PassContext(target=TARGET):
        assert "nn.conv2d_NCHWc" in ops(p(func))


def test_layout_transform_op_and_numpy_agree():
    x = Var("x", TensorType((2, 24, 3, 5), "float32"))
    to8 = Call("layout_transform", [x], {"src_layout": "NCHW", "dst_layout": "NCHW8c"})
    to4 = Call("layout_transform", [to8], {"src_layout": "NCHW8c", "dst_layout": "NCHW4c"})
    back = Call("layout_transform", [to4], {"src_layout": "NCHW4c", "dst_layout": "NCHW"})
    assert to8.shape == (2, 3, 3, 5, 8) and to4.shape == (2, 6, 3, 5, 4)
    assert get_op("layout_transform").attrs["src_layout"] is not None
    xv = rand((2, 24, 3, 5), 1)
    got4 = run(Function([x], to4), [xv])
    np.testing.assert_array_equal(got4, to_nchwc(xv, 4))
    np.testing.assert_array_equal(got4, layout_transform_numpy(
        layout_transform_numpy(xv, "NCHW", "NCHW8c"), "NCHW8c", "NCHW4c"))
    np.testing.assert_array_equal(run(Function([x], back), [xv]), xv)
    with pytest.raises(Exception, match="divisible"):
        Call("layout_transform", [x], {"src_layout": "NCHW", "dst_layout": "NCHW16c"})


# ---------------------------------------------------------------- Winograd


@pytest.mark.parametrize("tile", [2, 4])
def test_winograd_matrices_compute_the_3x3_correlation(tile):
    a, b, g = WINOGRAD_MATRICES[tile]
    rng = np.random.default_rng(tile)
    d, k = rng.standard_normal((tile + 2, tile + 2)), rng.standard_normal((3, 3))
    y = a.T @ ((g @ k @ g.T) * (b.T @ d @ b)) @ a
    want = [[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(tile)] for i in range(tile)]
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_which_convs_use_winograd():
    x = Var("x", TensorType((1, 16, 8, 8), "float32"))
    assert default_winograd_tile(conv(x, 32, 1), 8) == 4
    assert default_winograd_tile(conv(x, 32, 1), 0) == 0  # no vectors: no blocked layout
    assert default_winograd_tile(conv(x, 32, 1, stride=2), 8) == 0
    assert default_winograd_tile(conv(x, 32, 1, k=5), 8) == 0
    assert default_winograd_tile(conv(x, 16, 1, groups=16), 8) == 0
    rgb = Var("rgb", TensorType((1, 3, 8, 8), "float32"))
    assert default_winograd_tile(conv(rgb, 32, 1), 8) == 0  # 3 input channels
    tiny = Var("tiny", TensorType((1, 16, 3, 3), "float32"))
    assert default_winograd_tile(conv(tiny, 32, 1), 8) == 0  # no full 4x4 output tile
    # 512 x 512 channels: F(4x4)'s kernel would be 38 MB, F(2x2)'s is 17 MB
    wide = Var("wide", TensorType((1, 512, 7, 7), "float32"))
    assert default_winograd_tile(Call("nn.conv2d", [wide, Constant(np.zeros(
        (512, 512, 3, 3), "float32"))], {"padding": (1, 1, 1, 1)}), 8) == 2


class _WinogradNet(torch.nn.Module):
    """3x3 convs: padded, unpadded, a residual add and bias/relu epilogues."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.c2 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.c3 = torch.nn.Conv2d(32, 24, 3, bias=False)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        return self.c3(torch.relu(self.c2(y) + y))


def test_winograd_convs_match_eager():
    torch.manual_seed(0)
    model = _WinogradNet().eval()
    x = torch.randn(2, 16, 10, 9)  # 10 x 9: the last tiles reach past the border
    func, ex = _compile_with_layout(model, (x,))
    convs = calls(func, "nn.conv2d_NCHWc")
    assert [c.attrs["winograd_tile"] for c in convs] == [4, 4, 4]
    assert all(c.args[1].shape[:2] == (6, 6) for c in convs)  # G g G^T, at compile time
    fresh = torch.randn(2, 16, 10, 9, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model(fresh).numpy()
    np.testing.assert_allclose(ex.run_flat(fresh.numpy())[0], want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- real models


def _compile_with_layout(model, inputs):
    from tecc.api import import_model

    imported = import_model(model, inputs)
    func = imported.func
    with PassContext(target=TARGET):
        func = convert_layout_nchwc(optimize(func))
    result = build(fuse_ops(func), TARGET, [s.name for s in imported.inputs],
                   [s.name for s in imported.outputs], imported.output_structure,
                   imported.param_names)
    return func, runtime.Executor(result.executable, result.plan, result.params)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_models_match_eager_in_blocked_layout(name):
    from tests.models import MobileNetV2, resnet18

    torch.manual_seed(0)
    model = resnet18() if name == "resnet18" else MobileNetV2()
    model.eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    func, ex = _compile_with_layout(model, (x,))
    assert not calls(func, "nn.conv2d")  # every conv is blocked
    # no layout transform at all: the RGB input is read in place (1-channel blocks),
    # the head's global pooling leaves the blocked layout by itself
    assert not calls(func, "layout_transform")
    assert calls(func, "nn.conv2d_NCHWc")[0].attrs["data_layout"] == "NCHW1c"
    fresh = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(fresh).numpy()
    np.testing.assert_allclose(ex.run_flat(fresh.numpy())[0], want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- generated code


def _conv_nchwc_func(c=32, o=32, hw=14, ic=8, oc=16, groups=1, depthwise=False):
    x = Var("x", TensorType((1, c // ic, hw, hw, ic), "float32"))
    if depthwise:
        w = Var("w", TensorType((c // ic, 1, 3, 3, 1, ic), "float32"))
        groups, oc, o = c, ic, c
    else:
        w = Var("w", TensorType((o // oc, c // ic // groups, 3, 3, ic, oc), "float32"))
    b = Var("b", TensorType((o // oc, 1, 1, oc), "float32"))
    r = Var("r", TensorType((1, o // oc, hw, hw, oc), "float32"))
    y = Call("nn.conv2d_NCHWc", [x, w], {"padding": (1, 1, 1, 1), "groups": groups,
                                         "data_layout": f"NCHW{ic}c",
                                         "out_layout": f"NCHW{oc}c"})
    out = Call("relu", [Call("add", [Call("add", [y, b]), r])])  # bias, residual, relu
    return Function([x, w, b, r], out)


def _conv_block_loops(script: str, block: str) -> list[str]:
    lines = script.splitlines()
    at = next(i for i, ln in enumerate(lines) if f'T.sblock("{block}")' in ln)
    indent = len(lines[at]) - len(lines[at].lstrip())
    loops = []
    for ln in reversed(lines[:at]):
        ind = len(ln) - len(ln.lstrip())
        if ind < indent and ln.lstrip().startswith("for "):
            loops.append(ln.strip())
            indent = ind
    return loops[::-1]


@pytest.mark.parametrize("kind", ["conv", "depthwise"])
def test_blocked_conv_kernel_is_parallel_vectorized_with_fused_epilogue(kind):
    func = _conv_nchwc_func(depthwise=kind == "depthwise")
    script = lower_primitive(func, "k", TARGET).script()
    block = "conv2d_NCHWc_update" if kind == "conv" else "depthwise_conv2d_NCHWc_update"
    loops = _conv_block_loops(script, block)
    assert "T.parallel" in loops[0]  # (n, oc_chunk, oh) fused
    assert "T.vectorized" in loops[-1]  # the oc block
    assert "T.unroll" in loops[-2]  # the output-width register tile
    # the epilogue is computed per tile, inside the parallel loop, vectorized
    relu = _conv_block_loops(script, "relu")
    assert relu[0] == loops[0] and "T.vectorized" in relu[-1]
    assert script.count("T.parallel") <= 2  # the conv nest (+ the padding)


def test_rgb_padding_keeps_its_rows_whole():
    """The padded copy of a 3-channel (RGB) block: parallel over rows, each row a plain
    loop with its 3 channels unrolled, so no index is divided per element."""
    func = _conv_nchwc_func(c=3, ic=3, hw=112)
    script = lower_primitive(func, "k", TARGET).script()
    loops = _conv_block_loops(script, "conv_pad")
    assert "T.parallel" in loops[0] and "T.unroll(3)" in loops[-1]
    assert not any("T.vectorized" in lp for lp in loops)
    assert "range(114)" in loops[-2] or "serial(114)" in loops[-2]  # a whole padded row


def test_blocked_conv_and_depthwise_kernels_compute_the_convolution():
    rng = np.random.default_rng(0)
    for kind in ("conv", "grouped", "depthwise"):
        groups = 2 if kind == "grouped" else 1
        func = _conv_nchwc_func(groups=groups, depthwise=kind == "depthwise")
        x = rng.standard_normal((1, 32, 14, 14)).astype("float32")
        if kind == "depthwise":
            w = rng.standard_normal((32, 1, 3, 3)).astype("float32")
            wp, oc, groups = pack_depthwise_weight(w, 8), 8, 32
        else:
            w = rng.standard_normal((32, 32 // groups, 3, 3)).astype("float32")
            wp, oc = pack_conv_weight(w, 8, 16), 16
        b = rng.standard_normal(32).astype("float32")
        r = rng.standard_normal((1, 32, 14, 14)).astype("float32")
        with torch.no_grad():
            want = torch.relu(torch.nn.functional.conv2d(
                torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), 1, 1,
                groups=groups) + torch.from_numpy(r)).numpy()
        got = run(func, [to_nchwc(x, 8), wp, b.reshape(32 // oc, 1, 1, oc), to_nchwc(r, oc)])
        np.testing.assert_allclose(got, to_nchwc(want, oc), rtol=1e-4, atol=1e-4,
                                   err_msg=kind)


def test_avx512_blocked_kernels_build():
    """16 lanes: the pass picks 16-channel blocks; the kernels build for skylake-avx512
    (built only: this host may lack AVX-512)."""
    new = convert(residual_net(), target=AVX512)
    assert {c.attrs["out_layout"] for c in calls(new, "nn.conv2d_NCHWc")} == {"NCHW16c"}
    for kind in ("conv", "depthwise"):
        f = _conv_nchwc_func(ic=16, oc=16, depthwise=kind == "depthwise")
        prim = lower_primitive(f, "k", AVX512)
        assert "T.vectorized(16)" in prim.script()
        tvm.compile(tvm.IRModule({"k": prim}), target=AVX512)


@pytest.mark.parametrize("in_place_extra_s, in_place_wins", [(40e-6, True), (400e-6, False)])
def test_input_conv_reads_in_place_unless_much_slower(tmp_path, in_place_extra_s,
                                                      in_place_wins):
    # The RGB input's conv: a record reading NCHW in place (ic_bn 1) is chosen over a
    # faster one reading NCHW3c while the difference is below what the transform into
    # NCHW3c costs (3x224x224: about 75 us), and the input then reaches it unmoved.
    from tecc.autotune.records import Record, RecordWriter
    from tecc.schedules.templates_conv import CONV2D, conv_workload

    from tecc.target import target_to_json
    from tecc.tuning import TuningContext

    x = Var("x", TensorType((1, 3, 224, 224), "float32"))
    stem = conv(x, 16, 3, stride=2)
    func = Function([x], Call("relu", [stem]))
    wl = conv_workload(CONV2D.name, stem)
    base = {"oc_bn": 16, "tile_ow": 4, "tile_oh": 2, "unroll_kw": True,
            "reduce_order": "kh_kw_icc"}
    path = tmp_path / "stem.jsonl"
    with RecordWriter(path, "test", "test") as writer:
        for ic_bn, cost in ((3, 200e-6), (1, 200e-6 + in_place_extra_s)):
            writer.write(Record(target_to_json(TARGET), wl, dict(base, ic_bn=ic_bn),
                                [cost, cost], None))
    tuning = TuningContext(path, TARGET)
    assert tuning.conv_blocks(stem, None) == ((1, 16) if in_place_wins else (3, 16))
    new = convert(func, conv_blocks=tuning.conv_blocks)
    transforms = [t.attrs["dst_layout"] for t in calls(new, "layout_transform")]
    assert transforms == (["NCHW"] if in_place_wins else ["NCHW3c", "NCHW"])


@pytest.mark.parametrize("as_is_extra_s, as_is_wins", [(40e-6, True), (400e-6, False)])
def test_conv_reads_its_producers_block_unless_much_slower(tmp_path, as_is_extra_s,
                                                          as_is_wins):
    # Two convs of one workload on 64x28x28: the first reads the input in 8-channel
    # blocks and writes 16-channel ones. The second reads those as they are (ic_bn 16)
    # while that config is slower than the best (ic_bn 8) by less than the transform
    # from 16 to 8 channels costs (2 x 200 KB: about 25 us), else it gets its best
    # config and a layout_transform before it; either way it computes the same.
    from tecc.autotune.records import Record, RecordWriter
    from tecc.schedules.templates_conv import CONV2D, conv_workload

    from tecc.target import target_to_json
    from tecc.tuning import TuningContext

    x = Var("x", TensorType((1, 64, 28, 28), "float32"))
    first = conv(x, 64, 5)
    second = Call("nn.conv2d", [Call("relu", [first]), const((64, 64, 3, 3), 6)],
                  {"strides": (1, 1), "padding": (1, 1, 1, 1), "groups": 1})
    func = Function([x], Call("relu", [second]))
    wl = conv_workload(CONV2D.name, second)
    assert wl == conv_workload(CONV2D.name, first)
    base = {"oc_bn": 16, "tile_ow": 4, "tile_oh": 2, "unroll_kw": True,
            "reduce_order": "kh_kw_icc"}
    path = tmp_path / "convs.jsonl"
    with RecordWriter(path, "test", "test") as writer:
        for ic_bn, cost in ((8, 10e-6), (16, 10e-6 + as_is_extra_s / 10)):
            writer.write(Record(target_to_json(TARGET), wl, dict(base, ic_bn=ic_bn),
                                [cost, cost], None))
    tuning = TuningContext(path, TARGET, winograd=False)  # both convs direct
    assert tuning.conv_blocks(second, 16) == ((16, 16) if as_is_wins else (8, 16))
    new = convert(func, conv_blocks=tuning.conv_blocks, winograd_tile=tuning.winograd_tile)
    transforms = [t.attrs["dst_layout"] for t in calls(new, "layout_transform")]
    assert transforms == (["NCHW8c", "NCHW"] if as_is_wins else ["NCHW8c", "NCHW8c", "NCHW"])
    inputs = [rand((1, 64, 28, 28), 7)]
    np.testing.assert_allclose(run(new, inputs), run(func, inputs), rtol=1e-4, atol=1e-4)
