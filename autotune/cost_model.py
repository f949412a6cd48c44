"""Cost models: predict which configs of a task run fastest, from their features.

`CostModel` is the interface the tuner and the search strategies use; `XGBCostModel`
(AutoTVM's recipe) is its implementation. Models are trained on the measured costs of
one task; `pretrain` adds data of other workloads (transfer learning), as throughputs
normalized per workload, since only costs of one workload compare with each other.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import xgboost as xgb


def normalized_throughputs(costs: np.ndarray) -> np.ndarray:
    """Costs (seconds, inf for a failed candidate) as throughputs relative to the best:
    the best is 1, failures 0. All zero when nothing succeeded."""
    costs = np.asarray(costs, dtype=np.float64)
    finite = costs[np.isfinite(costs)]
    if len(finite) == 0:
        return np.zeros(len(costs))
    return np.where(np.isfinite(costs), finite.min() / costs, 0.0)


@runtime_checkable
class CostModel(Protocol):
    """Scores configs from their features (higher: faster); only the order counts."""

    @property
    def trained(self) -> bool:
        """False until a fit or pretrain had data to learn from (predict is then 0)."""
        ...

    def fit(self, features: np.ndarray, costs: np.ndarray) -> None:
        """Train on the task's measured configs: features [n, dim], costs [n] in seconds
        (inf: failed). Each call passes everything measured so far."""
        ...

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Scores [n] of configs' features [n, dim]."""
        ...

    def pretrain(self, features: np.ndarray, throughputs: np.ndarray,
                 groups: list[int] | None = None) -> None:
        """Transfer learning: data of other workloads, `groups` rows per workload (one
        group if None), throughputs normalized per workload (best 1, failed 0). Kept
        and mixed into every later fit; the model is trained on it right away, so the
        first batch already follows it."""
        ...


class XGBCostModel:
    """Gradient-boosted trees; a ranking objective by default, since the search only
    needs the order."""

    def __init__(self, loss: str = "rank", num_rounds: int = 80, seed: int = 0) -> None:
        if loss not in ("rank", "reg"):
            raise ValueError(f"loss must be 'rank' or 'reg', not {loss!r}")
        self.loss = loss
        self.num_rounds = num_rounds
        self.params = {
            "max_depth": 6,
            "gamma": 0.0001,
            "min_child_weight": 1,
            "subsample": 1.0,
            "eta": 0.3,
            "lambda": 1.0,
            "alpha": 0.0,
            "objective": "rank:pairwise" if loss == "rank" else "reg:squarederror",
            "seed": seed,
            "nthread": 1,
            "verbosity": 0,
        }
        self._booster: xgb.Booster | None = None
        self._base: tuple[np.ndarray, np.ndarray, list[int]] | None = None

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def pretrain(self, features: np.ndarray, throughputs: np.ndarray,
                 groups: list[int] | None = None) -> None:
        if len(features):
            self._base = (features, throughputs, list(groups or [len(features)]))
            self._train(np.zeros((0, features.shape[1]), dtype=features.dtype), np.zeros(0))

    def fit(self, features: np.ndarray, costs: np.ndarray) -> None:
        costs = np.asarray(costs, dtype=np.float64)
        if not np.isfinite(costs).any():
            return  # nothing succeeded: no order to learn
        self._train(features, normalized_throughputs(costs))

    def _train(self, features: np.ndarray, throughputs: np.ndarray) -> None:
        x, y = features, throughputs
        groups = [len(x)] if len(x) else []
        if self._base is not None and self._base[0].shape[1] == x.shape[1]:
            x = np.concatenate([self._base[0], x])
            y = np.concatenate([self._base[1], y])
            groups = self._base[2] + groups
        if len(x) < 2 or np.ptp(y) == 0:
            return  # nothing to rank yet
        dtrain = xgb.DMatrix(x, label=y)
        if self.loss == "rank":
            # pairs only within a task: throughputs of two workloads do not compare
            dtrain.set_group(groups)
        self._booster = xgb.train(self.params, dtrain, num_boost_round=self.num_rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self._booster is None:
            return np.zeros(len(features))
        return self._booster.predict(xgb.DMatrix(features))
