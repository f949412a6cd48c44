"""Winograd against the direct conv on a CUDA GPU, per layer: ResNet-style 3x3 convs
(conv, batch norm, relu), fp32 with TF32 off, untuned, against cuDNN (torch eager),
in one process with CUDA events.

    python benchmarks/gpu_winograd.py [--batches 1,16] [--layers 64x56,128x28]

Per layer and batch: tecc with the direct conv (one implicit-GEMM kernel), tecc with
Winograd F(4x4, 3x3) (input transform, GEMM, output transform), cuDNN, and which of
the two the default rule (graph_opt/winograd.py) picks. Writes results/gpu_winograd.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc  # noqa: E402
from benchmarks.common import write_table  # noqa: E402
from benchmarks.e2e_gpu import cuda_ms  # noqa: E402
from tests.util import max_rel_error  # noqa: E402

# channels x plane of ResNet-18's 3x3 stride-1 layers, and two narrower ones
LAYERS = ("32x56", "64x56", "128x28", "256x14", "512x7", "64x112")


def layer(channels: int) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(channels), torch.nn.ReLU()).eval()
    bn = model[1]
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 1.5)
    return model


def run(channels: int, plane: int, batch: int) -> list[str]:
    torch.manual_seed(0)
    model = layer(channels)
    x = torch.randn(batch, channels, plane, plane)
    with torch.no_grad():
        expected = model(x)
    default = "winograd" if any("winograd" in k["name"] for k in tecc.compile(
        model, (x,), target="cuda").plan["kernels"]) else "direct"
    built = {"direct": tecc.compile(model, (x,), target="cuda", winograd=False),
             "winograd": every_layer_winograd(model, x)}
    gx = x.cuda()
    gpu_model = model.cuda()
    errors = {k: max_rel_error(v(gx).cpu(), expected) for k, v in built.items()}
    with torch.no_grad():
        ms = cuda_ms({"cudnn": lambda: gpu_model(gx), **{k: (lambda v=v: v(gx))
                                                          for k, v in built.items()}})
    flops = 2 * batch * channels * channels * 9 * plane * plane
    row = [f"{channels}x{plane}", str(batch), f"{ms['cudnn']:.4f}", f"{ms['direct']:.4f}",
           f"{ms['winograd']:.4f}", f"{ms['direct'] / ms['winograd']:.2f}x",
           f"{ms['cudnn'] / min(ms['direct'], ms['winograd']):.2f}x", default,
           f"{flops / (ms['winograd'] * 1e-3) / 1e12:.1f}",
           f"{max(errors.values()):.1e}"]
    print(" | ".join(row), flush=True)
    return row


def every_layer_winograd(model: torch.nn.Module, x: torch.Tensor):
    """tecc's Winograd build of a layer, also where the default rule keeps it direct
    (its thresholds lowered for this build)."""
    from tecc.graph_opt import winograd as rule

    saved = rule.GPU_WINOGRAD_MIN_CHANNELS, rule.GPU_WINOGRAD_MIN_PLANE
    rule.GPU_WINOGRAD_MIN_CHANNELS, rule.GPU_WINOGRAD_MIN_PLANE = 1, rule.GPU_WINOGRAD_TILE
    try:
        return tecc.compile(model, (x,), target="cuda", winograd=True)
    finally:
        rule.GPU_WINOGRAD_MIN_CHANNELS, rule.GPU_WINOGRAD_MIN_PLANE = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--layers", default=",".join(LAYERS))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for spec in args.layers.split(","):
            channels, plane = (int(v) for v in spec.split("x"))
            rows.append(run(channels, plane, batch))
    write_table("gpu_winograd", "Winograd F(4x4, 3x3) against the direct conv, CUDA GPU, "
                "fp32, untuned (median ms)",
                ["layer (channels x plane)", "batch", "cuDNN", "tecc direct", "tecc Winograd",
                 "Winograd speedup", "tecc best vs cuDNN", "default rule", "Winograd "
                 "TFLOP/s (direct-conv FLOPs)", "max rel err"], rows,
                [f"Device: {torch.cuda.get_device_name()}; torch {torch.__version__}. A 3x3 "
                 "conv (stride 1, padding 1), batch norm and relu: one kernel direct, three "
                 "with Winograd (the batch norm folded, the relu fused into the output "
                 "transform). TF32 off; CUDA-event medians in interleaved rounds.",
                 "Command: `python benchmarks/gpu_winograd.py`."])


if __name__ == "__main__":
    main()
