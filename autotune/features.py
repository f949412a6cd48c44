"""Features of a candidate for the cost model: the knob values of its config, then
either the scheduled loop nest (TVM's per-store features: loop extents and kinds,
vectorization, parallelism, arithmetic counts, buffer accesses with strides and
touched bytes, summarized over the stores of the kernel; CPU templates) or, for a
template that has them (`Template.kernel_features`: the GPU matmul rules), features
computed from the workload and the config without scheduling: grid and block sizes,
shared memory, registers, occupancy, waves, bytes moved (scheduling a GPU config takes
~50 ms, and annealing scores hundreds per batch).

Features are cached per (task, config index): simulated annealing asks for the same
configs again and again.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@functools.cache
def _per_store_extractor() -> Any:
    from tvm.s_tir import meta_schedule as ms

    return ms.feature_extractor.PerStoreFeature()


def _tune_context(target: Any) -> Any:
    """A bare TuneContext holding the target, one per target (by its text: tvm
    Targets hash by identity)."""
    return _tune_context_of(str(target))


@functools.cache
def _tune_context_of(target_text: str) -> Any:
    """Built through the FFI constructor: TuneContext.__init__ first imports every
    tensor intrinsic TVM ships (CUDA, ROCm, Hexagon, ...), which takes about a
    minute per process and which the per-store features do not use."""
    import tvm
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.logging import get_logger, get_logging_func
    from tvm.s_tir.meta_schedule.tune_context import TuneContext

    context = TuneContext.__new__(TuneContext)
    context.__init_handle_by_constructor__(
        _ffi_api.TuneContext, None, tvm.target.Target(target_text), None, None, "main", 1,
        -1, get_logging_func(get_logger(__name__)))
    return context


LOOP_FEATURES = 164 * 3  # mean, max and sum over the stores of PerStoreFeature's 164


def loop_nest_features(primfunc: Any, target: Any) -> np.ndarray:
    """Per-store features of a scheduled PrimFunc, summarized to a fixed length."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    mod = tvm.IRModule({"main": primfunc})
    context = _tune_context(target)
    args = [ms.arg_info.TensorInfo(str(p.dtype), [int(d) for d in p.shape])
            for p in primfunc.params] if hasattr(primfunc.params[0], "shape") else []
    candidate = ms.MeasureCandidate(Schedule(mod), args)
    (per_store,) = _per_store_extractor().extract_from(context, [candidate])
    stores = per_store.numpy()
    if stores.size == 0:
        return np.zeros(LOOP_FEATURES, dtype=np.float32)
    return np.concatenate([stores.mean(0), stores.max(0), stores.sum(0)]).astype(np.float32)


class FeatureCache:
    """Features of the configs of one task: loop-nest features plus knob features."""

    def __init__(self, task: Any, use_loop_features: bool = True) -> None:
        self.task = task
        self.use_loop_features = use_loop_features
        self._cache: dict[int, np.ndarray] = {}
        self._target = None
        template = getattr(task, "template_obj", None)
        self._kernel_features = getattr(template, "kernel_features", None)
        self._info = None

    def __call__(self, configs: list[Any]) -> np.ndarray:
        rows = [self._one(c) for c in configs]
        return np.stack(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)

    @property
    def dim(self) -> int:
        first = self.task.space.get(0)
        knobs = len(self.task.space.features(first))
        if self._kernel_features is not None:
            return knobs + len(self._kernel(first))
        return knobs + (LOOP_FEATURES if self.use_loop_features else 0)

    def _kernel(self, config: Any) -> np.ndarray:
        from tecc.target import target_info

        if self._info is None:
            self._info = target_info(self.task.target)
        return np.asarray(self._kernel_features(self.task.workload, config, self._info),
                          dtype=np.float32)

    def _one(self, config: Any) -> np.ndarray:
        cached = self._cache.get(config.index)
        if cached is not None:
            return cached
        knobs = np.asarray(self.task.space.features(config), dtype=np.float32)
        parts = [knobs]
        if self._kernel_features is not None:
            parts.append(self._kernel(config))
        elif self.use_loop_features:
            parts.append(self._loop(config))
        row = np.concatenate(parts)
        self._cache[config.index] = row
        return row

    def _loop(self, config: Any) -> np.ndarray:
        import tvm

        if self._target is None:
            target = self.task.target
            self._target = target if isinstance(target, tvm.target.Target) else \
                tvm.target.Target(target)
        try:
            return loop_nest_features(self.task.build_primfunc(config), self._target)
        except Exception as err:  # a config that does not schedule: features of nothing
            log.debug("features of config %d failed: %s", config.index, err)
            return np.zeros(LOOP_FEATURES, dtype=np.float32)
