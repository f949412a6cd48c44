"""Task scheduler: the model time its tuned kernels add up to (calls x best time,
summed over the kernels) against trials spent, for tecc's gradient scheduler and
round-robin, tuning the same model from empty records with the same tuner and seed,
in one run.

    python benchmarks/scheduler.py [--model resnet18] [--trials 640] [--seeds 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.models_factory as models  # noqa: E402
from autotune.tune import SCHEDULERS, model_time_estimate, tune_tasks  # noqa: E402
from benchmarks.common import host_line, write_table  # noqa: E402
from schedules.tasks import extract_tasks  # noqa: E402
from tecc.api import _graph, task_weights  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--trials", type=int, default=640)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--output", default="scheduler")
    args = parser.parse_args()
    model, inputs = getattr(models, args.model)()
    _, partitioned, _, _, target = _graph(model, inputs, "llvm", 3, None, None, {})
    tasks = extract_tasks(partitioned, target)
    weights = task_weights(partitioned, target, tasks)
    marks = [args.trials * q // 4 for q in (1, 2, 3, 4)]
    rows, finals = [], []
    for scheduler in SCHEDULERS:
        at_marks: list[list[float]] = []
        for seed in range(args.seeds):
            curve: dict[int, float] = {}
            start = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                tune_tasks(tasks, weights, Path(tmp) / "records.jsonl", args.trials,
                           batch_size=16, seed=seed, progress=False, verify_top=0,
                           transfer=False, scheduler=scheduler,
                           on_batch=lambda states, spent: curve.__setitem__(  # noqa: B023
                               spent, model_time_estimate(states)))
            spent = sorted(curve)
            # nan: no batch had finished by that mark
            at_marks.append([curve[max(done)] * 1e3 if (done := [s for s in spent if s <= m])
                             else float("nan") for m in marks])
            print(f"{scheduler} seed {seed}: {at_marks[-1][-1]:.2f} ms "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
        means = np.mean(at_marks, axis=0)
        finals.append(means[-1])
        rows.append([args.model, scheduler] + [f"{v:.3f}" if np.isfinite(v) else "-"
                                               for v in means])
    for row, final in zip(rows, finals, strict=True):  # SCHEDULERS[1] is round-robin
        row.append(f"{finals[1] / final:.2f}x")
    write_table(
        args.output, "Task scheduler: estimated model time (ms) against trials",
        ["model", "scheduler"] + [f"@{m}" for m in marks] + ["round-robin / this, at the end"],
        rows,
        [f"Host: {host_line()}; {len(tasks)} tasks, xgb tuner, batches of 16, no transfer "
         f"and no verification, {args.seeds} seed(s). Model time: calls x best measured "
         "time, summed over the kernels (each task's first batch starts with its fallback).",
         f"Command: `python benchmarks/scheduler.py --model {args.model} --trials "
         f"{args.trials} --seeds {args.seeds}`."],
    )


if __name__ == "__main__":
    main()
