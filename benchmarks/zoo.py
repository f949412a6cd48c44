"""The model zoo: real architectures from transformers (random init, nothing
downloaded, batch 1) through tecc, against torch eager, torch.compile (inductor) and
ONNX Runtime on this CPU, in one run.

Per model: whether tecc.compile takes it strictly (the default: every op supported),
whether it runs through the torch.compile backend (backend="tecc"), the largest
relative error of the backend's outputs against eager, and latency (median ms over
interleaved rounds) of each framework with tecc untuned (fallback configs).

    python benchmarks/zoo.py [--models resnet18,gpt2_cache] [--threads 2] [--resume] [--list]

Results go to results/zoo_<cpu>.md and .json, <cpu> as LLVM names this host
(emeraldrapids, znver4): ONNX Runtime's and eager's times differ most between hosts,
so each host keeps its own table.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc  # noqa: E402
from benchmarks.common import (  # noqa: E402
    RESULTS,
    against_eager,
    host_line,
    interleaved_ms,
    with_and_without,
    write_table,
)
from benchmarks.e2e_cpu import onnxruntime_session  # noqa: E402
from tecc.target import target_info  # noqa: E402
from tests.models import ByPosition  # noqa: E402
from tests.util import max_rel_error  # noqa: E402

IMAGE = 224
SEQ = 64


@dataclass
class ZooModel:
    name: str
    family: str
    config_note: str  # what differs from the published default config
    build: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


def _image(size: int = IMAGE, channels: int = 3) -> tuple[torch.Tensor]:
    return (torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(0)),)


def _ids(vocab: int, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(0))


def calibrate_batchnorm(model: torch.nn.Module, image: torch.Tensor) -> None:
    """A random scale and shift for every batch norm, and running statistics measured
    on its own input in one eval pass over two random images: with transformers'
    initialization (conv weights of std 0.02, unit running variance) a deep CNN's
    activations vanish (MobileNetV2's logits were 1e-22), and comparing outputs that
    are all zero checks nothing."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    gen = torch.Generator().manual_seed(7)

    def measure(module, args):
        dims = [d for d in range(args[0].ndim) if d != 1]
        module.running_mean.copy_(args[0].mean(dims))
        module.running_var.copy_(args[0].var(dims) + 1e-3)

    hooks = [m.register_forward_pre_hook(measure) for m in norms]
    with torch.no_grad():
        for m in norms:
            m.weight.copy_(1 + 0.2 * torch.randn(m.num_features, generator=gen))
            m.bias.copy_(0.1 * torch.randn(m.num_features, generator=gen))
        model.eval()(torch.cat([image, torch.randn(image.shape, generator=gen)]))
    for hook in hooks:
        hook.remove()


def _vision(model_cls: str, config_cls: str, size: int = IMAGE, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_cls)(**{"num_labels": 1000, **config})
        model = getattr(transformers, model_cls)(cfg)
        calibrate_batchnorm(model, _image(size)[0])
        return ByPosition(model, ("pixel_values",), return_dict=False), _image(size)

    return build


def _text(model_cls: str, config_cls: str, vocab: int, mask: bool = True,
          seq: int = SEQ, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_cls)(vocab_size=vocab, **config)
        fixed = {"return_dict": False}
        if "use_cache" in config:
            fixed["use_cache"] = config["use_cache"]
        model = getattr(transformers, model_cls)(cfg)
        ids = _ids(vocab, seq)
        if not mask:
            return ByPosition(model, ("input_ids",), **fixed), (ids,)
        attention = torch.ones_like(ids)
        attention[:, -seq // 8:] = 0
        return ByPosition(model, ("input_ids", "attention_mask"), **fixed), (ids, attention)

    return build


def _whisper_encoder():
    import transformers

    cfg = transformers.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                                     decoder_layers=1, decoder_attention_heads=6,
                                     encoder_ffn_dim=1536, num_mel_bins=80,
                                     max_source_positions=1500)
    encoder = transformers.WhisperModel(cfg).get_encoder()
    features = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(0))
    return ByPosition(encoder, ("input_features",), return_dict=False), (features,)


def _t5_encoder():
    import transformers

    cfg = transformers.T5Config(vocab_size=1000, d_model=256, d_kv=32, d_ff=1024,
                                num_layers=4, num_heads=8)
    model = transformers.T5EncoderModel(cfg)
    ids = _ids(1000)
    return ByPosition(model, ("input_ids", "attention_mask"), return_dict=False), (
        ids, torch.ones_like(ids))


def _clip():
    import transformers

    cfg = transformers.CLIPConfig(
        text_config=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024, vocab_size=1000),
        vision_config=dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                           intermediate_size=1536, image_size=IMAGE, patch_size=32))
    ids = _ids(1000, 16)
    return ByPosition(transformers.CLIPModel(cfg), ("input_ids", "pixel_values", "attention_mask"),
                    return_dict=False), (ids, _image()[0], torch.ones_like(ids))


def _wav2vec2():
    import transformers

    cfg = transformers.Wav2Vec2Config(hidden_size=256, num_hidden_layers=4,
                                      num_attention_heads=4, intermediate_size=1024)
    audio = torch.randn(1, 16000, generator=torch.Generator().manual_seed(0))
    return ByPosition(transformers.Wav2Vec2Model(cfg), ("input_values",), return_dict=False), (
        audio,)


SMALL_TEXT = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                  intermediate_size=1024, max_position_embeddings=128)
SMALL_DECODER = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=688,
                     max_position_embeddings=128)
GPT2 = dict(n_embd=256, n_layer=4, n_head=4, n_positions=128)
SMALL_VIT = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                 intermediate_size=1536, image_size=IMAGE, patch_size=16)

ZOO = [
    # CNNs
    ZooModel("resnet18", "CNN", "ResNet-18 (basic blocks, depths 2-2-2-2)",
             _vision("ResNetForImageClassification", "ResNetConfig", layer_type="basic",
                     depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512])),
    ZooModel("resnet50", "CNN", "default (ResNet-50)",
             _vision("ResNetForImageClassification", "ResNetConfig")),
    ZooModel("mobilenet_v2", "CNN", "default (1.0, 224)",
             _vision("MobileNetV2ForImageClassification", "MobileNetV2Config")),
    ZooModel("efficientnet_b0", "CNN", "B0 (width and depth 1.0, 224; default is B7)",
             _vision("EfficientNetForImageClassification", "EfficientNetConfig",
                     width_coefficient=1.0, depth_coefficient=1.0, image_size=IMAGE,
                     hidden_dim=1280)),
    ZooModel("regnet_y", "CNN (grouped convs)", "RegNetY-400MF widths, depths 1-3-6-6",
             _vision("RegNetForImageClassification", "RegNetConfig", layer_type="y",
                     hidden_sizes=[48, 104, 208, 440], depths=[1, 3, 6, 6], groups_width=8,
                     embedding_size=32)),
    ZooModel("convnext", "CNN", "depths 2-2-4-2, widths 48-96-192-384 (tiny: 3-3-9-3, 96-768)",
             _vision("ConvNextForImageClassification", "ConvNextConfig",
                     depths=[2, 2, 4, 2], hidden_sizes=[48, 96, 192, 384])),
    # vision transformers
    ZooModel("vit", "ViT", "ViT-S/16 (hidden 384, 6 layers; B/16 has 768, 12)",
             _vision("ViTForImageClassification", "ViTConfig", **SMALL_VIT)),
    ZooModel("deit", "ViT", "DeiT-S/16 distilled (hidden 384, 6 layers)",
             _vision("DeiTForImageClassificationWithTeacher", "DeiTConfig", **SMALL_VIT)),
    ZooModel("beit", "ViT", "hidden 384, 6 layers, relative position bias",
             _vision("BeitForImageClassification", "BeitConfig",
                     use_relative_position_bias=True, **SMALL_VIT)),
    ZooModel("swin", "ViT (windows)", "embed 48, depths 2-2-2-2, heads 3-6-12-24",
             _vision("SwinForImageClassification", "SwinConfig", embed_dim=48,
                     depths=[2, 2, 2, 2], num_heads=[3, 6, 12, 24])),
    ZooModel("mobilevit", "CNN + ViT", "default (MobileViT-S, 256)",
             _vision("MobileViTForImageClassification", "MobileViTConfig", size=256)),
    ZooModel("segformer", "ViT (segmentation)", "default (MiT-B0, 224), 150 classes",
             _vision("SegformerForSemanticSegmentation", "SegformerConfig", num_labels=150)),
    # text encoders
    ZooModel("bert", "encoder", "hidden 256, 4 layers, sequence 64",
             _text("BertModel", "BertConfig", 1000, **SMALL_TEXT)),
    ZooModel("distilbert", "encoder", "dim 256, 4 layers, sequence 64",
             _text("DistilBertModel", "DistilBertConfig", 1000, dim=256, n_layers=4,
                   n_heads=4, hidden_dim=1024, max_position_embeddings=128)),
    ZooModel("roberta", "encoder", "hidden 256, 4 layers, sequence 64",
             _text("RobertaModel", "RobertaConfig", 1000, **SMALL_TEXT)),
    ZooModel("albert", "encoder", "hidden 256, 4 layers, sequence 64",
             _text("AlbertModel", "AlbertConfig", 1000, embedding_size=128, **SMALL_TEXT)),
    ZooModel("t5_encoder", "encoder", "d_model 256, 4 layers, sequence 64",
             _t5_encoder),
    ZooModel("whisper_encoder", "encoder (audio)", "d_model 384, 4 layers, 3000 frames",
             _whisper_encoder),
    # decoders
    ZooModel("gpt2", "decoder", "n_embd 256, 4 layers, sequence 64, use_cache=False",
             _text("GPT2Model", "GPT2Config", 1000, use_cache=False, **GPT2)),
    ZooModel("gpt2_cache", "decoder", "as gpt2, use_cache=True (DynamicCache output)",
             _text("GPT2Model", "GPT2Config", 1000, use_cache=True, **GPT2)),
    ZooModel("llama", "decoder", "hidden 256, 4 layers, GQA 4/2 heads, use_cache=False",
             _text("LlamaModel", "LlamaConfig", 1000, use_cache=False, **SMALL_DECODER)),
    ZooModel("qwen2", "decoder", "hidden 256, 4 layers, GQA 4/2 heads, use_cache=False",
             _text("Qwen2Model", "Qwen2Config", 1000, use_cache=False, **SMALL_DECODER)),
    # transposed convs, group norms, vector norms, computed indices, a selective scan
    ZooModel("convnextv2", "CNN (global response norm)",
             "depths 2-2-4-2, widths 48-96-192-384 (tiny: 3-3-9-3, 96-768)",
             _vision("ConvNextV2Model", "ConvNextV2Config", depths=[2, 2, 4, 2],
                     hidden_sizes=[48, 96, 192, 384])),
    ZooModel("poolformer", "CNN (group norms, pooling)", "default (PoolFormer-S12)",
             _vision("PoolFormerModel", "PoolFormerConfig")),
    ZooModel("swinv2", "ViT (windows, cosine attention)", "embed 48, depths 2-2-2-2, "
             "heads 3-6-12-24", _vision("Swinv2Model", "Swinv2Config", embed_dim=48,
                                        depths=[2, 2, 2, 2], num_heads=[3, 6, 12, 24])),
    ZooModel("dpt", "ViT (depth, transposed convs)", "hidden 384, 6 layers, 224",
             _vision("DPTForDepthEstimation", "DPTConfig", **dict(
                 SMALL_VIT, backbone_out_indices=[1, 3, 4, 5]))),
    ZooModel("clip", "text + vision encoders", "text hidden 256, 4 layers, 16 tokens; "
             "vision hidden 384, 4 layers, patch 32", _clip),
    ZooModel("wav2vec2", "encoder (audio, conv features)", "hidden 256, 4 layers, 1 s of "
             "16 kHz", _wav2vec2),
    ZooModel("mamba", "decoder (selective scan)", "hidden 256, 4 layers, state 16, "
             "sequence 64", _text("MambaModel", "MambaConfig", 1000, mask=False,
                                  hidden_size=256, num_hidden_layers=4, state_size=16,
                                  use_cache=False)),
]


def ab_rows(names: str, without: Callable[[], Any]) -> list[list[str]]:
    """Per zoo model of `names` (comma-separated): tecc untuned without a change (under
    the context `without()`) and with it, against eager in one set of interleaved
    rounds; rows of [model, eager ms, without ms, with ms, without / with, max rel err]."""
    by_name = {m.name: m for m in ZOO}
    rows = []
    for name in names.split(","):
        model, inputs = by_name[name].build()
        model = model.eval()
        print(f"== {name}", flush=True)
        before, after = with_and_without(model, inputs, without)
        ms, err = against_eager(model, inputs, {"before": before, "after": after})
        rows.append([name, f"{ms['eager']:.3f}", f"{ms['before']:.3f}", f"{ms['after']:.3f}",
                     f"{ms['before'] / ms['after']:.3f}x", f"{err:.1e}"])
        print(rows[-1], flush=True)
    return rows


def plain(text: str) -> str:
    """`text` without terminal color codes (torch.onnx's errors have them)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def first_line(err: BaseException) -> str:
    text = plain(str(err)).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(err).__name__}: {line}"[:160].replace("|", "/")


def tensors_of(value) -> list:
    """The tensors of a model output in order, a transformers cache's keys and values
    included (eager returns the cache object, tecc's strict build a dict of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_of(v)]
    if hasattr(value, "layers"):  # DynamicCache: per layer its keys and values
        return [t for layer in value.layers for t in (layer.keys, layer.values)]
    return [value]


def output_error(got, expected) -> float:
    return max_rel_error(tensors_of(got), tensors_of(expected))


def backend_model(model: torch.nn.Module, inputs: tuple) -> tuple[Callable, list[str]]:
    """The model through torch.compile(backend="tecc"), called once; the warnings of
    graphs that ran in torch."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tecc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            compiled(*inputs)
    fallbacks = [str(w.message).splitlines()[0] for w in caught if "tecc" in str(w.message)]
    return compiled, fallbacks


def measure(entry: ZooModel, threads: int) -> dict:
    model, inputs = entry.build()
    model.eval()
    row: dict = {"name": entry.name, "family": entry.family, "config": entry.config_note}
    with torch.no_grad():
        expected = model(*inputs)
    competitors: dict[str, Callable] = {}

    def eager():
        with torch.no_grad():
            return model(*inputs)

    competitors["eager"] = eager
    start = time.perf_counter()
    try:
        strict = tecc.compile(model, inputs)
        row["strict"] = "yes"
        np_inputs = [x.numpy() for x in inputs]
        row["strict_err"] = output_error(strict(*inputs), expected)
        competitors["tecc"] = lambda: strict(*np_inputs)
    except Exception as err:
        row["strict"] = first_line(err)
    row["compile_s"] = time.perf_counter() - start
    try:
        via_backend, fallbacks = backend_model(model, inputs)
        with torch.no_grad():
            row["err"] = output_error(via_backend(*inputs), expected)
        row["backend"] = "yes" if not fallbacks else f"{len(fallbacks)} graph(s) in torch"
        row["fallbacks"] = fallbacks

        def backend():
            with torch.no_grad():
                return via_backend(*inputs)

        competitors["backend"] = backend
    except Exception as err:
        row["backend"] = first_line(err)
        traceback.print_exc()
    try:
        torch._dynamo.reset()
        inductor = torch.compile(model)
        with torch.no_grad():
            inductor(*inputs)

        def run_inductor():
            with torch.no_grad():
                return inductor(*inputs)

        competitors["inductor"] = run_inductor
    except Exception as err:  # a competitor failing is reported, not fatal
        row["inductor_error"] = first_line(err)
    try:
        competitors["ort"] = onnxruntime_session(model, inputs, threads)
    except Exception as err:
        row["ort_error"] = first_line(err)
    # 7 rounds: on a shared host a framework's slow phase (ONNX Runtime's spinning
    # thread pool, for one) can last a round; 3 short rounds let one outlier decide
    row["ms"] = interleaved_ms(competitors, rounds=7, seconds_per_round=0.15)
    torch._dynamo.reset()
    return row


def _fmt(ms: dict, key: str) -> str:
    return f"{ms[key]:.2f}" if key in ms else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        ms = r.get("ms", {})
        tecc_ms = ms.get("tecc", ms.get("backend"))
        errors = " / ".join(f"{r[k]:.1e}" if k in r else "-" for k in ("strict_err", "err"))
        out.append([r["name"], r["family"], r["config"], r["strict"], r.get("backend", "-"),
                    errors, _fmt(ms, "eager"),
                    _fmt(ms, "inductor"), _fmt(ms, "ort"), _fmt(ms, "tecc"),
                    _fmt(ms, "backend"), _ratio(ms.get("eager"), tecc_ms),
                    _ratio(ms.get("ort"), tecc_ms), f"{r.get('compile_s', 0):.0f}"])
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def write_results(rows: list[dict], output: str, threads: int, wall_s: float) -> None:
    strict_ok = sum(r["strict"] == "yes" for r in rows)
    backend_ok = [r for r in rows if r.get("err") is not None and r["err"] < 1e-3]
    tecc_ms = {r["name"]: r["ms"].get("tecc", r["ms"].get("backend")) for r in rows if "ms" in r}
    over_ort = [r["ms"]["ort"] / tecc_ms[r["name"]] for r in rows
                if "ms" in r and "ort" in r["ms"] and tecc_ms[r["name"]]]
    over_eager = [r["ms"]["eager"] / tecc_ms[r["name"]] for r in rows
                  if "ms" in r and tecc_ms[r["name"]]]
    slower = [r["name"] for r in rows if "ms" in r and tecc_ms[r["name"]]
              and tecc_ms[r["name"]] > r["ms"]["eager"]]
    write_table(
        output, "Model zoo, CPU, batch 1, tecc untuned (median ms)",
        ["model", "kind", "config", "strict compile", "backend",
         "max rel err (strict / backend)", "eager", "torch.compile", "ONNX Runtime", "tecc",
         "tecc backend", "tecc vs eager", "tecc vs ORT", "tecc compile s"],
        table_rows(rows),
        [f"Host: {host_line()}; {threads} threads for every framework.",
         f"torch {torch.__version__}, tecc {tecc.__version__}, transformers "
         f"{__import__('transformers').__version__}; random weights (batch norms with "
         "measured statistics), batch 1, nothing downloaded; the config column says where "
         "a smaller one than the published default was used. tecc runs its fallback "
         "configs (no tuning records).",
         "strict compile: tecc.compile(model, inputs) (yes, or the error's first line). "
         "backend: torch.compile(model, backend=\"tecc\"). tecc: the strict build called "
         "with numpy arrays; tecc backend: through Dynamo. Ratios use the strict build "
         "where there is one, else the backend.",
         "Medians over 7 interleaved rounds of 0.15 s (every framework measured in each "
         "round); "
         "ratios above 1 mean tecc is faster.",
         f"Summary: {strict_ok}/{len(rows)} compile strictly, {len(backend_ok)}/{len(rows)} "
         f"run through the backend with rel err < 1e-3; geometric mean over ONNX Runtime "
         f"{geomean(over_ort):.2f}x ({len(over_ort)} models), over eager "
         f"{geomean(over_eager):.2f}x; slower than eager: {', '.join(slower) or 'none'}. "
         f"Measuring took {wall_s / 60:.0f} min.",
         *[f"{r['name']}: {key.split('_')[0]} failed: {plain(r[key])}" for r in rows
           for key in ("inductor_error", "ort_error") if key in r],
         "Command: `python benchmarks/zoo.py` (per model rows are kept in "
         f"results/{output}.json as they are measured: `--resume` continues a run)."],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(m.name for m in ZOO))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None,
                        help="results name (default zoo_<this CPU as LLVM names it>: the "
                             "figures move with the host, so each host keeps its table)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of results/OUTPUT.json, measure the other models")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args()
    by_name = {m.name: m for m in ZOO}
    if args.list:
        for m in ZOO:
            print(f"{m.name:16} {m.family:20} {m.config_note}")
        return
    unknown = [n for n in args.models.split(",") if n not in by_name]
    if unknown:
        parser.error(f"unknown models {unknown}; --list shows them")
    torch.set_num_threads(args.threads)
    args.output = args.output or f"zoo_{target_info('llvm').cpu}"
    store = RESULTS / f"{args.output}.json"
    saved = json.loads(store.read_text()) if args.resume and store.exists() else {
        "rows": [], "wall_s": 0.0}
    done = {r["name"] for r in saved["rows"]}
    for name in args.models.split(","):
        if name in done:
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            row = measure(by_name[name], args.threads)
        except Exception as err:  # the model itself failed in eager: reported, not fatal
            traceback.print_exc()
            entry = by_name[name]
            row = {"name": name, "family": entry.family, "config": entry.config_note,
                   "strict": first_line(err)}
        saved["rows"].append(row)
        saved["wall_s"] += time.perf_counter() - t0
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps(saved, indent=1) + "\n")
        print(table_rows([row])[0], f"{time.perf_counter() - t0:.0f} s", flush=True)
        for line in row.get("fallbacks", []):
            print("   ", line)
    order = {name: i for i, name in enumerate(by_name)}
    rows = sorted(saved["rows"], key=lambda r: order.get(r["name"], len(order)))
    write_results(rows, args.output, args.threads, saved["wall_s"])


if __name__ == "__main__":
    main()
