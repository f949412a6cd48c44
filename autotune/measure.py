"""Measuring tuning candidates: the builder builds them, the runner times them, and
this module joins the two with the tasks: reference inputs and expected outputs per
task, one tuning record per candidate.

    with LocalBuilder(timeout_s=30) as builder, LocalRunner(timeout_s=10) as runner:
        results = measure_batch(builder, runner, [MeasureInput(task, cfg), ...], writer)

The roles (AutoTVM's and MetaSchedule's split):
- tecc.autotune.pool: worker processes, replaced after a crash or a time-out;
- tecc.autotune.builder: TE/TIR -> exported library, needs the compiler, builds in
  parallel;
- tecc.autotune.runner: loads a library and times it, needs only the TVM runtime (GPU
  candidates are timed on a machine that may lack the compiler);
- here: the task side. Reference inputs come from task.reference_inputs(seed),
  expected outputs from task.reference_outputs(inputs), computed in this process
  once per task and runner; tasks whose configs change the kernel's layout convert
  them with task.adapt_io. Failures are recorded by kind (tecc.autotune.errors).

This module imports neither tvm nor the compiler at module level.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from tecc.autotune.builder import remove_built
from tecc.autotune.errors import RUN_ERROR, error_kind, format_error
from tecc.autotune.records import Record, RecordWriter, Timed
from tecc.autotune.runner import RunJob, RunOutcome
from threadpoolctl import threadpool_limits

from tecc.canonical import canonical_json

if TYPE_CHECKING:
    from tecc.autotune.builder import Builder, BuildResult
    from tecc.autotune.runner import Runner
    from tecc.autotune.task import TunableTask
    from tecc.schedules.space import Config


@dataclass(frozen=True)
class MeasureInput:
    task: TunableTask
    config: Config


@dataclass
class MeasureResult(Timed):
    costs_s: list[float]  # seconds per run, one per repeat; empty on error
    error: str | None
    all_cost: float  # wall seconds spent on this candidate (build + run)
    timestamp: float

    @property
    def error_kind(self) -> str | None:
        return error_kind(self.error)


def target_json(target: Any) -> dict[str, Any]:
    if isinstance(target, dict):
        return dict(target)
    from tecc.target import target_to_json

    return target_to_json(target)


def task_key(task: TunableTask) -> str:
    """One task on one target: candidates of one key are compared with each other."""
    return canonical_json([task.name, task.workload, target_json(task.target)])


def _device_of(target: Any) -> str:
    kind = target.get("kind") if isinstance(target, dict) else target.kind.name
    return "cuda" if kind == "cuda" else "cpu"


References = tuple[list[np.ndarray], list[np.ndarray] | None]
# Per runner (its seed and check_correctness decide them) while it lives, per task key:
# a reference can be a build of the task's fallback, too slow to repeat every batch.
# Keyed by id: a runner need not be hashable.
_REFERENCES: dict[int, dict[str, References]] = {}


def _reference(runner: Runner, task: TunableTask) -> References:
    if id(runner) not in _REFERENCES:
        _REFERENCES[id(runner)] = {}
        weakref.finalize(runner, _REFERENCES.pop, id(runner), None)
    cache = _REFERENCES[id(runner)]
    key = task_key(task)
    if key not in cache:
        options = runner.options
        # numpy's BLAS on one thread: a multi-threaded reference (a dense's matmul)
        # leaves its idle threads spinning for a while (OpenBLAS: about 0.1 s) on the
        # cores the runner times the next candidate on; a 2-thread kernel of 0.3 ms
        # then timed 8 ms
        with threadpool_limits(limits=1, user_api="blas"):
            inputs = [np.ascontiguousarray(a) for a in task.reference_inputs(options.seed)]
            expected = None
            if options.check_correctness:
                expected = [np.asarray(e) for e in task.reference_outputs(inputs)]
        cache[key] = (inputs, expected)
    return cache[key]


def run_built(runner: Runner, inputs: Sequence[MeasureInput],
              build_results: Sequence[BuildResult],
              callback: Callable[[int, MeasureResult], None] | None = None
              ) -> list[MeasureResult]:
    """Runs the built candidates of `inputs` on `runner`: one result per input, in
    order; `callback(index, result)` as each is known."""
    results: list[MeasureResult | None] = [None] * len(inputs)

    def done(index: int, result: MeasureResult) -> None:
        results[index] = result
        if callback is not None:
            callback(index, result)

    # Candidates that did not build are reported at once, in order with the others
    # as far as possible: the records file then follows the batch.
    jobs: list[RunJob] = []
    job_index: list[int] = []
    pending_failures: list[tuple[int, MeasureResult]] = []
    for i, (inp, built) in enumerate(zip(inputs, build_results, strict=True)):
        if built.path is None:
            pending_failures.append((i, MeasureResult([], built.error, built.build_s,
                                                      time.time())))
            continue
        try:
            ref_inputs, expected = _reference(runner, inp.task)
            # tasks whose configs change the kernel's layout (conv channel blocks,
            # dense weight packing) convert the canonical reference to it
            adapt = getattr(inp.task, "adapt_io", None)
            if adapt is not None:
                ref_inputs, expected = adapt(inp.config, ref_inputs, expected)
        except Exception as exc:  # noqa: BLE001 - a broken task fails its candidates
            pending_failures.append((i, MeasureResult(
                [], format_error(RUN_ERROR, f"reference failed: {type(exc).__name__}: {exc}"),
                built.build_s, time.time())))
            continue
        jobs.append(RunJob(built.path, ref_inputs, list(built.arg_specs[len(ref_inputs):]),
                           expected, _device_of(inp.task.target), task_key(inp.task)))
        job_index.append(i)

    def flush_failures(before: int) -> None:
        while pending_failures and pending_failures[0][0] < before:
            done(*pending_failures.pop(0))

    def job_done(j: int, outcome: RunOutcome) -> None:
        i = job_index[j]
        flush_failures(i)
        done(i, MeasureResult(outcome.costs_s, outcome.error,
                              build_results[i].build_s + outcome.run_s, time.time()))

    runner.run(jobs, job_done)
    flush_failures(len(inputs) + 1)
    return [r for r in results if r is not None]


def measure_batch(builder: Builder, runner: Runner, inputs: Sequence[MeasureInput],
                  writer: RecordWriter | None = None, keep_libs: bool = False,
                  callback: Callable[[int, MeasureResult], None] | None = None
                  ) -> list[MeasureResult]:
    """Builds and runs `inputs`; appends one record per candidate to `writer` as soon
    as that candidate is measured (flushed by the writer), then calls `callback`.
    The built libraries are deleted afterwards unless `keep_libs`."""
    built = builder.build(inputs)

    def record(index: int, result: MeasureResult) -> None:
        if writer is not None:
            writer.write(record_of(inputs[index], result))
        if callback is not None:
            callback(index, result)

    try:
        return run_built(runner, inputs, built, record)
    finally:
        if not keep_libs:
            remove_built(built)


def record_of(inp: MeasureInput, result: MeasureResult, verify: str | None = None) -> Record:
    """The tuning record of one measured candidate."""
    return Record(target_json(inp.task.target), inp.task.workload, inp.config.to_json(),
                  list(result.costs_s), result.error, result.timestamp, verify=verify)
