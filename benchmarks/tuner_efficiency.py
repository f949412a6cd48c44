"""Tuner efficiency: best GFLOP/s against trials for tecc's XGBoost tuner, random
search, and TVM MetaSchedule's own tune_tir on the same workloads and trial counts,
with torch as the reference, in one run.

    python benchmarks/tuner_efficiency.py [--trials 512] [--seeds 3] [--only matmul_512]
        [--tuners xgb,random,metaschedule] [--curves results/tuner_efficiency_curves.json]
    python benchmarks/tuner_efficiency.py --target cuda --trials 192 --seeds 1
        (GPU: GEMM 1024^3 and 4096^3, three ResNet-18 convs, a BERT-base dense; TFLOP/s
        against cuBLAS/cuDNN; results/tuner_efficiency_cuda.md)

Finished curves are kept in a JSON file; a re-run measures only the missing ones, so
the full matrix (about 9 hours here) can be run in parts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.autotune.builder import LocalBuilder  # noqa: E402
from tecc.autotune.measure import MeasureInput, measure_batch  # noqa: E402
from tecc.autotune.runner import LocalRunner  # noqa: E402
from tecc.autotune.tune import runner_options_for  # noqa: E402
from tecc.autotune.tuner import make_tuner  # noqa: E402
from tecc.frontend.ir import Call, Function  # noqa: E402

from benchmarks.common import (  # noqa: E402
    RESULTS,
    CurveStore,
    host_line,
    median_ms,
    write_table,
)
from benchmarks.ops_cpu import anchor_task, var, workloads  # noqa: E402
from tecc.target import resolve_target  # noqa: E402

SELECTED = ["matmul_512", "matmul_1024", "conv_64x56_64_k3s1", "conv_128x28_128_k3s1",
            "conv_256x14_256_k3s1", "bert_dense_128x768x3072"]
GPU_SELECTED = ["matmul_1024", "matmul_4096", "conv_64x56_64_k3s1", "conv_128x28_128_k3s1",
                "conv_256x14_256_k3s1", "bert_dense_128x768x3072"]
CHECKPOINTS = [16, 32, 64, 128, 192, 256, 512, 1024, 2048]
TUNERS = ("xgb", "random", "metaschedule")


def build_without_intrinsics(mod, target, _params):
    """MetaSchedule's default build minus its `import tvm.s_tir.tensor_intrin`: that
    import parses every intrinsic TVM ships (about a minute), longer than a build
    worker's time-out, in every fresh worker; a CPU float32 workload uses none."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)


def database_curve(path: Path) -> list[float]:
    """Best seconds after each trial, from MetaSchedule's JSON database file (appended
    in measurement order; the database object returns its records sorted by cost)."""
    costs = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            run_secs = json.loads(line)[1][1]
        except (json.JSONDecodeError, IndexError, TypeError):
            continue  # the line being written when a snapshot read the file
        costs.append(float(np.median(run_secs)) if run_secs else math.inf)
    return list(np.minimum.accumulate(costs)) if costs else []


def metaschedule_curve(task, trials: int, target, seed: int,
                       progress: Callable[[list[float], float], None] | None = None,
                       every_s: float = 30.0) -> list[float]:
    """Best seconds after each trial of MetaSchedule's tune_tir on the task's anchor
    (its default layout, as built by the task with the fallback config, unscheduled).
    `progress(curve, seconds)` gets the curve so far every `every_s` seconds while it
    runs, so that a run cut short (a time limit, a machine taken back) keeps what it
    measured."""
    import tvm
    from tecc.runtime.cpu import host_cores
    from tecc.schedules.lower import build_te
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    placeholders, outputs = build_te(task.kernel_func(None), target)
    mod = tvm.IRModule({"main": te.create_prim_func(placeholders + outputs)})
    cores = host_cores()
    with tempfile.TemporaryDirectory() as work_dir:
        database = Path(work_dir) / "database_tuning_record.json"
        start, done = time.perf_counter(), threading.Event()

        def snapshot() -> None:
            seen = 0
            while not done.wait(every_s):
                curve = database_curve(database)
                if len(curve) > seen:
                    seen = len(curve)
                    progress(curve, time.perf_counter() - start)

        watcher = threading.Thread(target=snapshot, daemon=True) if progress else None
        if watcher:
            watcher.start()
        try:
            # a CUDA build needs the default builder's intrinsics and nvcc/nvrtc set-up
            builder = ms.builder.LocalBuilder(
                f_build=None if target.kind.name == "cuda" else build_without_intrinsics,
                max_workers=cores, timeout_sec=60)
            ms.tune_tir(mod, target, work_dir, max_trials_global=trials,
                        num_trials_per_iter=64, seed=seed, num_tuning_cores=cores,
                        builder=builder)
        finally:
            done.set()
            if watcher:
                watcher.join()
        return database_curve(database)


def at(curve: list[float], n: int) -> float:
    return curve[min(n, len(curve)) - 1] if curve else math.inf


def mean_gflops_at(curves: list[list[float]], flops: float, marks: list[int]) -> list[float]:
    """Best GFLOP/s after each mark's trials, averaged over the curves (best seconds
    after each trial); a curve with nothing measured by then counts 0."""
    return [float(np.mean([flops / at(c, m) / 1e9 if math.isfinite(at(c, m)) else 0.0
                           for c in curves])) for m in marks]


def table_rows(store: CurveStore, chosen: list[dict], trials: int, marks: list[int]
               ) -> list[list[str]]:
    """Mean best GFLOP/s at each mark over every seed the store holds at `trials` (a run
    that adds one tuner's seed keeps the other rows' seeds in the table)."""
    rows = []
    for wl in chosen:
        name = wl["name"]
        torch_gflops = store.torch(name)
        held = {t: {seed: c for seed in store.seeds(name, t)
                    if (c := store.curve(name, t, seed, trials)) is not None} for t in TUNERS}
        curves = {t: list(by_seed.values()) for t, by_seed in held.items()}
        mean_at = {t: mean_gflops_at(cs, wl["flops"], marks) for t, cs in curves.items() if cs}
        reach = ""
        if "xgb" in mean_at and "random" in mean_at:
            reach = next((str(m) for m, g in zip(marks, mean_at["xgb"], strict=True)
                          if g >= mean_at["random"][-1]), "not reached")
        for t, means in mean_at.items():
            ratio = f"{means[-1] / torch_gflops:.2f}" if torch_gflops else ""
            walls = [w for seed in held[t] if (w := store.wall_s(name, t, seed))]
            wall = f"{np.mean(walls):.0f}" if walls else "-"
            rows.append([name, t, str(len(curves[t]))] + [f"{g:.1f}" for g in means]
                        + [f"{torch_gflops:.1f}" if torch_gflops else "-", ratio, wall,
                           reach if t == "xgb" else ""])
    return rows


def run_missing(args: argparse.Namespace, chosen: list[dict], tuners: list[str], target,
                store: CurveStore) -> None:
    """Measure the (workload, tuner, seed) curves the store does not hold yet (all of
    the chosen ones with --redo)."""
    tasks: dict[str, object] = {}
    # seed by seed: the table covers every workload early and gains seeds as it runs
    # CPU: 3 calls a timing; CUDA: warm L2 as MetaSchedule and cuBLAS are timed here
    options = (runner_options_for(20.0, False, None, target) if target.kind.name == "cuda"
               else {"number": 3, "repeat": 3, "min_repeat_ms": 30, "timeout_s": 20})
    with LocalBuilder(timeout_s=60) as builder, LocalRunner(**options) as runner:
        for seed in range(args.seeds):
            for wl in chosen:
                for name in tuners:
                    if store.curve(wl["name"], name, seed, args.trials) is not None \
                            and not args.redo:
                        continue
                    if wl["name"] not in tasks:
                        tasks[wl["name"]] = anchor_task(wl["func"], target)
                    task = tasks[wl["name"]]
                    start = time.perf_counter()
                    if name == "metaschedule":
                        def keep(curve: list[float], seconds: float, wl: dict = wl,
                                 seed: int = seed) -> None:
                            # a cut run's curve, stored with the trials it reached: a
                            # table of that many trials (--report --trials N) shows it
                            store.add(wl["name"], "metaschedule", seed, len(curve), curve,
                                      seconds)
                            print(f"{wl['name']} metaschedule seed {seed}: {len(curve)} "
                                  f"trials measured ({seconds:.0f}s)", flush=True)

                        try:
                            curve = metaschedule_curve(task, args.trials, target, seed,
                                                       progress=keep)
                        except Exception as err:  # the anchor is reported, not fatal
                            print(f"MetaSchedule failed on {wl['name']}: {err}")
                            continue
                    else:
                        tuner = make_tuner(name, task, seed=seed)
                        tuner.tune(args.trials, lambda cs: measure_batch(  # noqa: B023
                            builder, runner, [MeasureInput(task, c) for c in cs]),  # noqa: B023
                            batch_size=32)
                        curve = tuner.history.best_curve()
                        if tuner.history.best_config is not None:
                            print(f"{wl['name']} {name} seed {seed} best config: "
                                  f"{tuner.history.best_config.to_json()}", flush=True)
                    store.add(wl["name"], name, seed, args.trials, curve,
                              time.perf_counter() - start)
                    best = wl["flops"] / curve[-1] / 1e9 if curve else 0.0
                    print(f"{wl['name']} {name} seed {seed}: {best:.1f} GFLOP/s "
                          f"({time.perf_counter() - start:.0f}s)", flush=True)


def gpu_workloads() -> list[dict]:
    """GPU_SELECTED: the CPU list's workloads plus GEMM 4096^3."""
    n = 4096
    a, b = var("a", (n, n)), var("b", (n, n))
    big = {"name": f"matmul_{n}", "func": Function([a, b], Call("nn.matmul", [a, b])),
           "flops": 2 * n**3, "shapes": [(n, n), (n, n)],
           "torch": lambda x, y: torch.matmul(x, y)}
    return [w for w in [*workloads(), big] if w["name"] in GPU_SELECTED]


def torch_gflops(wl: dict, cuda: bool) -> float:
    """The torch op's GFLOP/s (CUDA: by CUDA events, TF32 off)."""
    rng = np.random.default_rng(0)
    arrays = [torch.from_numpy(rng.standard_normal(s).astype("float32")) for s in wl["shapes"]]
    with torch.no_grad():
        if cuda:
            from benchmarks.e2e_gpu import cuda_ms

            arrays = [x.cuda() for x in arrays]
            seconds = cuda_ms({"torch": lambda: wl["torch"](*arrays)})["torch"] / 1e3
        else:
            seconds = median_ms(lambda: wl["torch"](*arrays)) / 1e3
    return wl["flops"] / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=512)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma-separated workload names")
    parser.add_argument("--tuners", default=",".join(TUNERS),
                        help="comma-separated subset of xgb, random, metaschedule")
    parser.add_argument("--output", default=None,
                        help="results name (default tuner_efficiency, _cuda for cuda)")
    parser.add_argument("--curves", type=Path, default=None,
                        help="JSON file of finished curves, read and extended "
                             "(default: results/<output>_curves.json)")
    parser.add_argument("--target", default="llvm", help="llvm (this CPU) or cuda[:sm_XX]")
    parser.add_argument("--redo", action="store_true",
                        help="measure the chosen curves again (a changed search space), "
                             "replacing those the file holds")
    parser.add_argument("--report", action="store_true",
                        help="measure nothing: write the table of the curves the file holds")
    args = parser.parse_args()
    tuners = [t for t in TUNERS if t in args.tuners.split(",")]
    target = resolve_target(args.target)
    cuda = target.kind.name == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(2)
    args.output = args.output or ("tuner_efficiency_cuda" if cuda else "tuner_efficiency")
    names = (args.only or ",".join(GPU_SELECTED if cuda else SELECTED)).split(",")
    every = gpu_workloads() if cuda else workloads()
    chosen = [w for w in every if w["name"] in names]
    marks = [c for c in CHECKPOINTS if c <= args.trials]
    store = CurveStore(args.curves or RESULTS / f"{args.output}_curves.json")
    if not args.report:
        run_missing(args, chosen, tuners, target, store)
    # torch is measured when the table is written (a second each), not hours earlier
    # under whatever else the machine ran then
    on_device = not cuda or torch.cuda.is_available()
    for wl in chosen:
        if on_device:  # a --report away from the GPU keeps the figures measured there
            store.set_torch(wl["name"], torch_gflops(wl, cuda))
    device = (torch.cuda.get_device_name() if on_device else "the GPU the curves were "
              "measured on") if cuda else host_line()
    write_table(
        args.output, "Tuner efficiency: best GFLOP/s against trials (mean over seeds)",
        ["workload", "tuner", "seeds"] + [f"@{m}" for m in marks]
        + ["torch", f"@{marks[-1]} / torch", "wall s", "xgb trials to random's best"],
        # every workload with stored curves: a run of a few (--only) keeps the others' rows
        table_rows(store, every, args.trials, marks),
        [f"{'Device' if cuda else 'Host'}: {device}; batches of 32 for tecc's tuners (one "
         "runner" + ("; CUDA: warm L2, 3 calls a timing, as MetaSchedule's runner and "
                     "the cuBLAS/cuDNN reference (torch, TF32 off) are timed"
                     if cuda else ": candidates 3x slower than the best of earlier batches "
                     "are timed by one call") + "), 64 for MetaSchedule (evolutionary "
         "search, its XGBoost model). Seeds: how many the mean is over.",
         f"Command: `python benchmarks/tuner_efficiency.py --target {args.target} --trials "
         f"{args.trials} --seeds {args.seeds}` (finished curves in `{store.path.name}`; a "
         "re-run measures only the missing ones)."],
    )


if __name__ == "__main__":
    main()
