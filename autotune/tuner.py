"""Tuners: propose configs of one task to measure, learn from the results.

A tuner is a search strategy (tecc.autotune.search) and, optionally, a cost model
(tecc.autotune.cost_model) that learns from every measured batch and guides the
search. All tuners share one loop (`Tuner.tune`): ask for a batch, measure it, update,
until the trial budget or early stopping ends it; a config is never measured twice.
The tuners users name (make_tuner, `tecc.tune(tuner=...)`):
- "random": RandomSearch, no model.
- "grid": GridSearch, no model.
- "xgb": AnnealingSearch guided by an XGBoost cost model on loop-nest features,
  retrained after each batch, pre-trainable on other workloads' records (transfer).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tecc.autotune.cost_model import CostModel, XGBCostModel
from tecc.autotune.features import FeatureCache
from tecc.autotune.search import AnnealingSearch, GridSearch, RandomSearch, SearchStrategy
from tecc.schedules.space import Config, ConfigSpace

MeasureFn = Callable[[list[Config]], list[Any]]  # configs -> results with .ok and .cost


@dataclass
class TuneHistory:
    """What a tuner measured: configs in order, their costs (inf if failed)."""

    configs: list[Config] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    visited: set[int] = field(default_factory=set)  # indices of the configs

    def add(self, configs: Sequence[Config], costs: Sequence[float]) -> None:
        for c, cost in zip(configs, costs, strict=True):
            self.visited.add(c.index)
            self.configs.append(c)
            self.costs.append(cost)

    @property
    def best_cost(self) -> float:
        return min(self.costs, default=math.inf)

    @property
    def best_config(self) -> Config | None:
        if not self.costs or math.isinf(self.best_cost):
            return None
        return self.configs[int(np.argmin(self.costs))]

    def best_curve(self) -> list[float]:
        return list(np.minimum.accumulate(self.costs)) if self.costs else []


class Tuner:
    """`strategy` proposes; `model`, fed `features` of the measured configs, scores."""

    def __init__(self, task: Any, strategy: SearchStrategy, model: CostModel | None = None,
                 features: FeatureCache | None = None, seed: int = 0) -> None:
        if model is not None and features is None:
            raise ValueError("a tuner with a cost model needs the features it reads")
        self.task = task
        self.space: ConfigSpace = task.space
        self.strategy = strategy
        self.model = model
        self.features = features
        self.history = TuneHistory()
        self.rng = random.Random(seed)
        self.rules_seen: set[tuple[int, ...]] = set()  # rule_of of the measured configs
        self.rules_refused: set[tuple[int, ...]] = set()  # no sample the space allows

    @property
    def visited(self) -> set[int]:
        return self.history.visited

    @property
    def exhausted(self) -> bool:
        return len(self.visited) >= len(self.space)

    def unexplored_rules(self) -> list[tuple[int, ...]]:
        """The rules of the space (option digits of its rule knobs) none of whose
        configs was measured, once others were: a rule added to a template after its
        records were written, or one the first batches missed. Empty before any
        measurement (the first batches sample every rule) and for a space without
        rules."""
        if not self.history.configs or not self.space.rule_knobs:
            return []
        options = [range(len(self.space.options(name))) for name in self.space.rule_knobs]
        return [rule for rule in itertools.product(*options)
                if rule not in self.rules_seen and rule not in self.rules_refused]

    def _unexplored_rule_samples(self, n: int) -> list[Config]:
        """Up to `n` random configs of the unexplored rules, shared among them. A cost
        model trained on the other rules alone knows nothing of these and would rank
        them anywhere: without samples of their own they could stay unmeasured for
        good (AnnealingSearch's random picks are a tenth of a batch)."""
        rules = self.unexplored_rules()
        if not rules or n <= 0:
            return []
        per_rule = max(1, n // len(rules))
        picks: list[Config] = []
        for rule in rules:
            found = 0
            for _ in range(8 * per_rule):
                if found >= per_rule or len(picks) >= n:
                    break
                config = self.space.get(self.space.sample_index(self.rng, rule=rule))
                if config.index in self.visited or config in picks:
                    continue
                if self.space.why_not(config) is not None:
                    self.history.visited.add(config.index)
                    continue
                picks.append(config)
                found += 1
            if not found:
                self.rules_refused.add(rule)  # every draw refused: not asked again
        return picks

    def next_batch(self, n: int) -> list[Config]:
        """Up to `n` configs to measure; configs the space's constraints refuse are
        marked visited unmeasured (no trial spent on them) and others proposed. While
        a rule of the space has no measured config (unexplored_rules), half the batch
        samples those rules."""
        trained = self.model is not None and self.model.trained
        batch: list[Config] = self._unexplored_rule_samples((n + 1) // 2)
        for _ in range(8):  # a mostly refused space can run out of proposals
            proposed = self.strategy.propose(n - len(batch), self.space, self.history,
                                             self._score if trained else None)
            taken = {c.index for c in batch}
            for config in proposed:
                if config.index in taken:
                    continue
                if self.space.why_not(config) is None:
                    batch.append(config)
                    taken.add(config.index)
                else:
                    self.history.visited.add(config.index)
            if not proposed or len(batch) >= n:
                break
        return batch

    def _score(self, configs: Sequence[Config]) -> np.ndarray:
        """The cost model's scores of configs (higher: faster)."""
        assert self.model is not None and self.features is not None
        return self.model.predict(self.features(list(configs)))

    def record(self, configs: Sequence[Config], costs: Sequence[float]) -> None:
        self.history.add(configs, costs)
        if self.space.rule_knobs:
            self.rules_seen.update(self.space.rule_of(c) for c in configs)
        if self.model is not None and self.features is not None and self.history.configs:
            self.model.fit(self.features(self.history.configs), np.array(self.history.costs))

    def load_history(self, configs: Sequence[Config], costs: Sequence[float]) -> None:
        """Resume: configs measured before (records) count as measured."""
        if configs:
            self.record(configs, costs)

    def pretrain(self, features: np.ndarray, throughputs: np.ndarray,
                 groups: list[int] | None = None) -> None:
        """Transfer learning from other workloads' records (same feature layout,
        `groups` rows per workload): the first batch then follows the model."""
        if self.model is None:
            raise ValueError("this tuner has no cost model to pre-train")
        self.model.pretrain(features, throughputs, groups)

    def tune(self, n_trial: int, measure: MeasureFn, batch_size: int = 16,
             early_stopping: int | None = None,
             callback: Callable[[Tuner, list[Config], list[Any]], None] | None = None) -> None:
        trials = 0
        best_at = 0
        while trials < n_trial and not self.exhausted:
            batch = self.next_batch(min(batch_size, n_trial - trials))
            if not batch:
                break
            results = measure(batch)
            costs = [r.cost if r.ok else math.inf for r in results]
            before = self.history.best_cost
            self.record(batch, costs)
            trials += len(batch)
            if self.history.best_cost < before:
                best_at = trials
            if callback is not None:
                callback(self, batch, results)
            if early_stopping is not None and trials - best_at >= early_stopping:
                break


class RandomTuner(Tuner):
    def __init__(self, task: Any, seed: int = 0) -> None:
        super().__init__(task, RandomSearch(seed), seed=seed)


class GridTuner(Tuner):
    def __init__(self, task: Any, seed: int = 0) -> None:
        super().__init__(task, GridSearch())


class XGBTuner(Tuner):
    def __init__(self, task: Any, seed: int = 0, loss: str = "rank",
                 use_loop_features: bool = True, epsilon: float = 0.1,
                 sa_chains: int = 32, sa_steps: int = 16, diversity: float = 0.25) -> None:
        super().__init__(task, AnnealingSearch(seed, epsilon, sa_chains, sa_steps, diversity),
                         XGBCostModel(loss, seed=seed), FeatureCache(task, use_loop_features),
                         seed)


TUNERS: dict[str, Callable[..., Tuner]] = {"xgb": XGBTuner, "random": RandomTuner,
                                           "grid": GridTuner}


def make_tuner(name: str, task: Any, seed: int = 0) -> Tuner:
    if name not in TUNERS:
        raise ValueError(f"unknown tuner {name!r}; choose one of {sorted(TUNERS)}")
    return TUNERS[name](task, seed=seed)
