"""Configs of the GPU matmul and implicit-GEMM conv templates on the shapes that
matter (fp32, TF32 off), against cuBLAS / cuDNN through torch: GEMM 1024^3 and
4096^3, BERT-base's batch-16 dense (2048 x 3072 -> 768), ResNet-18's 3x3 convs
(512x7x7, 256x14x14, 128x28x28) at batch 16 and 1. Per workload: the template's
fallback and the most promising simt configs (ranked by the template's kernel
features, see `ranked_configs`). Builds in parallel on every core, times each kernel
with TVM's time_evaluator in a child process (a faulting kernel kills only that
process), checks it against torch on the GPU, prints TFLOP/s per config and writes
the table to results/gpu_gemm_configs.md.

    python benchmarks/gpu_gemm_configs.py [--only gemm_1024,conv_512x7_b16] [--configs 20]
    python benchmarks/gpu_gemm_configs.py --dry-run   # build every kernel only (no GPU)
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, write_table  # noqa: E402

TARGET = "cuda:sm_90"


def _conv(n: int, c: int, hw: int) -> dict[str, Any]:
    return {"template": "conv2d", "data": [n, c, hw, hw], "kernel": [c, c, 3, 3],
            "dtype": "float32", "strides": [1, 1], "padding": [1, 1, 1, 1],
            "dilation": [1, 1], "groups": 1}


def _matmul(m: int, n: int, k: int) -> dict[str, Any]:
    return {"template": "matmul", "inputs": [[[m, k], "float32"], [[k, n], "float32"]],
            "attrs": {}}


def _dense(m: int, n: int, k: int) -> dict[str, Any]:
    """x[m, k] @ w[n, k].T, as torch's Linear."""
    return {"template": "dense", "inputs": [[[m, k], "float32"], [[n, k], "float32"]],
            "attrs": {}}


WORKLOADS: dict[str, dict[str, Any]] = {
    "gemm_1024": _matmul(1024, 1024, 1024),
    "gemm_4096": _matmul(4096, 4096, 4096),
    # x[2048, 3072] @ w[768, 3072].T: BERT-base's FFN output dense at batch 16, seq 128
    "bert_dense_b16": _dense(2048, 768, 3072),
    "bert_ffn_up_b16": _dense(2048, 3072, 768),
    "bert_attn_out_b16": _dense(2048, 768, 768),
    # the fused query / key / value projection (simplify's combine_dense)
    "bert_qkv_b16": _dense(2048, 2304, 768),
    # the same at batch 1: grids of 24 to 96 blocks of 64 x 64 on 132 multiprocessors
    "bert_dense_b1": _dense(128, 768, 3072),
    "bert_ffn_up_b1": _dense(128, 3072, 768),
    "bert_attn_out_b1": _dense(128, 768, 768),
    # odd extents against even neighbours (197 is prime): ViT-B/16's FFN at batch 1
    **{f"vit_ffn_{part}_{m}": _dense(m, n, k) for m in (197, 196)
       for part, n, k in (("up", 3072, 768), ("down", 768, 3072))},
    **{f"conv_{c}x{hw}_b{n}": _conv(n, c, hw)
       for n in (16, 1) for c, hw in ((512, 7), (256, 14), (128, 28))},
}


def flops(workload: dict[str, Any]) -> int:
    from tecc.schedules.gpu_templates import workload_dims

    batch, m, n, k = workload_dims(workload)
    return 2 * batch * m * n * k


def ranked_configs(workload: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The `count` unsplit simt configs (vector 4, unroll 256) and the `count` // 2
    configs with k in slices that an estimate from the
    template's kernel features ranks first: time ~ waves x blocks resident per
    multiprocessor x block tile area / efficiency, where the efficiency counts FMAs
    per shared load of the register tile (8x8 best), warps to hide latency (8 per
    multiprocessor), the block tile's reuse of what it loads, and, on long k loops,
    whether the next step's loads are in flight (register double buffering), and the
    syncs of each k step; k slices divide each block's work and add the partial sums'
    round trip through global memory (at ~3 TB/s, in FMA-row units of the block)."""
    from tecc.schedules.gpu_templates import (
        MICRO_K,
        PIPELINES,
        SPLIT_K,
        TILES,
        kernel_features,
        tile_name,
        workload_dims,
    )

    from tecc.target import target_info

    info = target_info(TARGET)
    limit = info.max_shared_memory_per_block or 49152
    sms = info.multiprocessors or 132
    batch, m, n, k = workload_dims(workload)
    scored: dict[bool, list] = {False: [], True: []}
    for tile, micro_k, pipeline, split_k in itertools.product(TILES, MICRO_K, PIPELINES,
                                                               SPLIT_K):
        if k // split_k < max(4 * micro_k, 128):
            continue
        config = {"rule": "simt", "tile": tile_name(tile), "micro_k": micro_k, "vector": 4,
                  "unroll": 256, "pipeline": pipeline, "split_k": split_k}
        f = kernel_features(workload, config, info)
        if f["shared_bytes"] > limit:
            continue
        _, _, vm, vn, mm, mn = tile
        bm, bn = f["block_m"], f["block_n"]
        resident = min(f["blocks_per_sm"], -(-f["blocks"] // sms))
        waves = -(-f["blocks"] // (sms * f["blocks_per_sm"]))
        fma_per_load = min(1.0, vm * mm * vn * mn / (vm * mm + vn * mn) / 4)
        warps = min(1.0, resident * f["threads"] / 32 / 8)
        reuse = min(1.0, bm * bn / (bm + bn) / 16)
        overlap = 1.0 if pipeline == "double" or f["k_steps"] < 16 else 0.85
        # a short loop barely overlaps; each step pays its syncs (~4 FMA rows' worth)
        steps = (1.0 if f["k_steps"] >= 8 else 0.9) * micro_k / (micro_k + 4)
        time = waves * resident * bm * bn / (fma_per_load * warps * reuse * overlap * steps)
        time /= split_k
        if split_k > 1:
            # the partial sums' bytes at ~3 TB/s against ~60 TFLOP/s of FMAs, in the
            # same units (one unit: a block tile's FMAs of a k of the whole loop)
            time += (2 * split_k * batch * m * n * 4 / 3e12) * 60e12 / (2 * k) / sms
        scored[split_k > 1].append((time, config))
    ranked = [c for _, c in sorted(scored[False], key=lambda s: s[0])[:count]]
    # the split configs: the best k step and pipeline of each tile and slice count
    seen: set[tuple[str, int]] = set()
    for _, c in sorted(scored[True], key=lambda s: s[0]):
        if (c["tile"], c["split_k"]) not in seen and len(seen) < count // 2:
            seen.add((c["tile"], c["split_k"]))
            ranked.append(c)
    return ranked


def tile_configs(workload: dict[str, Any], tiles: list[str]) -> list[dict[str, Any]]:
    """Unsplit simt configs of each of `tiles` at k steps 8 to 32, unpipelined and
    double-buffered (vector 4, unroll 256), within a block's shared memory."""
    from tecc.schedules.gpu_templates import PIPELINES, kernel_features

    from tecc.target import target_info

    info = target_info(TARGET)
    limit = info.max_shared_memory_per_block or 49152
    configs = []
    for tile, micro_k, pipeline in itertools.product(tiles, (8, 16, 32), PIPELINES):
        config = {"rule": "simt", "tile": tile, "micro_k": micro_k, "vector": 4,
                  "unroll": 256, "pipeline": pipeline, "split_k": 1}
        if kernel_features(workload, config, info)["shared_bytes"] <= limit:
            configs.append(config)
    return configs


def _build(job: tuple[str, dict | None, str]) -> tuple[str, str | None]:
    """Build one kernel into `path` (None: the template's fallback); the error if any."""
    import tvm
    from tecc.schedules.tasks import task_from_workload

    from tecc.cuda_toolchain import compile_cuda

    name, config, path = job
    try:
        task = task_from_workload(WORKLOADS[name], TARGET, name="k")
        prim = task.build_primfunc(config if config is not None else task.fallback_config())
        compile_cuda(tvm.IRModule({"k": prim}), task.tvm_target).export_library(path)
        return path, None
    except Exception as err:  # noqa: BLE001 - reported in the table
        return path, f"{type(err).__name__}: {str(err).splitlines()[-1][:120]}"


def _torch_case(workload: dict[str, Any], seed: int = 0):
    """(inputs, the torch function on them) on the GPU."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    if "kernel" in workload:
        x = torch.randn(*workload["data"], device="cuda", generator=gen)
        w = torch.randn(*workload["kernel"], device="cuda", generator=gen)
        return [x, w], lambda: torch.nn.functional.conv2d(
            x, w, stride=workload["strides"], padding=workload["padding"][:2])
    (a_shape, _), (b_shape, _) = workload["inputs"]
    a = torch.randn(*a_shape, device="cuda", generator=gen)
    b = torch.randn(*b_shape, device="cuda", generator=gen)
    if workload["template"] == "dense":
        return [a, b], lambda: a @ b.T
    return [a, b], lambda: a @ b


def _time_workload(name: str, paths: list[str], out: str) -> None:
    """In a child process: time each built kernel, one JSON line per kernel in `out`
    written before the next starts (a kernel that faults kills only this process)."""
    import torch
    import tvm

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dev = tvm.cuda(0)
    inputs, ref = _torch_case(WORKLOADS[name])
    want = ref()
    args = [tvm.runtime.from_dlpack(x) for x in inputs]
    got = torch.empty_like(want)
    args.append(tvm.runtime.from_dlpack(got))
    with open(out, "a") as f:
        for path in paths:
            f.write(json.dumps({"path": path, "started": True}) + "\n")
            f.flush()
            got.zero_()
            lib = tvm.runtime.load_module(path)
            seconds = float(np.median(lib.time_evaluator("k", dev, number=10, repeat=7)(
                *args).results))
            # as the tuner's runner times a candidate (autotune/tune.py, warm L2)
            tuner_s = float(np.mean(lib.time_evaluator(
                "k", dev, number=3, repeat=3, min_repeat_ms=20)(*args).results))
            err = float((got - want).abs().max() / want.abs().max())
            f.write(json.dumps({"path": path, "seconds": seconds, "tuner_s": tuner_s,
                                "err": err}) + "\n")
            f.flush()


def torch_seconds(name: str) -> float:
    """cuBLAS / cuDNN through torch, TF32 off: median of CUDA-event timings."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    _, ref = _torch_case(WORKLOADS[name])
    for _ in range(5):
        ref()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(7):
        start.record()
        for _ in range(10):
            ref()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 10 * 1e-3)
    return float(np.median(times))


def measure(name: str, jobs: list, errors: dict, log: Path) -> dict[str, float]:
    """Seconds per built kernel's path; a kernel that crashes its process is reported
    as such and the others are timed in a fresh process."""
    done: dict[str, float] = {}
    built = [j[2] for j in jobs if errors[j[2]] is None]
    while True:
        todo = [p for p in built if p not in done]
        if not todo:
            break
        child = multiprocessing.get_context("spawn").Process(
            target=_time_workload, args=(name, todo, str(log)))
        child.start()
        child.join()
        started = None
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if "seconds" in entry:
                done[entry["path"]] = entry["seconds"]
                errors[entry["path"]] = (f"rel err {entry['err']:.1e}; as tuned "
                                         f"{entry['tuner_s'] * 1e6:.1f} us")
            else:
                started = entry["path"]
        if child.exitcode != 0 and started is not None and started not in done:
            done[started] = float("inf")
            errors[started] = f"crashed the process (exit {child.exitcode})"
    return done


def config_name(config: dict | None) -> str:
    if config is None:
        return "fallback"
    split = f" split{config['split_k']}" if config.get("split_k", 1) > 1 else ""
    return (f"{config['rule']} {config['tile']} k{config['micro_k']} "
            f"{config['pipeline']}{split}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="workload names")
    parser.add_argument("--configs", type=int, default=20, help="configs per workload")
    parser.add_argument("--tiles", nargs="*", default=[],
                        help="simt tiles (as the knob spells them) timed at every k step "
                             "and pipeline besides the ranked configs")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--dry-run", action="store_true",
                        help="build every kernel that would be timed, time none")
    args = parser.parse_args()
    names = args.only.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    tmp = Path(tempfile.mkdtemp(prefix="tecc-gemm-"))
    jobs = []
    for i, name in enumerate(names):
        fallback_and_ranked = [None, *ranked_configs(WORKLOADS[name], args.configs)]
        fallback_and_ranked += [c for c in tile_configs(WORKLOADS[name], args.tiles)
                                if c not in fallback_and_ranked]
        jobs += [(name, c, str(tmp / f"{i}_{j}.so")) for j, c in enumerate(fallback_and_ranked)]
    start = time.time()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        errors = dict(pool.map(_build, jobs))
    failed = [(config_name(j[1]), errors[j[2]]) for j in jobs if errors[j[2]]]
    print(f"built {len(jobs) - len(failed)} of {len(jobs)} kernels in {time.time() - start:.0f} s",
          flush=True)
    for config, error in failed:
        print(f"  build failed: {config}: {error}")
    if args.dry_run:
        return
    rows = []
    for i, name in enumerate(names):
        work = [j for j in jobs if j[0] == name]
        seconds = measure(name, work, errors, tmp / f"{i}.jsonl")
        reference = torch_seconds(name)
        total = flops(WORKLOADS[name])
        print(f"== {name}: torch {total / reference / 1e12:.1f} TFLOP/s "
              f"({reference * 1e6:.0f} us)", flush=True)
        results = sorted(((seconds.get(j[2], float("inf")), config_name(j[1]), errors[j[2]])
                          for j in work), key=lambda r: r[0])
        for sec, config, note in results:
            tflops = total / sec / 1e12 if np.isfinite(sec) else 0.0
            print(f"  {tflops:6.2f} TFLOP/s {sec * 1e6:9.1f} us  {reference / sec:5.2f}x  "
                  f"{config}  {note}")
            rows.append([name, config, f"{sec * 1e6:.1f}", f"{tflops:.2f}",
                         f"{total / reference / 1e12:.2f}", f"{reference / sec:.2f}x", note or ""])
    # the rows and commands of earlier runs for the workloads not measured in this one
    kept_rows, commands = previous_rows(RESULTS / "gpu_gemm_configs.md", set(names))
    commands += odd_shape_ratios(kept_rows + rows)
    tiles = f" --tiles {' '.join(args.tiles)}" if args.tiles else ""
    commands.append("Command: `python benchmarks/gpu_gemm_configs.py "
                    f"--only {args.only} --configs {args.configs}{tiles}`")
    write_table("gpu_gemm_configs",
                "GPU matmul / implicit-GEMM conv configs against cuBLAS / cuDNN (fp32, TF32 off)",
                ["workload", "config", "us", "TFLOP/s", "torch TFLOP/s", "vs torch", "check"],
                kept_rows + rows, commands)


def odd_shape_ratios(rows: list[list[str]]) -> list[str]:
    """A line per odd workload measured with its even neighbour (`*_197` and `*_196`):
    the TFLOP/s of the odd one over the even one's, fallback against fallback and best
    against best."""
    tflops: dict[str, dict[str, float]] = {}
    for name, config, _, value, *_ in rows:
        tflops.setdefault(name, {})[config] = float(value)
    lines = []
    for odd in sorted(n for n in tflops if n.endswith("_197")):
        even = odd[:-len("197")] + "196"
        if even in tflops and tflops[even].get("fallback") and max(tflops[even].values()):
            fallback = tflops[odd].get("fallback", 0.0) / tflops[even]["fallback"]
            best = max(tflops[odd].values()) / max(tflops[even].values())
            lines.append(f"{odd} / {even}: {fallback:.2f} of the TFLOP/s with the fallback "
                         f"configs, {best:.2f} best against best.")
    return lines


def previous_rows(path: Path, measured: set[str]) -> tuple[list[list[str]], list[str]]:
    """The table rows in `path` of the workloads not in `measured`, and the command
    lines of the runs they came from."""
    if not path.exists():
        return [], []
    rows, commands = [], []
    for line in path.read_text().splitlines():
        if line.startswith("Command:"):
            commands.append(line)
        elif line.startswith("| ") and not line.startswith("| workload"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cells[0] not in measured:
                rows.append(cells)
    workloads = {r[0] for r in rows}
    commands = [c for c in commands if any(w in c for w in workloads)]
    return rows, commands


if __name__ == "__main__":
    main()
