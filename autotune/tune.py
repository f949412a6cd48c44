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
from tecc.autotune.pool import exit_if_in_worker
from tecc.autotune.records import (
    RETARGET_BUDGET_S,
    RETARGET_K,
    RETARGET_SESSION,
    Record,
    RecordWriter,
    adopt_same_chip,
    exact_target_key,
    load_records,
    records_lock,
    vector_bits,
    workload_key,
)
from tecc.autotune.runner import LocalRunner, Runner
from tecc.autotune.transfer import TransferSource
from tecc.autotune.tuner import Tuner, make_tuner
from tecc.schedules.space import Config
from tqdm import tqdm

from tecc.target import target_info


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
    # the layers this task's workload is one way of computing: for each, its forms
    # (the direct conv, the Winograd kernels), of which the model runs the faster
    alternatives: list[list[list[TaskState]]] = field(default_factory=list, repr=False)

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
    def fresh(self) -> bool:
        """Whether the scheduler owes this task a first batch: never measured, nothing
        valid yet, its fallback unmeasured, or a rule of its space never measured (a
        rule added to its template after its records were written)."""
        return (self.trials == 0 or not math.isfinite(self.best_cost)
                or not self.fallback_measured or bool(self.tuner.unexplored_rules()))

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
    cache_flush: bool | None = None,
    alternatives: Sequence[Sequence[Sequence[int]]] = (),
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
    whose weights do not all fit in cache; one call per timing. On a CUDA target every
    call starts with a cold L2 unless it is False (None: the target's default).
    `alternatives`: groups of forms (lists of task indices), of which a model runs the
    faster (tecc.api.model_tasks: a conv's direct and Winograd kernels); the gradient
    scheduler counts a drop in the slower form only past the faster.
    Returns each task's state (tuner history, curve)."""
    exit_if_in_worker()
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {SCHEDULERS}")
    if not tasks:
        return []
    with records_lock(records):
        return _tune_locked(tasks, weights, Path(records), trials, tuner, batch_size,
                            early_stopping, timeout_s, seed, progress, tecc_version,
                            tvm_version, runner_options, verify_top, verify_rounds,
                            transfer, scheduler, on_batch, cache_flush, alternatives)


def _tune_locked(tasks: Sequence[Any], weights: Sequence[int], path: Path, trials: int,
                 tuner: str, batch_size: int, early_stopping: int | None, timeout_s: float,
                 seed: int, progress: bool, tecc_version: str, tvm_version: str,
                 runner_options: dict[str, Any] | None, verify_top: int, verify_rounds: int,
                 transfer: bool | str | Path | Sequence[str | Path], scheduler: str,
                 on_batch: Callable[[Sequence[TaskState], int], None] | None,
                 cache_flush: bool | None,
                 alternatives: Sequence[Sequence[Sequence[int]]]) -> list[TaskState]:
    """tune_tasks with the records file locked."""
    target = tasks[0].target
    # this chip's records under another LLVM name continue as this target's
    earlier = adopt_same_chip(load_records(path)[0] if path.exists() else [],
                              target_info(tasks[0].tvm_target))
    states = [TaskState(t, w, make_tuner(tuner, t, seed), estimate_flops(t))
              for t, w in zip(tasks, weights, strict=True)]
    link_alternatives(states, alternatives)
    resumed = sum(_resume(s, earlier, target) for s in states)
    if transfer is not False:
        extra = [] if transfer is True else load_records(transfer)[0]
        pretrained = _pretrain(states, earlier + extra, target, seed)
        if progress and pretrained:
            print(f"pre-trained the cost model of {pretrained} task(s) on records of "
                  "other workloads")
    budget = trials
    bar = tqdm(total=budget, disable=not progress, unit="trial", dynamic_ncols=True)
    options = runner_options_for(timeout_s, cache_flush, runner_options, target)
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


def runner_options_for(timeout_s: float = 30.0, cache_flush: bool | None = False,
                       overrides: dict[str, Any] | None = None,
                       target: Any = None) -> dict[str, Any]:
    """LocalRunner's options for tuning `target` (None: the CPU): 3 calls a timing, 3
    timings, at least 20 ms. A CUDA target is timed cold by default (`cache_flush`
    None): 20 single calls, each after its L2 is overwritten (twice its size)."""
    options: dict[str, Any] = {"number": 3, "repeat": 3, "min_repeat_ms": 20,
                               "timeout_s": timeout_s}
    info = target_info(target) if target is not None else None
    if info is not None and info.kind == "cuda":
        options.update(device="cuda", flush_bytes=2 * info.l2_bytes)
        if cache_flush is not False:
            options.update(number=1, repeat=20, min_repeat_ms=0, cache_flush=True)
    elif cache_flush:  # TVM flushes before each repeat: a repeat of one call is all cold
        options.update(number=1, repeat=10, min_repeat_ms=0, cache_flush=True)
    options.update(overrides or {})
    return options


def session_name(prefix: str = "") -> str:
    """A new verification session's name: its start time and process."""
    return f"{prefix}{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


def verify_best(states: Sequence[TaskState], builder: Builder, runner: Runner,
                writer: RecordWriter, top: int = 4, rounds: int = 3,
                progress: bool = True) -> None:
    """Measure each task's `top` best configs and its fallback again, built once and
    run in `rounds` interleaved rounds, each result a record of one session."""
    session = session_name()
    work = [(s, c) for s in states if (c := _verify_candidates(s, top))]
    bar = tqdm(total=len(work) * rounds, disable=not progress, unit="round",
               desc="verifying", dynamic_ncols=True)
    for state, candidates in work:
        inputs = [MeasureInput(state.task, c) for c in candidates]
        built = builder.build(inputs)
        try:
            measure_in_rounds(runner, [(inputs, built)], rounds,
                              lambda inp, result: writer.write(
                                  record_of(inp, result, verify=session)),
                              on_round=lambda: bar.update(1))
        finally:
            remove_built(built)
    bar.close()


def measure_in_rounds(runner: Runner,
                      groups: Sequence[tuple[Sequence[MeasureInput], Sequence[Any]]],
                      rounds: int, on_result: Callable[[MeasureInput, Any], None],
                      deadline: float | None = None,
                      on_round: Callable[[], None] | None = None) -> int:
    """Run built candidates (per group, the candidates of one task and their build
    results) in `rounds` interleaved rounds, one runner pass over every group a
    round; each round starts each group at another candidate, so none is always the
    first run after a build, or always the last. `on_result(input, result)` as each
    is measured. Past `deadline` (time.perf_counter) no further round starts, nor
    one that would end past it; at least one runs. Returns the rounds run."""
    done = 0
    started = time.perf_counter()
    for r in range(rounds):
        if done and deadline is not None:
            per_round = (time.perf_counter() - started) / done
            if time.perf_counter() + per_round > deadline:
                break
        order = [(inputs[(i + r) % len(inputs)], built[(i + r) % len(inputs)])
                 for inputs, built in groups for i in range(len(inputs))]
        run_built(runner, [inp for inp, _ in order], [b for _, b in order],
                  lambda j, result, order=order: on_result(order[j][0], result))
        done += 1
        if on_round is not None:
            on_round()
    return done


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


def link_alternatives(states: Sequence[TaskState],
                      alternatives: Sequence[Sequence[Sequence[int]]]) -> None:
    """Give each task of a group of alternative forms (task indices) the group, as
    lists of states."""
    for group in alternatives:
        forms = [[states[i] for i in form] for form in group]
        for state in {id(s): s for form in forms for s in form}.values():
            state.alternatives.append(forms)


def _room(state: TaskState, peak: dict[str, float]) -> float:
    """Seconds a call of the task may still drop: its distance to 1/beta of the best
    throughput a task of its template reached."""
    best_flops = peak.get(state.task.workload.get("template", ""), 0.0)
    if not best_flops or not math.isfinite(state.best_cost):
        return 0.0
    return max(0.0, state.best_cost - GRADIENT_BETA * state.flops / best_flops)


def reaching_share(state: TaskState, peak: dict[str, float]) -> float:
    """The share of the task's expected drop that reaches the model: 1, unless every
    layer it computes has a faster form (alternatives) measured; then, at most, the
    share of its form's room (summed over the form's tasks) that lies past the faster
    form's time (0 when the whole room would not get there)."""
    if not state.alternatives:
        return 1.0
    share = 0.0
    for forms in state.alternatives:
        times = [sum(s.best_cost for s in form) for form in forms]
        if not all(math.isfinite(t) for t in times):
            return 1.0  # not every form measured yet: no judgement
        mine = next(i for i, form in enumerate(forms) if any(s is state for s in form))
        behind = times[mine] - min(times)
        if behind <= 0:
            return 1.0
        room = sum(_room(s, peak) for s in forms[mine])
        share = max(share, (room - behind) / room if room > behind else 0.0)
    return share


def _pick(states: list[TaskState]) -> TaskState | None:
    """The next task to measure: first every task once, then the task whose weighted
    time is expected to drop the most per trial. As in Ansor, that expectation mixes
    the task's recent drop per trial with a forward-looking one: the larger of its
    time spread over the trials it has had (a task measured little may still drop a
    lot) and its distance to 1/beta of the best throughput a task of its template
    reached (a layer far slower than its kind has room); for a task of the slower form
    of a layer with alternatives, only the share that would pass the faster form
    (reaching_share)."""
    live = [s for s in states if not s.done]
    if not live:
        return None
    fresh = [s for s in live if s.fresh]
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
        forward = max(s.best_cost / max(1, s.trials), _room(s, peak))
        return s.weight * reaching_share(s, peak) * (
            GRADIENT_ALPHA * recent + (1 - GRADIENT_ALPHA) * forward)

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
        fresh = sum(1 for s in states if not s.done and s.fresh)
        if fresh and state.fresh:
            # leave every untouched task (unmeasured fallback, unexplored rule) a first
            # batch
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


# -- retargeting: a quick local tuning from another machine's records

RUN_OVERHEAD_S = 0.1  # a measured candidate's seconds besides its timed calls


@dataclass
class RetargetState:
    """One task of a retarget run: its foreign candidates (valid here, best first by
    their foreign cost), how many of them were measured, and the outcome here."""

    task: Any
    weight: int
    candidates: list[Config]
    fallback: Config
    foreign_cost_s: float  # the best foreign config's cost on its own machine
    measured: int = 0  # foreign candidates built and measured here
    costs: dict[int, list[float]] = field(default_factory=dict)  # config index -> costs
    # measured configs of the layout chain's (retarget_tasks' layout_variants)
    variants: list[Config] = field(default_factory=list)

    @property
    def configs(self) -> list[Config]:
        """What is measured here: the first `measured` candidates, the fallback and
        the layout chain's variants."""
        picked = {c.index: c for c in self.candidates[:self.measured]}
        picked.setdefault(self.fallback.index, self.fallback)
        for c in self.variants:
            picked.setdefault(c.index, c)
        return list(picked.values())

    def median_s(self, config: Config) -> float:
        costs = self.costs.get(config.index, [])
        return float(np.median(costs)) if costs and all(map(math.isfinite, costs)) else math.inf

    @property
    def fallback_s(self) -> float:
        return self.median_s(self.fallback)

    @property
    def best_s(self) -> float:
        return min((self.median_s(c) for c in self.configs), default=math.inf)

    @property
    def speedup(self) -> float:
        """The fallback's median time over the best config's, here."""
        best = self.best_s
        return self.fallback_s / best if math.isfinite(best) and best > 0 else 0.0


def foreign_candidates(task: Any, records: Sequence[Record]) -> tuple[list[Config], float]:
    """The distinct configs of `task`'s workload among `records` that are points of its
    config space here, best first, and the best one's cost. A config's rank is its
    median cost over its records relative to the best config of the same target (so
    records of several machines rank together); failed configs are left out."""
    key = workload_key(task.workload)
    costs: dict[tuple[str, str], list[float]] = {}
    configs: dict[str, dict[str, Any]] = {}
    target_of: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.key == key and r.ok:
            tkey = exact_target_key(r.target)
            costs.setdefault((tkey, r.config_key), []).append(r.cost)
            configs.setdefault(r.config_key, r.config)
            target_of.setdefault(r.config_key, r.target)
    medians = {k: float(np.median(c)) for k, c in costs.items()}
    best_of_target: dict[str, float] = {}
    for (tkey, _), cost in medians.items():
        best_of_target[tkey] = min(best_of_target.get(tkey, math.inf), cost)
    rank: dict[str, float] = {}
    for (tkey, ckey), cost in medians.items():
        rank[ckey] = min(rank.get(ckey, math.inf), cost / best_of_target[tkey])
    local_bits = target_info(task.tvm_target).vector_bits
    ranked: list[Config] = []
    for ckey in sorted(rank, key=lambda c: (rank[c], c)):
        # the config scaled to this vector width first, then as it was measured
        foreign_bits = vector_bits(target_of[ckey])
        ratio = local_bits / foreign_bits if foreign_bits else 1.0
        for values in (scaled_to_lanes(configs[ckey], task, ratio), configs[ckey]):
            try:
                config = task.space.from_json(values)
            except (KeyError, ValueError):
                continue  # not a point of this target's space
            if all(c.index != config.index for c in ranked):
                ranked.append(config)
    return ranked, min(best_of_target.values(), default=math.inf)


def scaled_to_lanes(config: dict[str, Any], task: Any, ratio: float) -> dict[str, Any]:
    """`config` (JSON) with the template's lane knobs (Template.lane_knobs) scaled by
    `ratio`, the local vector width over the measuring machine's: to the knob's option
    here nearest the scaled value (a packing block of 1000 features: 40 for 8 lanes
    would be 80 for 16, no option; 64 is the nearest); other values are kept."""
    if ratio == 1:
        return config
    options = {k.name: k.options for k in task.space.knobs}
    scaled = dict(config)
    for knob in task.template_obj.lane_knobs:
        value = config.get(knob)
        numeric = [o for o in options.get(knob, ()) if isinstance(o, int)]
        if isinstance(value, int) and not isinstance(value, bool) and numeric:
            scaled[knob] = min(numeric, key=lambda o: (abs(o - value * ratio), o))
    return scaled


def retarget_tasks(
    tasks: Sequence[Any],
    weights: Sequence[int],
    foreign: Sequence[Record],
    records: str | Path,
    k: int = RETARGET_K,
    time_budget_s: float = RETARGET_BUDGET_S,
    rounds: int = 3,
    timeout_s: float = 30.0,
    progress: bool = True,
    tecc_version: str = "",
    tvm_version: str = "",
    runner_options: dict[str, Any] | None = None,
    layout_variants: Callable[[], dict[str, list[dict[str, Any]]]] | None = None,
    cache_flush: bool | None = None,
) -> list[RetargetState]:
    """A quick local tuning from `foreign` records (another machine's): per task, its
    best foreign configs that are valid here (up to `k`) and its fallback, built in
    parallel and measured here in `rounds` interleaved rounds (as verify_best), one
    retarget session of records appended to `records`. `time_budget_s` bounds the
    run: every task with candidates gets its best one; more go to the tasks with the
    largest share of the model's estimated time (weight x foreign cost), while the
    measured build and estimated run times fit. Tasks without foreign records of
    their workload get none (their fallback stays). `layout_variants()`, given, says
    from the records written so far which configs (workload key -> config JSONs) the
    model's layout needs besides, to run without transforms between its layers (the
    tuner measures kernels alone, and a block change between two of them costs as
    much as a kernel): the time of one more candidate per task is kept for them, and
    they are measured in the same session until it asks for none new or the time is
    spent. `cache_flush` as in tune_tasks. Returns the retargeted tasks."""
    deadline = time.perf_counter() + time_budget_s
    states = []
    for task, weight in zip(tasks, weights, strict=True):
        candidates, cost = foreign_candidates(task, foreign)
        if candidates:
            states.append(RetargetState(task, weight, candidates, task.fallback_config(), cost))
    if not states:
        return []
    options = runner_options_for(timeout_s, cache_flush, runner_options, states[0].task.target)
    session = session_name(RETARGET_SESSION)
    with records_lock(records), RecordWriter(records, tecc_version, tvm_version) as writer, \
            LocalBuilder(timeout_s=max(timeout_s, 30.0)) as builder, \
            LocalRunner(**options) as runner:
        built: dict[tuple[int, int], Any] = {}

        def build(wanted: list[tuple[RetargetState, Config]]) -> None:
            results = builder.build([MeasureInput(s.task, c) for s, c in wanted])
            built.update({(id(s), c.index): b for (s, c), b in zip(wanted, results,
                                                                   strict=True)})

        try:
            for s in states:
                s.measured = 1
            first = [(s, c) for s in states for c in s.configs]
            build_started = time.perf_counter()
            build(first)
            per_build_s = (time.perf_counter() - build_started) / len(first)
            extra = _allot(states, k, per_build_s, rounds, options,
                           deadline - time.perf_counter(),
                           reserved=1 if layout_variants is not None else 0)
            more = [(s, c) for s in states for c in s.candidates[1:1 + extra.get(id(s), 0)]]
            if progress:
                print(f"built {len(first)} configs (each task's best foreign one and its "
                      f"fallback) in {per_build_s * len(first):.0f} s; building "
                      f"{len(more)} more")
            build(more)
            for s in states:
                s.measured += extra.get(id(s), 0)
            by_task = {workload_key(s.task.workload): s for s in states}

            def measured(inp: MeasureInput, result: Any) -> None:
                writer.write(record_of(inp, result, verify=session))
                by_task[workload_key(inp.task.workload)].costs.setdefault(inp.config.index, []).append(
                    result.cost)

            def measure(wanted: list[tuple[RetargetState, Config]], what: str) -> None:
                groups = []
                for s in states:
                    inputs = [MeasureInput(s.task, c) for t, c in wanted if t is s]
                    if inputs:
                        groups.append((inputs, [built[(id(s), inp.config.index)]
                                                for inp in inputs]))
                bar = tqdm(total=rounds, disable=not progress, unit="round",
                           desc=f"measuring {len(wanted)} {what}", dynamic_ncols=True)
                measure_in_rounds(runner, groups, rounds, measured, deadline,
                                  on_round=lambda: bar.update(1))
                bar.close()

            measure([(s, c) for s in states for c in s.configs], "configs")
            while layout_variants is not None and time.perf_counter() < deadline:
                wanted = _new_variants(by_task, layout_variants(), built)
                if not wanted:
                    break
                build(wanted)
                for s, c in wanted:
                    s.variants.append(c)
                measure(wanted, "configs of the layout chain")
        finally:
            remove_built(list(built.values()))
    return states


def _new_variants(by_task: dict[str, RetargetState], wanted: dict[str, list[dict[str, Any]]],
                  built: dict[tuple[int, int], Any]) -> list[tuple[RetargetState, Config]]:
    """The configs of `wanted` (workload key -> config JSONs) of the retargeted tasks
    that are points of their spaces and not built yet."""
    new: list[tuple[RetargetState, Config]] = []
    for key, configs in wanted.items():
        state = by_task.get(key)
        if state is None:
            continue
        for values in configs:
            try:
                config = state.task.space.from_json(values)
            except (KeyError, ValueError):
                continue
            if (id(state), config.index) not in built and \
                    all(c.index != config.index for t, c in new if t is state):
                new.append((state, config))
    return new


def _allot(states: Sequence[RetargetState], k: int, per_build_s: float, rounds: int,
           options: dict[str, Any], left_s: float, reserved: int = 0) -> dict[int, int]:
    """Further candidates per task (by id) beyond the first, within `left_s` seconds
    less the time of `reserved` more a task (for a later phase): each next one goes
    to the task with the largest estimated time per candidate it has (weight x
    foreign cost / candidates), as seats by D'Hondt's rule, while its build
    (`per_build_s`, measured) and its runs fit."""
    def run_s(state: RetargetState) -> float:
        # time_evaluator: `repeat` timings of at least min_repeat_ms, after a checked
        # call and an untimed one; loading the library and checking the outputs took
        # about 0.1 s more a candidate on a 2-core machine
        cost = state.foreign_cost_s if math.isfinite(state.foreign_cost_s) else 1e-3
        timing = max(options["min_repeat_ms"] / 1e3, options["number"] * cost)
        return options["repeat"] * timing + 2 * cost + RUN_OVERHEAD_S

    left_s -= sum(rounds * run_s(s) * (len(s.configs) + reserved) + reserved * per_build_s
                  for s in states)
    extra = {id(s): 0 for s in states}
    while True:
        open_ = [s for s in states if 1 + extra[id(s)] < min(k, len(s.candidates))]
        if not open_:
            return extra
        s = max(open_, key=lambda s: s.weight * s.foreign_cost_s / (2 + extra[id(s)]))
        cost = per_build_s + rounds * run_s(s)
        if cost > left_s:
            return extra
        left_s -= cost
        extra[id(s)] += 1


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
