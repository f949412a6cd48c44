"""Task scheduler: tecc's gradient scheduler against round-robin, tuning the same model
from empty records with the same tuner, budget and seed.

The two runs of a seed are interleaved batch by batch in one process, so that both
see the same phases of the machine (runs one after the other, as the table's older
rows were, differ by the phase they ran in as much as by their scheduler).

Two figures per run: the model time its tuned kernels add up to (calls x best
measured time, summed over the kernels) against trials spent, and, at the end, the
model compiled with each run's records and timed end to end (the two compiled models
of a seed and the untuned one in the same interleaved rounds, so the comparison does
not rest on the tuner's own, noisy, best-of measurements).

    python benchmarks/scheduler.py [--model resnet18] [--trials 640] [--seeds 3]

Finished runs (their curves, records and timings) are kept, so a re-run does only
what is missing: the records under --work, the curves and timings in
results/<output>_runs.json.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.autotune.builder import LocalBuilder  # noqa: E402
from tecc.autotune.measure import MeasureInput, measure_batch  # noqa: E402
from tecc.autotune.records import RecordWriter  # noqa: E402
from tecc.autotune.runner import LocalRunner  # noqa: E402
from tecc.autotune.tune import (  # noqa: E402
    SCHEDULERS,
    TaskState,
    estimate_flops,
    model_time_estimate,
    runner_options_for,
    schedule_steps,
)
from tecc.autotune.tuner import make_tuner  # noqa: E402
from tecc.schedules.tasks import extract_tasks  # noqa: E402

import benchmarks.models_factory as models  # noqa: E402
import tecc  # noqa: E402
from benchmarks.common import (  # noqa: E402
    RESULTS,
    CurveStore,
    host_line,
    interleaved_ms,
    write_table,
)
from tecc.api import fused_graph, task_weights  # noqa: E402

BATCH = 16
WORK = Path(__file__).resolve().parent / ".work" / "scheduler"


def estimate_curve(batches: list[tuple[int, float]], trials: int) -> list[float]:
    """Model-time estimate after each trial, from the (trials spent, estimate) of each
    finished batch; nan until every task has been measured (before, the estimate
    leaves unmeasured tasks out and is not comparable)."""
    curve, value, ends = [], math.nan, dict(batches)
    for spent in range(1, trials + 1):
        value = ends.get(spent, value)
        curve.append(value)
    return curve


def tune_pair(tasks, weights, records: dict[str, Path], trials: int,
              seed: int) -> dict[str, list[float]]:
    """Tune the model once per scheduler, the two runs interleaved batch by batch in
    one process (one builder, one runner), so that both see the same phases of the
    machine; returns each scheduler's estimate curve."""
    states = {s: [TaskState(t, w, make_tuner("xgb", t, seed), estimate_flops(t))
                  for t, w in zip(tasks, weights, strict=True)] for s in SCHEDULERS}
    batches: dict[str, list[tuple[int, float]]] = {s: [] for s in SCHEDULERS}
    for path in records.values():
        path.unlink(missing_ok=True)  # a run cut short is redone, not resumed
    with ExitStack() as stack:
        builder = stack.enter_context(LocalBuilder(n_parallel=2))
        runner = stack.enter_context(LocalRunner(**runner_options_for()))
        steps = {}
        for name in SCHEDULERS:
            writer = stack.enter_context(RecordWriter(records[name]))
            steps[name] = schedule_steps(
                states[name], trials, BATCH,
                lambda state, batch, writer=writer: measure_batch(
                    builder, runner, [MeasureInput(state.task, c) for c in batch], writer),
                name)
        while steps:
            for name in list(steps):
                step = next(steps[name], None)
                if step is None:
                    del steps[name]
                    continue
                complete = all(math.isfinite(s.best_cost) for s in states[name])
                batches[name].append((step[1], model_time_estimate(states[name]) if complete
                                      else math.nan))
    return {name: estimate_curve(batches[name], trials) for name in SCHEDULERS}


def time_compiled(model, inputs, records: dict[str, Path]) -> dict[str, float]:
    """Median ms of the model compiled with each records file, and untuned, measured in
    the same interleaved rounds."""
    np_inputs = [x.numpy() for x in inputs]
    compiled = {name: tecc.compile(model, inputs, records=str(path))
                for name, path in records.items()}
    compiled["untuned"] = tecc.compile(model, inputs)
    return interleaved_ms({name: (lambda cm=cm: cm(*np_inputs))
                           for name, cm in compiled.items()}, rounds=11)


def run_missing(args: argparse.Namespace, store: CurveStore, run_name: str, model, inputs,
                tasks, weights) -> None:
    """Tune the (scheduler, seed) runs the store does not hold yet, and time the
    compiled models of every seed whose records changed or were never timed."""
    timings = store.data.setdefault(run_name, {}).setdefault("measured_ms", {})
    args.work.mkdir(parents=True, exist_ok=True)
    for seed in range(args.seeds):
        records = {s: args.work / f"{args.model}_{args.trials}_{s}_seed{seed}.jsonl"
                   for s in SCHEDULERS}
        if not all(store.curve(run_name, name, seed, args.trials) is not None
                   and records[name].exists() for name in SCHEDULERS):
            start = time.perf_counter()
            timings.pop(str(seed), None)  # its records change: time them again
            curves = tune_pair(tasks, weights, records, args.trials, seed)
            for name, curve in curves.items():
                store.add(run_name, name, seed, args.trials, curve)
                print(f"{name} seed {seed}: estimate {curve[-1] * 1e3:.2f} ms", flush=True)
            print(f"seed {seed}: both schedulers in {time.perf_counter() - start:.0f}s",
                  flush=True)
        if str(seed) not in timings:
            timings[str(seed)] = {k: float(f"{v:.5g}") for k, v in
                                  time_compiled(model, inputs, records).items()}
            store.save()
            print(f"seed {seed} compiled: {timings[str(seed)]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--trials", type=int, default=640)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--output", default="scheduler")
    parser.add_argument("--work", type=Path, default=WORK,
                        help="folder for the runs' tuning records")
    parser.add_argument("--report", action="store_true",
                        help="measure nothing: write the table of the finished runs")
    args = parser.parse_args()
    store = CurveStore(RESULTS / f"{args.output}_runs.json")
    if args.report:
        write_report(args, store)
        return
    torch.set_num_threads(2)
    model, inputs = getattr(models, args.model)()
    _, partitioned, _, _, target = fused_graph(model, inputs, "llvm", 3, None, None, {})
    tasks = extract_tasks(partitioned, target)
    weights = task_weights(partitioned, target, tasks)
    run_name = f"{args.model}@{args.trials}/interleaved"
    store.data.setdefault(run_name, {})["tasks"] = len(tasks)
    run_missing(args, store, run_name, model, inputs, tasks, weights)
    write_report(args, store)


def write_report(args: argparse.Namespace, store: CurveStore) -> None:
    """One table of every finished run the store holds (all models and budgets)."""
    rows = []
    for run_name, run in sorted(store.data.items()):
        # "model@trials", and "/interleaved" for the runs stepped in turn (tune_pair)
        model, _, rest = run_name.partition("@")
        trials, _, method = rest.partition("/")
        timings = run.get("measured_ms", {})
        seeds = sorted(int(s) for s in timings)
        if not seeds:
            continue
        marks = [int(trials) * q // 4 for q in (1, 2, 3, 4)]
        untuned = np.mean([timings[str(s)]["untuned"] for s in seeds])
        for scheduler in SCHEDULERS:
            curves = [store.curve(run_name, scheduler, s, int(trials)) for s in seeds]
            estimate = [np.mean([c[m - 1] for c in curves]) * 1e3 for m in marks]
            measured = [timings[str(s)][scheduler] for s in seeds]
            speedup = [timings[str(s)]["round_robin"] / timings[str(s)][scheduler]
                       for s in seeds]
            rows.append([model, str(run.get("tasks", "")), trials,
                         method or "one after the other", scheduler, str(len(seeds))]
                        + [f"{v:.3f}" if np.isfinite(v) else "-" for v in estimate]
                        + [f"{np.mean(measured):.3f}",
                           " ".join(f"{x:.3f}" for x in measured), f"{untuned:.3f}",
                           " ".join(f"{x:.2f}x" for x in speedup)])
    if not rows:
        print(f"no finished run in {store.path}")
        return
    write_table(
        args.output, "Task scheduler: gradient against round-robin on a whole model",
        ["model", "tasks", "trials", "runs", "scheduler", "seeds"]
        + [f"estimate @{q}/4 of the trials (ms)" for q in (1, 2, 3, 4)]
        + ["compiled model (ms, mean)", "per seed (ms)", "untuned (ms, mean)",
           "round-robin / this, per seed"],
        rows,
        [f"Host: {host_line()}; xgb tuner, batches of {BATCH}, no transfer and no "
         "verification, the same seeds for both schedulers.",
         "Estimate: calls x best measured time, summed over the kernels, mean over the "
         "seeds ('-': some task not measured yet). Compiled model: the model compiled "
         "with the run's records, median of interleaved rounds with the other "
         "scheduler's model and the untuned one.",
         "Command: `python benchmarks/scheduler.py --model MODEL --trials N --seeds S` "
         f"(runs kept in `{store.path.name}`; `--report` rewrites this table).",
         ],
    )


if __name__ == "__main__":
    main()
