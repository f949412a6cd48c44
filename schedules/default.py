"""The default (untuned) schedule for a lowered primitive function on a CPU.

Shape of what it does, in order:
1. inline every pure injective block that is not an output into its consumers
   (elementwise chains, broadcasts, reshapes, scalar constants), so that a fused
   epilogue becomes ONE block reading the anchor's result;
2. anchors ("tecc.anchor" annotation from computes.py) get a template: the one
   registered for the anchor kind in schedules/template.py's TEMPLATES (tunable:
   a config space, a fallback config, a config from the caller's chooser; dense /
   matmul / batch_matmul in templates_dense.py, the NCHWc convs in
   templates_conv.py, others in further template modules), else a fixed schedule
   here (_TEMPLATES: the NCHW conv2d, pools): the accumulator in a local buffer, the
   fused epilogue computed under the tile loop;
3. every block still at the root gets parallel outer loops and a vectorized
   inner loop when the extents allow.
Each template runs on a copy of the schedule; if any primitive refuses (ScheduleError),
the copy is dropped and the block keeps the generic schedule: never wrong, maybe slow.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.target import num_cores, vector_lanes
from tecc.schedules.template import ScheduleContext, Template, load_templates
from tvm.s_tir.schedule import Schedule

log = logging.getLogger(__name__)

ANCHOR_ATTR = "tecc.anchor"
PARALLEL_MIN_WORK = 16384  # below this, thread-pool start-up costs more than it saves
DATA_PAR, COMM_REDUCE = 0, 2
CONV_ACC_VECTORS = 0  # accumulator vectors of a conv register tile (0: from the ISA)


# ---------------------------------------------------------------- block queries


def _root_blocks(sch: Schedule) -> list:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def _block_name(sch: Schedule, block) -> str:
    return sch.get(block).name_hint


def _iter_types(sch: Schedule, block) -> list[int]:
    return [int(iv.iter_type) for iv in sch.get(block).iter_vars]


def _is_reduction(sch: Schedule, block) -> bool:
    return any(t != DATA_PAR for t in _iter_types(sch, block))


def _anchor_kind(sch: Schedule, block) -> str | None:
    value = sch.get(block).annotations.get(ANCHOR_ATTR)
    return None if value is None else str(value)


def _extent(sch: Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tvm.tirx.IntImm) else None


def _output_names(sch: Schedule) -> set[str]:
    return {_block_name(sch, b) for b in sch.get_output_blocks(sch.get_sblock("root"))}


def _is_output(sch: Schedule, block, outputs: set[str]) -> bool:
    return _block_name(sch, block) in outputs


def _largest_divisor(n: int, limit: int, pow2: bool = False) -> int:
    """Largest d <= limit dividing n (a power of two when pow2)."""
    for d in range(min(limit, n), 0, -1):
        if n % d == 0 and (not pow2 or d & (d - 1) == 0):
            return d
    return 1


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
    source: str  # "fallback", "exact", "compatible", "given", "generic" (template refused)
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
    if target.kind.name == "cuda":
        from tecc.schedules.gpu_default import gpu_schedule

        return gpu_schedule(sch, target, choose, workloads, applied)
    templates = load_templates()
    lanes = vector_lanes(target)
    cores = num_cores(target)
    _inline_injective(sch)
    if all(_anchor_kind(sch, b) is None and not _is_reduction(sch, b)
           for b in _root_blocks(sch)):
        # A group of injective ops only: the injective template (its fallback config).
        from tecc.schedules.templates_reduce import schedule_injective_group

        trial = sch.copy()
        try:
            schedule_injective_group(trial, target)
            return trial
        except Exception as err:  # noqa: BLE001 - keep the generic schedule
            log.debug("injective template failed, generic schedule: %s", err)
    for block in _root_blocks(sch):
        kind = _anchor_kind(sch, block)
        if kind is None:
            continue
        name = _block_name(sch, block)
        template = templates.get(kind)
        if template is not None:
            sch = _apply_template(sch, name, kind, template, target, lanes, cores, choose,
                                  (workloads or {}).get(name), applied)
            continue
        legacy = _TEMPLATES.get(kind)
        if legacy is None:
            continue
        trial = sch.copy()
        try:
            legacy(trial, trial.get_sblock(name), lanes)
        except Exception as err:  # noqa: BLE001 - any refusal means: keep generic
            log.debug("template %s failed on %s, generic schedule: %s", kind, name, err)
            continue
        sch = trial
    for block in _root_blocks(sch):
        if not _is_scheduled(sch, block):
            _generic(sch, block, lanes)
    return sch


def _apply_template(sch: Schedule, name: str, kind: str, template: Template,
                    target: tvm.target.Target, lanes: int, cores: int,
                    choose: ConfigChooser | None, workload: dict[str, Any] | None,
                    applied: list[AppliedTemplate] | None) -> Schedule:
    """Run `template` on a copy of `sch`: the chosen config, else the fallback, else
    leave the block to the generic schedule."""

    def context(s: Schedule) -> ScheduleContext:
        return ScheduleContext(s, s.get_sblock(name), target, lanes, cores, kind, workload)

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


def _inline_injective(sch: Schedule) -> None:
    """compute_inline spatial, non-output blocks into their consumers; repeat until
    nothing changes (inlining one block can make its producer inlinable)."""
    outputs = _output_names(sch)
    changed = True
    while changed:
        changed = False
        for block in _root_blocks(sch):
            if _is_reduction(sch, block) or _is_output(sch, block, outputs):
                continue
            name = _block_name(sch, block)
            if _keep_materialized(sch, block, name):
                continue
            try:
                sch.compute_inline(block)
                changed = True
            except Exception:
                pass


def padding_producer(sch: Schedule, block):
    """The padding block `block` reads (kept materialized by _inline_injective), or None."""
    pads = [p for p in sch.get_producers(block)
            if not _is_reduction(sch, p) and "pad" in _block_name(sch, p)]
    return pads[0] if pads else None


def _keep_materialized(sch: Schedule, block, name: str) -> bool:
    """Padding read by a conv or pool stays a buffer: inlined, it puts a bounds check
    in the innermost loop of the anchor."""
    if "pad" not in name:
        return False
    return any(_anchor_kind(sch, c) in _PADDED_ANCHORS for c in sch.get_consumers(block))


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
        if _is_reduction(sch, block):
            _generic_reduction(sch, block)
        else:
            _generic_spatial(sch, block, lanes)
    except Exception as err:
        log.debug("generic schedule failed on %s: %s", _block_name(sch, block), err)


def _generic_spatial(sch: Schedule, block, lanes: int) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    exts = [_extent(sch, lp) for lp in loops]
    if any(e is None for e in exts):
        return
    total = math.prod(exts)
    inner = exts[-1]
    vec = _largest_divisor(inner, lanes, pow2=True)
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
        vec = _largest_divisor(total, lanes, pow2=True)
        lo, vi = sch.split(fused, [None, vec]) if vec > 1 else (fused, None)
        outer = [lo]
    top = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if total >= PARALLEL_MIN_WORK and total // max(vec, 1) > 1:
        sch.parallel(top)
    if vi is not None and vec > 1:
        sch.vectorize(vi)


def _generic_reduction(sch: Schedule, block) -> None:
    types = _iter_types(sch, block)
    loops = sch.get_loops(block)
    if len(loops) != len(types):
        return
    spatial = [lp for lp, t in zip(loops, types, strict=True) if t == DATA_PAR]
    if not spatial or loops[: len(spatial)] != spatial:
        return
    exts = [_extent(sch, lp) for lp in loops]
    if any(e is None for e in exts):
        return
    work = math.prod(exts)
    outer = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    if work >= PARALLEL_MIN_WORK and math.prod(exts[: len(spatial)]) > 1:
        sch.parallel(outer)


# ---------------------------------------------------------------- templates


def _epilogue_target(sch: Schedule, anchor, write_back):
    """The block to compute under the anchor's tile: the write-back block, or (when
    the anchor's result feeds an epilogue) the write-back inlined into the epilogue."""
    consumers = list(sch.get_consumers(write_back))
    if len(consumers) == 1 and not _is_reduction(sch, consumers[0]):
        try:
            _require_identity_read(sch, consumers[0], sch.get(write_back).writes[0].source)
        except ValueError:
            return write_back  # reshaping epilogue: stays at the root, generic schedule
        sch.compute_inline(write_back)
        return consumers[0]
    return write_back


def _tile_epilogue_parallel(sch: Schedule, anchor, write_back, at, outer: Sequence,
                            work: int):
    """The tail every tiled anchor nest shares: the epilogue (or write-back) computed
    under loop `at` on the finished tile, the `outer` loops fused and made parallel when
    there is enough work. Returns the epilogue block and the fused outer loop."""
    target = _epilogue_target(sch, anchor, write_back)
    sch.reverse_compute_at(target, at, preserve_unit_loops=True)
    top = sch.fuse(*outer)
    if work >= PARALLEL_MIN_WORK:
        sch.parallel(top)
    return target, top


def _require_identity_read(sch: Schedule, consumer, buffer) -> None:
    """reverse_compute_at relaxes the consumer's region to a bounding box; unless the
    consumer reads the anchor's result elementwise (same index, same shape) that box
    can cover elements other tiles have not produced yet. Refuse such epilogues
    (the template then falls back) rather than risk a wrong result."""
    block = sch.get(consumer)
    ivars = [iv.var for iv in block.iter_vars]
    for region in block.reads:
        if not region.source.same_as(buffer):
            continue
        if len(region.region) != len(ivars) or [int(d) for d in region.source.shape] != [
                int(iv.dom.extent) for iv in block.iter_vars]:
            raise ValueError("epilogue is not elementwise in the anchor's result")
        for rng, var in zip(region.region, ivars, strict=True):
            if not (rng.min.same_as(var) and int(rng.extent) == 1):
                raise ValueError("epilogue is not elementwise in the anchor's result")


def _vectorize_tail(sch: Schedule, block, lanes: int) -> None:
    """Vectorize the last of `block`'s loops (under the tile) when its extent allows."""
    loops = sch.get_loops(block)
    last = loops[-1]
    ext = _extent(sch, last)
    if ext is None or ext < 2:
        return
    vec = _largest_divisor(ext, lanes, pow2=True)
    if vec == ext or 4 <= ext <= 2 * lanes:  # short odd rows: one vector + LLVM's tail
        sch.vectorize(last)
    elif vec > 1:
        _, vi = sch.split(last, [None, vec])
        sch.vectorize(vi)


def _pack_map(block, nb: int):
    """Index map packing operand B of a dense-like block to [..., N/nb, K, nb]:
    B[..., n, k] for dense and matmul_nt, B[..., k, n] for matmul."""
    kind = str(block.annotations[ANCHOR_ATTR])
    n_major = kind == "dense" or kind.endswith("_nt")

    def index_map(*idx):
        *batch, a, b = idx
        nn, kk = (a, b) if n_major else (b, a)
        return (*batch, nn // nb, kk, nn % nb)

    return index_map


def _pack_schedule(sch: Schedule, block, lanes: int) -> None:
    loops = sch.get_loops(block)
    ext = math.prod(_extent(sch, lp) or 1 for lp in loops)
    if ext >= PARALLEL_MIN_WORK:
        sch.parallel(loops[0])


def _conv2d(sch: Schedule, block, lanes: int) -> None:
    """NCHW conv: parallel(n, oc_o, oh) / ow_o / ic, kh, kw / oc_i (unrolled) /
    ow_i (vectorized); accumulator local, epilogue under ow_o."""
    loops = sch.get_loops(block)
    if len(loops) != 7:
        raise ValueError("conv2d template expects n, oc, oh, ow, ic, kh, kw")
    n, oc, oh, ow, ic, kh, kw = loops
    exts = [_extent(sch, lp) for lp in loops]
    oc_ext, ow_ext = exts[1], exts[3]
    # One vector of output columns (7 of 14, 8 of 56 on AVX2) times 8 output channels:
    # 8 accumulators; wider column tiles measured 2-5x slower (register spills).
    owb = _largest_divisor(ow_ext, lanes)
    ocb = _largest_divisor(oc_ext, 8)
    acc = sch.cache_write(block, 0, "local")
    oco, oci = sch.split(oc, [None, ocb])
    owo, owi = sch.split(ow, [None, owb])
    sch.reorder(n, oco, oh, owo, ic, kh, kw, oci, owi)
    target, _ = _tile_epilogue_parallel(sch, block, acc, owo, [n, oco, oh], math.prod(exts))
    sch.unroll(oci)
    if owb >= 4:  # odd widths (7, 14) become LLVM vectors with a short tail
        sch.vectorize(owi)
    init = sch.decompose_reduction(block, ic)
    _vectorize_tail(sch, target, lanes)
    _vectorize_tail(sch, init, lanes)


def _acc_budget(lanes: int, vecs: int) -> int:
    """Accumulator vectors of a register tile: the vector registers (16 with AVX2,
    32 with AVX-512) less the weight vectors and one broadcast input value."""
    if CONV_ACC_VECTORS:
        return max(vecs, CONV_ACC_VECTORS)
    registers = 32 if lanes >= 16 else 16
    return max(vecs, min(28, registers - vecs - 1))


_PADDED_ANCHORS = ("conv2d", "pool", "conv2d_NCHWc", "depthwise_conv2d_NCHWc")
# Fixed schedules for anchor kinds no registered template serves (yet): the NCHW
# conv (when the layout pass is off) and the pools (until a pool template registers).
_TEMPLATES = {
    "conv2d": _conv2d,  # plain NCHW (layout pass off); pools have a registered template
}
