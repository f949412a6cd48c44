"""Search strategies: which configs of a task to measure next.

A `SearchStrategy` proposes the next batch from the space, the history of what was
measured, and the tuner's cost model (as a scoring function of configs, None while the
model is untrained or the tuner has none). A proposal never repeats a measured config.
- RandomSearch: uniform samples of the space.
- GridSearch: the space in index order.
- AnnealingSearch: simulated annealing on the model's scores; each batch is the
  model's top predictions with an epsilon of random picks, filtered for diversity
  (AutoTVM's recipe). Random until the model is trained.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
from tecc.schedules.space import Config, ConfigSpace

if TYPE_CHECKING:
    from tecc.autotune.tuner import TuneHistory

# A cost model's scores of configs (higher: faster).
Scorer = Callable[[Sequence[Config]], np.ndarray]


@runtime_checkable
class SearchStrategy(Protocol):
    def propose(self, n: int, space: ConfigSpace, history: TuneHistory,
                score: Scorer | None) -> list[Config]:
        """Up to `n` distinct configs not in history.visited (fewer when the space runs
        out). `score`: the tuner's cost model, None while it has no trained one."""
        ...


def sample_unvisited(space: ConfigSpace, visited: set[int], n: int,
                     rng: random.Random) -> list[Config]:
    """Up to `n` distinct random configs not in `visited`."""
    out: list[Config] = []
    total = len(space)
    tries = 0
    while len(out) < n and len(visited) + len(out) < total and tries < 50 * n + 100:
        tries += 1
        index = space.sample_index(rng)
        if index not in visited and all(index != c.index for c in out):
            out.append(space.get(index))
    if len(out) < n and total <= 100_000:  # a nearly exhausted small space
        rest = [i for i in range(total) if space.canonical_index(i) == i and i not in visited
                and all(i != c.index for c in out)]
        out += [space.get(i) for i in rest[: n - len(out)]]
    return out


class RandomSearch:
    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def propose(self, n: int, space: ConfigSpace, history: TuneHistory,
                score: Scorer | None) -> list[Config]:
        return sample_unvisited(space, history.visited, n, self.rng)


class GridSearch:
    def __init__(self) -> None:
        self._next = 0

    def propose(self, n: int, space: ConfigSpace, history: TuneHistory,
                score: Scorer | None) -> list[Config]:
        out: list[Config] = []
        while len(out) < n and self._next < len(space):
            if self._next not in history.visited and \
                    space.canonical_index(self._next) == self._next:
                out.append(space.get(self._next))
            self._next += 1
        return out


class AnnealingSearch:
    """Model-guided search. Loop-nest features cost ~10-40 ms a config (the schedule is
    built to read them), so annealing is kept to 32 chains x 16 steps a round (a few
    seconds)."""

    def __init__(self, seed: int = 0, epsilon: float = 0.1, chains: int = 32,
                 steps: int = 16, diversity: float = 0.25) -> None:
        self.rng = random.Random(seed)
        self.epsilon = epsilon
        self.chains = chains
        self.steps = steps
        self.diversity = diversity

    def propose(self, n: int, space: ConfigSpace, history: TuneHistory,
                score: Scorer | None) -> list[Config]:
        if score is None:
            return sample_unvisited(space, history.visited, n, self.rng)
        n_random = max(1, int(round(n * self.epsilon)))
        picks = self._anneal(n - n_random, space, history, score)
        taken = {c.index for c in picks}
        picks += [c for c in sample_unvisited(space, history.visited, n_random + 2, self.rng)
                  if c.index not in taken]
        return picks[:n]

    def _anneal(self, n: int, space: ConfigSpace, history: TuneHistory,
                score: Scorer) -> list[Config]:
        """Simulated annealing on the model's scores; the best unvisited configs seen,
        at most `diversity` of them sharing a knob value set with another."""
        if n <= 0:
            return []
        measured = [c for c, cost in sorted(zip(history.configs, history.costs, strict=True),
                                            key=lambda p: p[1]) if math.isfinite(cost)]
        starts = measured[: self.chains // 2]
        starts += sample_unvisited(space, history.visited, self.chains - len(starts), self.rng)
        points = list(starts)
        scores = score(points)
        seen: dict[int, tuple[float, Config]] = {
            c.index: (float(s), c) for c, s in zip(points, scores, strict=True)}
        for step in range(self.steps):
            temperature = max(1e-3, 1.0 - step / self.steps)
            proposals = [space.random_neighbour(p, self.rng) for p in points]
            new_scores = score(proposals)
            scale = max(float(np.ptp(scores)), 1e-9)
            for i, (prop, s_new) in enumerate(zip(proposals, new_scores, strict=True)):
                seen.setdefault(prop.index, (float(s_new), prop))
                accept = s_new >= scores[i] or self.rng.random() < math.exp(
                    (s_new - scores[i]) / (scale * temperature))
                if accept:
                    points[i], scores[i] = prop, s_new
        ranked = sorted((v for k, v in seen.items() if k not in history.visited),
                        key=lambda v: -v[0])
        return self._diverse([c for _, c in ranked], n, space)

    def _diverse(self, ranked: list[Config], n: int, space: ConfigSpace) -> list[Config]:
        """Keep the order but skip configs whose knob values mostly repeat those of
        configs already picked, so one batch explores more than one corner."""
        picked: list[Config] = []
        limit = max(1, int(len(space.knobs) * (1 - self.diversity)))
        for c in ranked:
            if len(picked) >= n:
                break
            same = max((sum(c[k] == p[k] for k in c) for p in picked), default=0)
            if same <= limit or len(space.knobs) <= 1:
                picked.append(c)
        for c in ranked:  # fill up if the filter was too strict
            if len(picked) >= n:
                break
            if c not in picked:
                picked.append(c)
        return picked
