"""The default (untuned) schedule of a lowered primitive function for CUDA.

In order:
1. anchors ("tecc.anchor") with a template registered for target kind "cuda"
   (schedules/template.py; the GPU templates live in schedules/gpu_templates.py) get
   it, on a copy of the schedule, with the chosen config or the template's fallback;
   the template schedules the whole group (anchor, fused epilogue, padding); a
   group of injective ops only gets the injective template (gpu_injective.py);
2. a group no template scheduled gets TVM's generic GPU rules (dlight: Matmul, GEMV,
   reductions, the fallback for everything spatial);
3. any block still not bound to blocks and threads gets a plain binding here (its
   spatial loops fused over blockIdx.x / threadIdx.x, reductions serial per thread):
   never wrong, maybe slow.
`check_bound(prim)` then refuses any block left outside a thread binding: an unbound
nest would run its loops on one thread at best, so it is an error, not a fallback.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import tvm
from tecc.schedules.blocks import (
    anchor_kind,
    block_name,
    injective_anchor,
    inline_injective,
    is_reduction,
    output_names,
    root_blocks,
)
from tecc.schedules.template import INJECTIVE_KIND, ScheduleContext, templates_for
from tvm.s_tir.schedule import Schedule

from tecc.target import target_info

log = logging.getLogger(__name__)

CUDA = "cuda"
THREAD_TAGS = ("blockIdx.", "threadIdx.", "vthread")
DEFAULT_THREADS = 256  # threads of a block in the plain binding
DATA_PAR = 0


class UnboundKernelError(RuntimeError):
    """A GPU kernel with a block outside every blockIdx / threadIdx binding."""


def gpu_schedule(sch: Schedule, target: tvm.target.Target, choose=None,
                 workloads: dict | None = None, applied: list | None = None) -> Schedule:
    """Schedule every block of `sch` for a CUDA `target` (see the module docstring)."""
    target = with_cuda_limits(target)

    templates = templates_for(CUDA)
    anchors = [(sch.get(b).name_hint, anchor_kind(sch, b)) for b in root_blocks(sch)]
    anchors = [(name, kind) for name, kind in anchors if kind is not None]
    result = None
    group = injective_anchor(sch)  # None where the group has an anchor
    if group is not None and INJECTIVE_KIND in templates:
        name = block_name(sch, group)
        result = apply_gpu_template(sch, name, INJECTIVE_KIND, templates[INJECTIVE_KIND],
                                    target, choose, (workloads or {}).get(name), applied)
    for name, kind in anchors:
        template = templates.get(kind)
        if template is not None:
            result = apply_gpu_template(sch, name, kind, template, target, choose,
                                        (workloads or {}).get(name), applied)
            if result is not None:
                break  # one anchor's template schedules the whole group
    if result is None:
        kinds = {kind for _, kind in anchors}
        if kinds & DIRECT_KINDS:
            # convs dlight cannot see as a GEMM (depthwise, grouped) and pools: one
            # output element per thread. dlight's reduction rules mis-index some of
            # these groups (a grouped 1x1 conv at 7x7 came out wrong).
            result = _dlight(sch, target, matmul_only=True) if "conv2d" in kinds else None
            if result is None:
                result = direct_schedule(sch)
        else:
            result = _dlight(sch, target) or sch
    bind_unbound(result, target_info(target).max_threads_per_block or 1024)
    return result


def with_cuda_limits(target: tvm.target.Target) -> tvm.target.Target:
    """`target` with the per-block limits dlight reads (a target spelled with its arch
    only gets those of the arch from tecc.target)."""
    if target.attrs.get("max_shared_memory_per_block") is not None:
        return target
    from tecc.target import resolve_target

    return resolve_target(f"cuda:{target.attrs.get('arch') or 'sm_90'}")


def apply_gpu_template(sch: Schedule, name: str, kind: str, template, target,
                       choose, workload: dict | None, applied: list | None
                       ) -> Schedule | None:
    """The schedule `template` makes of the group (the chosen config, else its
    fallback), or None when it refuses; `applied` notes what was used."""
    from tecc.schedules.default import AppliedTemplate

    info = target_info(target)

    def context(s: Schedule) -> ScheduleContext:
        return ScheduleContext(s, s.get_sblock(name), info, kind, workload)

    def note(size: int, config, source: str, error: str | None) -> None:
        if applied is not None:
            applied.append(AppliedTemplate(name, kind, template.name, workload, size,
                                           None if config is None else config.to_json(),
                                           source, error))

    try:
        ctx = context(sch.copy())
        space = template.define_space(ctx)
        attempts = [(template.fallback(space, ctx), "fallback")]
    except Exception as err:  # noqa: BLE001 - the template does not fit: generic rules
        log.info("GPU template %s cannot schedule %s: %s", template.name, name, err)
        note(0, None, "generic", f"{type(err).__name__}: {err}")
        return None
    if choose is not None:
        try:
            config, source = choose(ctx, template, space)
            if config is not None:
                attempts.insert(0, (config, source))
        except Exception as err:  # noqa: BLE001 - a record that does not fit this space
            log.warning("config for %s (%s) unusable, fallback: %s", name, template.name, err)
    error = None
    for config, source in attempts:
        try:
            result = template.apply(context(sch.copy()), config)
        except Exception as err:  # noqa: BLE001 - a refusal: next attempt
            error = f"{type(err).__name__}: {err}"
            log.info("GPU template %s refused %s config %s: %s", template.name, source,
                     config.to_json(), err)
            continue
        note(len(space), config, source, error)  # error: why an earlier attempt was refused
        return result
    note(len(space), None, "generic", error)
    return None


DIRECT_KINDS = frozenset({"conv2d", "pool"})


def direct_schedule(sch: Schedule, threads: int = DEFAULT_THREADS) -> Schedule:
    """One output element per thread: the group's spatial producers (padding, the
    epilogue's operands) inlined, its reductions (the anchor) computed in registers
    under the output's thread loop. Memory-bound anchors (depthwise convs, pools)
    need no more; blocks it cannot place stay for the plain binding."""

    trial = sch.copy()
    inline_injective(trial)
    outputs = output_names(trial)
    for block in root_blocks(trial):
        if not is_reduction(trial, block) and trial.get(block).name_hint not in outputs:
            try:
                trial.compute_inline(block)
            except Exception:  # noqa: BLE001 - stays a root block, bound on its own
                pass
    out_blocks = [b for b in root_blocks(trial) if trial.get(b).name_hint in outputs]
    if len(out_blocks) != 1:
        return sch
    out = out_blocks[0]
    if is_reduction(trial, out):
        _bind_plain(trial, out, threads)
        return trial
    loops = trial.get_loops(out)
    if not loops:
        return sch
    fused = trial.fuse(*loops) if len(loops) > 1 else loops[0]
    total = int(trial.get(fused).extent)
    bx, tx = trial.split(fused, [None, min(threads, total)])
    trial.bind(bx, "blockIdx.x")
    trial.bind(tx, "threadIdx.x")
    for producer in trial.get_producers(out):
        if is_reduction(trial, producer):
            try:
                trial.compute_at(producer, tx, preserve_unit_loops=True)
                trial.set_scope(producer, 0, "local")
            except Exception as err:  # noqa: BLE001
                log.debug("direct schedule cannot place %s: %s", trial.get(producer).name_hint,
                          err)
                return sch
    return trial


def _dlight(sch: Schedule, target: tvm.target.Target, matmul_only: bool = False
            ) -> Schedule | None:
    """TVM's generic GPU rules (the first that applies), or None."""
    import tvm.s_tir.dlight as dl

    rules = (dl.gpu.Matmul(),) if matmul_only else (
        dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
        dl.gpu.Fallback())
    func = sch.mod["main"]
    with target:
        for rule in rules:
            try:
                result = rule.apply(func, target, False)
            except Exception as err:  # noqa: BLE001 - a rule that breaks: try the next
                log.debug("dlight rule %s failed: %s", type(rule).__name__, err)
                continue
            if result is None:
                continue
            if isinstance(result, list):
                result = result[0]
            return result
    return None


# ---------------------------------------------------------------- binding checks


def _loop_tags(sch: Schedule, block) -> list[str]:
    tags = []
    for lp in sch.get_loops(block):
        loop = sch.get(lp)
        if loop.thread_binding is not None:
            tags.append(str(loop.thread_binding.thread_tag))
    return tags


def _all_blocks(sch: Schedule) -> list:
    """Every block of the function but the root, outermost first."""
    found, stack = [], [sch.get_sblock("root")]
    while stack:
        children = list(sch.get_child_blocks(stack.pop()))
        found.extend(children)
        stack.extend(children)
    return found


def _is_bound(sch: Schedule, block) -> bool:
    return any(t.startswith(("blockIdx.", "threadIdx.")) for t in _loop_tags(sch, block))


def bind_unbound(sch: Schedule, max_threads: int) -> None:
    """Give every root-level nest that no rule bound a plain block/thread binding."""
    root = sch.get_sblock("root")
    for block in list(sch.get_child_blocks(root)):
        if _is_bound(sch, block) or _inside_bound(sch, block):
            continue
        _bind_plain(sch, block, max_threads)


def _inside_bound(sch: Schedule, block) -> bool:
    """Whether a block nested under `block`'s loops is bound (a scheduled nest)."""
    loops = sch.get_loops(block)
    if not loops:
        return False
    return any(_is_bound(sch, b) for b in sch.get_child_blocks(loops[0]))


def _bind_plain(sch: Schedule, block, max_threads: int) -> None:
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    types = [int(iv.iter_type) for iv in stmt.iter_vars]
    spatial = []
    for lp in loops:
        ext = sch.get(lp).extent
        # the leading loops that carry only spatial iteration (reductions stay serial)
        if len(spatial) < len(types) and types[len(spatial)] == DATA_PAR \
                and isinstance(ext, tvm.tirx.IntImm):
            spatial.append(lp)
        else:
            break
    if not spatial:
        unit = sch.add_unit_loop(loops[0] if loops else block)
        sch.bind(unit, "threadIdx.x")
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    total = int(sch.get(fused).extent)
    threads = min(max_threads, DEFAULT_THREADS, total)
    if total > threads:
        bx, tx = sch.split(fused, [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    else:
        sch.bind(fused, "threadIdx.x")


def unbound_blocks(prim: tvm.tirx.PrimFunc) -> list[str]:
    """The blocks of `prim` outside every blockIdx / threadIdx binding (a block nested
    in a bound block is bound)."""
    sch = Schedule(tvm.IRModule({"main": prim}))
    loose: list[str] = []
    stack = [(b, False) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    while stack:
        block, outer_bound = stack.pop()
        bound = outer_bound or _is_bound(sch, block)
        if not bound:
            loose.append(sch.get(block).name_hint)
        stack.extend((b, bound) for b in sch.get_child_blocks(block))
    return loose


def uneven_thread_extents(prim: tvm.tirx.PrimFunc) -> dict[str, list[int]]:
    """The thread tags that loops of one kernel of `prim` (the blocks under one
    outermost loop) bind with different extents, and those extents. TVM launches such
    a kernel with one of them, so the loops of the others run on too few threads (a
    cross-thread reduction over 32 lanes in a block of 25 misses 7) or on too many."""
    sch = Schedule(tvm.IRModule({"main": prim}))
    kernels: dict[Any, dict[str, set[int]]] = {}
    for block in _all_blocks(sch):
        loops = [sch.get(lp) for lp in sch.get_loops(block)]
        if not loops:
            continue
        extents = kernels.setdefault(loops[0], {})
        for loop in loops:
            if loop.thread_binding is not None and isinstance(loop.extent, tvm.tirx.IntImm):
                extents.setdefault(str(loop.thread_binding.thread_tag), set()).add(
                    int(loop.extent))
    return {tag: sorted(values) for extents in kernels.values()
            for tag, values in extents.items() if len(values) > 1}


def check_bound(prim: tvm.tirx.PrimFunc, name: str = "") -> None:
    """Raise UnboundKernelError when a block of `prim` runs outside every GPU thread
    binding (it would otherwise be compiled as a host loop over device memory), or
    when one kernel binds a thread axis with different extents."""
    kernel = name or prim.attrs.get("global_symbol")
    loose = unbound_blocks(prim)
    if loose:
        raise UnboundKernelError(
            f"kernel {kernel}: block(s) {loose} are not bound "
            "to blockIdx/threadIdx; the GPU schedule left them as loops. This is a bug in the "
            "GPU schedule of this group: report it with the model (tecc.compile(..., "
            "target='cuda'))")
    uneven = uneven_thread_extents(prim)
    if uneven:
        raise UnboundKernelError(
            f"kernel {kernel}: loops bound to the same thread axis have different extents "
            f"({', '.join(f'{tag}: {v}' for tag, v in uneven.items())}); the kernel would run "
            "part of them on too few threads. This is a bug in the GPU schedule of this "
            "group: report it with the model (tecc.compile(..., target='cuda'))")


def launch_extents(prim: tvm.tirx.PrimFunc) -> dict[str, int]:
    """The thread-binding extents of `prim` (largest per tag), for tests and summaries."""
    sch = Schedule(tvm.IRModule({"main": prim}))
    extents: dict[str, int] = {}
    for block in _all_blocks(sch):
        for lp in sch.get_loops(block):
            loop = sch.get(lp)
            if loop.thread_binding is not None and isinstance(loop.extent, tvm.tirx.IntImm):
                tag = str(loop.thread_binding.thread_tag)
                extents[tag] = max(extents.get(tag, 1), int(loop.extent))
    return extents


def threads_per_block(prim: tvm.tirx.PrimFunc) -> int:
    ext = launch_extents(prim)
    return math.prod(v for k, v in ext.items() if k.startswith("threadIdx."))


__all__ = ["CUDA", "ScheduleContext", "UnboundKernelError", "bind_unbound", "check_bound",
           "gpu_schedule", "launch_extents"]
