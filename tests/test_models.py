"""The five reference models, end to end against torch eager."""

import pytest
import torch

import tecc
from tests.conftest import MODEL_ERRORS
from tests.models import (  # noqa: F401
    MLP,
    ByPosition,
    MobileNetV2,
    bert_encoder,
    randomize_batchnorm,
    resnet18,
    transformer_encoder_layer,
)
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


class MBConvSE(torch.nn.Module):
    """EfficientNet's block as transformers writes it: 1x1 expansion, a "same" zero
    pad (ZeroPad2d, asymmetric) before a stride-2 depthwise conv, squeeze-and-excitation
    (mean, 1x1 convs to a few channels and back, sigmoid, times the activation), 1x1
    projection; then a stride-1 block with a residual, a 1x1 head, and the head's
    AvgPool2d whose window (1280, ceil_mode) is far larger than its 5x5 input."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn

        def bn_act(c, act=True):
            return [nn.BatchNorm2d(c)] + ([nn.SiLU()] if act else [])

        def se(c, squeezed):
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, squeezed, 1), nn.SiLU(),
                                 nn.Conv2d(squeezed, c, 1), nn.Sigmoid())

        self.expand = nn.Sequential(nn.Conv2d(16, 96, 1, bias=False), *bn_act(96),
                                    nn.ZeroPad2d((1, 2, 1, 2)),
                                    nn.Conv2d(96, 96, 5, 2, groups=96, bias=False), *bn_act(96))
        self.se1 = se(96, 4)
        self.project = nn.Sequential(nn.Conv2d(96, 64, 1, bias=False), *bn_act(64, False))
        self.block2 = nn.Sequential(nn.Conv2d(64, 384, 1, bias=False), *bn_act(384),
                                    nn.Conv2d(384, 384, 3, 1, 1, groups=384, bias=False),
                                    *bn_act(384))
        self.se2 = se(384, 16)
        self.project2 = nn.Sequential(nn.Conv2d(384, 64, 1, bias=False), *bn_act(64, False))
        self.head = nn.Sequential(nn.Conv2d(64, 128, 1, bias=False), *bn_act(128),
                                  nn.AvgPool2d(1280, ceil_mode=True))
        randomize_batchnorm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.expand(x)
        y = self.project(h * self.se1(h))
        h = self.block2(y)
        y = y + self.project2(h * self.se2(h))
        return self.head(y).flatten(1)


def test_efficientnet_blocks_match_eager():
    model = MBConvSE().eval()
    x = torch.randn(2, 16, 10, 10, generator=torch.Generator().manual_seed(3))
    compiled = tecc.compile(model, (x,))
    with torch.no_grad():
        expected = model(x)
    assert expected.shape == (2, 128)
    assert_close(compiled(x), expected, rtol=1e-4, atol=1e-5)


def _transformers_model(name: str):
    """Tiny configs of transformers architectures that need the importer's group
    norms, transposed convs, vector norms, argmax with computed indices and None
    outputs (random weights, nothing downloaded)."""
    import transformers

    gen = torch.Generator().manual_seed(12)
    image = torch.randn(1, 3, 64, 64, generator=gen)
    if name == "wav2vec2":  # group norm in its conv feature encoder
        cfg = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64,
                                          conv_dim=(16, 16), conv_stride=(5, 2),
                                          conv_kernel=(10, 3), num_conv_pos_embeddings=16)
        return transformers.Wav2Vec2Model(cfg), ("input_values",), (
            torch.randn(1, 800, generator=gen),)
    if name == "poolformer":  # group norms; (hidden, None) out
        cfg = transformers.PoolFormerConfig(depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 16, 32])
        return transformers.PoolFormerModel(cfg), ("pixel_values",), (image,)
    if name == "dpt":  # transposed convs upsampling the reassembled tokens
        cfg = transformers.DPTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                     intermediate_size=64, image_size=64, patch_size=16,
                                     neck_hidden_sizes=[8, 16, 16, 32], fusion_hidden_size=16,
                                     head_hidden_size=8, backbone_out_indices=[0, 1, 2, 3])
        return transformers.DPTForDepthEstimation(cfg), ("pixel_values",), (image,)
    if name == "clip":  # the pooled token at each text's argmax; normalized embeddings
        cfg = transformers.CLIPConfig(
            text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, vocab_size=100),
            vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, image_size=64, patch_size=16))
        ids = torch.randint(0, 100, (2, 7), generator=gen)
        return transformers.CLIPModel(cfg), ("input_ids", "pixel_values"), (
            ids, torch.randn(2, 3, 64, 64, generator=gen))
    raise KeyError(name)


@pytest.mark.parametrize("name", ["clip", "dpt", "poolformer", "wav2vec2"])
def test_transformers_architectures_match_eager(name):
    model, names, inputs = _transformers_model(name)
    model = ByPosition(model.eval(), names, return_dict=False)
    with torch.no_grad():
        expected = model(*inputs)
    got = tecc.compile(model, inputs)(*inputs)
    error = max_rel_error(got, expected)
    MODEL_ERRORS[f"transformers {name}"] = error
    assert error < 1e-4, f"{name}: max relative error {error:.2e}"
