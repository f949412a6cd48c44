"""The fused attention on the GPU (schedules/gpu_attention.py) against the chain tecc
builds without it (batched Q K^T, masked softmax, P V: three kernels) and torch's
scaled_dot_product_attention, for BERT-base's attention (12 heads, 128 tokens, head
size 64, an additive padding mask) at each batch; fp32, TF32 off. Then the template's
configs timed alone (the fallback and --configs more drawn from its space).

    python benchmarks/gpu_attention.py [--batches 1,16] [--configs 24]

Writes results/gpu_attention.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tvm  # noqa: E402
from tecc.frontend.ir import Call, Function, TensorType, Var  # noqa: E402
from tecc.graph_opt import attention as attention_pass  # noqa: E402
from tecc.runtime.cuda import device_arch  # noqa: E402
from tecc.schedules.lower import lower_primitive  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import write_table  # noqa: E402
from benchmarks.e2e_gpu import cuda_ms  # noqa: E402
from tecc.cuda_toolchain import compile_cuda  # noqa: E402
from tecc.target import resolve_target, target_info  # noqa: E402

HEADS, SEQ, HEAD = 12, 128, 64


class Sdpa(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def inputs(batch: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(batch)
    q, k, v = (torch.randn(batch, HEADS, SEQ, HEAD, generator=gen) for _ in range(3))
    mask = torch.zeros(batch, 1, 1, SEQ)
    mask[..., SEQ - 8:] = torch.finfo(torch.float32).min  # padding tokens
    return [q, k, v, mask]


def compile_model(cpu_inputs: list[torch.Tensor], fused: bool, arch: str):
    limit = attention_pass.MAX_GPU_KEYS
    attention_pass.MAX_GPU_KEYS = limit if fused else 0  # 0: the pass leaves the chain
    try:
        return tecc.compile(Sdpa(), tuple(cpu_inputs), target=f"cuda:{arch}")
    finally:
        attention_pass.MAX_GPU_KEYS = limit


def op_function(cpu_inputs: list[torch.Tensor]) -> Function:
    params = [Var(f"x{i}", TensorType(tuple(x.shape), "float32"))
              for i, x in enumerate(cpu_inputs)]
    attrs = {"scale": HEAD ** -0.5, "k_transposed": False, "safe_softmax": True}
    return Function(params, Call("nn.attention", params, attrs))


def sweep_configs(cpu_inputs: list[torch.Tensor], arch: str, count: int,
                  reference: torch.Tensor) -> list[tuple[str, float, float]]:
    """(config, µs, max abs error) of the fallback and `count` configs of the space."""
    target = resolve_target(f"cuda:{arch}")
    info = target_info(f"cuda:{arch}")
    func = op_function(cpu_inputs)
    seen: list[dict] = []

    def choose(workload, space):
        valid = [c for c in space if space.why_not(c) is None]
        rng = random.Random(0)
        picked = rng.sample(valid, min(count, len(valid)))
        seen.extend(c.to_json() for c in picked)
        return None

    lower_primitive(func, "k", target, choose)
    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(x.numpy(), dev) for x in cpu_inputs]
    out = tvm.runtime.empty(tuple(reference.shape), "float32", dev)
    rows = []
    for config in [None, *seen]:
        prim, applied = lower_primitive(func, "k", target, config, return_info=True)
        if applied[0].error is not None or applied[0].template != "attention":
            rows.append((str(config), float("nan"), float("nan")))
            continue
        lib = compile_cuda(tvm.IRModule({"k": prim}), info.tvm_target)
        lib["k"](*args, out)
        error = float((torch.from_numpy(out.numpy()) - reference).abs().max())
        timer = lib.mod.time_evaluator("k", dev, number=50, repeat=7)
        us = statistics.median(timer(*args, out).results) * 1e6
        rows.append((f"fallback {applied[0].config}" if config is None else str(config),
                     us, error))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--configs", type=int, default=24)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    arch = device_arch(0)
    model_rows, config_rows = [], []
    for batch in (int(b) for b in args.batches.split(",")):
        cpu = inputs(batch)
        gpu = [x.cuda() for x in cpu]
        with torch.no_grad():
            reference = Sdpa()(*gpu)
        start = time.time()
        fused, unfused = compile_model(cpu, True, arch), compile_model(cpu, False, arch)
        print(f"batch {batch}: compiled in {time.time() - start:.0f} s")
        kernels = {name: len(m.plan["kernels"]) for name, m in
                   (("fused", fused), ("unfused", unfused))}
        errors = {name: float((m(*gpu) - reference).abs().max())
                  for name, m in (("fused", fused), ("unfused", unfused))}
        with torch.no_grad():
            ms = cuda_ms({"torch sdpa": lambda x=gpu: Sdpa()(*x),
                          "tecc unfused": lambda m=unfused, x=gpu: m(*x),
                          "tecc fused": lambda m=fused, x=gpu: m(*x)}, rounds=7, per_round=50)
        print(batch, ms, kernels, errors)
        model_rows.append([str(batch), f"{ms['torch sdpa'] * 1e3:.1f}",
                           f"{ms['tecc unfused'] * 1e3:.1f} ({kernels['unfused']} kernels)",
                           f"{ms['tecc fused'] * 1e3:.1f} ({kernels['fused']} kernel)",
                           f"{ms['tecc unfused'] / ms['tecc fused']:.2f}x",
                           f"{ms['torch sdpa'] / ms['tecc fused']:.2f}x",
                           f"{errors['fused']:.1e} / {errors['unfused']:.1e}"])
        for config, us, error in sweep_configs(cpu, arch, args.configs, reference.cpu()):
            print(batch, config, f"{us:.1f} us", f"err {error:.1e}")
            config_rows.append([str(batch), config, f"{us:.1f}", f"{error:.1e}"])
    device = torch.cuda.get_device_name(0)
    path = write_table(
        "gpu_attention", "BERT-base attention on the GPU (fp32, µs per call)",
        ["batch", "torch SDPA", "tecc unfused", "tecc fused", "fused vs unfused",
         "fused vs SDPA", "max abs err (fused / unfused)"], model_rows,
        [f"Device: {device}; torch {torch.__version__}. 12 heads, 128 tokens, head size 64, "
         "an additive padding mask (8 tokens masked); TF32 off. Medians by CUDA events "
         "over 7 interleaved rounds of 50 calls; tecc calls replay a CUDA graph and copy "
         "the output out, as torch allocates its own.",
         "tecc unfused: the chain with the pass's GPU limit at 0 keys (batched Q K^T, the "
         "masked softmax, P V); tecc fused: nn.attention with the template's fallback.",
         f"Command: `python benchmarks/gpu_attention.py --batches {args.batches} "
         f"--configs {args.configs}`"])
    lines = ["", "## The template's configs alone (time_evaluator, 50 calls x 7, warm L2)", "",
             "| batch | config | µs | max abs err |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in config_rows]
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
