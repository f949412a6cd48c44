"""Every supported ATen op, through the whole pipeline, against torch eager."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tecc.frontend.importer import ImportError_, from_torch
from tecc.frontend.ir import Call, post_order

import tecc
from tests.util import assert_close


class Lambda(torch.nn.Module):
    def __init__(self, fn, *params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        self.params = torch.nn.ParameterList([torch.nn.Parameter(p, requires_grad=False)
                                              for p in params])

    def forward(self, *xs):
        return self.fn(*xs, *self.params)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CASES = {
    # elementwise and broadcast
    "relu": (lambda x: torch.relu(x), [(3, 7)], [(2, 5, 9)]),
    "gelu": (lambda x: F.gelu(x), [(4, 33)], [(2, 3, 17)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [(4, 33)], [(1, 65)]),
    "sigmoid": (torch.sigmoid, [(5, 7)], [(2, 3, 31)]),
    "tanh": (torch.tanh, [(5, 7)], [(3, 129)]),
    "exp_log": (lambda x: torch.log(torch.exp(x) + 1), [(6, 9)], [(2, 17)]),
    "sqrt_rsqrt": (lambda x: torch.sqrt(x.abs() + 1) + torch.rsqrt(x.abs() + 1), [(6, 9)],
                   [(2, 17)]),
    "erf_neg": (lambda x: -torch.erf(x), [(6, 9)], [(3, 3, 3)]),
    "hardtanh_relu6": (lambda x: F.relu6(x * 4) + F.hardtanh(x), [(2, 8, 5, 5)], [(1, 3, 7)]),
    "hardswish": (F.hardswish, [(2, 8, 5, 5)], [(1, 3, 7)]),
    "hardsigmoid": (F.hardsigmoid, [(2, 8, 5, 5)], [(1, 3, 7)]),
    "silu": (F.silu, [(2, 8, 5, 5)], [(1, 3, 7)]),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), [(4, 5)], [(3, 7)]),
    "clamp": (lambda x: x.clamp(min=-0.5) + x.clamp(max=0.3) + x.clamp(-0.1, 0.2), [(4, 5)],
              [(2, 9)]),
    "add_sub_mul_div": (lambda x, y: (x + y) * (x - y) / (y.abs() + 1), [(3, 4), (3, 4)],
                        [(2, 1, 5), (3, 1)]),
    "scalars": (lambda x: (x * 0.5 + 2) / 3 - 1, [(4, 5)], [(7,)]),
    "pow_max_min": (lambda x, y: torch.maximum(x, y) + torch.minimum(x, y) ** 2,
                    [(3, 4), (4,)], [(2, 3), (2, 3)]),
    "pow_constants": (lambda x: x ** 3 - x ** 2 + (x.abs() + 1) ** 0.5 + (x.abs() + 1) ** -1
                      + (x.abs() + 1) ** 1.7, [(4, 33)], [(2, 17)]),
    "compare_where": (lambda x, y: torch.where(x > y, x, y * 2) + (x <= 0).float(),
                      [(3, 4), (3, 4)], [(5, 1), (1, 6)]),
    # linear algebra
    "linear": (None, [(3, 20)], [(2, 4, 33)]),
    "matmul_bmm": (lambda a, b: torch.bmm(a, b), [(2, 5, 7), (2, 7, 3)],
                   [(3, 16, 33), (3, 33, 9)]),
    "mm": (lambda a, b: a @ b, [(5, 7), (7, 3)], [(31, 17), (17, 65)]),
    # convolution and normalization
    "conv2d": (None, [(1, 3, 13, 11)], [(2, 3, 16, 16)]),
    "batch_norm": (None, [(2, 6, 7, 9)], [(1, 6, 4, 4)]),
    "layer_norm": (None, [(3, 24)], [(2, 5, 24)]),
    # NCHW (PoolFormer, U-Nets) and NCL (wav2vec2's feature encoder, one channel a group)
    "group_norm": (None, [(2, 12, 5, 7)], [(3, 8, 33)]),
    "var_mean": (lambda x: torch.var_mean(x, -1, keepdim=True)[0] * torch.var_mean(x, (0, 1))[1],
                 [(3, 4, 9)], [(2, 5, 17)]),
    # F.normalize (Swin v2's cosine attention, CLIP's embeddings), ConvNeXt v2's global
    # response norm, and other orders
    "vector_norm": (lambda x: F.normalize(x, dim=-1) + torch.linalg.vector_norm(
        x, dim=(1, 2), keepdim=True) + torch.linalg.vector_norm(x, ord=1, dim=-1, keepdim=True)
        + torch.linalg.vector_norm(x, ord=float("inf")) + x.norm(), [(2, 3, 8)], [(1, 6, 5)]),
    "softmax": (lambda x: torch.softmax(x, -1) + torch.log_softmax(x, 1), [(3, 17)],
                [(2, 4, 9)]),
    # pooling and reductions
    "max_pool": (lambda x: F.max_pool2d(x, 3, 2, 1), [(1, 4, 11, 11)], [(2, 3, 8, 8)]),
    "max_pool_ceil": (lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True), [(1, 2, 7, 9)],
                      [(2, 3, 5, 5)]),
    "avg_pool": (lambda x: F.avg_pool2d(x, 3, 2, 1) + F.avg_pool2d(x, 3, 2, 1,
                                                                 count_include_pad=False),
                 [(1, 4, 11, 11)], [(2, 3, 8, 8)]),
    "adaptive_avg_pool": (lambda x: F.adaptive_avg_pool2d(x, 1) + F.adaptive_avg_pool2d(x, 1),
                          [(1, 8, 7, 7)], [(2, 3, 9, 5)]),
    "adaptive_avg_pool_3": (lambda x: F.adaptive_avg_pool2d(x, (3, 2)), [(1, 2, 7, 7)],
                            [(2, 3, 9, 5)]),
    # windows past the padded input (transformers' EfficientNet: a 1280 window, ceil_mode,
    # over 7x7), one window or several, dilated
    "pool_window_past_input": (lambda x: F.avg_pool2d(x, 40, ceil_mode=True) + F.max_pool2d(
        x, 12, 5, 2, ceil_mode=True) + F.avg_pool2d(x, 8, 1, 2) * F.avg_pool2d(
        x, 8, 1, 2, count_include_pad=False) - F.max_pool2d(x, 5, 1, 2, dilation=2).amax(
        (2, 3), keepdim=True), [(1, 4, 5, 5)], [(2, 3, 6, 7)]),
    "mean_sum_amax": (lambda x: x.mean(-1) + x.sum(1) + x.amax(-1), [(3, 5, 5)],
                      [(2, 7, 7)]),
    "var": (lambda x: x.var(-1, keepdim=True) + x, [(3, 9)], [(2, 4, 17)]),
    "argmax_argmin": (lambda x: (x.argmax(-1) * 3 + x.argmin(2, keepdim=True).squeeze(-1)
                                 + x.argmax(1, keepdim=True).sum(-1) + x.argmax()
                                 - x.argmin(0)[:1, :1]), [(3, 5, 7)], [(2, 9, 4)]),
    "log1p": (lambda x: torch.log1p(x.abs() * 1e-9) * 1e9 + torch.log1p(x.abs()), [(4, 33)],
              [(2, 17)]),
    # data movement
    "view_permute": (lambda x: x.view(x.shape[0], -1, 2).permute(2, 0, 1).contiguous() * 2,
                     [(3, 4, 6)], [(2, 10)]),
    "transpose_expand": (lambda x: x.transpose(0, 1).unsqueeze(0).expand(3, -1, -1) + 1,
                         [(4, 5)], [(7, 2)]),
    "slice_select": (lambda x: x[:, 1:4] * x[:, 0:1] + x[:, ::2][:, :3] + x.select(1, 2)
                     .unsqueeze(1), [(3, 7)], [(2, 9)]),
    # writes into slices (torch.export makes them slice_scatter): a range, a step, the
    # last axis
    "slice_scatter": (lambda x, y: torch.slice_scatter(x, y[:, :2] * 2, 1, 1, 3)
                      + torch.slice_scatter(x, y[:, 1:4], 1, 0, None, 2)
                      + torch.slice_scatter(x, y[..., :1] + 1, -1, -2, -1), [(3, 6, 4), (3, 6, 4)],
                      [(2, 5, 3), (2, 5, 3)]),
    "cat_split": (lambda x, y: torch.cat([x, y * 2], 1).split([2, 5], 1)[1] + 1,
                  [(3, 3), (3, 4)], [(2, 2), (2, 5)]),
    "flatten_squeeze": (lambda x: x.flatten(1).unsqueeze(1).squeeze(1) * 3, [(2, 3, 4)],
                        [(1, 5, 1)]),
    "roll": (lambda x: torch.roll(x, 2, 1) + torch.roll(x, (-1, 3, 1), (0, -1, 0)) * 2
             + torch.roll(x, 5), [(3, 5, 4)], [(2, 7, 6)]),
    # Swin's shifted windows: two rolled axes after a reshape, then a reshape back
    "roll_after_reshape": (lambda x, s: torch.roll((x * 2).view(x.shape[0], 7, -1, x.shape[2]),
                                                   (3, 3), (1, 2)).reshape(x.shape) + s,
                           [(1, 49, 8), (1, 49, 8)], [(2, 35, 4), (2, 35, 4)]),
    "constant_pad": (lambda x: F.pad(x, (1, 2, 0, 3)) + F.pad(x, (-1, 2, 2, -1), value=-0.5)
                     .sum() + F.pad(x, (1, 1, 0, 0, 2, 0), value=2.0).mean(), [(2, 3, 5, 6)],
                     [(1, 4, 7, 3)]),
    # TensorFlow's "same" padding before a conv (HF's MobileNetV2): the pad folds into it
    "pad_then_conv": (None, [(1, 3, 9, 8)], [(2, 3, 12, 7)]),
    "conv1d": (None, [(1, 6, 20)], [(2, 6, 33)]),
    # upsampling by 2 (DPT, U-Nets), odd kernels with output_padding, groups, dilation,
    # padding past the kernel (a crop), 1-d
    "conv_transpose": (None, [(1, 8, 6, 5)], [(2, 8, 7, 7)]),
    "conv_transpose1d": (None, [(1, 6, 9)], [(2, 6, 16)]),
    "gather": (lambda x, i: torch.gather(x, 1, i) * 2 + torch.gather(x, 0, i[:2, :3] // 4).sum(),
               [(2, 5, 6), (2, 4, 6)], [(3, 7, 2), (3, 9, 2)]),
    # computed indices: CLIP's pooled token (one per row, at its argmax), an index of
    # one axis, negative indices
    "index_computed": (lambda x, i: x[torch.arange(x.shape[0]), (i * 3).argmax(-1)] * 2
                       + x[((i > 0).long().sum(-1) - 1).clamp(max=x.shape[0] - 1)].sum(1),
                       [(3, 5, 4), (3, 5)], [(2, 7, 3), (2, 7)]),
    "cumsum": (lambda x, i: torch.cumsum(x, 1) * 2 + x.cumsum(-1) - (
        torch.cumsum(i.ne(1).int(), dim=-1) * i.ne(1)).sum(), [(2, 5, 6), (2, 6)],
        [(3, 9), (3, 9)]),
    "interpolate": (lambda x: F.interpolate(x, size=(13, 9), mode="bilinear").mean() + (
        F.interpolate(x, scale_factor=2, mode="nearest") + F.interpolate(
            x, scale_factor=2, mode="bilinear") + F.interpolate(
            x, size=(x.shape[2] * 2, x.shape[3] * 2), mode="bilinear", align_corners=True)),
        [(1, 3, 7, 10)], [(2, 2, 4, 4)]),
}


def build_case(name: str, shapes: list[tuple[int, ...]]):
    fn = CASES[name][0]
    gen = torch.Generator().manual_seed(1)
    if name == "linear":
        module = torch.nn.Linear(shapes[0][-1], 13)
    elif name == "conv2d":
        module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1),
                                     torch.nn.Conv2d(8, 8, 3, 1, 1, groups=8),
                                     torch.nn.Conv2d(8, 6, 1, groups=2, bias=False),
                                     torch.nn.Conv2d(6, 5, (3, 2), dilation=(1, 2)))
    elif name == "batch_norm":
        module = torch.nn.BatchNorm2d(shapes[0][1])
        module.running_mean.normal_(generator=gen)
        module.running_var.uniform_(0.5, 2, generator=gen)
        module.weight.data.normal_(generator=gen)
    elif name == "layer_norm":
        module = torch.nn.LayerNorm(shapes[0][-1])
        module.weight.data.normal_(generator=gen)
        module.bias.data.normal_(generator=gen)
    elif name == "conv_transpose":
        module = torch.nn.Sequential(
            torch.nn.ConvTranspose2d(8, 6, 2, stride=2),
            torch.nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1, groups=2),
            torch.nn.ConvTranspose2d(4, 5, 3, stride=(1, 2), dilation=2, padding=(0, 1)),
            torch.nn.ConvTranspose2d(5, 3, 1, padding=1, bias=False))
    elif name == "conv_transpose1d":
        module = torch.nn.Sequential(torch.nn.ConvTranspose1d(6, 8, 4, stride=2, padding=1),
                                     torch.nn.ConvTranspose1d(8, 5, 3, stride=3,
                                                              output_padding=2))
    elif name == "group_norm":
        channels = shapes[0][1]
        module = torch.nn.GroupNorm(4 if channels % 4 == 0 and channels != 8 else channels,
                                    channels)
        module.weight.data.normal_(generator=gen)
        module.bias.data.normal_(generator=gen)
    elif name == "pad_then_conv":
        module = torch.nn.Sequential(Lambda(lambda x: F.pad(x, (0, 1, 1, 2))),
                                     torch.nn.Conv2d(3, 8, 3, 2),
                                     Lambda(lambda x: F.pad(x, (1, 1, 1, 1))),
                                     torch.nn.Conv2d(8, 8, 3, groups=8))
    elif name == "conv1d":
        module = torch.nn.Sequential(torch.nn.Conv1d(6, 8, 3, padding=1),
                                     torch.nn.Conv1d(8, 5, 5, stride=2))
    else:
        module = Lambda(fn)
    inputs = tuple(randn(*s, seed=i) for i, s in enumerate(shapes))
    if name in ("gather", "cumsum"):  # the index (mask) input: integers within range
        bound = {"gather": min(shapes[0][0], shapes[0][1]), "cumsum": 3}[name]
        inputs = inputs[:1] + (torch.randint(0, bound, shapes[1],
                                             generator=torch.Generator().manual_seed(5)),)
    return module.eval(), inputs


@pytest.mark.parametrize("shape_set", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_torch(name, shape_set):
    module, inputs = build_case(name, CASES[name][shape_set])
    compiled = tecc.compile(module, inputs)
    with torch.no_grad():
        expected = module(*inputs)
    assert_close(compiled(*inputs), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("activation, op", [
    (torch.nn.Hardswish(), "hardswish"), (torch.nn.SiLU(), "silu"),
    (torch.nn.Hardsigmoid(), "hardsigmoid"), (Lambda(lambda x: torch.roll(x, (1, -2), (2, 3))),
                                              "roll"),
])
def test_ops_with_a_converter_import_natively(activation, op):
    # an ATen op with a converter is not decomposed: the model reaches its own IR op
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), activation).eval()
    x = randn(2, 3, 9, 7, seed=4) * 3
    calls = [n.op for n in post_order(from_torch(model, (x,)).func.body)
             if isinstance(n, Call)]
    assert calls == ["nn.conv2d", "nn.bias_add", op]
    with torch.no_grad():
        expected = model(x)
    assert_close(tecc.compile(model, (x,))(x), expected, rtol=1e-4, atol=1e-5)


def test_argmax_takes_the_first_of_ties_and_a_nan_as_torch_does():
    """Ties give the lowest index; a NaN is the largest value and the smallest (argmax
    and argmin both give the first NaN of a row); integers too."""
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0, -2.0], [float("nan"), 5.0, float("nan"), 0.0, 9.0],
                      [0.5, float("-inf"), float("inf"), float("inf"), float("-inf")]])
    model = Lambda(lambda x: torch.stack([x.argmax(-1), x.argmin(-1), x.argmax(0)[:3],
                                          x.argmin(0)[:3]]))
    assert torch.equal(tecc.compile(model, (x,))(x), model(x))
    ints = torch.tensor([[4, 7, 7, 1], [2, 2, 0, 0]], dtype=torch.int32)
    model = Lambda(lambda i: i.argmax(-1) * 10 + i.argmin(-1))
    assert torch.equal(tecc.compile(model, (ints,))(ints), model(ints))


def test_a_transposed_conv_spreads_inf_and_nan_only_where_torch_does():
    """The inserted zeros are zeros, not an input times 0: an inf or a NaN reaches the
    outputs its kernel window covers, as in torch, and no others."""
    model = torch.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1).eval()
    x = randn(1, 3, 6, 6, seed=8)
    x[0, 0, 1, 2], x[0, 2, 4, 4] = float("inf"), float("nan")
    with torch.no_grad():
        expected = model(x)
    assert expected.isfinite().sum() > expected.numel() // 2  # most outputs stay finite
    assert_close(tecc.compile(model, (x,))(x), expected, rtol=1e-4, atol=1e-5)


def test_group_norm_keeps_its_per_group_statistics():
    """native_group_norm's mean and 1/std outputs, as torch computes them."""
    x = randn(2, 6, 4, 5, seed=3) * 3 + 1
    weight, bias = randn(6, seed=4), randn(6, seed=5)
    model = Lambda(lambda x: torch.ops.aten.native_group_norm(x, weight, bias, 2, 6, 20, 3, 1e-5))
    for got, expected in zip(tecc.compile(model, (x,))(x), model(x), strict=True):
        assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_constant_exponents_are_multiplications_and_roots():
    """x ** 3 (gelu's tanh form) as x * x * x, x ** 0.5 as sqrt, x ** -1 as 1 / x, as
    torch's pow kernel computes them; another exponent stays a power."""
    model = Lambda(lambda x: x ** 3 + torch.pow(x, 2.0) + x.abs() ** -0.5 + x ** -1 + x ** 1.5)
    x = randn(3, 8, seed=6)
    calls = [n.op for n in post_order(from_torch(model, (x,)).func.body)
             if isinstance(n, Call)]
    assert calls.count("power") == 1 and "rsqrt" in calls and "divide" in calls, calls
    torch.testing.assert_close(tecc.compile(model, (x,))(x), model(x), equal_nan=True,
                               rtol=1e-5, atol=1e-6)


def test_embedding_and_int_inputs():
    emb = torch.nn.Embedding(50, 16)

    class M(torch.nn.Module):
        def forward(self, ids, mask):
            hidden = emb(ids) * mask.unsqueeze(-1).to(torch.float32)
            keep = (mask == 0).logical_not()
            return torch.where(keep.unsqueeze(-1), hidden, torch.full_like(hidden, -1.0))

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (2, 7), generator=gen)
    mask = torch.randint(0, 2, (2, 7), generator=gen)
    model = M().eval()
    compiled = tecc.compile(model, (ids, mask))
    assert_close(compiled(ids, mask), model(ids, mask), rtol=1e-5, atol=1e-6)


def test_numpy_in_numpy_out():
    module, inputs = build_case("linear", CASES["linear"][1])
    compiled = tecc.compile(module, inputs)
    out = compiled(inputs[0].numpy())
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, module(*inputs).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_fast_math_keeps_the_edges_of_exp_tanh_and_softmax():
    """exp, tanh and softmax run as vectorized polynomials in float32: still inf where
    exp overflows, NaN for NaN, and masked (-inf) logits get no probability."""
    class Edges(torch.nn.Module):
        def forward(self, x, logits):
            return torch.exp(x), torch.tanh(x), torch.softmax(logits, -1)

    x = torch.tensor([[0.0, -1.0, 1.5, 88.0, 88.8, 100.0, -100.0, float("nan"),
                       float("inf"), -float("inf"), 20.0, -20.0, 0.3, -7.5, 4e-4, 9.5]])
    logits = randn(3, 16) * 4
    logits[:, ::3] = -float("inf")
    module = Edges()
    compiled = tecc.compile(module, (randn(1, 16), randn(3, 16)))
    for got, want in zip(compiled(x, logits), module(x, logits), strict=True):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-30)


def test_a_padding_before_a_conv_becomes_the_convs_own():
    module, inputs = build_case("pad_then_conv", CASES["pad_then_conv"][1])
    calls = [n for n in post_order(from_torch(module, inputs).func.body) if isinstance(n, Call)]
    assert [c.op for c in calls if c.op in ("pad", "nn.conv2d")] == ["nn.conv2d"] * 2
    assert calls[0].attrs["padding"] == (1, 0, 2, 1)


class Strided(torch.nn.Module):
    def forward(self, x):
        return (torch.as_strided(x, (3, 4), (1, 3)) * 2,  # the transpose of a (4, 3) view
                torch.as_strided(x, (2, 2, 3), (24, 0, 2), 1) + 1,  # steps and an expand
                torch.as_strided(x.transpose(0, 1), (4, 2), (6, 1), 5) - 1,  # of a transpose
                torch.as_strided(x, (2, 1, 5), (30, 7, 2), 20))  # its last row ends past x


def test_as_strided_views_match_torch():
    x = randn(2, 5, 6, seed=3)
    assert_close(tecc.compile(Strided(), (x,))(x), Strided()(x), rtol=1e-6, atol=0)


def test_as_strided_with_overlapping_windows_names_its_sizes_and_strides():
    class Windows(torch.nn.Module):
        def forward(self, x):
            return torch.as_strided(x, (4, 3), (2, 1)) * 2

    with pytest.raises(ImportError_, match=r"as_strided with sizes \(4, 3\), strides \(2, 1\)"):
        tecc.compile(Windows(), (randn(2, 5, 6),))


def test_a_key_value_cache_in_the_outputs_is_flattened():
    """GPT-2 with use_cache=True returns a transformers DynamicCache: its keys and
    values come back as a dict named by their attributes."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=16)
    model = GPT2Model(config).eval()
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)
    got = tecc.compile(model, (ids,))(ids)
    hidden_key, cache_key = expected.keys()  # the cache's name changes between versions
    cache = got[cache_key]
    assert list(cache) == ["layers.0.keys", "layers.0.values", "layers.1.keys",
                           "layers.1.values"]
    want = [t for layer in expected[cache_key].layers for t in (layer.keys, layer.values)]
    assert_close([got[hidden_key], *cache.values()], [expected[hidden_key], *want],
                 rtol=1e-4, atol=1e-5)
