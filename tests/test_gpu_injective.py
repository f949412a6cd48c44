"""The GPU injective template (schedules/gpu_injective.py): every case builds for cuda
without a GPU (template applied, kernels bound, the lanes vectorized where the
buffers are 32-bit and the lanes divide the last axis); where a GPU is visible each
kernel also runs there against torch on the GPU (tests/test_cuda.py's rule)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tecc.frontend.ir import Call, Constant, Function, TensorType, Var
from tecc.schedules.gpu_default import check_bound, launch_extents
from tecc.schedules.gpu_injective import fallback_values
from tecc.schedules.lower import lower_primitive

from tecc.cuda_toolchain import compile_cuda
from tecc.target import resolve_target, target_info
from tests.test_cuda import ARCH, GPU
from tests.util import assert_close, max_rel_error, to_cpu

B, S, H, D = 2, 16, 4, 8  # batch, sequence, heads, head size: BERT's layout, small


def _var(name: str, shape, dtype: str = "float32") -> Var:
    return Var(name, TensorType(tuple(shape), dtype))


def query_heads():
    x = _var("qkv", (B * S, 3 * H * D))
    q = Call("strided_slice", [x], {"begin": (H * D,), "end": (2 * H * D,), "strides": (1,),
                                   "axes": (1,)})
    q = Call("reshape", [q], {"newshape": (B, S, H, D)})
    q = Call("transpose", [q], {"axes": (0, 2, 1, 3)})
    func = Function([x], Call("multiply", [q, Constant(np.float32(0.25))]))
    return func, lambda t: t[:, H * D:2 * H * D].reshape(B, S, H, D).transpose(1, 2) * 0.25


def merge_heads():
    x = _var("context", (B * H, S, D))
    y = Call("reshape", [x], {"newshape": (B, H, S, D)})
    y = Call("transpose", [y], {"axes": (0, 2, 1, 3)})
    func = Function([x], Call("reshape", [y], {"newshape": (B, S, H * D)}))
    return func, lambda t: t.reshape(B, H, S, D).transpose(1, 2).reshape(B, S, H * D)


def mask_add():
    s, m = _var("scores", (B * H, S, S)), _var("mask", (B, 1, 1, S))
    func = Function([s, m], Call("add", [Call("reshape", [s], {"newshape": (B, H, S, S)}), m]))
    return func, lambda x, y: x.reshape(B, H, S, S) + y


def add_relu(shape=(B, 6, 7, 12)):
    a, b = _var("a", shape), _var("b", shape)
    return Function([a, b], Call("relu", [Call("add", [a, b])])), lambda x, y: torch.relu(x + y)


def odd_last_axis():  # 15 columns: no lanes divide it
    return add_relu((3, 5, 15))


def two_lane_axis():  # 6 columns: two lanes
    return add_relu((3, 7, 6))


def cast_from_int64():  # an int64 input: scalar
    x = _var("x", (4, 32), "int64")
    y = _var("y", (4, 32))
    func = Function([x, y], Call("add", [Call("cast", [x], {"dtype": "float32"}), y]))
    return func, lambda a, b: a.float() + b


# (name, maker, the fallback's lanes)
CASES = [
    ("query_heads", query_heads, 4),
    ("merge_heads", merge_heads, 4),
    ("mask_add", mask_add, 4),
    ("add_relu", add_relu, 4),
    ("odd_last_axis", odd_last_axis, 1),
    ("two_lane_axis", two_lane_axis, 2),
    ("cast_from_int64", cast_from_int64, 1),
]


def _inputs(func: Function) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for p in func.params:
        if str(p.dtype) == "int64":
            out.append(torch.randint(-50, 50, p.shape, generator=gen))
        else:
            x = torch.randn(p.shape, generator=gen)
            x.view(-1)[3] = float("nan")  # NaN passes through as in eager
            out.append(x)
    return out


def _build_and_check(func, reference, config, expect_lanes: int | None):
    info = target_info(f"cuda:{ARCH}")
    prim, applied = lower_primitive(func, "k", resolve_target(f"cuda:{ARCH}"), config,
                                    return_info=True)
    assert [(a.template, a.source, a.error) for a in applied] == [
        ("injective", "given" if config else "fallback", None)], applied
    lanes = applied[0].config["vector"]
    if expect_lanes is not None:
        assert lanes == expect_lanes, applied[0].config
    check_bound(prim, "k")
    threads = launch_extents(prim)
    assert threads["threadIdx.x"] <= applied[0].config["threads"], threads
    lib = compile_cuda(tvm.IRModule({"k": prim}), info.tvm_target)
    source = lib.mod.imports[0].inspect_source()
    assert (f"float{lanes}" in source) == (lanes > 1), source
    if GPU:
        inputs = _inputs(func)
        expected = reference(*(x.cuda() for x in inputs)).cpu()
        dev = tvm.cuda(0)
        args = [tvm.runtime.tensor(x.numpy(), dev) for x in inputs]
        out = tvm.runtime.empty(tuple(expected.shape), "float32", dev)
        lib["k"](*args, out)
        assert_close(torch.from_numpy(out.numpy()), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_injective_template_vectorizes_where_it_can(case):
    _, make, lanes = case
    func, reference = make()
    _build_and_check(func, reference, None, lanes)


@pytest.mark.parametrize("config", [{"threads": 64, "vector": 1}, {"threads": 1024, "vector": 2},
                                    {"threads": 128, "vector": 4}])
def test_injective_template_builds_every_lane_and_thread_choice(config):
    # 2 x 4 x 16 x 8 = 1024 elements: 1024 threads of 2 lanes leave half a block idle
    func, reference = query_heads()
    _build_and_check(func, reference, config, config["vector"])


def test_injective_template_refuses_lanes_that_do_not_divide_the_last_axis():
    func, _ = odd_last_axis()
    prim, applied = lower_primitive(func, "k", resolve_target(f"cuda:{ARCH}"),
                                    {"threads": 64, "vector": 4}, return_info=True)
    # 4 lanes are no point of this group's space: the fallback (scalar lanes) schedules it
    assert [(a.template, a.source, a.config["vector"]) for a in applied] == [
        ("injective", "fallback", 1)], applied
    check_bound(prim, "k")


def test_injective_fallback_keeps_every_multiprocessor_busy():
    assert fallback_values(16 * 128 * 768, 4, 132) == {"threads": 256, "vector": 4}
    # 8192 vectors: 256-thread blocks would leave 100 of 132 multiprocessors idle
    assert fallback_values(32768, 4, 132) == {"threads": 64, "vector": 4}
    assert fallback_values(10, 1, 132) == {"threads": 64, "vector": 1}


def test_bert_on_the_gpu_has_no_layout_kernel_and_its_attention_reads_the_mask():
    import tecc
    from tests.models import bert_encoder

    torch.manual_seed(0)
    model = bert_encoder(hidden=64, layers=2, heads=4).eval()
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    compiled = tecc.compile(model, (ids, mask), target=f"cuda:{ARCH}")
    kernels = compiled.build_result.kernels
    templates = {name: [(a.template, a.source) for a in k.templates]
                 for name, k in kernels.items()}
    # the head splits are fetched by the fused attention and the head merges by the
    # dense after it (fuse_ops' ROW_FUSING and LOAD_FUSING anchors): no kernel of
    # layout ops alone is left
    assert not [name for name in kernels if "transpose" in name and not any(
        anchor in name for anchor in ("matmul", "dense", "attention"))], templates
    # each layer's Q K^T, masked softmax and P V are one kernel reading the mask,
    # which is computed once from the int64 attention mask by an injective group
    attention = [name for name in kernels if "attention" in name]
    assert len(attention) == 1 and kernels[attention[0]].calls == 2, templates
    assert templates[attention[0]] == [("attention", "fallback")], templates
    assert not [name for name in kernels if "softmax" in name or "matmul" in name], templates
    mask_kernels = [name for name in kernels if "cast" in name]
    assert len(mask_kernels) == 1, templates
    assert templates[mask_kernels[0]] == [("injective", "fallback")], templates
    if GPU:
        with torch.no_grad():
            expected = model(ids, mask)
        error = max_rel_error(to_cpu(compiled(ids.cuda(), mask.cuda())), expected)
        assert error < 1e-4, f"max relative error {error:.2e}"
