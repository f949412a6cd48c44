"""What a task's reference computation does to the timing of its first candidates.

measure.py computes each task's reference outputs (numpy) in the tuning process just
before the runner times its first candidates on the same cores. With numpy's BLAS on
all cores, its idle threads spin on for about 0.1 s after the matmul. This script times
the fallback config of each dense task of ConvNeXt (zoo config) as the first candidate
of its task, with the reference on one BLAS thread (as measure.py does) and on all of
them, in alternating runs (a fresh runner each, so each recomputes its references),
and then once more with the reference cached (the kernel's own time).

    python benchmarks/reference_threads.py [--runs 2]

Writes results/reference_threads.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc.autotune.measure as measure  # noqa: E402
from tecc.autotune.builder import LocalBuilder  # noqa: E402
from tecc.autotune.measure import MeasureInput, measure_batch  # noqa: E402
from tecc.autotune.runner import LocalRunner  # noqa: E402
from tecc.autotune.tune import runner_options_for  # noqa: E402

from benchmarks.common import host_line, write_table  # noqa: E402
from benchmarks.zoo import ZOO  # noqa: E402
from tecc.api import model_tasks  # noqa: E402

ONE_THREAD = measure.threadpool_limits


def first_candidate_ms(tasks: list, one_blas_thread: bool) -> tuple[list[float], list[float]]:
    """Each task's fallback, timed as its task's first candidate, then again (median
    ms of the runner's repeats)."""
    measure.threadpool_limits = ONE_THREAD if one_blas_thread else (
        lambda **_: contextlib.nullcontext())
    try:
        first, again = [], []
        options = runner_options_for(30.0, False, None, tasks[0].target)
        with LocalBuilder(timeout_s=60) as builder, LocalRunner(**options) as runner:
            for task in tasks:
                for out in (first, again):
                    result = measure_batch(builder, runner,
                                           [MeasureInput(task, task.fallback_config())])[0]
                    out.append(statistics.median(result.costs_s) * 1e3)
        return first, again
    finally:
        measure.threadpool_limits = ONE_THREAD


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2, help="runs of each mode, alternating")
    args = parser.parse_args()
    model, inputs = next(z for z in ZOO if z.name == "convnext").build()
    tasks, _, _ = model_tasks([(model, inputs)], "llvm", True)
    dense = [t for t in tasks if t.template == "dense"]
    runs: dict[bool, list[tuple[list[float], list[float]]]] = {True: [], False: []}
    for _ in range(args.runs):
        for one in (False, True):
            runs[one].append(first_candidate_ms(dense, one))
            print(f"{'one' if one else 'all'} BLAS threads: first "
                  f"{[round(v, 3) for v in runs[one][-1][0]]}", flush=True)
    rows = []
    for i, task in enumerate(dense):
        (a_shape, _), (w_shape, _) = task.workload["inputs"]
        cells = [" / ".join(f"{run[0][i]:.3f}" for run in runs[one]) for one in (False, True)]
        kernel = statistics.median(run[1][i] for one in (False, True) for run in runs[one])
        rows.append([task.name, f"{a_shape} x {w_shape}", *cells, f"{kernel:.3f}"])
    write_table("reference_threads", "First candidate of each task after its reference",
                ["task", "input x weight", "first, reference on all BLAS threads (ms)",
                 "first, reference on one BLAS thread (ms)", "the kernel, reference cached"],
                rows,
                [f"Host: {host_line()}.",
                 "The fallback config of each dense task of ConvNeXt (the zoo's config), "
                 "timed as the first candidate of its task right after its reference "
                 "outputs were computed in the tuning process, one value per run (runs "
                 "alternate the two modes, a fresh runner each); the last column times it "
                 "again with the reference cached (median over all runs).",
                 "Command: `python benchmarks/reference_threads.py`."])


if __name__ == "__main__":
    main()
