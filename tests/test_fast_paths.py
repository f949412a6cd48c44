"""torch's transformer fast paths: in eval mode under no_grad, nn.TransformerEncoderLayer
and nn.MultiheadAttention each call one fused ATen op, which Dynamo hands the backend
(frontend/fast_paths.py). tecc compiles those graphs and matches eager, which runs the
same fast path: masks of each kind (a float mask counts as masked where non-zero), a
query row with every key masked (NaN, as eager gives), attention weights; a program
that calls either op itself compiles strictly."""

from __future__ import annotations

import warnings

import pytest
import torch

import tecc
import tecc.backend
from tests.util import assert_close

D, HEADS, FFN = 32, 4, 64


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def through_backend(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[object, list]:
    """The model's output through torch.compile(backend=tecc) and, per graph Dynamo
    made, (the functions it calls, whether tecc compiled it); no graph may run in torch."""
    graphs: list = []

    def spy(gm, example_inputs):
        result = tecc.backend.tecc_backend(gm, example_inputs)
        targets = " ".join(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        graphs.append((targets, getattr(result, "compiled", False)))
        return result

    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        out = torch.compile(model, backend=spy)(*args, **kwargs)
    assert not [str(w.message) for w in caught if "runs in torch" in str(w.message)]
    return out, graphs


def masks(kind: str, batch: int, length: int) -> dict:
    gen = torch.Generator().manual_seed(7)
    padding = torch.rand(batch, length, generator=gen) < 0.3
    padding[:, 0] = False  # every row keeps a key
    if kind == "none":
        return {}
    if kind == "padding":
        return {"src_key_padding_mask": padding}
    if kind == "causal":
        return {"src_mask": torch.nn.Transformer.generate_square_subsequent_mask(length)}
    if kind == "both":  # of one dtype (a bool and a float mask break Dynamo's graph)
        causal = torch.ones(length, length, dtype=torch.bool).triu(1)
        return {"src_mask": causal, "src_key_padding_mask": padding}
    if kind == "float":  # the fast path masks every non-zero entry out
        values = torch.randn(length, length, generator=gen)
        return {"src_mask": torch.where(values > 0.3, values, 0.0)}
    if kind == "all keys masked":  # the second sequence is padding only: NaN in eager
        padding[1] = True
        return {"src_key_padding_mask": padding}
    raise ValueError(kind)


def encoder_layer(norm_first: bool, activation: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.TransformerEncoderLayer(D, HEADS, FFN, dropout=0.0, activation=activation,
                                            batch_first=True, norm_first=norm_first).eval()


@pytest.mark.parametrize("norm_first,activation,mask,length", [
    (False, "relu", "none", 6), (True, "gelu", "both", 6), (False, "gelu", "padding", 6),
    (True, "relu", "causal", 6), (False, "relu", "float", 6),
    (False, "relu", "all keys masked", 6),
    # 40 keys: the attention pass fuses the chain into the attention template
    (True, "gelu", "both", 40), (False, "relu", "all keys masked", 40),
])
def test_encoder_layer_fast_path_matches_eager(norm_first, activation, mask, length):
    model = encoder_layer(norm_first, activation, seed=length)
    x = torch.randn(2, length, D, generator=torch.Generator().manual_seed(3))
    kwargs = masks(mask, 2, length)
    with torch.no_grad():
        expected = model(x, **kwargs)
    got, graphs = through_backend(model, (x,), kwargs)
    assert any("_transformer_encoder_layer_fwd" in t for t, _ in graphs), graphs
    assert all(compiled is True for _, compiled in graphs), graphs
    if mask == "all keys masked":
        assert expected[1].isnan().all() and not expected[0].isnan().any()
    assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("need_weights,average,mask_type", [
    (True, True, 1), (True, False, 2), (False, True, None), (False, True, 2)])
def test_multi_head_attention_op_matches_eager(need_weights, average, mask_type):
    """aten._native_multi_head_attention, which nn.MultiheadAttention's fast path calls
    in eager (Dynamo's trace of the module takes its slow path): called by a program
    itself, imported and run as eager runs it."""
    torch.manual_seed(1)
    attn = torch.nn.MultiheadAttention(D, HEADS, batch_first=True).eval()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, D, generator=gen)
    padding = masks("padding", 3, 5)["src_key_padding_mask"]
    mask = {None: None, 1: padding,  # type 2: a float mask per head, non-zero is masked
            2: torch.where(torch.rand(3, HEADS, 5, 5, generator=gen) < 0.3, -1.5, 0.0)}[mask_type]

    class SelfAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = attn

        def forward(self, x):
            out, weights = torch._native_multi_head_attention(
                x, x, x, D, HEADS, attn.in_proj_weight, attn.in_proj_bias,
                attn.out_proj.weight, attn.out_proj.bias, mask, need_weights, average,
                mask_type)
            return (out, weights) if need_weights else out

    model = SelfAttention().eval()
    compiled = tecc.compile(model, (x,))
    with torch.no_grad():
        expected = model(x)
    if need_weights:
        assert expected[1].shape == ((3, 5, 5) if average else (3, HEADS, 5, 5))
    assert_close(compiled(x), expected, rtol=1e-4, atol=1e-5)


class FusedEncoderLayer(torch.nn.Module):
    """`layer` run as its fast path runs it (and as Dynamo's graph holds it): the fused
    op, called by the program itself; a mask given is of `mask_type`."""

    def __init__(self, layer: torch.nn.TransformerEncoderLayer, mask_type: int | None = None):
        super().__init__()
        self.layer, self.mask_type = layer, mask_type

    def forward(self, x, mask=None):
        layer, attn = self.layer, self.layer.self_attn
        return torch._transformer_encoder_layer_fwd(
            x, attn.embed_dim, attn.num_heads, attn.in_proj_weight, attn.in_proj_bias,
            attn.out_proj.weight, attn.out_proj.bias, layer.activation_relu_or_gelu == 2,
            layer.norm_first, layer.norm1.eps, layer.norm1.weight, layer.norm1.bias,
            layer.norm2.weight, layer.norm2.bias, layer.linear1.weight, layer.linear1.bias,
            layer.linear2.weight, layer.linear2.bias, mask,
            None if mask is None else self.mask_type)


def test_an_exported_fast_path_op_is_imported():
    """A program that calls the fused op itself (as a graph from Dynamo does) compiles
    strictly too."""
    model = FusedEncoderLayer(encoder_layer(False, "gelu", seed=5)).eval()
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(6))
    compiled = tecc.compile(model, (x,))
    with torch.no_grad():
        assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
