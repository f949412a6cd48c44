"""Isolated against in-model kernel times: for each tuned workload of a model, the
fallback's and the chosen config's medians in the records' latest verification
session (each kernel timed alone, as the tuner times it) next to the same kernels'
times inside the model (CompiledModel._executor.profile: every kernel call of the
untuned and the tuned build, in plan order, in alternating rounds), so that a tuning
gain that the model does not see shows where it is lost.

    python benchmarks/kernel_gap.py --records tuning_logs/llvm_znver3.jsonl
        [--model resnet18] [--rounds 15]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))


import tecc  # noqa: E402
from benchmarks.common import host_line, write_table  # noqa: E402
from tecc.tuning import TuningContext  # noqa: E402
from tests.models import example_models  # noqa: E402


def isolated_ms(tuning: TuningContext, workload: dict, config: dict) -> float | None:
    """Ms of `config` for `workload` as compile ranks it (RecordDatabase: its latest
    verification session's median over rounds), None where it was not measured."""
    choice = tuning.db.choose_where(workload, tuning.target_json, lambda c: c == config)
    return choice.cost_s * 1e3 if choice is not None else None


def in_model_ms(builds: dict, inputs: list, rounds: int) -> dict[str, dict[str, float]]:
    """Per build, per kernel name: the median over `rounds` of its calls' summed time
    in one run of the model."""
    samples: dict[str, dict[str, list[float]]] = {b: defaultdict(list) for b in builds}
    for _ in range(rounds):
        for label, cm in builds.items():
            per_call = cm._executor.profile(*inputs, repeat=3)
            summed: dict[str, float] = defaultdict(float)
            for name, sec in per_call:
                summed[name] += sec
            for name, sec in summed.items():
                samples[label][name].append(sec)
    return {b: {n: float(np.median(s)) * 1e3 for n, s in per.items()}
            for b, per in samples.items()}


def ratio(before: float, after: float) -> str:
    return f"{before / after:.2f}x" if before and after else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", required=True)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default="kernel_gap")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, inputs = example_models(batch=1)[args.model]
    tuning = TuningContext(args.records, "llvm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        builds = {"untuned": tecc.compile(model, inputs),
                  "tuned": tecc.compile(model, inputs, records=args.records)}
    arrays = [x.numpy() for x in inputs]
    times = in_model_ms(builds, arrays, args.rounds)
    untuned_tasks = {t["workload_key"]: t for t in builds["untuned"].tasks()}
    rows, seen = [], {"untuned": set(), "tuned": set()}
    totals = defaultdict(float)
    for task in builds["tuned"].tasks():
        key = task["workload_key"]
        fallback = untuned_tasks.get(key)
        if fallback is None:
            continue
        alone_fb = isolated_ms(tuning, task["workload"], fallback["config"])
        alone_tuned = isolated_ms(tuning, task["workload"], task["config"])
        model_fb = sum(times["untuned"].get(k, 0.0) for k in fallback["kernels"])
        model_tuned = sum(times["tuned"].get(k, 0.0) for k in task["kernels"])
        seen["untuned"].update(fallback["kernels"])
        seen["tuned"].update(task["kernels"])
        calls = sum(k["name"] in task["kernels"] for k in builds["tuned"].plan["kernels"])
        if alone_fb and alone_tuned:
            totals["alone untuned"] += calls * alone_fb
            totals["alone tuned"] += calls * alone_tuned
        totals["model untuned"] += model_fb
        totals["model tuned"] += model_tuned
        rows.append([task["template"], str(calls), task["source"],
                     f"{alone_fb:.3f}" if alone_fb else "-",
                     f"{alone_tuned:.3f}" if alone_tuned else "-",
                     ratio(alone_fb, alone_tuned),
                     f"{model_fb:.3f}", f"{model_tuned:.3f}", ratio(model_fb, model_tuned)])
    other = {b: sum(ms for n, ms in times[b].items() if n not in seen[b]) for b in builds}
    rows.append(["(other kernels: layout transforms, injective)", "", "", "", "", "",
                 f"{other['untuned']:.3f}", f"{other['tuned']:.3f}",
                 ratio(other["untuned"], other["tuned"])])
    rows.append(["all tuned workloads (alone: x calls)", "", "",
                 f"{totals['alone untuned']:.3f}", f"{totals['alone tuned']:.3f}",
                 ratio(totals["alone untuned"], totals["alone tuned"]),
                 f"{totals['model untuned']:.3f}", f"{totals['model tuned']:.3f}",
                 ratio(totals["model untuned"], totals["model tuned"])])
    for row in rows:
        print(row)
    write_table(
        args.output, f"Kernel times alone (tuning's verification) and in the model: "
        f"{args.model}, CPU, batch 1 (ms)",
        ["workload", "calls", "source", "alone: fallback", "alone: chosen", "alone gain",
         "in model: untuned", "in model: tuned", "in-model gain"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads. Records: {args.records}.",
         "alone: the records' latest verification session, one call, median over its rounds of "
         "each round's median (as compile ranks configs); in model: "
         "each workload's kernel calls summed over one run, medians over "
         f"{args.rounds} alternating rounds of 3 profiled runs per build. Command: "
         "`python benchmarks/kernel_gap.py" + "".join(f" {a}" for a in sys.argv[1:]) + "`."])


if __name__ == "__main__":
    main()
