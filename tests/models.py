"""The models tecc is checked on, defined here (random weights, nothing downloaded)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (64, 256, 256, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU() if i % 2 == 0 else nn.GELU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MatMul(nn.Module):
    """a @ b: one GEMM, for the matmul templates and against cuBLAS."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet with basic blocks; layers=(2, 2, 2, 2) is ResNet-18, (3, 4, 6, 3) ResNet-34."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 1000,
                 width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages = []
        inplanes = width
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            stride = 1 if i == 0 else 2
            seq = [BasicBlock(inplanes, planes, stride)]
            seq += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*seq))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)
        randomize_batchnorm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet((2, 2, 2, 2), num_classes)


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand: int, act: type[nn.Module]) -> None:
        super().__init__()
        hidden = inp * expand
        self.use_res = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(inp, hidden, 1, bias=False), nn.BatchNorm2d(hidden), act()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), act(),
            nn.Conv2d(hidden, oup, 1, bias=False), nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (width 1.0). ReLU6 in the early stages, hardswish and SiLU later, so
    one network covers the activations of the MobileNet family; one grouped (non
    depthwise) conv in the head."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        acts = [nn.ReLU6, nn.ReLU6, nn.ReLU6, nn.Hardswish, nn.Hardswish, nn.SiLU, nn.SiLU]
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32),
                                   nn.ReLU6()]
        inp = 32
        for (t, c, n, s), act in zip(self.SETTINGS, acts, strict=True):
            for i in range(n):
                layers.append(InvertedResidual(inp, c, s if i == 0 else 1, t, act))
                inp = c
        layers += [nn.Conv2d(inp, 1280, 1, groups=4, bias=False), nn.BatchNorm2d(1280),
                   nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        randomize_batchnorm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x)).flatten(1)
        return self.classifier(x)


def randomize_batchnorm(model: nn.Module) -> None:
    """Give batch norms non-trivial statistics so folding them is really checked."""
    gen = torch.Generator().manual_seed(7)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.weight.copy_(1 + 0.2 * torch.randn(c, generator=gen))
                m.bias.copy_(0.1 * torch.randn(c, generator=gen))
                m.running_mean.copy_(0.1 * torch.randn(c, generator=gen))
                m.running_var.copy_(1 + 0.2 * torch.rand(c, generator=gen))


def transformer_encoder_layer(d_model: int = 256, nhead: int = 4, ff: int = 1024) -> nn.Module:
    return nn.TransformerEncoderLayer(d_model, nhead, ff, dropout=0.1, batch_first=True)


def bert_encoder(hidden: int = 128, layers: int = 2, heads: int = 4, act: str = "gelu"):
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=hidden * 4,
                        max_position_embeddings=128, hidden_act=act)
    return BertModel(config, add_pooling_layer=True)


def example_models(batch: int = 1) -> dict[str, tuple[nn.Module, tuple]]:
    """name -> (model in eval mode, example inputs), the models of the test suite."""
    gen = torch.Generator().manual_seed(0)
    seq = 32
    ids = torch.randint(0, 1000, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[:, seq - 5:] = 0
    models = {
        "mlp": (MLP(), (torch.randn(batch, 64, generator=gen),)),
        "resnet18": (resnet18(), (torch.randn(batch, 3, 224, 224, generator=gen),)),
        "mobilenet_v2": (MobileNetV2(), (torch.randn(batch, 3, 224, 224, generator=gen),)),
        "transformer_layer": (transformer_encoder_layer(),
                              (torch.randn(batch, seq, 256, generator=gen),)),
        "bert": (bert_encoder(), (ids, mask)),
    }
    for model, _ in models.values():
        model.eval()
    return models


def mlp_example() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """For `tecc compile tests.models:mlp_example` (the same weights on every call)."""
    torch.manual_seed(0)
    return MLP().eval(), (torch.randn(2, 64, generator=torch.Generator().manual_seed(0)),)


class ByPosition(nn.Module):
    """A transformers model called with keyword arguments fixed (return_dict, caches),
    its inputs positional: the same call for every framework and for torch.export."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], **fixed) -> None:
        super().__init__()
        self.model = model
        self.names = names
        self.fixed = fixed

    def forward(self, *inputs: torch.Tensor):
        return self.model(**dict(zip(self.names, inputs, strict=True)), **self.fixed)
