"""Transfer learning: the first trials of tecc's xgb tuner with its cost model
pre-trained on other workloads' records (the shipped tuning log, the workload's own
records left out), against the same tuner from scratch and random search, on the
workloads of tuner_efficiency.py that have such records, in one run.

    python benchmarks/transfer.py [--trials 64] [--seeds 3] [--records tuning_logs/llvm_core-avx2.jsonl]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.autotune.builder import LocalBuilder  # noqa: E402
from tecc.autotune.measure import MeasureInput, measure_batch  # noqa: E402
from tecc.autotune.records import load_records  # noqa: E402
from tecc.autotune.runner import LocalRunner  # noqa: E402
from tecc.autotune.transfer import TransferSource  # noqa: E402
from tecc.autotune.tuner import make_tuner  # noqa: E402

from benchmarks.common import host_line, write_table  # noqa: E402
from benchmarks.ops_cpu import anchor_task, workloads  # noqa: E402
from benchmarks.tuner_efficiency import CHECKPOINTS, SELECTED, mean_gflops_at  # noqa: E402
from tecc.target import resolve_target  # noqa: E402

TUNERS = ("xgb_transfer", "xgb", "random")
# tuner_efficiency's workloads whose template the shipped records hold other
# workloads of (its matmuls have none: the models' matmuls are dense layers)
WITH_SOURCES = [w for w in SELECTED if not w.startswith("matmul")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", default=",".join(WITH_SOURCES))
    parser.add_argument("--records", default="tuning_logs/llvm_core-avx2.jsonl")
    parser.add_argument("--output", default="transfer")
    args = parser.parse_args()
    target = resolve_target("llvm")
    source = TransferSource(load_records(args.records)[0], target)
    marks = [c for c in CHECKPOINTS if c <= args.trials]
    rows = []
    with LocalBuilder(n_parallel=2, timeout_s=60) as builder, \
            LocalRunner(number=3, repeat=3, min_repeat_ms=30, timeout_s=20) as runner:
        for wl in [w for w in workloads() if w["name"] in args.only.split(",")]:
            task = anchor_task(wl["func"], target)
            start = time.perf_counter()
            data = source.data_for(task)  # the workload's own records are left out
            prep_s = time.perf_counter() - start
            curves: dict[str, list[list[float]]] = {t: [] for t in TUNERS}
            for seed in range(args.seeds):
                for name in TUNERS:
                    tuner = make_tuner("random" if name == "random" else "xgb", task, seed)
                    if name == "xgb_transfer" and data is not None:
                        tuner.pretrain(data.features, data.throughputs, data.groups)
                    tuner.tune(args.trials, lambda cs: measure_batch(  # noqa: B023
                        builder, runner, [MeasureInput(task, c) for c in cs]),  # noqa: B023
                        batch_size=16)
                    curves[name].append(tuner.history.best_curve())
            for name in TUNERS:
                gflops = mean_gflops_at(curves[name], wl["flops"], marks)
                rows.append([wl["name"], name,
                             str(len(data.groups)) if name == "xgb_transfer" and data else "",
                             f"{prep_s:.0f}" if name == "xgb_transfer" else ""]
                            + [f"{g:.1f}" for g in gflops])
                print(rows[-1], flush=True)
    write_table(
        args.output, "Transfer learning: best GFLOP/s against trials (mean over seeds)",
        ["workload", "tuner", "source workloads", "pre-training s"] + [f"@{m}" for m in marks],
        rows,
        [f"Host: {host_line()}; {args.seeds} seed(s), batches of 16. xgb_transfer: the cost "
         f"model pre-trained on `{args.records}` (other workloads of the template; the "
         "workload's own records left out) before its first batch.",
         f"Command: `python benchmarks/transfer.py --trials {args.trials} --seeds {args.seeds}`."],
    )


if __name__ == "__main__":
    main()
