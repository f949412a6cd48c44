"""The five reference models, end to end against torch eager."""

import pytest
import torch

import tecc
from tests.conftest import MODEL_ERRORS
from tests.models import MLP, MobileNetV2, bert_encoder, resnet18, transformer_encoder_layer  # noqa: F401
from tests.util import assert_close, max_rel_error


def make(name: str):
    gen = torch.Generator().manual_seed(11)
    if name == "mlp":
        return MLP(), (torch.randn(3, 64, generator=gen),)
    if name == "resnet18":
        return resnet18(), (torch.randn(2, 3, 96, 96, generator=gen),)
    if name == "mobilenet_v2":
        return MobileNetV2(), (torch.randn(2, 3, 96, 96, generator=gen),)
    if name == "transformer_layer":
        return transformer_encoder_layer(), (torch.randn(2, 19, 256, generator=gen),)
    if name == "bert":
        ids = torch.randint(0, 1000, (2, 24), generator=gen)
        mask = torch.ones(2, 24, dtype=torch.int64)
        mask[1, 17:] = 0
        return bert_encoder(), (ids, mask)
    raise KeyError(name)


TOLERANCE = {"mlp": 1e-4, "resnet18": 1e-3, "mobilenet_v2": 1e-3,
             "transformer_layer": 1e-4, "bert": 1e-4}


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_model_matches_eager(name):
    torch.manual_seed(0)
    model, inputs = make(name)
    model.eval()
    compiled = tecc.compile(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
    # Fresh random inputs, not the example ones the model was compiled with.
    got = compiled(*inputs)
    error = max_rel_error(got, expected)
    MODEL_ERRORS[name] = error
    assert error < TOLERANCE[name], f"{name}: max relative error {error:.2e}"
    if name != "bert":
        fresh = tuple(torch.randn_like(x) for x in inputs)
        with torch.no_grad():
            assert_close(compiled(*fresh), model(*fresh), rtol=TOLERANCE[name] * 10,
                         atol=TOLERANCE[name])


def test_model_output_structure_is_kept():
    model, inputs = make("bert")
    compiled = tecc.compile(model, inputs)
    out = compiled(*inputs)
    assert isinstance(out, dict) and list(out) == ["last_hidden_state", "pooler_output"]
    assert out["last_hidden_state"].shape == (2, 24, 128)
