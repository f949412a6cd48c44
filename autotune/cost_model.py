"""The XGBoost cost model: predicts which configs of a task run fastest.

Trained on (features, throughput) of measured configs, throughput normalized per task
(best = 1, failures = 0); a ranking objective by default, since the search only needs
the order. Records of other workloads or targets can pre-train it (transfer).
"""

from __future__ import annotations

import numpy as np
import xgboost as xgb


class XGBCostModel:
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
        """Data from other tasks (transfer learning), `groups` rows per task (one group
        if None): kept and mixed into each fit, and fitted alone right away so that
        the first batch already follows it."""
        if len(features):
            self._base = (features, throughputs, list(groups or [len(features)]))
            self.fit(np.zeros((0, features.shape[1]), dtype=features.dtype), np.zeros(0))

    def fit(self, features: np.ndarray, throughputs: np.ndarray) -> None:
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
