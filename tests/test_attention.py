"""nn.attention (frontend/op_defs/attention.py), the fuse_attention pass
(graph_opt/attention.py) and the CPU attention template
(schedules/templates_attention.py): against torch eager's SDPA and the explicit
softmax(q k^T * scale) v, NaN and masked rows as eager gives them, every knob value
along each axis of the template's space on an 8- and a 16-lane target, a whisper-like
encoder end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import tvm
from tecc.frontend.importer import from_torch
from tecc.frontend.ir import Call, Function, TensorType, Var, post_order
from tecc.frontend.ops import get_op
from tecc.graph_opt import attention as attention_pass
from tecc.graph_opt.pass_manager import PassContext, run_passes
from tecc.graph_opt.pipeline import optimization_pipeline
from tecc.schedules.lower import build_te, lower_primitive
from tecc.schedules.template import ScheduleContext, get_template
from tvm.s_tir.schedule import Schedule

import tecc
from tecc.target import resolve_target, target_info
from tests.util import VECTOR_TARGETS, max_rel_error, runs_on_host

HOST = target_info("llvm")


def _inputs(shape, n, dv=None, mask_shape=None, seed=0, k_transposed=False):
    *b, m, d = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*b, m, d, generator=gen)
    k = torch.randn(*b, n, d, generator=gen)
    v = torch.randn(*b, n, dv or d, generator=gen)
    mask = None if mask_shape is None else torch.randn(*mask_shape, generator=gen)
    return q, k, v, mask


def _attention_fn(shape, n, dv, mask_shape, scale, k_transposed, safe) -> Function:
    *b, m, d = shape
    params = [Var("q", TensorType(tuple(shape), "float32")),
              Var("k", TensorType((*b, d, n) if k_transposed else (*b, n, d), "float32")),
              Var("v", TensorType((*b, n, dv), "float32"))]
    if mask_shape is not None:
        params.append(Var("mask", TensorType(tuple(mask_shape), "float32")))
    attrs = {"scale": scale, "k_transposed": k_transposed, "safe_softmax": safe}
    return Function(params, Call("nn.attention", params, attrs))


def _run(func: Function, arrays, target=HOST, config=None):
    """Build `func` (one nn.attention) for `target`; its output where the host runs
    it (else None), and what the template applied."""
    prim, applied = lower_primitive(func, "attn", target.tvm_target, config, return_info=True)
    ex = tvm.compile(tvm.IRModule({"main": prim}), target=target.tvm_target)
    if not runs_on_host(target.tvm_target):
        return None, applied
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(func.body.shape, "float32"), dev)
    ex["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in arrays], out)
    return out.numpy(), applied


def _eager(q, k, v, mask, scale, safe):
    """The explicit form as eager computes it (safe: torch's _safe_softmax)."""
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s + mask
    p = torch.ops.aten._safe_softmax.default(s, -1) if safe else torch.softmax(s, -1)
    return p @ v


# (q shape, keys, value size, mask shape, k given transposed, safe softmax)
CASES = [
    ((1, 2, 1500, 64), 1500, 64, None, True, True),   # whisper's length
    ((2, 3, 197, 64), 197, 64, (2, 1, 1, 197), False, True),  # prime rows, padded keys
    ((1, 2, 77, 32), 77, 16, (77, 77), False, False),
    ((3, 20, 16), 45, 24, None, False, False),         # one batch axis, Dv != D
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])) + f"_n{c[1]}")
def test_op_matches_torch(case):
    shape, n, dv, mask_shape, k_t, safe = case
    q, k, v, mask = _inputs(shape, n, dv, mask_shape)
    scale = shape[-1] ** -0.5
    func = _attention_fn(shape, n, dv, mask_shape, scale, k_t, safe)
    k_in = k.transpose(-2, -1) if k_t else k
    arrays = [x.numpy() for x in (q, k_in, v, mask) if x is not None]
    got, applied = _run(func, arrays)
    assert applied[0].template == "attention" and applied[0].error is None
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    np.testing.assert_allclose(got, sdpa.numpy(), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(got, _eager(q, k, v, mask, scale, safe).numpy(), rtol=1e-4,
                               atol=2e-5)
    # the evaluator (constant folding, the tuner's references) agrees
    want = get_op("nn.attention").evaluate(arrays, func.body.attrs, func.body.ty)
    np.testing.assert_allclose(want, sdpa.numpy(), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("safe", [False, True], ids=["softmax", "safe_softmax"])
def test_nan_and_masked_rows_as_in_eager(safe):
    """A NaN in a query row makes that row NaN, one in V its column; a row masked
    everywhere gives NaN as softmax does, 0 as _safe_softmax does."""
    shape, n = (1, 2, 9, 16), 40
    q, k, v, mask = _inputs(shape, n, mask_shape=(1, 1, 9, n), seed=3)
    q[0, 0, 2, 5] = float("nan")
    v[0, 1, 7, 3] = float("nan")
    mask[0, 0, 4, :] = -float("inf")
    func = _attention_fn(shape, n, 16, (1, 1, 9, n), 0.25, False, safe)
    arrays = [x.numpy() for x in (q, k, v, mask)]
    got, _ = _run(func, arrays)
    want = _eager(q, k, v, mask, 0.25, safe).numpy()
    assert np.isnan(got[0, 0, 2]).all() and np.isnan(got[0, 1, :, 3]).all()
    masked = np.delete(got[0, :, 4], 3, axis=-1)  # V's NaN column is NaN there too
    assert np.isnan(masked).all() if not safe else (masked == 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5, equal_nan=True)
    evaluated = get_op("nn.attention").evaluate(arrays, func.body.attrs, func.body.ty)
    np.testing.assert_allclose(evaluated, want, rtol=1e-4, atol=2e-5, equal_nan=True)


# -------------------------------------------------------------------- the pass


class Explicit(torch.nn.Module):
    """Attention as a whisper-like model writes it: q scaled, heads split, a mask."""

    def __init__(self, heads: int = 2, masked: bool = False, weights: bool = False):
        super().__init__()
        self.heads, self.masked, self.weights = heads, masked, weights

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.heads
        q, k, v = (y.reshape(b, t, h, c // h).transpose(1, 2) for y in (x * 0.125, x + 1, x - 1))
        s = q @ k.transpose(-2, -1)
        if self.masked:
            s = s + mask
        p = torch.softmax(s, -1)
        out = (p @ v).transpose(1, 2).reshape(b, t, c)
        return (out, p) if self.weights else out


def _optimized(module, inputs, target):
    imported = from_torch(module, inputs)
    with PassContext(target=target, opt_level=3):
        return run_passes(imported.func, optimization_pipeline())


def _ops(func: Function) -> list[str]:
    return [n.op for n in post_order(func.body) if isinstance(n, Call) and isinstance(n.op, str)]


@pytest.mark.parametrize("masked", [False, True])
def test_pass_fuses_attention_on_cpu(masked):
    t = attention_pass.MIN_KEYS
    x, mask = torch.randn(1, t, 32), torch.randn(1, 1, t, t)
    func = _optimized(Explicit(masked=masked), (x, mask), "llvm")
    ops = _ops(func)
    assert ops.count("nn.attention") == 1 and "nn.softmax" not in ops
    call = next(n for n in post_order(func.body) if isinstance(n, Call) and n.op == "nn.attention")
    assert len(call.args) == (4 if masked else 3)
    assert math.isclose(call.attrs["scale"], 1.0)  # q's 0.125 stays in its producer
    cm = tecc.compile(Explicit(masked=masked), (x, mask))
    with torch.no_grad():
        assert max_rel_error(cm(x, mask), Explicit(masked=masked)(x, mask)) < 1e-4


def test_pass_leaves_short_and_shared_chains_and_what_the_gpu_template_cannot_take():
    t = attention_pass.MIN_KEYS
    x, mask = torch.randn(1, t, 32), torch.randn(1, 1, t, t)
    assert "nn.attention" not in _ops(_optimized(Explicit(), (x, mask), None))
    gpu = "cuda:sm_90"
    assert "nn.attention" in _ops(_optimized(Explicit(), (x, mask), gpu))
    # rows not in whole blocks of 8, more keys than the shared memory holds
    odd = attention_pass.GPU_ROW_BLOCK * 2 + 2
    assert "nn.attention" not in _ops(_optimized(Explicit(), (x[:, :odd], mask), gpu))
    long = attention_pass.MAX_GPU_KEYS + 8
    assert "nn.attention" not in _ops(_optimized(Explicit(), (torch.randn(1, long, 32),
                                                              mask), gpu))
    short = t // 2
    assert "nn.attention" not in _ops(_optimized(
        Explicit(), (x[:, :short], mask[..., :short, :short]), "llvm"))
    # the probabilities are an output too: the scores must exist, nothing to fuse
    assert "nn.attention" not in _ops(_optimized(Explicit(weights=True), (x, mask), "llvm"))


def test_pass_takes_sdpa_scale_and_mask():
    """SDPA with a boolean mask: torch scales q and k by the root of the scale and
    calls _safe_softmax; the op takes the product and the mask, as safe_softmax."""
    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v, keep):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    t = attention_pass.MIN_KEYS
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, t, 16, generator=gen) for _ in range(3))
    keep = torch.rand(1, 1, t, t, generator=gen) > 0.3
    keep[..., 5, :] = False  # a row masked everywhere: 0
    func = _optimized(Sdpa(), (q, k, v, keep), "llvm")
    call = next(n for n in post_order(func.body) if isinstance(n, Call) and n.op == "nn.attention")
    assert call.attrs["safe_softmax"] and math.isclose(call.attrs["scale"], 0.25, rel_tol=1e-6)
    cm = tecc.compile(Sdpa(), (q, k, v, keep))
    got = cm(q, k, v, keep)
    assert max_rel_error(got, Sdpa()(q, k, v, keep)) < 1e-4 and (got[0, :, 5] == 0).all()



class ScaledAndMasked(torch.nn.Module):
    """A scale and an additive mask on the scores, in either order."""

    def __init__(self, scale_first: bool):
        super().__init__()
        self.scale_first = scale_first

    def forward(self, q, k, v, mask):
        s = q @ k.transpose(-1, -2)
        s = s * 0.125 + mask if self.scale_first else (s + mask) * 0.125
        return s.softmax(-1) @ v


@pytest.mark.parametrize("scale_first", [True, False], ids=["scale_mask", "mask_scale"])
def test_pass_scales_the_mask_that_a_scale_follows(scale_first):
    """(S + mask) * c is S * c + mask * c: the op's mask is scaled too."""
    t = attention_pass.MIN_KEYS + 8
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, t, 16, generator=gen) for _ in range(3))
    mask = torch.randn(2, 3, t, t, generator=gen) * 4  # a bias, not only 0 and -inf
    model = ScaledAndMasked(scale_first)
    assert _ops(_optimized(model, (q, k, v, mask), "llvm")).count("nn.attention") == 1
    cm = tecc.compile(model, (q, k, v, mask))
    assert max_rel_error(cm(q, k, v, mask), model(q, k, v, mask)) < 1e-4


class Divided(torch.nn.Module):
    """MobileViT's and SegFormer's form: 4-d matmuls (batch and heads merged by the
    importer's reshapes), the scores divided by sqrt(d), a mask added after it."""

    def __init__(self, masked: bool):
        super().__init__()
        self.masked = masked

    def forward(self, q, k, v, mask):
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if self.masked:
            s = s + mask
        return torch.matmul(torch.softmax(s, dim=-1), v)


@pytest.mark.parametrize("masked", [False, True])
def test_pass_takes_a_division_of_the_scores(masked):
    t = attention_pass.MIN_KEYS + 4
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, t, 48, generator=gen) for _ in range(3))
    mask = torch.randn(2, 1, t, t, generator=gen) * 3
    model = Divided(masked)
    func = _optimized(model, (q, k, v, mask), "llvm")
    call = next(n for n in post_order(func.body) if isinstance(n, Call) and n.op == "nn.attention")
    assert math.isclose(call.attrs["scale"], 1 / math.sqrt(48), rel_tol=1e-6)
    assert "divide" not in _ops(func)
    cm = tecc.compile(model, (q, k, v, mask))
    assert max_rel_error(cm(q, k, v, mask), model(q, k, v, mask)) < 1e-4
    # MobileViT's 36-wide heads are no whole number of vectors: left unfused
    narrow = tuple(x[..., :36] for x in (q, k, v))
    assert "nn.attention" not in _ops(_optimized(model, (*narrow, mask), "llvm:skylake-avx512"))


# -------------------------------------------------------------------- the template

# (q shape, keys, value size, mask shape): ragged keys (20 of 32 padded) and a mask
TEMPLATE_CASE = ((1, 2, 8, 16), 20, 16, (1, 1, 8, 20))


def _knob_configs(space, fallback):
    """For each knob and each of its values, the fallback with that value (register
    rows and block rows adjusted to divide each other): every value along every axis."""
    rows_opts = space.knobs[0].options
    out = []
    for knob in space.knobs:
        for value in knob.options:
            values = dict(fallback.to_json(), **{knob.name: value})
            if knob.name == "rows":
                for tile in ("score_rows", "out_rows"):
                    values[tile] = max(t for t in space._by_name[tile].options if value % t == 0)
            elif knob.name in ("score_rows", "out_rows"):
                values["rows"] = next(r for r in reversed(rows_opts) if r % value == 0)
                other = "out_rows" if knob.name == "score_rows" else "score_rows"
                if values["rows"] % values[other]:
                    values[other] = 1
            config = space.from_json(values)
            assert space.why_not(config) is None, values
            if config not in out:
                out.append(config)
    return out


@pytest.mark.parametrize("target", VECTOR_TARGETS)
def test_template_every_knob_value(target):
    info = target_info(resolve_target(target))
    shape, n, dv, mask_shape = TEMPLATE_CASE
    func = _attention_fn(shape, n, dv, mask_shape, 0.3, False, True)
    q, k, v, mask = _inputs(shape, n, dv, mask_shape, seed=5)
    arrays = [x.numpy() for x in (q, k, v, mask)]
    want = _eager(q, k, v, mask, 0.3, True).numpy()
    template = get_template("attention")
    placeholders, outputs = build_te(func, info.tvm_target)
    sch = Schedule(tvm.IRModule({"main": tvm.te.create_prim_func(placeholders + outputs)}))
    ctx = ScheduleContext.create(sch, sch.get_sblock("attention"), info, "attention")
    space = template.define_space(ctx)
    fallback = template.fallback(space, ctx)
    assert space.why_not(fallback) is None
    configs = _knob_configs(space, fallback)
    assert len(configs) >= sum(len(k) for k in space.knobs) - len(space.knobs)
    # one library for all of them
    prims = {}
    for i, config in enumerate(configs):
        prim, applied = lower_primitive(func, f"attn{i}", info.tvm_target, config.to_json(),
                                        return_info=True)
        assert applied[0].source == "given" and applied[0].error is None, applied[0]
        prims[f"attn{i}"] = prim
    lib = tvm.compile(tvm.IRModule(prims), target=info.tvm_target)
    if not runs_on_host(info.tvm_target):
        return
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    for i, config in enumerate(configs):
        out = tvm.runtime.tensor(np.zeros(want.shape, "float32"), dev)
        lib[f"attn{i}"](*args, out)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=2e-5,
                                   err_msg=str(config.to_json()))


def test_template_refuses_tiles_that_do_not_divide():
    shape, n, dv, mask_shape = TEMPLATE_CASE
    func = _attention_fn(shape, n, dv, mask_shape, 0.3, False, True)
    space_probe = {}

    def choose(workload, space):
        space_probe["space"] = space
        return None

    lower_primitive(func, "attn", HOST.tvm_target, choose)
    space = space_probe["space"]
    bad = dict(space.get(0).to_json(), rows=2, score_rows=4)
    assert space.why_not(space.from_json(bad)) is not None


# -------------------------------------------------------------------- a whole model


def test_whisper_like_encoder_matches_eager():
    transformers = pytest.importorskip("transformers")
    frames = 2 * max(attention_pass.MIN_KEYS, 100)
    cfg = transformers.WhisperConfig(d_model=64, encoder_layers=1, encoder_attention_heads=2,
                                     decoder_layers=1, decoder_attention_heads=2,
                                     encoder_ffn_dim=128, num_mel_bins=16,
                                     max_source_positions=frames // 2)
    encoder = transformers.WhisperModel(cfg).get_encoder().eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, features):
            return self.encoder(features, return_dict=False)[0]

    x = torch.randn(1, 16, frames, generator=torch.Generator().manual_seed(0))
    cm = tecc.compile(Encoder(), (x,))
    assert sum(t["template"] == "attention" for t in cm.tasks()) == 1
    with torch.no_grad():
        assert max_rel_error(cm(x), Encoder()(x)) < 1e-4
