"""The GPU template of nn.attention (schedules/gpu_attention.py): every case builds for
cuda without a GPU (the template applied, one kernel, every block bound, shared
memory within the block's limit); where a GPU is visible each kernel also runs there
against torch on the GPU (tests/test_cuda.py's rule). BERT's shape with its mask and
K^T, keys padded to whole blocks, rows of NaN and rows masked to -inf, knob values
along each axis, and a BERT layer whose head splits are fused into the kernel."""

from __future__ import annotations

import re

import pytest
import torch
import tvm
from tecc.frontend.ir import Call, Function, TensorType, Var
from tecc.frontend.op_defs.attention import padded_keys
from tecc.schedules.gpu_attention import shared_bytes
from tecc.schedules.gpu_default import check_bound, launch_extents
from tecc.schedules.lower import lower_primitive

import tecc
from tecc.cuda_toolchain import compile_cuda
from tecc.target import resolve_target, target_info
from tests.test_cuda import ARCH, GPU
from tests.test_fast_paths import FusedEncoderLayer
from tests.util import assert_close

INFO = target_info(f"cuda:{ARCH}")


def _reference(q, k, v, mask, scale, k_transposed, safe):
    kt = k if k_transposed else k.transpose(-1, -2)
    s = q @ kt * scale
    if mask is not None:
        s = s + mask
    p = torch.ops.aten._safe_softmax(s, -1) if safe else torch.softmax(s, -1)
    return p @ v


def _case(b, m, n, d, dv, mask_shape, k_transposed, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*b, m, d, generator=gen)
    k = torch.randn(*b, *((d, n) if k_transposed else (n, d)), generator=gen)
    v = torch.randn(*b, n, dv, generator=gen)
    mask = None
    if mask_shape is not None:
        mask = torch.randn(*mask_shape, generator=gen)
        mask[..., -3:] = float("-inf")  # padding keys every query ignores
        if mask.shape[-2] > 1:
            mask[..., 1, :] = float("-inf")  # a query that sees nothing
    q[..., 2, 0] = float("nan")  # a row of NaN scores
    return [q, k, v] + ([mask] if mask is not None else [])


# (id, batch, M, N, D, Dv, mask shape, k_transposed, safe softmax, extra configs)
CASES = [
    ("bert", (2, 12), 128, 128, 64, 64, (2, 1, 128, 128), True, True,
     [{"rows": 16, "threads_y": 8, "threads_x": 16, "d_step": 16, "n_step": 32},
      {"rows": 32, "threads_y": 16, "threads_x": 8, "d_step": 4, "n_step": 8}]),
    ("padded_keys", (3,), 16, 50, 32, 16, None, False, False,
     [{"rows": 8, "threads_y": 8, "threads_x": 8, "d_step": 32, "n_step": 50}]),
    ("broadcast_mask", (1, 4), 64, 96, 16, 32, (1, 1, 1, 96), False, True,
     [{"rows": 32, "threads_y": 16, "threads_x": 32, "d_step": 8, "n_step": 32},
      {"rows": 8, "threads_y": 2, "threads_x": 32, "d_step": 16, "n_step": 16}]),
]


def _shared(source: str) -> int:
    return sum(4 * int(n) for n in re.findall(r"__shared__ alignas\(\d+\) float \w+\[(\d+)\]",
                                              source))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_attention_template_builds_for_cuda_and_matches_torch(case):
    _, b, m, n, d, dv, mask_shape, k_transposed, safe, configs = case
    inputs = _case(b, m, n, d, dv, mask_shape, k_transposed, seed=len(b) + m)
    params = [Var(f"x{i}", TensorType(tuple(x.shape), "float32")) for i, x in enumerate(inputs)]
    attrs = {"scale": d ** -0.5, "k_transposed": k_transposed, "safe_softmax": safe}
    func = Function(params, Call("nn.attention", params, attrs))
    expected_gpu = None
    if GPU:
        with torch.no_grad():
            expected_gpu = _reference(*(x.cuda() for x in inputs[:3]),
                                      inputs[3].cuda() if mask_shape else None,
                                      attrs["scale"], k_transposed, safe).cpu()
    for config in [None, *configs]:
        prim, applied = lower_primitive(func, "k", resolve_target(f"cuda:{ARCH}"), config,
                                        return_info=True)
        assert [(a.template, a.source, a.error) for a in applied] == [
            ("attention", "given" if config else "fallback", None)], applied
        check_bound(prim, "k")
        extents = launch_extents(prim)
        lib = compile_cuda(tvm.IRModule({"k": prim}), INFO.tvm_target)
        source = lib.mod.imports[0].inspect_source()
        assert source.count("__global__") == 2  # one kernel (declared, defined)
        assert _shared(source) <= INFO.max_shared_memory_per_block
        chosen = config or applied[0].config
        assert extents["threadIdx.x"] == chosen["threads_x"]
        assert extents["threadIdx.y"] == chosen["threads_y"]
        assert _shared(source) <= shared_bytes(chosen["rows"], padded_keys(n), dv,
                                               chosen["d_step"], chosen["n_step"])
        assert "__shfl" in source  # the row max and sum across a row's threads
        if GPU:
            dev = tvm.cuda(0)
            args = [tvm.runtime.tensor(x.numpy(), dev) for x in inputs]
            out = tvm.runtime.empty((*b, m, dv), "float32", dev)
            lib["k"](*args, out)
            assert_close(torch.from_numpy(out.numpy()), expected_gpu, rtol=1e-4, atol=1e-5)


class _BertLayer(torch.nn.Module):
    """A BERT-style self-attention: one QKV dense, heads split by view and transpose,
    SDPA with an additive padding mask."""

    def __init__(self, hidden: int = 128, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        bias = (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.out(o.transpose(1, 2).reshape(b, t, c))


def test_attention_layer_fuses_its_head_splits_and_matches_torch():
    gen = torch.Generator().manual_seed(3)
    model = _BertLayer().eval()
    x = torch.randn(2, 64, 128, generator=gen)
    mask = torch.ones(2, 64)
    mask[1, 50:] = 0
    compiled = tecc.compile(model, (x, mask), target=f"cuda:{ARCH}")
    attention = [k for k in compiled.summary().kernels if "nn.attention" in k.ops]
    assert len(attention) == 1 and "transpose" in attention[0].ops, \
        [k.ops for k in compiled.summary().kernels]
    tasks = [t for t in compiled.tasks() if t["template"] == "attention"]
    assert tasks and tasks[0]["source"] == "fallback" and tasks[0]["error"] is None, tasks
    if GPU:
        with torch.no_grad():
            expected = model.cuda()(x.cuda(), mask.cuda()).cpu()
        got = compiled(x.cuda(), mask.cuda()).cpu()
        assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_the_encoder_layer_fast_path_runs_in_the_template_and_matches_eager():
    """Decomposed at import (frontend/fast_paths.py), its attention is one template
    kernel on the GPU; a sequence with every key masked gives NaN, as eager's fast path
    does."""
    gen = torch.Generator().manual_seed(8)
    torch.manual_seed(8)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True,
                                             activation="gelu")
    model = FusedEncoderLayer(layer, mask_type=1).eval()  # a key padding mask
    x = torch.randn(2, 40, 32, generator=gen)
    padding = torch.rand(2, 40, generator=gen) < 0.3
    padding[0, 0] = False
    padding[1] = True
    compiled = tecc.compile(model, (x, padding), target=f"cuda:{ARCH}")
    attention = [k for k in compiled.summary().kernels if "nn.attention" in k.ops]
    assert len(attention) == 1, [k.ops for k in compiled.summary().kernels]
    if GPU:
        with torch.no_grad():
            expected = model(x, padding)
        assert expected[1].isnan().all()
        got = compiled(x.cuda(), padding.cuda()).cpu()
        assert_close(got, expected, rtol=1e-4, atol=1e-5)
