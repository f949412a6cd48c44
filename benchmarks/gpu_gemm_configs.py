"""Every block tile of the GPU matmul template on a few GEMM shapes (fp32, n x k @ k x m):
which config the fallback should pick. Prints GFLOP/s per config.

    python benchmarks/gpu_gemm_configs.py [--shapes 1024x1024x1024,128x768x768]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tvm  # noqa: E402
from tecc.frontend.ir import Call, Function, post_order  # noqa: E402
from tecc.schedules.gpu_templates import TILES, tile_name  # noqa: E402
from tecc.schedules.lower import lower_primitive  # noqa: E402

from tecc.api import fused_graph  # noqa: E402
from tecc.cuda_toolchain import compile_cuda  # noqa: E402


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="1024x1024x1024,4096x4096x4096,128x768x768,"
                                            "128x3072x768,49x512x4608")
    args = parser.parse_args()
    dev = tvm.cuda(0)
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        a, b = torch.randn(m, k), torch.randn(k, n)
        _, part, _, _, target = fused_graph(MatMul(), (a, b), "cuda", 3, None, None, {})
        prim_fn = next(c.op for c in post_order(part.body)
                       if isinstance(c, Call) and isinstance(c.op, Function))
        args_dev = [tvm.runtime.tensor(a.numpy(), dev), tvm.runtime.tensor(b.numpy(), dev),
                    tvm.runtime.empty((m, n), "float32", dev)]
        results = []
        for tile in TILES:
            for micro_k in (8, 16):
                config = {"rule": "tiled", "tile": tile_name(tile), "micro_k": micro_k,
                          "vector": 4, "unroll": 256}
                prim = lower_primitive(prim_fn, "mm", target, config)
                ex = compile_cuda(tvm.IRModule({"mm": prim}), target)
                timer = ex.mod.time_evaluator("mm", dev, number=20, repeat=5)
                seconds = float(np.median(timer(*args_dev).results))
                results.append((2 * m * n * k / seconds / 1e9, config))
        torch_a, torch_b = a.cuda(), b.cuda()
        torch.backends.cuda.matmul.allow_tf32 = False
        for _ in range(3):
            torch_a @ torch_b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            torch_a @ torch_b
        end.record()
        torch.cuda.synchronize()
        cublas = 2 * m * n * k / (start.elapsed_time(end) / 20 * 1e-3) / 1e9
        print(f"== {shape}: cuBLAS {cublas:.0f} GFLOP/s")
        for gflops, config in sorted(results, key=lambda r: -r[0]):
            print(f"  {gflops:8.0f}  {config['tile']:>16} micro_k {config['micro_k']}")


if __name__ == "__main__":
    main()
