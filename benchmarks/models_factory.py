"""`module:function` factories of the reference models at batch 1 (`_b16`: batch 16),
for `tecc tune`:

    tecc tune benchmarks.models_factory:resnet18 --records tuning_logs/llvm_core-avx2.jsonl
"""

from __future__ import annotations

from tests.models import example_models


def _get(name: str, batch: int = 1):
    model, inputs = example_models(batch=batch)[name]
    return model, inputs


def resnet18():
    return _get("resnet18")


def resnet18_b16():
    return _get("resnet18", 16)


def mobilenet_v2():
    return _get("mobilenet_v2")


def mobilenet_v2_b16():
    return _get("mobilenet_v2", 16)


def mlp():
    return _get("mlp")


def transformer_layer():
    return _get("transformer_layer")


def bert():
    return _get("bert")


def bert_base():
    """The BERT-base encoder (12 layers, hidden 768, sequence 128) of e2e_gpu.py."""
    from benchmarks.e2e_gpu import bert_base as make

    return make(1)


def bert_base_b16():
    from benchmarks.e2e_gpu import bert_base as make

    return make(16)
