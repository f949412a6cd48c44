"""Configs of the GPU matmul template on a few GEMM shapes (fp32, m x k @ k x n, TF32
off), against cuBLAS: which config the fallback should pick. Builds in parallel on
every core, times each kernel with TVM's time_evaluator; prints GFLOP/s per config
and writes the table to results/gpu_gemm_configs.md.

    python benchmarks/gpu_gemm_configs.py [--shapes 1024x1024x1024,128x768x768]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_table  # noqa: E402

SHAPES = "1024x1024x1024,2048x768x3072,128x768x768,49x512x4608"


def configs() -> list[dict]:
    from tecc.schedules.gpu_templates import PIPELINES, TILES, tile_name

    found = []
    for tile, micro_k, pipeline in itertools.product(TILES, (16, 64), PIPELINES):
        found.append({"rule": "simt", "tile": tile_name(tile), "micro_k": micro_k,
                      "vector": 4, "unroll": 256, "pipeline": pipeline})
    for tile in TILES[:4]:  # dlight's rule, for comparison
        found.append({"rule": "tiled", "tile": tile_name(tile), "micro_k": 16,
                      "vector": 4, "unroll": 256, "pipeline": "none"})
    return found


def _build(job: tuple[int, int, int, dict | None, str]) -> tuple[str, str | None]:
    """Build one kernel into `path` (None: the template's fallback); the error if any."""
    import tvm

    from tecc.cuda_toolchain import compile_cuda
    from tests.util import lowered_matmul

    m, n, k, config, path = job
    try:
        prim, _, info = lowered_matmul(torch.randn(m, k), torch.randn(k, n), "cuda", config)
        compile_cuda(tvm.IRModule({"mm": prim}), info.tvm_target).export_library(path)
        return path, None
    except Exception as err:  # noqa: BLE001 - reported in the table
        return path, f"{type(err).__name__}: {str(err).splitlines()[-1][:120]}"


def cublas_gflops(m: int, n: int, k: int) -> float:
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * m * n * k / (start.elapsed_time(end) / 50 * 1e-3) / 1e9


def config_name(config: dict | None) -> str:
    if config is None:
        return "fallback"
    return f"{config['rule']} {config['tile']} k{config['micro_k']} {config['pipeline']}"


def _time_shape(m: int, n: int, k: int, paths: list[str], out: str) -> None:
    """In a child process: time each built kernel, one JSON line per kernel in `out`
    written before the next starts (a kernel that faults kills only this process)."""
    import tvm

    dev = tvm.cuda(0)
    a, b = np.random.randn(m, k).astype("float32"), np.random.randn(k, n).astype("float32")
    want = a.astype("float64") @ b.astype("float64")
    args = [tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev),
            tvm.runtime.empty((m, n), "float32", dev)]
    with open(out, "a") as f:
        for path in paths:
            f.write(json.dumps({"path": path, "started": True}) + "\n")
            f.flush()
            lib = tvm.runtime.load_module(path)
            seconds = float(np.median(lib.time_evaluator("mm", dev, number=20, repeat=5)(
                *args).results))
            err = float(np.abs(args[2].numpy() - want).max() / np.abs(want).max())
            f.write(json.dumps({"path": path, "seconds": seconds, "err": err}) + "\n")
            f.flush()


def measure_shape(m: int, n: int, k: int, jobs: list, errors: dict, log: Path) -> list:
    """(GFLOP/s, config name, note) per job; a kernel that crashes its process is
    reported as such and the others are timed in a fresh process."""
    done: dict[str, str | float] = {}
    built = [j[4] for j in jobs if errors[j[4]] is None]
    while True:
        todo = [p for p in built if p not in done]
        if not todo:
            break
        child = multiprocessing.get_context("spawn").Process(
            target=_time_shape, args=(m, n, k, todo, str(log)))
        child.start()
        child.join()
        started = None
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if "seconds" in entry:
                done[entry["path"]] = 2 * m * n * k / entry["seconds"] / 1e9
                errors[entry["path"]] = f"rel err {entry['err']:.1e}"
            else:
                started = entry["path"]
        if child.exitcode != 0 and started is not None and started not in done:
            done[started] = 0.0
            errors[started] = f"crashed the process (exit {child.exitcode})"
    return [(float(done.get(j[4], 0.0)), config_name(j[3]), errors[j[4]]) for j in jobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="tecc-gemm-"))
    jobs = [(m, n, k, config, str(tmp / f"{i}_{j}.so"))
            for i, (m, n, k) in enumerate(shapes)
            for j, config in enumerate([None, *configs()])]
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        errors = dict(pool.map(_build, jobs))
    rows = []
    for i, (m, n, k) in enumerate(shapes):
        shape_jobs = [j for j in jobs if Path(j[4]).name.startswith(f"{i}_")]
        results = measure_shape(m, n, k, shape_jobs, errors, tmp / f"{i}.jsonl")
        cublas = cublas_gflops(m, n, k)
        print(f"== {m}x{n}x{k}: cuBLAS {cublas:.0f} GFLOP/s", flush=True)
        for gflops, name, note in sorted(results, key=lambda r: -r[0]):
            print(f"  {gflops:8.0f}  {gflops / cublas:5.2f}x  {name}  {note}")
            rows.append([f"{m}x{n}x{k}", name, f"{gflops:.0f}", f"{cublas:.0f}",
                         f"{gflops / cublas:.2f}x", note])
    write_table("gpu_gemm_configs", "GPU matmul template configs against cuBLAS (fp32, TF32 off)",
                ["shape m x n x k", "config", "GFLOP/s", "cuBLAS GFLOP/s", "vs cuBLAS", "check"],
                rows, [f"Command: `python benchmarks/gpu_gemm_configs.py --shapes {args.shapes}`"])


if __name__ == "__main__":
    main()
