"""Transfer learning: tuning records of other workloads pre-train a task's cost model.

A conv of a new model rarely has records of its own, but the records file often holds
hundreds of measured configs of other convs (other shapes, other models, another
machine of the same instruction set). Their configs are scheduled on the new task's
target to read their loop-nest features, their costs become throughputs normalized per
workload (best = 1), and the XGBoost model trains on them before the task's first
batch, which it then picks instead of a random sample (AutoTVM's transfer learning).
Each source workload is one ranking group: only configs of the same workload are
compared with each other.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tecc.autotune.cost_model import normalized_throughputs
from tecc.autotune.features import FeatureCache
from tecc.autotune.records import Record, workload_key

log = logging.getLogger(__name__)

# Per source workload, its best configs and as many random others (the model must see
# bad configs too), and at most this many configs in all per template.
PER_WORKLOAD = 48
PER_TEMPLATE = 384


@dataclass
class TransferData:
    features: np.ndarray  # [n, feature dim]
    throughputs: np.ndarray  # [n], per workload best = 1, failures 0
    groups: list[int]  # rows per source workload, in order


class TransferSource:
    """The records to transfer from, with features computed once per source workload
    (shared by every task of a tuning run that transfers from it)."""

    def __init__(self, records: Iterable[Record], target: Any, seed: int = 0) -> None:
        self.target = target
        self.rng = random.Random(seed)
        self._by_template: dict[str, dict[str, list[Record]]] = {}
        for r in records:
            template = r.workload.get("template")
            if template is None:
                continue
            self._by_template.setdefault(template, {}).setdefault(r.key, []).append(r)
        self._features: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}

    def data_for(self, task: Any, use_loop_features: bool = True) -> TransferData | None:
        """Pre-training data for `task` from the other workloads of its template whose
        features have the task's layout; None when there are none."""
        by_key = self._by_template.get(task.workload.get("template"), {})
        own = workload_key(task.workload)
        sources = {k: rs for k, rs in by_key.items() if k != own}
        if not sources:
            return None
        dim = FeatureCache(task, use_loop_features).dim
        # one share for every task of the template (features are cached per source)
        per_workload = max(2, min(PER_WORKLOAD, PER_TEMPLATE // len(by_key)))
        feats, ys, groups = [], [], []
        for key in sorted(sources):
            got = self._source_features(key, sources[key], per_workload, use_loop_features)
            if got is None or got[0].shape[1] != dim:
                continue
            feats.append(got[0])
            ys.append(got[1])
            groups.append(len(got[1]))
        if not groups:
            return None
        return TransferData(np.concatenate(feats), np.concatenate(ys), groups)

    def _source_features(self, key: str, records: list[Record], limit: int,
                         use_loop_features: bool) -> tuple[np.ndarray, np.ndarray] | None:
        if key in self._features:
            return self._features[key]
        from tecc.schedules.tasks import task_from_workload

        result = None
        try:
            task = task_from_workload(records[0].workload, self.target)
            best: dict[int, float] = {}  # config index -> best cost (inf: failed)
            configs = {}
            for r in records:
                try:
                    config = task.space.from_json(r.config)
                except (KeyError, ValueError, TypeError):
                    continue  # a record of an older space
                configs[config.index] = config
                best[config.index] = min(best.get(config.index, np.inf), r.cost)
            ok = sorted(c for c in best.values() if np.isfinite(c))
            if len(ok) >= 2 and ok[0] < ok[-1]:
                ranked = sorted(best, key=best.__getitem__)
                keep = ranked[: limit // 2]
                rest = ranked[limit // 2:]
                keep += self.rng.sample(rest, min(len(rest), limit - len(keep)))
                chosen = [configs[i] for i in keep]
                throughputs = normalized_throughputs(np.array([best[i] for i in keep]))
                result = (FeatureCache(task, use_loop_features)(chosen), throughputs)
        except Exception as err:  # noqa: BLE001 - a source that does not build is skipped
            log.debug("transfer source %s skipped: %s", key, err)
        self._features[key] = result
        return result
