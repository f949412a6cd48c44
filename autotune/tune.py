"""Tune a model's tasks within one trial budget.

The scheduler spreads the budget over the tasks by their weight (calls in the model
times the task's measured time) and their recent improvement, in the spirit of
Ansor's gradient rule: after one batch per task, each next batch goes to the task
whose weighted time is expected to drop most. A task stops early when it has not
improved for `early_stopping` trials, or when its space is exhausted.

Every measurement is appended to the records file as it happens; re-running on the
same file resumes: measured configs are loaded into each tuner (never measured again,
and its cost model is trained on them).

At the end, each task's best few configs and its fallback are measured again in
interleaved rounds (`verify_best`): the trials are single measurements taken minutes
apart, and on a busy machine one can be lucky by 2x. Compile time then picks the
config with the lowest median over those rounds, so a config that only looked fast,
or that loses to the untuned fallback, is not used.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tecc.autotune.builder import Builder, LocalBuilder, remove_built
from tecc.autotune.measure import MeasureInput, measure_batch, record_of, run_built
from tecc.autotune.records import (
    Record,
    RecordWriter,
    exact_target_key,
    load_records,
    records_lock,
    workload_key,
)
from tecc.autotune.runner import LocalRunner, Runner
from tecc.autotune.transfer import TransferSource
from tecc.autotune.tuner import Tuner, make_tuner
from tecc.schedules.space import Config
from tqdm import tqdm


def estimate_flops(task: Any) -> float:
    """Operations of a task's anchor, counted by TVM on the TIR of its canonical form
    (tvm.s_tir.analysis.estimate_tir_flops): 2 per multiply-add, so a conv or a dense
    is 2 x MACs (a Winograd conv counts as the direct conv it replaces)."""
    import tvm  # as in the rest of this module, tvm loads only when it is used
    from tecc.schedules.lower import build_te
    from tvm.s_tir.analysis import estimate_tir_flops

    inputs, outputs = build_te(task.func, task.tvm_target)
    prim = tvm.te.create_prim_func(inputs + outputs)
    return float(estimate_tir_flops(tvm.IRModule({"main": prim})))


SCHEDULERS = ("gradient", "round_robin")


@dataclass
class TaskState:
    task: Any
    weight: int  # calls of this workload in the model
    tuner: Tuner
    flops: float
    trials: int = 0
    best_at: int = 0
    done: bool = False
    curve: list[tuple[int, float]] = field(default_factory=list)  # (trials, best GFLOP/s)
    _fallback_index: int | None = field(default=None, repr=False)

    @property
    def best_cost(self) -> float:
        return self.tuner.history.best_cost

    @property
    def fallback_index(self) -> int | None:
        """The index of the task's fallback config (building it costs a schedule, so
        it is computed once, not on every pick of the scheduler)."""
        if self._fallback_index is None and hasattr(self.task, "fallback_config"):
            fallback = self.task.fallback_config().to_json()
            self._fallback_index = self.tuner.space.from_json(fallback).index
        return self._fallback_index

    @property
    def fallback_measured(self) -> bool:
        return self.fallback_index is None or self.fallback_index in self.tuner.visited

    @property
    def best_gflops(self) -> float:
        cost = self.best_cost
        return self.flops / cost / 1e9 if math.isfinite(cost) else 0.0


def _resume(state: TaskState, records: list[Record], target: dict[str, Any]) -> int:
    """Load earlier measurements of this task on this target into its tuner."""
    key, tkey = workload_key(state.task.workload), exact_target_key(target)
    configs, costs = [], []
    space = state.tuner.space
    for r in records:
        if r.key != key or exact_target_key(r.target) != tkey:
            continue
        try:
            config = space.from_json(r.config)
        except (KeyError, ValueError):
            continue  # a record of an older space
        if config.index in state.tuner.visited or any(c.index == config.index
                                                        for c in configs):
            continue
        configs.append(config)
        costs.append(r.cost)
    state.tuner.load_history(configs, costs)
    state.trials = len(configs)
    if configs:  # early stopping counts from the best resumed trial
        state.best_at = int(np.argmin(costs)) + 1
    return len(configs)


def _pretrain(states: Sequence[TaskState], records: list[Record], target: Any,
              seed: int) -> int:
    """Transfer learning for the tasks with a cost model that start without records of
    their own."""
    fresh = [s for s in states if s.trials == 0 and s.tuner.model is not None
             and s.tuner.features is not None]
    if not fresh or not records:
        return 0
    source = TransferSource(records, target, seed)
    done = 0
    for state in fresh:
        data = source.data_for(state.task, state.tuner.features.use_loop_features)
        if data is not None:
            state.tuner.pretrain(data.features, data.throughputs, data.groups)
            done += 1
    return done


def tune_tasks(
    tasks: Sequence[Any],
    weights: Sequence[int],
    records: str | Path,
    trials: int,
    tuner: str = "xgb",
    batch_size: int = 16,
    early_stopping: int | None = 128,
    timeout_s: float = 30.0,
    seed: int = 0,
    progress: bool = True,
    tecc_version: str = "",
    tvm_version: str = "",
    runner_options: dict[str, Any] | None = None,
    verify_top: int = 4,
    verify_rounds: int = 3,
    transfer: bool | str | Path | Sequence[str | Path] = True,
    scheduler: str = "gradient",
    on_batch: Callable[[Sequence[TaskState], int], None] | None = None,
    cache_flush: bool = False,
) -> list[TaskState]:
    """Tune `tasks` (weights: calls per task in the model) with `trials` measurements in
    all, appending to `records`; then re-measure each task's `verify_top` best configs
    and its fallback in `verify_rounds` interleaved rounds (0: no verification).
    `transfer`: the xgb model of a task without records of its own is pre-trained on
    the records of other workloads of its template, from `records` (True), also from
    these files or folders, or not at all (False).
    `scheduler`: "gradient" (see _pick) or "round_robin" (for comparison).
    `on_batch(states, trials spent)` is called after every measured batch.
    `cache_flush`: every timed call starts with the kernel's weights and outputs flushed
    from the CPU caches (its first argument, the data, stays warm), as inside a model
    whose weights do not all fit in cache; one call per timing.
    Returns each task's state (tuner history, curve)."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {SCHEDULERS}")
    if not tasks:
        return []
    with records_lock(records):
        return _tune_locked(tasks, weights, Path(records), trials, tuner, batch_size,
                            early_stopping, timeout_s, seed, progress, tecc_version,
                            tvm_version, runner_options, verify_top, verify_rounds,
                            transfer, scheduler, on_batch, cache_flush)


def _tune_locked(tasks: Sequence[Any], weights: Sequence[int], path: Path, trials: int,
                 tuner: str, batch_size: int, early_stopping: int | None, timeout_s: float,
                 seed: int, progress: bool, tecc_version: str, tvm_version: str,
                 runner_options: dict[str, Any] | None, verify_top: int, verify_rounds: int,
                 transfer: bool | str | Path | Sequence[str | Path], scheduler: str,
                 on_batch: Callable[[Sequence[TaskState], int], None] | None,
                 cache_flush: bool) -> list[TaskState]:
    """tune_tasks with the records file locked."""
    target = tasks[0].target
    earlier = load_records(path)[0] if path.exists() else []
    states = [TaskState(t, w, make_tuner(tuner, t, seed), estimate_flops(t))
              for t, w in zip(tasks, weights, strict=True)]
    resumed = sum(_resume(s, earlier, target) for s in states)
    if transfer is not False:
        extra = [] if transfer is True else load_records(transfer)[0]
        pretrained = _pretrain(states, earlier + extra, target, seed)
        if progress and pretrained:
            print(f"pre-trained the cost model of {pretrained} task(s) on records of "
                  "other workloads")
    budget = trials
    bar = tqdm(total=budget, disable=not progress, unit="trial", dynamic_ncols=True)
    options = runner_options_for(timeout_s, cache_flush, runner_options)
    started = time.perf_counter()

    def after_batch(states: Sequence[TaskState], state: TaskState, spent: int, n: int) -> None:
        if on_batch is not None:
            on_batch(states, spent)
        elapsed = time.perf_counter() - started
        bar.update(n)
        bar.set_postfix_str(f"{state.task.name}: {state.trials} trials, best "
                            f"{state.best_gflops:.1f} GFLOP/s, "
                            f"~{elapsed / spent * (budget - spent):.0f}s left")

    with RecordWriter(path, tecc_version, tvm_version) as writer, \
            LocalBuilder(timeout_s=max(timeout_s, 30.0)) as builder, \
            LocalRunner(**options) as runner:
        run_schedule(states, budget, batch_size,
                     lambda state, batch: measure_batch(
                         builder, runner, [MeasureInput(state.task, c) for c in batch], writer),
                     scheduler, early_stopping, after_batch)
        bar.close()
        if verify_top > 0 and verify_rounds > 0:
            verify_best(states, builder, runner, writer, verify_top, verify_rounds, progress)
    if progress and resumed:
        print(f"resumed from {resumed} earlier measurement(s) in {path}")
    return states


def runner_options_for(timeout_s: float = 30.0, cache_flush: bool = False,
                       overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """LocalRunner's options for tuning: 3 calls a timing, 3 timings, at least 20 ms."""
    options = {"number": 3, "repeat": 3, "min_repeat_ms": 20, "timeout_s": timeout_s}
    if cache_flush:  # TVM flushes before each repeat: a repeat of one call is all cold
        options.update(number=1, repeat=10, min_repeat_ms=0, cache_flush=True)
    options.update(overrides or {})
    return options


def verify_best(states: Sequence[TaskState], builder: Builder, runner: Runner,
                writer: RecordWriter, top: int = 4, rounds: int = 3,
                progress: bool = True) -> None:
    """Measure each task's `top` best configs and its fallback again, built once and
    run in `rounds` interleaved rounds, each result a record of one session."""
    session = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    work = [(s, c) for s in states if (c := _verify_candidates(s, top))]
    bar = tqdm(total=len(work) * rounds, disable=not progress, unit="round",
               desc="verifying", dynamic_ncols=True)
    for state, candidates in work:
        inputs = [MeasureInput(state.task, c) for c in candidates]
        built = builder.build(inputs)
        try:
            for r in range(rounds):
                # each round starts at another candidate: none is always the first run
                # after a build, or always the last
                order = [(i + r) % len(inputs) for i in range(len(inputs))]
                run_built(runner, [inputs[i] for i in order], [built[i] for i in order],
                          lambda j, result, order=order, inputs=inputs: writer.write(
                              record_of(inputs[order[j]], result, verify=session)))
                bar.update(1)
        finally:
            remove_built(built)
    bar.close()


def _verify_candidates(state: TaskState, top: int) -> list[Config]:
    """The task's `top` best measured configs and its fallback (when two or more)."""
    history = state.tuner.history
    ranked = sorted((cost, i) for i, cost in enumerate(history.costs) if math.isfinite(cost))
    picked: dict[int, Config] = {}
    for _, i in ranked:
        config = history.configs[i]
        picked.setdefault(config.index, config)
        if len(picked) == top:
            break
    if state.fallback_index is not None and state.fallback_index not in picked:
        picked[state.fallback_index] = state.tuner.space.get(state.fallback_index)
    return list(picked.values()) if len(picked) > 1 else []


# Ansor's task scheduler (Zheng et al., OSDI 2020, section 6), its default constants:
# the weight of the recent improvement against the forward-looking estimate, and how
# far below the best throughput of its kind a task is still thought to have room.
GRADIENT_ALPHA = 0.2
GRADIENT_BETA = 2.0
GRADIENT_WINDOW = 32  # trials over which the recent improvement is taken


def _pick(states: list[TaskState]) -> TaskState | None:
    """The next task to measure: first every task once, then the task whose weighted
    time is expected to drop the most per trial. As in Ansor, that expectation mixes
    the task's recent drop per trial with a forward-looking one: the larger of its
    time spread over the trials it has had (a task measured little may still drop a
    lot) and its distance to 1/beta of the best throughput a task of its template
    reached (a layer far slower than its kind has room)."""
    live = [s for s in states if not s.done]
    if not live:
        return None
    fresh = [s for s in live if s.trials == 0 or not math.isfinite(s.best_cost)
             or not s.fallback_measured]
    if fresh:
        return fresh[0]
    peak: dict[str, float] = {}  # template -> best FLOP/s of its tasks
    for s in states:
        if math.isfinite(s.best_cost) and s.best_cost > 0:
            template = s.task.workload.get("template", "")
            peak[template] = max(peak.get(template, 0.0), s.flops / s.best_cost)

    def gain(s: TaskState) -> float:
        window = s.tuner.history.best_curve()[-GRADIENT_WINDOW:]
        recent = ((window[0] - window[-1]) / len(window)
                  if len(window) > 1 and math.isfinite(window[0]) else 0.0)
        best_flops = peak.get(s.task.workload.get("template", ""), 0.0)
        room = s.best_cost - GRADIENT_BETA * s.flops / best_flops if best_flops else 0.0
        forward = max(s.best_cost / max(1, s.trials), room)
        return s.weight * (GRADIENT_ALPHA * recent + (1 - GRADIENT_ALPHA) * forward)

    return max(live, key=gain)


def run_schedule(states: list[TaskState], budget: int, batch_size: int,
                 measure: Callable[[TaskState, list[Config]], list[Any]],
                 scheduler: str = "gradient", early_stopping: int | None = 128,
                 after_batch: Callable[[Sequence[TaskState], TaskState, int, int], None]
                 | None = None) -> int:
    """Spend `budget` trials over the tasks, a batch at a time: the scheduler picks the
    task, its tuner the configs, `measure(state, configs)` returns results with .ok
    and .cost. Returns the trials spent."""
    spent = 0
    for state, spent, n in schedule_steps(states, budget, batch_size, measure, scheduler,
                                          early_stopping):
        if after_batch is not None:
            after_batch(states, state, spent, n)
    return spent


def schedule_steps(states: list[TaskState], budget: int, batch_size: int,
                   measure: Callable[[TaskState, list[Config]], list[Any]],
                   scheduler: str = "gradient", early_stopping: int | None = 128,
                   ) -> Iterator[tuple[TaskState, int, int]]:
    """run_schedule one batch at a time: yields (task state, trials spent, batch size)
    after each measured batch, so that two schedules can be interleaved batch by batch
    (and so see the same phases of a busy machine)."""
    spent = 0
    last: TaskState | None = None
    while spent < budget:
        state = _pick(states) if scheduler == "gradient" else _next_in_turn(states, last)
        last = state
        if state is None:
            break
        n = min(batch_size, budget - spent)
        fresh = sum(1 for s in states if not s.done and (s.trials == 0
                                                          or not s.fallback_measured))
        if fresh and (state.trials == 0 or not state.fallback_measured):
            # leave every untouched task (or unmeasured fallback) a first batch
            n = max(1, min(n, (budget - spent) // fresh))
        batch = state.tuner.next_batch(n)
        if not state.fallback_measured:
            # The fallback is measured first (also when resuming older records): a
            # record must beat what an untuned compile gets, or it would slow it down.
            fallback = state.tuner.space.get(state.fallback_index)
            batch = [fallback] + [c for c in batch if c.index != fallback.index][:n - 1]
        if not batch:
            state.done = True
            continue
        results = measure(state, batch)
        before = state.best_cost
        state.tuner.record(batch, [r.cost if r.ok else math.inf for r in results])
        state.trials += len(batch)
        spent += len(batch)
        if state.best_cost < before:
            state.best_at = state.trials
        state.curve.append((state.trials, state.best_gflops))
        if state.tuner.exhausted or (early_stopping is not None
                                     and state.trials - state.best_at >= early_stopping):
            state.done = True
        yield state, spent, len(batch)


def _next_in_turn(states: list[TaskState], last: TaskState | None) -> TaskState | None:
    """Round-robin: the next live task after `last`, in task order."""
    live = [s for s in states if not s.done]
    if not live:
        return None
    if last is None:
        return live[0]
    after = [s for s in live if states.index(s) > states.index(last)]
    return after[0] if after else live[0]


def model_time_estimate(states: Sequence[TaskState]) -> float:
    """Seconds per model run the tuned kernels add up to: weight x best time, summed
    over the tasks measured so far (what the scheduler minimizes)."""
    return sum(s.weight * s.best_cost for s in states if math.isfinite(s.best_cost))


PLOT_EXTRA = "pip install tecc[plot]"


def require_plotting() -> None:
    """Raises a clear error when matplotlib, which plot_curves needs, is missing: call
    it before tuning, not after hours of it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ModuleNotFoundError(f"plotting tuning curves needs matplotlib: {PLOT_EXTRA}",
                                  name="matplotlib") from err


def plot_curves(states: Sequence[TaskState], path: str | Path) -> None:
    """Best GFLOP/s against trials, one line per task."""
    require_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for s in states:
        best = s.tuner.history.best_curve()
        if best:
            gflops = [s.flops / c / 1e9 if math.isfinite(c) else 0.0 for c in best]
            ax.plot(range(1, len(gflops) + 1), gflops, label=f"{s.task.name} (x{s.weight})")
    ax.set_xlabel("trials of the task")
    ax.set_ylabel("best GFLOP/s")
    ax.set_title("tuning progress")
    ax.legend(fontsize="small", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
