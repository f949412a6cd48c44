"""The default (untuned) schedule for a lowered primitive function on a CPU.

Shape of what it does, in order:
1. inline every pure injective block that is not an output into its consumers
   (blocks.inline_injective), so that a fused epilogue becomes ONE block reading the
   anchor's result;
2. anchors ("tecc.anchor" annotation from computes.py) get the template registered
   for the target's kind and the anchor kind (schedules/template.py): a config
   space, a fallback config, a config from the caller's chooser (dense / matmul /
   batch_matmul in templates_dense.py, the convs in templates_conv.py, pools and
   reductions in templates_reduce.py); a group of injective ops only gets the
   "injective" template (templates_injective.py) on its last output block;
3. every block still at the root gets parallel outer loops and a vectorized
   inner loop when the extents allow.
Each template runs on a copy of the schedule; if any primitive refuses (ScheduleError),
the copy is dropped and the block keeps the generic schedule: never wrong, maybe slow.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tvm
from tecc.schedules.blocks import (
    DATA_PAR,
    PARALLEL_MIN_WORK,
    anchor_kind,
    block_name,
    injective_anchor,
    inline_injective,
    is_reduction,
    iter_types,
    largest_divisor,
    loop_extent,
    root_blocks,
    shared_exp,
)
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import INJECTIVE_KIND, ScheduleContext, Template, templates_for
from tvm.s_tir.schedule import Schedule, ScheduleError

from tecc.target import TargetInfo, target_info

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- entry point


@dataclass
class AppliedTemplate:
    """What a template did to one anchor block: for cm.tasks() and the tuner."""

    block: str
    kind: str
    template: str
    workload: dict[str, Any] | None
    space_size: int
    config: dict[str, Any] | None  # the config's JSON (None: the template failed)
    # "fallback", "exact", "compatible", "retargeted" (a tuning record's, see
    # autotune.records), "given", "generic" (template refused)
    source: str
    error: str | None = None


# (ctx, template, space) -> (config or None for the fallback, its source)
ConfigChooser = Callable[[ScheduleContext, Template, ConfigSpace], "tuple[Config | None, str]"]


def default_schedule(sch: Schedule, target: tvm.target.Target,
                     choose: ConfigChooser | None = None,
                     workloads: dict[str, dict[str, Any]] | None = None,
                     applied: list[AppliedTemplate] | None = None) -> Schedule:
    """Schedule every block of `sch` for `target`; returns the (possibly new) Schedule.

    Anchors whose kind has a registered template (schedules/template.py) get it, with
    the config `choose` gives (None: the template's fallback); `workloads` maps an
    anchor block's name to its workload dict; `applied` collects what was done."""
    info = target_info(target)
    if info.is_gpu:
        from tecc.schedules.gpu_default import gpu_schedule

        return gpu_schedule(sch, info.tvm_target, choose, workloads, applied)
    templates = templates_for(info.kind)
    inline_injective(sch, keep=shared_exp)
    group = injective_anchor(sch)
    if group is not None and INJECTIVE_KIND in templates:
        name = block_name(sch, group)
        scheduled = _apply_template(sch, name, INJECTIVE_KIND, templates[INJECTIVE_KIND],
                                    info, choose, (workloads or {}).get(name), applied)
        if scheduled is not sch:
            return scheduled
    for name in [block_name(sch, b) for b in root_blocks(sch)]:
        try:
            block = sch.get_sblock(name)
        except (ScheduleError, ValueError):  # inlined by an earlier group's template
            continue
        kind = anchor_kind(sch, block)
        template = None if kind is None else templates.get(kind)
        if template is None:
            continue
        sch = _apply_template(sch, name, kind, template, info, choose,
                              (workloads or {}).get(name), applied)
    if info.kind != "llvm":
        return sch
    for block in root_blocks(sch):
        if not _is_scheduled(sch, block):
            _generic(sch, block, info.vector_lanes("float32"))
    return sch


def _apply_template(sch: Schedule, name: str, kind: str, template: Template,
                    info: TargetInfo, choose: ConfigChooser | None,
                    workload: dict[str, Any] | None,
                    applied: list[AppliedTemplate] | None) -> Schedule:
    """Run `template` on a copy of `sch`: the chosen config, else the fallback, else
    leave the block to the generic schedule (`sch` itself is returned)."""

    def context(s: Schedule) -> ScheduleContext:
        return ScheduleContext(s, s.get_sblock(name), info, kind, workload)

    def note(space_size: int, config: Config | None, source: str, error: str | None) -> None:
        if applied is not None:
            applied.append(AppliedTemplate(
                name, kind, template.name, workload, space_size,
                None if config is None else config.to_json(), source, error))

    try:
        ctx = context(sch.copy())
        space = template.define_space(ctx)
        fallback = template.fallback(space, ctx)
    except Exception as err:  # noqa: BLE001
        log.warning("template %s cannot schedule %s: %s", template.name, name, err)
        note(0, None, "generic", f"{type(err).__name__}: {err}")
        return sch
    attempts: list[tuple[Config, str]] = []
    if choose is not None:
        try:
            config, source = choose(ctx, template, space)
        except Exception as err:  # noqa: BLE001 - a record that does not fit this space
            log.warning("config for %s (%s) unusable, fallback: %s", name, template.name, err)
            config, source = None, "fallback"
        if config is not None:
            if template.accepts(ctx, config):
                attempts.append((config, source))
            else:
                log.info("config for %s does not fit the kernel's layout; fallback", name)
    attempts.append((fallback, "fallback"))
    error = None
    for config, source in attempts:
        trial = sch.copy()
        try:
            template.apply(context(trial), config)
        except Exception as err:  # noqa: BLE001 - a refusal: next attempt
            error = f"{type(err).__name__}: {err}"
            log.warning("template %s failed on %s with %s config %s: %s", template.name,
                        name, source, config.to_json(), err)
            continue
        note(len(space), config, source, None)
        return trial
    note(len(space), None, "generic", error)
    return sch


def _is_scheduled(sch: Schedule, block) -> bool:
    """A block placed by a template: it shares its outermost loop with other blocks
    (anchor + init + epilogue) or a loop of it is already annotated."""
    loops = sch.get_loops(block)
    if not loops:
        return False
    if len(sch.get_child_blocks(loops[0])) > 1:
        return True
    return any(int(sch.get(lp).kind) != 0 for lp in loops)  # 0: serial


# ---------------------------------------------------------------- generic


def _generic(sch: Schedule, block, lanes: int) -> None:
    try:
        if is_reduction(sch, block):
            _generic_reduction(sch, block)
        else:
            _generic_spatial(sch, block, lanes)
    except Exception as err:
        log.debug("generic schedule failed on %s: %s", block_name(sch, block), err)


def _generic_spatial(sch: Schedule, block, lanes: int) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    exts = [loop_extent(sch, lp) for lp in loops]
    if any(e is None for e in exts):
        return
    total = math.prod(exts)
    inner = exts[-1]
    vec = largest_divisor(inner, lanes, pow2=True)
    if inner < 4 and len(loops) >= 3:
        # a short innermost axis (3 channels of an RGB block): vectors across the
        # fused index would need a division per element; keep the rows whole
        *outer, row, last = loops
        top = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        if total >= PARALLEL_MIN_WORK:
            sch.parallel(top)
        sch.unroll(last)
        return
    if vec >= 4 or len(loops) == 1:
        # vectorize the innermost axis: contiguous for the common row-major case
        *outer, last = loops
        lo, vi = sch.split(last, [None, vec]) if vec > 1 else (last, None)
        outer = [*outer, lo]
    else:
        fused = sch.fuse(*loops)
        vec = largest_divisor(total, lanes, pow2=True)
        lo, vi = sch.split(fused, [None, vec]) if vec > 1 else (fused, None)
        outer = [lo]
    top = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if total >= PARALLEL_MIN_WORK and total // max(vec, 1) > 1:
        sch.parallel(top)
    if vi is not None and vec > 1:
        sch.vectorize(vi)


def _generic_reduction(sch: Schedule, block) -> None:
    types = iter_types(sch, block)
    loops = sch.get_loops(block)
    if len(loops) != len(types):
        return
    spatial = [lp for lp, t in zip(loops, types, strict=True) if t == DATA_PAR]
    if not spatial or loops[: len(spatial)] != spatial:
        return
    exts = [loop_extent(sch, lp) for lp in loops]
    if any(e is None for e in exts):
        return
    work = math.prod(exts)
    outer = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    if work >= PARALLEL_MIN_WORK and math.prod(exts[: len(spatial)]) > 1:
        sch.parallel(outer)
