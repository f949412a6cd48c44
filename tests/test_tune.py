"""The tuners and the tuning driver: budgets, no repeated measurements, resume after a
killed run, and records that compile picks up."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from tecc.autotune.cost_model import CostModel, XGBCostModel, normalized_throughputs
from tecc.autotune.features import FeatureCache
from tecc.autotune.records import load_records
from tecc.autotune.search import AnnealingSearch, RandomSearch, SearchStrategy
from tecc.autotune.tune import (
    TaskState,
    link_alternatives,
    model_time_estimate,
    plot_curves,
    reaching_share,
    run_schedule,
    schedule_steps,
)
from tecc.autotune.tuner import GridTuner, RandomTuner, Tuner, XGBTuner, make_tuner
from tecc.schedules.space import ConfigSpace

import tecc
from tests.models import mlp_example
from tests.util import assert_close

# Not serial: the tuning runs here assert what was measured and written, never how fast,
# and their runner's 30 s time-out is far above a small dense kernel's time on a busy core.

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    cost: float
    ok: bool = True


class SyntheticTask:
    """A space whose cost is a smooth function of the knobs (no compiler needed)."""

    name = "synthetic"
    workload = {"template": "synthetic"}
    target = {"kind": "llvm"}

    def __init__(self) -> None:
        self.space = ConfigSpace()
        self.space.define_split("tile_x", 256, 2)
        self.space.define_split("tile_y", 64, 2)
        self.space.define_choice("unroll", [0, 4, 16, 64])

    def cost(self, config) -> float:
        x, y = config["tile_x"][1], config["tile_y"][1]
        return (1 + abs(math.log2(x) - 4)) * (1 + abs(math.log2(y) - 3)) * (
            1 + 0.1 * abs(config["unroll"] - 16) / 16) * 1e-3


def synthetic_measure(task, fail_every: int = 0):
    count = [0]

    def measure(configs):
        out = []
        for c in configs:
            count[0] += 1
            failed = fail_every and count[0] % fail_every == 0
            out.append(Result(math.inf, False) if failed else Result(task.cost(c)))
        return out

    return measure


@pytest.mark.parametrize("name", ["random", "grid", "xgb"])
def test_tuners_respect_budget_and_never_repeat(name):
    task = SyntheticTask()
    tuner = make_tuner(name, task, seed=1)
    if isinstance(tuner, XGBTuner):
        tuner = XGBTuner(task, seed=1, use_loop_features=False)
    tuner.tune(100, synthetic_measure(task, fail_every=7), batch_size=16)
    indices = [c.index for c in tuner.history.configs]
    assert len(indices) == 100 and len(set(indices)) == 100
    assert sum(math.isinf(c) for c in tuner.history.costs) == 100 // 7
    assert tuner.history.best_config is not None


def test_xgb_finds_the_optimum_region_faster_than_random():
    task = SyntheticTask()
    best = min(task.cost(c) for c in task.space)
    found = {}
    for cls in (RandomTuner, XGBTuner):
        runs = []
        for seed in range(3):
            tuner = cls(task, seed=seed) if cls is RandomTuner else cls(
                task, seed=seed, use_loop_features=False)
            tuner.tune(64, synthetic_measure(task), batch_size=16)
            runs.append(tuner.history.best_cost)
        found[cls.__name__] = float(np.mean(runs))
    assert found["XGBTuner"] <= found["RandomTuner"]
    assert found["XGBTuner"] <= best * 1.5


def test_early_stopping_and_exhaustion():
    task = SyntheticTask()
    tuner = GridTuner(task)
    tuner.tune(10_000, lambda cs: [Result(1.0) for _ in cs], batch_size=8, early_stopping=24)
    assert len(tuner.history.costs) == 32  # first batch improves, then 24 without
    small = ConfigSpace()
    small.define_bool("flag")
    task.space = small
    tuner = RandomTuner(task)
    tuner.tune(50, lambda cs: [Result(1.0) for _ in cs])
    assert len(tuner.history.costs) == 2 and tuner.exhausted


class ScaledTask(SyntheticTask):
    def __init__(self, name: str, scale: float) -> None:
        super().__init__()
        self.name, self.scale = name, scale

    def cost(self, config) -> float:
        return self.scale * super().cost(config)


def skewed_states(seed: int) -> list[TaskState]:
    """One heavy kernel (10 calls of a 10x slower workload) and four light ones."""
    tasks = [ScaledTask("heavy", 10.0)] + [ScaledTask(f"light{i}", 0.1) for i in range(4)]
    weights = [10, 1, 1, 1, 1]
    return [TaskState(t, w, RandomTuner(t, seed=seed + i), 1.0)
            for i, (t, w) in enumerate(zip(tasks, weights, strict=True))]


def measure_synthetic(state: TaskState, batch: list) -> list[Result]:
    return [Result(state.task.cost(c)) for c in batch]


def scheduled_estimate(scheduler: str, seed: int) -> float:
    """Model time after 96 trials on skewed_states."""
    states = skewed_states(seed)
    spent = run_schedule(states, 96, 8, measure_synthetic, scheduler, early_stopping=None)
    assert spent == 96 and sum(s.trials for s in states) == 96
    assert all(s.trials > 0 for s in states)  # every task gets a first batch
    return model_time_estimate(states)


def test_gradient_scheduler_beats_round_robin():
    # Each task's tuner proposes the same sequence under both schedulers; the gradient
    # rule gives the heavy task more of the budget, so its model time is never worse
    # (within what the light tasks lose) and lower on average.
    pairs = [(scheduled_estimate("gradient", seed), scheduled_estimate("round_robin", seed))
             for seed in range(10)]
    assert all(g <= 1.01 * r for g, r in pairs), pairs
    assert np.mean([g for g, _ in pairs]) < 0.95 * np.mean([r for _, r in pairs]), pairs


def test_interleaved_schedules_run_as_they_would_alone():
    # benchmarks/scheduler.py steps two schedules in turn; each must spend its budget
    # and reach the same trials per task and the same model time as when run alone.
    alone = {}
    for name in ("gradient", "round_robin"):
        states = skewed_states(3)
        run_schedule(states, 96, 8, measure_synthetic, name, early_stopping=None)
        alone[name] = ([s.trials for s in states], model_time_estimate(states))
    paired = {name: skewed_states(3) for name in alone}
    steps = {name: schedule_steps(paired[name], 96, 8, measure_synthetic, name,
                                  early_stopping=None) for name in alone}
    spent = dict.fromkeys(alone, 0)
    while steps:
        for name in list(steps):
            step = next(steps[name], None)
            if step is None:
                del steps[name]
            else:
                spent[name] = step[1]
    assert spent == dict.fromkeys(alone, 96)
    for name, states in paired.items():
        assert ([s.trials for s in states], model_time_estimate(states)) == alone[name]
    assert alone["gradient"][0] != alone["round_robin"][0]  # the two did differ


class RuleTask(SyntheticTask):
    """A space of three rules with knobs of their own (as the GPU conv template's
    implicit GEMM rules and its direct rule), the third fastest; `refuse_third`: the
    space's constraints refuse every config of the third."""

    def __init__(self, name: str = "rules", refuse_third: bool = False) -> None:
        super().__init__()
        self.name = name
        self.space = ConfigSpace()
        self.space.define_choice("rule", ["gemm_a", "gemm_b", "direct"])
        self.space.define_split("tile_x", 256, 2, when=("rule", ("gemm_a", "gemm_b")))
        self.space.define_split("tile_y", 64, 2, when=("rule", ("direct",)))
        self.space.define_choice("unroll", [0, 4, 16, 64])
        if refuse_third:
            self.space.add_constraint(lambda c: c["rule"] != "direct", "no direct here")

    def cost(self, config) -> float:
        base = {"gemm_a": 3.0, "gemm_b": 2.0, "direct": 1.0}[config["rule"]]
        return base * (1 + 0.1 * abs(config["unroll"] - 16) / 16) * 1e-3


def resumed_without_third_rule(task: RuleTask, tuner: Tuner, n: int = 40) -> None:
    """Load `n` measurements of the first two rules, as records written before the
    third rule existed."""
    old = [c for c in task.space if c["rule"] != "direct"][:n]
    tuner.load_history(old, [task.cost(c) for c in old])


@pytest.mark.parametrize("name", ["xgb", "random"])
def test_a_rule_the_records_never_measured_gets_half_of_the_next_batch(name):
    task = RuleTask()
    tuner = XGBTuner(task, seed=0, use_loop_features=False) if name == "xgb" \
        else make_tuner(name, task, seed=0)
    assert tuner.unexplored_rules() == []  # nothing measured: the first batch samples all
    resumed_without_third_rule(task, tuner)
    assert tuner.unexplored_rules() == [(2,)]
    batch = tuner.next_batch(8)
    assert len(batch) == 8 and len({c.index for c in batch}) == 8
    assert sum(c["rule"] == "direct" for c in batch) >= 4
    assert not tuner.visited & {c.index for c in batch}
    tuner.record(batch, [task.cost(c) for c in batch])
    assert tuner.unexplored_rules() == []
    assert tuner.history.best_config["rule"] == "direct"


def test_a_rule_the_constraints_refuse_is_given_up():
    task = RuleTask(refuse_third=True)
    tuner = XGBTuner(task, seed=0, use_loop_features=False)
    resumed_without_third_rule(task, tuner)
    batch = tuner.next_batch(8)
    assert len(batch) == 8 and all(c["rule"] != "direct" for c in batch)
    assert tuner.unexplored_rules() == [] and tuner.rules_refused == {(2,)}


def test_the_scheduler_gives_a_resumed_task_with_an_unexplored_rule_a_batch_first():
    # the heavy task has the larger expected gain, but the light one's space gained a
    # rule since its records: it is measured first, and that rule wins
    heavy, light = ScaledTask("heavy", 10.0), RuleTask("light")
    states = [TaskState(heavy, 10, RandomTuner(heavy, seed=0), 1.0),
              TaskState(light, 1, RandomTuner(light, seed=0), 1.0)]
    old = list(heavy.space)[:40]
    states[0].tuner.load_history(old, [heavy.cost(c) for c in old])
    resumed_without_third_rule(light, states[1].tuner)
    for state in states:
        state.trials = len(state.tuner.history.configs)
        state._fallback_index = state.tuner.history.configs[0].index
    assert not states[0].fresh and states[1].fresh
    steps = schedule_steps(states, 16, 8, measure_synthetic, "gradient", early_stopping=None)
    first, _, _ = next(steps)
    assert first is states[1] and not states[1].fresh
    assert states[1].tuner.history.best_config["rule"] == "direct"
    assert next(steps)[0] is states[0]  # then the gradient rule as before


def layer_with_two_forms(seed: int, alternatives: bool) -> list[TaskState]:
    """A conv layer computed either by one direct kernel (a 10x slower workload) or by
    three Winograd kernels, and another kernel; `alternatives`: the scheduler knows the
    model runs the faster form."""
    tasks = [ScaledTask("direct", 10.0), ScaledTask("input", 0.5), ScaledTask("gemm", 1.0),
             ScaledTask("output", 0.5), ScaledTask("other", 2.0)]
    states = [TaskState(t, 1, RandomTuner(t, seed=seed + i), 1.0) for i, t in enumerate(tasks)]
    if alternatives:
        link_alternatives(states, [[[0], [1, 2, 3]]])
    return states


def model_time_of_layer(states: list[TaskState]) -> float:
    direct, inp, gemm, out, other = (s.best_cost for s in states)
    return other + min(direct, inp + gemm + out)


def test_the_scheduler_counts_a_slower_form_only_past_the_faster():
    # Without the alternatives the direct kernel looks like the largest room (a slow
    # workload of its template) and takes most of the budget; with them its drops
    # count only past the Winograd form's time, so the budget goes where the model
    # gains. Each task's tuner proposes the same sequence in both runs.
    runs = {}
    for alternatives in (False, True):
        runs[alternatives] = []
        for seed in range(6):
            states = layer_with_two_forms(seed, alternatives)
            run_schedule(states, 96, 8, measure_synthetic, "gradient", early_stopping=None)
            runs[alternatives].append((model_time_of_layer(states), states[0].trials))
    assert all(w[0] <= wo[0] for w, wo in zip(runs[True], runs[False], strict=True)), runs
    assert np.mean([t for t, _ in runs[True]]) < 0.9 * np.mean([t for t, _ in runs[False]])
    assert sum(n for _, n in runs[True]) < sum(n for _, n in runs[False])
    # a form not measured yet is no reason to hold back the other
    states = layer_with_two_forms(0, True)
    assert reaching_share(states[0], {"synthetic": 1e3}) == 1.0


TUNE_SCRIPT = r"""
import sys
import tecc
from tests.models import mlp_example

if __name__ == "__main__":
    model, inputs = mlp_example()
    tecc.tune(model, inputs, records=sys.argv[1], trials=int(sys.argv[2]), tuner="random",
              batch_size=4, progress=False)
"""


def run_tune(records: Path, trials: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", TUNE_SCRIPT, str(records), str(trials)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def test_killed_run_keeps_its_records_and_the_next_run_resumes(tmp_path):
    records = tmp_path / "mlp.jsonl"
    proc = run_tune(records, 400)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if records.exists() and len(records.read_text().splitlines()) >= 8:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its workers, mid-batch
    proc.wait()
    lines = records.read_text().splitlines()
    assert len(lines) >= 8
    first, skipped = load_records(records)
    assert skipped == 0 and len(first) == len(lines)  # every line written is whole

    assert not any(r.verify for r in first)  # killed before the verification rounds

    proc = run_tune(records, 8)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-2000:]
    second, _ = load_records(records)
    trials = [r for r in second if r.verify is None]
    assert len(trials) == len(first) + 8
    seen = [(r.key, json.dumps(r.config, sort_keys=True)) for r in trials]
    assert len(seen) == len(set(seen)), "a config was measured twice"
    # the finished run re-measured its best configs, over the resumed ones too
    assert any(r.verify for r in second)


def test_tuned_records_are_applied(tmp_path):
    model, inputs = mlp_example()
    records = tmp_path / "mlp.jsonl"
    states = tecc.tune(model, inputs, records=records, trials=12, tuner="random",
                       batch_size=4, progress=False)
    assert sum(s.trials for s in states) == 12
    lines, _ = load_records(records)
    assert sum(r.verify is None for r in lines) == 12
    session = [r for r in lines if r.verify is not None]
    assert len({r.verify for r in session}) == 1
    compiled = tecc.compile(model, inputs, records=records)
    sources = {t["source"] for t in compiled.tasks() if t["template"] == "dense"}
    assert sources == {"exact"} or "exact" in sources
    for t in compiled.tasks():
        rounds: dict[str, list[float]] = {}
        for r in session:
            if r.workload == t["workload"]:
                rounds.setdefault(json.dumps(r.config, sort_keys=True), []).append(r.cost)
        if t["source"] != "exact" or not rounds:
            continue
        # each verified config (best few and the fallback) ran 3 rounds; the lowest
        # median is the one compile uses
        assert all(len(c) == 3 for c in rounds.values()) and 2 <= len(rounds) <= 5
        best = min(rounds, key=lambda k: float(np.median(rounds[k])))
        assert json.loads(best) == t["config"]
    x = torch.randn(inputs[0].shape)
    with torch.no_grad():
        assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_cache_flush_reaches_the_runner(tmp_path, monkeypatch):
    import tecc.autotune.tune

    made: list[dict] = []

    class SpyRunner(tecc.autotune.tune.LocalRunner):
        def __init__(self, **options):
            made.append(options)
            super().__init__(**options)

    monkeypatch.setattr(tecc.autotune.tune, "LocalRunner", SpyRunner)
    model, inputs = mlp_example()
    for flush in (False, True):
        states = tecc.tune(model, inputs, records=tmp_path / f"{flush}.jsonl", trials=3,
                           tuner="random", batch_size=3, progress=False, verify_top=0,
                           cache_flush=flush)
        assert all(math.isfinite(s.best_cost) for s in states if s.trials)
    assert [o.get("cache_flush", False) for o in made] == [False, True]
    assert made[1]["number"] == 1 and made[1]["min_repeat_ms"] == 0


def test_tuner_names_are_a_search_strategy_and_a_cost_model():
    task = SyntheticTask()
    xgb = make_tuner("xgb", task)
    assert isinstance(xgb.strategy, AnnealingSearch) and isinstance(xgb.model, XGBCostModel)
    assert isinstance(xgb.strategy, SearchStrategy) and isinstance(xgb.model, CostModel)
    random_tuner = make_tuner("random", task)
    assert isinstance(random_tuner.strategy, RandomSearch) and random_tuner.model is None
    with pytest.raises(ValueError, match="choose one of"):
        make_tuner("annealing", task)
    with pytest.raises(ValueError, match="no cost model"):
        random_tuner.pretrain(np.zeros((2, 5)), np.ones(2))


class HighestFirst:
    """A search strategy of its own: the unmeasured configs from the last index down."""

    def propose(self, n, space, history, score):
        free = [i for i in reversed(range(len(space))) if i not in history.visited]
        return [space.get(i) for i in free[:n]]


class OracleModel:
    """A cost model of its own that knows the synthetic cost of each feature row once
    it has been fitted; it records what the tuner fits it on."""

    def __init__(self, task: SyntheticTask) -> None:
        features = FeatureCache(task, use_loop_features=False)
        self.truth = {tuple(features([c])[0]): -task.cost(c) for c in task.space}
        self.fitted: list[np.ndarray] = []

    @property
    def trained(self) -> bool:
        return bool(self.fitted)

    def fit(self, features, costs):
        assert len(features) == len(costs)
        self.fitted.append(np.asarray(costs))

    def predict(self, features):
        return np.array([self.truth[tuple(row)] for row in features])

    def pretrain(self, features, throughputs, groups=None):
        raise NotImplementedError


def test_tuners_take_any_strategy_and_model():
    task = SyntheticTask()
    tuner = Tuner(task, HighestFirst())
    tuner.tune(20, synthetic_measure(task), batch_size=8)
    assert [c.index for c in tuner.history.configs] == list(range(251, 231, -1))

    oracle = OracleModel(task)
    assert isinstance(oracle, CostModel) and isinstance(HighestFirst(), SearchStrategy)
    guided = Tuner(task, AnnealingSearch(seed=0), oracle,
                   FeatureCache(task, use_loop_features=False))
    guided.tune(32, synthetic_measure(task, fail_every=5), batch_size=16)
    # fitted on everything measured so far, failures as inf; the model-guided second
    # batch finds the optimum
    assert [len(c) for c in oracle.fitted] == [16, 32]
    assert np.isinf(oracle.fitted[-1]).sum() == 32 // 5
    optimum = min(task.space, key=task.cost)
    assert optimum.index in [c.index for c in guided.history.configs[16:]]
    with pytest.raises(ValueError, match="features"):
        Tuner(task, AnnealingSearch(), oracle)


def test_xgb_cost_model_learns_the_order_from_costs():
    assert list(normalized_throughputs(np.array([2.0, 1.0, math.inf]))) == [0.5, 1.0, 0.0]
    task = SyntheticTask()
    features = FeatureCache(task, use_loop_features=False)
    configs = list(task.space)
    costs = np.array([task.cost(c) for c in configs])
    costs[::9] = math.inf  # failures: ranked below everything
    model = XGBCostModel()
    assert not model.trained and not model.predict(features(configs[:3])).any()
    model.fit(features(configs), np.full(len(configs), math.inf))
    assert not model.trained  # nothing succeeded: nothing to learn
    model.fit(features(configs), costs)
    scores = model.predict(features(configs))
    ok = np.isfinite(costs)
    rank = np.corrcoef(np.argsort(np.argsort(scores[ok])),
                       np.argsort(np.argsort(-costs[ok])))[0, 1]
    assert rank > 0.8
    assert scores[~ok].mean() < scores[ok].mean()


def test_plot_curves_writes_a_png(tmp_path):
    states = skewed_states(0)
    run_schedule(states, 24, 8, measure_synthetic, early_stopping=None)
    plot_curves(states, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


NO_MATPLOTLIB = r"""
import sys

class NoMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoMatplotlib())
from tecc.autotune.tune import plot_curves

plot_curves([], sys.argv[1])
"""


def test_plotting_without_matplotlib_says_what_to_install(tmp_path):
    proc = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, str(tmp_path / "c.png")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "needs matplotlib: pip install tecc[plot]" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "c.png").exists()
