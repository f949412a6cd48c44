"""`module:function` factories of the reference models at batch 1, for `tecc tune`:

    tecc tune benchmarks.models_factory:resnet18 --records tuning_logs/llvm_core-avx2.jsonl
"""

from __future__ import annotations

from tests.models import example_models


def _get(name: str):
    model, inputs = example_models(batch=1)[name]
    return model, inputs


def resnet18():
    return _get("resnet18")


def mobilenet_v2():
    return _get("mobilenet_v2")


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
