"""The GPU row-reduction templates (schedules/gpu_reduce.py) and the masked softmax of
attention (nn.safe_softmax): every case builds for cuda without a GPU (template
applied, kernels bound, shared memory within the block's limit); where a GPU is
visible each kernel also runs there against torch on the GPU (tests/test_cuda.py's
rule). Sizes of BERT, ViT and odd ones, rows of NaN and rows masked to -inf."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import tvm
from tecc.frontend.ir import Call, Function, TensorType, Var
from tecc.schedules.gpu_default import check_bound, launch_extents
from tecc.schedules.gpu_reduce import KERNEL_FEATURES, row_fallback
from tecc.schedules.lower import lower_primitive
from tecc.schedules.template import get_template

import tecc
from tecc.cuda_toolchain import compile_cuda
from tecc.target import resolve_target, target_info
from tests.test_cuda import ARCH, GPU
from tests.util import assert_close

LN = {"epsilon": 1e-5}


def _masked(shape, seed: int) -> torch.Tensor:
    """Attention scores with masked columns (-inf), one row masked everywhere and one
    row of NaN: the rows torch's _safe_softmax treats specially."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3
    x[..., -5:] = float("-inf")
    x[..., 1, :] = float("-inf")
    x[..., 2, 3] = float("nan")
    return x


def _randn(shape, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _with_nan_row(shape, seed: int) -> torch.Tensor:
    x = _randn(shape, seed)
    x.view(-1, shape[-1])[1] = float("nan")
    return x


def _with_inf_row(x: torch.Tensor) -> torch.Tensor:
    x.view(-1, x.shape[-1])[2] = -float("inf")
    return x


# (id, op, input makers, attrs, torch reference, template, extra configs)
CASES = [
    ("bert_safe_softmax", "nn.safe_softmax", [lambda: _masked((1, 12, 128, 128), 0)],
     {"axis": -1}, lambda x: torch.ops.aten._safe_softmax(x, -1), "softmax",
     [{"threads": 64, "rows": 2, "vector": 2, "cache": "none"}]),
    ("vit_softmax", "nn.softmax", [lambda: _with_nan_row((1, 12, 197, 197), 1)],
     {"axis": -1}, lambda x: torch.softmax(x, -1), "softmax",
     [{"threads": 128, "rows": 1, "vector": 1, "cache": "none"}]),
    ("odd_softmax", "nn.softmax", [lambda: _randn((7, 33), 2)], {"axis": -1},
     lambda x: torch.softmax(x, -1), "softmax",
     [{"threads": 8, "rows": 1, "vector": 1, "cache": "none"},
      {"threads": 1, "rows": 1, "vector": 1, "cache": "shared"}]),
    ("log_softmax", "nn.log_softmax", [lambda: _randn((2, 4, 50), 3)], {"axis": -1},
     lambda x: torch.log_softmax(x, -1), "log_softmax",
     [{"threads": 16, "rows": 4, "vector": 2, "cache": "shared"}]),
    ("bert_layer_norm", "nn.layer_norm",
     [lambda: _with_nan_row((1, 128, 768), 4), lambda: _randn((768,), 5),
      lambda: _randn((768,), 6)], LN,
     lambda x, w, b: F.layer_norm(x, (768,), w, b, 1e-5), "layer_norm",
     [{"threads": 32, "rows": 4, "vector": 4, "cache": "shared"},
      {"threads": 1024, "rows": 1, "vector": 4, "cache": "none"}]),
    ("vit_layer_norm", "nn.layer_norm",
     [lambda: _randn((1, 197, 768), 7) * 4 + 1, lambda: _randn((768,), 8),
      lambda: _randn((768,), 9)], LN,
     lambda x, w, b: F.layer_norm(x, (768,), w, b, 1e-5), "layer_norm",
     [{"threads": 64, "rows": 1, "vector": 2, "cache": "shared"}]),
    ("row_sum", "sum", [lambda: _randn((64, 1000), 10)], {"axis": (1,), "keepdims": False},
     lambda x: x.sum(1), "reduce", [{"threads": 512, "rows": 2, "vector": 4, "cache": "shared"}]),
    ("row_mean", "mean", [lambda: _randn((3, 5, 49), 11)], {"axis": (2,), "keepdims": True},
     lambda x: x.mean(2, keepdim=True), "reduce",
     [{"threads": 64, "rows": 1, "vector": 1, "cache": "none"}]),
    # amax / amin as a plain max and a count (NaN-keeping): both reducers the GPU knows
    ("row_amax", "max", [lambda: _with_inf_row(_with_nan_row((8, 300), 13))],
     {"axis": (1,), "keepdims": False}, lambda x: x.amax(1), "reduce",
     [{"threads": 64, "rows": 2, "vector": 4, "cache": "shared"}]),
    ("global_pool", "nn.adaptive_avg_pool2d", [lambda: _randn((2, 512, 7, 7), 12)],
     {"output_size": (1, 1), "layout": "NCHW"}, lambda x: F.adaptive_avg_pool2d(x, 1), "pool",
     [{"threads": 16, "rows": 8, "vector": 1, "cache": "shared"}]),
]


def _shared_bytes(source: str) -> int:
    sizes = {"float": 4, "int": 4, "half": 2, "double": 8}
    return sum(sizes.get(dtype, 4) * int(n) for dtype, n in re.findall(
        r"__shared__ (?:alignas\(\d+\) )?(\w+) \w+\[(\d+)\]", source))


def _lowered(op: str, inputs, attrs, config):
    params = [Var(f"x{i}", TensorType(tuple(x.shape), "float32")) for i, x in enumerate(inputs)]
    func = Function(params, Call(op, params, attrs))
    return lower_primitive(func, "k", resolve_target(f"cuda:{ARCH}"), config, return_info=True)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_row_template_builds_for_cuda_and_matches_torch(case):
    _, op, makers, attrs, reference, template, configs = case
    inputs = [make() for make in makers]
    info = target_info(f"cuda:{ARCH}")
    with torch.no_grad():
        expected = reference(*inputs)
    for config in [None, *configs]:
        prim, applied = _lowered(op, inputs, attrs, config)
        assert [(a.template, a.source, a.error) for a in applied] == [
            (template, "given" if config else "fallback", None)], applied
        check_bound(prim, "k")
        lib = compile_cuda(tvm.IRModule({"k": prim}), info.tvm_target)
        source = lib.mod.imports[0].inspect_source()
        assert _shared_bytes(source) <= info.max_shared_memory_per_block, config
        threads = launch_extents(prim)
        assert threads.get("blockIdx.x", 1) >= 1 and "threadIdx.x" in threads
        if config is None and op != "nn.adaptive_avg_pool2d":
            assert "__shfl" in source  # the row is reduced across threads
        if GPU:
            dev = tvm.cuda(0)
            args = [tvm.runtime.tensor(x.numpy(), dev) for x in inputs]
            out = tvm.runtime.empty(tuple(expected.shape), "float32", dev)
            lib["k"](*args, out)
            gpu = reference(*(x.cuda() for x in inputs)).cpu()
            assert_close(torch.from_numpy(out.numpy()), gpu, rtol=1e-4, atol=1e-5)


def test_fallback_fills_the_gpu_and_keeps_rows_in_shared_memory():
    sms = 132
    bert = row_fallback(12 * 128, 128, 4, sms, 49152)
    assert bert == {"threads": 32, "rows": 4, "vector": 4, "cache": "shared"}  # a row per warp
    ln = row_fallback(128, 768, 3, sms, 49152)
    assert ln["rows"] == 1 and ln["threads"] >= 64 and ln["cache"] == "shared"
    long_row = row_fallback(4, 50000, 3, sms, 49152)
    assert long_row["threads"] == 1024 and long_row["cache"] == "none"
    single = row_fallback(64, 1000, 1, sms, 49152)
    assert single["cache"] == "none"  # one pass reads the row once anyway


def test_kernel_features_rank_row_configs():
    template = get_template("softmax", "cuda")
    workload = {"template": "softmax", "inputs": [[[1, 12, 128, 128], "float32"]], "attrs": {}}
    info = target_info(f"cuda:{ARCH}")
    warp = template.kernel_features(workload, {"threads": 32, "rows": 4, "vector": 4,
                                               "cache": "shared"}, info)
    block = template.kernel_features(workload, {"threads": 1024, "rows": 1, "vector": 1,
                                                "cache": "none"}, info)
    assert len(warp) == len(KERNEL_FEATURES) and warp != block


class _Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _attention_inputs():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=gen) for _ in range(3))
    mask = torch.zeros(1, 1, 16, 16)
    mask[..., 12:] = float("-inf")
    mask[..., 5, :] = float("-inf")  # a query that sees nothing: 0, not NaN
    return q, k, v, mask


def test_attention_mask_softmax_is_one_op_and_matches_torch_on_cpu():
    """sdpa with a mask: _safe_softmax is imported whole (softmax, the -inf rows'
    test and the select in one kernel), where its decomposition made three."""
    inputs = _attention_inputs()
    compiled = tecc.compile(_Attention(), inputs, target="llvm")
    ops = [op for kernel in compiled.summary().kernels for op in kernel.ops]
    assert "nn.safe_softmax" in ops and "max" not in ops and "where" not in ops, ops
    with torch.no_grad():
        assert_close(compiled(*inputs), _Attention()(*inputs), rtol=1e-4, atol=1e-5)
    scores = _masked((2, 3, 6, 9), 13)
    direct = Function([x := Var("x", TensorType(tuple(scores.shape), "float32"))],
                      Call("nn.safe_softmax", [x], {"axis": -1}))
    from tecc.graph_opt.evaluate import evaluate_function

    got = evaluate_function(direct, [scores.numpy()])[0]
    np.testing.assert_allclose(got, torch.ops.aten._safe_softmax(scores, -1).numpy(),
                               rtol=1e-5, atol=1e-7)


def test_attention_builds_for_cuda_with_the_softmax_template():
    # 12 queries: rows the fused attention's GPU template does not take (whole blocks
    # of 8), so the chain keeps its masked softmax
    q, k, v, mask = _attention_inputs()
    inputs = (q[..., :12, :].contiguous(), k, v, mask[..., :12, :].contiguous())
    compiled = tecc.compile(_Attention(), inputs, target=f"cuda:{ARCH}")
    softmax = [t for t in compiled.tasks() if t["template"] == "softmax"]
    assert softmax and all(t["source"] == "fallback" for t in softmax), compiled.tasks()
    if GPU:
        with torch.no_grad():
            expected = _Attention().cuda()(*(x.cuda() for x in inputs)).cpu()
        got = compiled(*(x.cuda() for x in inputs)).cpu()
        assert_close(got, expected, rtol=1e-4, atol=1e-5)
