"""Single-operator throughput on this CPU (GFLOP/s): numpy, torch, tecc's fallback
config and the best of N random configs of tecc's template space, in one run.
Shows that the template spaces hold fast code for the tuner to find.

    python benchmarks/ops_cpu.py [--trials 200] [--only matmul_1024,conv]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.autotune.builder import LocalBuilder  # noqa: E402
from tecc.autotune.measure import MeasureInput, measure_batch  # noqa: E402
from tecc.autotune.runner import LocalRunner  # noqa: E402
from tecc.autotune.tuner import RandomTuner  # noqa: E402
from tecc.frontend.ir import Call, Constant, Function, TensorType, Var  # noqa: E402
from tecc.graph_opt.pass_manager import PassContext, TuningCallbacks, run_passes  # noqa: E402
from tecc.graph_opt.pipeline import compile_pipeline  # noqa: E402
from tecc.schedules.tasks import extract_tasks  # noqa: E402

from benchmarks.common import host_line, median_ms, write_table  # noqa: E402
from tecc.target import resolve_target  # noqa: E402

# The distinct convolutions of ResNet-18 at 224x224, batch 1: (C, H, O, kernel, stride)
RESNET18_CONVS = [(3, 224, 64, 7, 2), (64, 56, 64, 3, 1), (64, 56, 128, 3, 2),
                  (64, 56, 128, 1, 2), (128, 28, 128, 3, 1), (128, 28, 256, 3, 2),
                  (128, 28, 256, 1, 2), (256, 14, 256, 3, 1), (256, 14, 512, 3, 2),
                  (256, 14, 512, 1, 2), (512, 7, 512, 3, 1)]
BERT_DENSE = [(128, 768, 768), (128, 768, 3072), (128, 3072, 768)]  # (M, K, N)
# attention's two batched products in Whisper's encoder (d_model 384): (heads, frames, dim)
WHISPER_ATTENTION = [(6, 1500, 64)]


def var(name: str, shape: tuple[int, ...]) -> Var:
    return Var(name, TensorType(shape, "float32"))


def weight(shape: tuple[int, ...]) -> Constant:
    """Weights are constants, as in a model: the graph pipeline packs them."""
    return Constant(np.random.default_rng(1).standard_normal(shape).astype("float32"))


def workloads() -> list[dict]:
    out = []
    for n in (512, 1024):
        a, b = var("a", (n, n)), var("b", (n, n))
        out.append({"name": f"matmul_{n}", "func": Function([a, b], Call("nn.matmul", [a, b])),
                    "flops": 2 * n**3, "shapes": [(n, n), (n, n)],
                    "torch": lambda x, y: torch.matmul(x, y), "numpy": np.matmul})
    for c, h, o, k, s in RESNET18_CONVS:
        x, w = var("x", (1, c, h, h)), weight((o, c, k, k))
        pad = k // 2
        conv = Call("nn.conv2d", [x, w], {"strides": (s, s), "padding": (pad,) * 4})
        oh = conv.shape[2]
        out.append({"name": f"conv_{c}x{h}_{o}_k{k}s{s}", "func": Function([x], conv),
                    "flops": 2 * o * oh * oh * c * k * k, "shapes": [(1, c, h, h), (o, c, k, k)],
                    "torch": lambda x_, w_, s=s, p=pad: F.conv2d(x_, w_, stride=s, padding=p),
                    "numpy": None, "resnet": True})
    c, h = 96, 56  # MobileNetV2's depthwise 3x3 on 56x56 (block 2, expand 6)
    x, w = var("x", (1, c * 6, h, h)), weight((c * 6, 1, 3, 3))
    conv = Call("nn.conv2d", [x, w], {"padding": (1,) * 4, "groups": c * 6})
    out.append({"name": "depthwise_576x56_k3", "func": Function([x], conv),
                "flops": 2 * c * 6 * h * h * 9, "shapes": [(1, c * 6, h, h), (c * 6, 1, 3, 3)],
                "torch": lambda x_, w_, g=c * 6: F.conv2d(x_, w_, padding=1, groups=g),
                "numpy": None})
    for m, k, n in BERT_DENSE:
        x, w = var("x", (m, k)), weight((n, k))
        out.append({"name": f"bert_dense_{m}x{k}x{n}", "func": Function([x], Call(
            "nn.dense", [x, w])), "flops": 2 * m * k * n, "shapes": [(m, k), (n, k)],
            "torch": lambda x_, w_: F.linear(x_, w_), "numpy": lambda x_, w_: x_ @ w_.T})
    for h, t, d in WHISPER_ATTENTION:
        q, k = var("q", (h, t, d)), var("k", (h, t, d))
        out.append({"name": f"attn_qk_{h}x{t}x{d}", "func": Function([q, k], Call(
            "nn.matmul", [q, k], {"transpose_b": True})), "flops": 2 * h * t * t * d,
            "shapes": [(h, t, d), (h, t, d)],
            "torch": lambda q_, k_: q_ @ k_.transpose(-1, -2),
            "numpy": lambda q_, k_: q_ @ np.swapaxes(k_, -1, -2)})
        p, v = var("p", (h, t, t)), var("v", (h, t, d))
        out.append({"name": f"attn_pv_{h}x{t}x{d}", "func": Function([p, v], Call(
            "nn.matmul", [p, v])), "flops": 2 * h * t * t * d, "shapes": [(h, t, t), (h, t, d)],
            "torch": lambda p_, v_: p_ @ v_, "numpy": np.matmul})
    return out


def anchor_task(func: Function, target, winograd: bool = False) -> object:
    """The tuning task of the op as a model would run it: through the graph pipeline
    (NCHWc layout for convs, weights pre-packed for dense), then its anchor's task.
    3x3 convs stay direct unless `winograd` (the direct conv is the TE workload other
    tuners are compared on)."""
    tuning = TuningCallbacks() if winograd else TuningCallbacks(
        winograd_tile=lambda c, lanes: 0, gpu_winograd_tile=lambda c, info: 0)
    with PassContext(target=target, opt_level=3, tuning=tuning):
        fused = run_passes(func, compile_pipeline())
    tasks = [t for t in extract_tasks(fused, target) if t.template != "injective"]
    if len(tasks) != 1:
        raise RuntimeError(f"expected one anchor task, got {[t.name for t in tasks]}")
    return tasks[0]


def blas_name() -> str:
    try:
        from threadpoolctl import threadpool_info

        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"
                 and "numpy" in (i.get("filepath") or "")]
        if infos:
            return f"{infos[0]['internal_api']} {infos[0].get('version', '')}".strip()
    except ImportError:
        pass
    config = np.show_config(mode="dicts") if "mode" in np.show_config.__code__.co_varnames \
        else {}
    return json.dumps(config.get("Build Dependencies", {}).get("blas", {}).get("name", "?"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated name prefixes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default="ops_cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = resolve_target("llvm")
    rng = np.random.default_rng(0)
    rows, ratios = [], {"matmul_1024": None, "resnet": []}
    selected = [w for w in workloads() if not args.only or any(
        w["name"].startswith(p) for p in args.only.split(","))]
    with LocalBuilder(n_parallel=2, timeout_s=60) as builder, \
            LocalRunner(number=3, repeat=3, min_repeat_ms=30, timeout_s=20) as runner:
        for wl in selected:
            start = time.perf_counter()
            arrays = [rng.standard_normal(s).astype("float32") for s in wl["shapes"]]
            tensors = [torch.from_numpy(a) for a in arrays]
            with torch.no_grad():
                torch_ms = median_ms(lambda: wl["torch"](*tensors), min_seconds=0.5)  # noqa: B023
            numpy_ms = (median_ms(lambda: wl["numpy"](*arrays), min_seconds=0.5)  # noqa: B023
                        if wl["numpy"] else math.nan)
            task = anchor_task(wl["func"], target)
            fallback = task.fallback_config()

            def measure(configs, task=task):
                return measure_batch(builder, runner, [MeasureInput(task, c) for c in configs])

            (fb,) = measure([fallback])
            tuner = RandomTuner(task, seed=0)
            tuner.load_history([fallback], [fb.cost if fb.ok else math.inf])
            tuner.tune(args.trials, measure, batch_size=32)
            best_s = tuner.history.best_cost
            failures = sum(math.isinf(c) for c in tuner.history.costs)

            def gflops(seconds: float) -> float:
                return wl["flops"] / seconds / 1e9  # noqa: B023

            g_torch, g_fb, g_best = gflops(torch_ms / 1e3), gflops(fb.cost), gflops(best_s)
            rows.append([wl["name"], f"{gflops(numpy_ms / 1e3):.1f}" if wl["numpy"] else "-",
                         f"{g_torch:.1f}", f"{g_fb:.1f}", f"{g_best:.1f}",
                         f"{g_fb / g_torch:.2f}", f"{g_best / g_torch:.2f}",
                         f"{len(task.space)}", f"{failures}"])
            if wl["name"] == "matmul_1024":
                ratios["matmul_1024"] = (g_fb / g_torch, g_best / g_torch)
            if wl.get("resnet"):
                ratios["resnet"].append((g_fb / g_torch, g_best / g_torch))
            print(rows[-1], f"{time.perf_counter() - start:.0f}s", flush=True)
    notes = [f"Host: {host_line()}; {args.threads} threads; numpy BLAS: {blas_name()}.",
             f"tecc: fallback config, and the best of {args.trials} random configs of the "
             "template's space (plus the fallback), measured with TVM's time_evaluator.",
             "Command: `python benchmarks/ops_cpu.py`."]
    if ratios["resnet"]:
        fb_med = float(np.median([r[0] for r in ratios["resnet"]]))
        best_med = float(np.median([r[1] for r in ratios["resnet"]]))
        notes.append(f"Median over the ResNet-18 convolutions of tecc / torch: fallback "
                     f"{fb_med:.2f}x, best of {args.trials}: {best_med:.2f}x.")
    if ratios["matmul_1024"]:
        notes.append(f"matmul 1024^3, tecc / torch: fallback {ratios['matmul_1024'][0]:.2f}x, "
                     f"best: {ratios['matmul_1024'][1]:.2f}x.")
    write_table(args.output, "Operator throughput, CPU (GFLOP/s)",
                ["workload", "numpy", "torch", "tecc fallback", f"tecc best of {args.trials}",
                 "fallback / torch", "best / torch", "space size", "failed configs"],
                rows, notes)


if __name__ == "__main__":
    main()
