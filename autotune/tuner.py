"""Tuners: propose configs of one task to measure, learn from the results.

All tuners share one loop (`Tuner.tune`): ask for a batch, measure it, update, until
the trial budget or early stopping ends it; a config is never measured twice.
- RandomTuner: uniform samples of the space.
- GridTuner: the space in index order.
- XGBTuner: an XGBoost cost model, retrained after each batch, drives simulated
  annealing over the space; each batch is the model's top predictions with an
  epsilon of random picks, filtered for diversity (AutoTVM's recipe).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tecc.autotune.cost_model import XGBCostModel
from tecc.autotune.features import FeatureCache
from tecc.schedules.space import Config, ConfigSpace

MeasureFn = Callable[[list[Config]], list[Any]]  # configs -> results with .ok and .cost


@dataclass
class TuneHistory:
    """What a tuner measured: configs in order, their costs (inf if failed)."""

    configs: list[Config] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)

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
    def __init__(self, task: Any, seed: int = 0) -> None:
        self.task = task
        self.space: ConfigSpace = task.space
        self.rng = random.Random(seed)
        self.history = TuneHistory()
        self.visited: set[int] = set()

    # Subclasses choose what to measure next and may learn from results.
    def next_batch(self, n: int) -> list[Config]:
        raise NotImplementedError

    def update(self, configs: Sequence[Config], costs: Sequence[float]) -> None:
        pass

    def record(self, configs: Sequence[Config], costs: Sequence[float]) -> None:
        for c, cost in zip(configs, costs, strict=True):
            self.visited.add(c.index)
            self.history.configs.append(c)
            self.history.costs.append(cost)
        self.update(configs, costs)

    def load_history(self, configs: Sequence[Config], costs: Sequence[float]) -> None:
        """Resume: configs measured before (records) count as measured."""
        if configs:
            self.record(configs, costs)

    @property
    def exhausted(self) -> bool:
        return len(self.visited) >= len(self.space)

    def _unvisited_random(self, n: int) -> list[Config]:
        out: list[Config] = []
        total = len(self.space)
        tries = 0
        while len(out) < n and len(self.visited) + len(out) < total and tries < 50 * n + 100:
            tries += 1
            index = self.rng.randrange(total)
            if index not in self.visited and all(index != c.index for c in out):
                out.append(self.space.get(index))
        if len(out) < n and total <= 100_000:  # a nearly exhausted small space
            rest = [i for i in range(total) if i not in self.visited
                    and all(i != c.index for c in out)]
            out += [self.space.get(i) for i in rest[: n - len(out)]]
        return out

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
    def next_batch(self, n: int) -> list[Config]:
        return self._unvisited_random(n)


class GridTuner(Tuner):
    def __init__(self, task: Any, seed: int = 0) -> None:
        super().__init__(task, seed)
        self._next = 0

    def next_batch(self, n: int) -> list[Config]:
        out: list[Config] = []
        while len(out) < n and self._next < len(self.space):
            if self._next not in self.visited:
                out.append(self.space.get(self._next))
            self._next += 1
        return out


class XGBTuner(Tuner):
    """Loop-nest features cost ~10-40 ms a config (the schedule is built to read them),
    so annealing is kept to 32 chains x 16 steps a round (a few seconds)."""

    def __init__(self, task: Any, seed: int = 0, loss: str = "rank",
                 use_loop_features: bool = True, epsilon: float = 0.1,
                 sa_chains: int = 32, sa_steps: int = 16, diversity: float = 0.25) -> None:
        super().__init__(task, seed)
        self.model = XGBCostModel(loss, seed=seed)
        self.features = FeatureCache(task, use_loop_features)
        self.epsilon = epsilon
        self.sa_chains = sa_chains
        self.sa_steps = sa_steps
        self.diversity = diversity

    def pretrain(self, features: np.ndarray, throughputs: np.ndarray,
                 groups: list[int] | None = None) -> None:
        """Transfer learning from other workloads' records (same feature layout,
        `groups` rows per workload): the first batch then follows the model."""
        self.model.pretrain(features, throughputs, groups)

    def update(self, configs: Sequence[Config], costs: Sequence[float]) -> None:
        costs_arr = np.array(self.history.costs)
        finite = costs_arr[np.isfinite(costs_arr)]
        if len(finite) == 0:
            return
        # Normalized throughput: the best measured config is 1, failures 0.
        y = np.where(np.isfinite(costs_arr), finite.min() / costs_arr, 0.0)
        self.model.fit(self.features(self.history.configs), y)

    def next_batch(self, n: int) -> list[Config]:
        if not self.model.trained:
            return self._unvisited_random(n)
        n_random = max(1, int(round(n * self.epsilon)))
        picks = self._anneal(n - n_random)
        taken = {c.index for c in picks}
        picks += [c for c in self._unvisited_random(n_random + 2) if c.index not in taken]
        return picks[:n]

    def _score(self, configs: list[Config]) -> np.ndarray:
        return self.model.predict(self.features(configs))

    def _anneal(self, n: int) -> list[Config]:
        """Simulated annealing on the model's predictions; the best unvisited configs
        seen, at most `diversity` of them sharing a knob value set with another."""
        if n <= 0:
            return []
        measured = [c for c, cost in sorted(zip(self.history.configs, self.history.costs,
                                                strict=True), key=lambda p: p[1])
                    if math.isfinite(cost)]
        starts = measured[: self.sa_chains // 2]
        starts += self._unvisited_random(self.sa_chains - len(starts))
        points = list(starts)
        scores = self._score(points)
        seen: dict[int, tuple[float, Config]] = {
            c.index: (float(s), c) for c, s in zip(points, scores, strict=True)}
        for step in range(self.sa_steps):
            temperature = max(1e-3, 1.0 - step / self.sa_steps)
            proposals = [self.space.random_neighbour(p, self.rng) for p in points]
            new_scores = self._score(proposals)
            scale = max(float(np.ptp(scores)), 1e-9)
            for i, (prop, s_new) in enumerate(zip(proposals, new_scores, strict=True)):
                seen.setdefault(prop.index, (float(s_new), prop))
                accept = s_new >= scores[i] or self.rng.random() < math.exp(
                    (s_new - scores[i]) / (scale * temperature))
                if accept:
                    points[i], scores[i] = prop, s_new
        ranked = sorted((v for k, v in seen.items() if k not in self.visited),
                        key=lambda v: -v[0])
        return self._diverse([c for _, c in ranked], n)

    def _diverse(self, ranked: list[Config], n: int) -> list[Config]:
        """Keep the order but skip configs whose knob values mostly repeat those of
        configs already picked, so one batch explores more than one corner."""
        picked: list[Config] = []
        limit = max(1, int(len(self.space.knobs) * (1 - self.diversity)))
        for c in ranked:
            if len(picked) >= n:
                break
            same = max((sum(c[k] == p[k] for k in c) for p in picked), default=0)
            if same <= limit or len(self.space.knobs) <= 1:
                picked.append(c)
        for c in ranked:  # fill up if the filter was too strict
            if len(picked) >= n:
                break
            if c not in picked:
                picked.append(c)
        return picked


TUNERS: dict[str, type[Tuner]] = {"xgb": XGBTuner, "random": RandomTuner, "grid": GridTuner}


def make_tuner(name: str, task: Any, seed: int = 0) -> Tuner:
    try:
        return TUNERS[name](task, seed=seed)
    except KeyError:
        raise ValueError(f"unknown tuner {name!r}; choose one of {sorted(TUNERS)}") from None
