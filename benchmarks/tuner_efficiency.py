"""Tuner efficiency: best GFLOP/s against trials for tecc's XGBoost tuner, random
search, and TVM MetaSchedule's own tune_tir on the same workloads and trial counts,
with torch as the reference, in one run.

    python benchmarks/tuner_efficiency.py [--trials 512] [--seeds 3] [--only matmul_512]
        [--tuners xgb,random,metaschedule]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.measure import LocalBuilder, LocalRunner, MeasureInput, measure_batch  # noqa: E402
from autotune.tuner import make_tuner  # noqa: E402
from benchmarks.common import host_line, median_ms, write_table  # noqa: E402
from benchmarks.ops_cpu import anchor_task, workloads  # noqa: E402
from schedules.target import resolve_target  # noqa: E402

SELECTED = ["matmul_512", "matmul_1024", "conv_64x56_64_k3s1", "conv_128x28_128_k3s1",
            "conv_256x14_256_k3s1", "bert_dense_128x768x3072"]
CHECKPOINTS = [16, 32, 64, 128, 256, 512, 1024, 2048]


def build_without_intrinsics(mod, target, _params):
    """MetaSchedule's default build minus its `import tvm.s_tir.tensor_intrin`: that
    import parses every intrinsic TVM ships (about a minute), longer than a build
    worker's time-out, in every fresh worker; a CPU float32 workload uses none."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)


def metaschedule_curve(task, trials: int, target, seed: int) -> list[float]:
    """Best seconds after each trial of MetaSchedule's tune_tir on the task's anchor
    (its default layout, as built by the task with the fallback config, unscheduled)."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from schedules.lower import build_te

    placeholders, outputs = build_te(task.kernel_func(None), target)
    mod = tvm.IRModule({"main": te.create_prim_func(placeholders + outputs)})
    with tempfile.TemporaryDirectory() as work_dir:
        builder = ms.builder.LocalBuilder(f_build=build_without_intrinsics, max_workers=2,
                                          timeout_sec=60)
        ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=64,
                    seed=seed, num_tuning_cores=2, builder=builder)
        # the JSON database file is appended in measurement order (the database object
        # returns its records sorted by cost)
        costs = []
        for line in (Path(work_dir) / "database_tuning_record.json").read_text().splitlines():
            run_secs = json.loads(line)[1][1]
            costs.append(float(np.median(run_secs)) if run_secs else math.inf)
    return list(np.minimum.accumulate(costs)) if costs else []


def at(curve: list[float], n: int) -> float:
    return curve[min(n, len(curve)) - 1] if curve else math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=512)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", default=",".join(SELECTED))
    parser.add_argument("--tuners", default="xgb,random,metaschedule",
                        help="comma-separated subset of xgb, random, metaschedule")
    parser.add_argument("--output", default="tuner_efficiency")
    args = parser.parse_args()
    tuners = set(args.tuners.split(","))
    torch.set_num_threads(2)
    target = resolve_target("llvm")
    chosen = [w for w in workloads() if w["name"] in args.only.split(",")]
    marks = [c for c in CHECKPOINTS if c <= args.trials]
    rows = []
    rng = np.random.default_rng(0)
    with LocalBuilder(n_parallel=2, timeout_s=60) as builder, \
            LocalRunner(number=3, repeat=3, min_repeat_ms=30, timeout_s=20) as runner:
        for wl in chosen:
            task = anchor_task(wl["func"], target)
            arrays = [torch.from_numpy(rng.standard_normal(s).astype("float32"))
                      for s in wl["shapes"]]
            with torch.no_grad():
                torch_gflops = wl["flops"] / (median_ms(lambda: wl["torch"](*arrays)) / 1e3) / 1e9  # noqa: B023

            def gflops(seconds: float) -> float:
                return wl["flops"] / seconds / 1e9 if math.isfinite(seconds) else 0.0  # noqa: B023

            curves: dict[str, list[list[float]]] = {"xgb": [], "random": [], "metaschedule": []}
            for seed in range(args.seeds):
                for name in [t for t in ("xgb", "random") if t in tuners]:
                    start = time.perf_counter()
                    tuner = make_tuner(name, task, seed=seed)
                    tuner.tune(args.trials, lambda cs: measure_batch(  # noqa: B023
                        builder, runner, [MeasureInput(task, c) for c in cs]), batch_size=32)  # noqa: B023
                    curves[name].append(tuner.history.best_curve())
                    print(f"{wl['name']} {name} seed {seed}: "
                          f"{gflops(tuner.history.best_cost):.1f} GFLOP/s "
                          f"({time.perf_counter() - start:.0f}s)", flush=True)
                if "metaschedule" in tuners:
                    try:
                        curves["metaschedule"].append(
                            metaschedule_curve(task, args.trials, target, seed))
                    except Exception as err:  # the anchor is reported, not fatal
                        print(f"MetaSchedule failed on {wl['name']}: {err}")
            mean_at = {name: [float(np.mean([gflops(at(c, m)) for c in cs])) if cs else 0.0
                              for m in marks] for name, cs in curves.items()}
            random_best = mean_at["random"][-1] if curves["random"] else math.inf
            reach = [next((m for m, g in zip(marks, mean_at["xgb"], strict=True)
                           if g >= random_best), None)]
            for name in ("xgb", "random", "metaschedule"):
                if curves[name]:
                    rows.append([wl["name"], name] + [f"{g:.1f}" for g in mean_at[name]]
                                + [f"{torch_gflops:.1f}",
                                   f"{mean_at[name][-1] / torch_gflops:.2f}",
                                   ("not reached" if reach[0] is None else str(reach[0]))
                                   if name == "xgb" and curves["random"] else ""])
                    print(rows[-1], flush=True)
    write_table(
        args.output, "Tuner efficiency: best GFLOP/s against trials (mean over seeds)",
        ["workload", "tuner"] + [f"@{m}" for m in marks]
        + ["torch", f"@{marks[-1]} / torch", "xgb trials to random's best"],
        rows,
        [f"Host: {host_line()}; {args.seeds} seed(s), batches of 32 for tecc's tuners, "
         "64 for MetaSchedule (evolutionary search, its XGBoost model).",
         f"Command: `python benchmarks/tuner_efficiency.py --trials {args.trials} "
         f"--seeds {args.seeds}`."],
    )


if __name__ == "__main__":
    main()
