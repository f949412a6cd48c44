"""The default (untuned) schedule of a lowered primitive function for CUDA.

In order:
1. anchors ("tecc.anchor") with a template registered for target kind "cuda"
   (schedules/template.py; the GPU templates live in schedules/gpu_templates.py) get
   it, on a copy of the schedule, with the chosen config or the template's fallback;
   the template schedules the whole group (anchor, fused epilogue, padding);
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

import tvm
from tecc.schedules.template import ScheduleContext, load_templates
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
    from tecc.schedules.default import (
        _anchor_kind,
        _apply_template,
        _inline_injective,
        _root_blocks,
    )

    templates = load_templates(CUDA)
    info = target_info(target)
    lanes = max(1, info.vector_lanes("float32"))
    anchors = [(sch.get(b).name_hint, _anchor_kind(sch, b)) for b in _root_blocks(sch)]
    anchors = [(name, kind) for name, kind in anchors if kind is not None]
    scheduled = False
    for name, kind in anchors:
        template = templates.get(kind)
        if template is None:
            continue
        trial = sch.copy()
        _inline_injective(trial)
        done: list = []
        result = _apply_template(trial, name, kind, template, target, lanes,
                                 info.multiprocessors, choose, (workloads or {}).get(name), done)
        if done and done[-1].source != "generic":
            sch, scheduled = result, True
            if applied is not None:
                applied.extend(done)
            break  # one anchor per group schedules it; the rest is bound below
        if applied is not None:
            applied.extend(done)
    if not scheduled:
        sch = _dlight(sch, target)
    bind_unbound(sch, info.max_threads_per_block or 1024)
    return sch


def _dlight(sch: Schedule, target: tvm.target.Target) -> Schedule:
    import tvm.s_tir.dlight as dl

    rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
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
    return sch


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


def check_bound(prim: tvm.tirx.PrimFunc, name: str = "") -> None:
    """Raise UnboundKernelError when a block of `prim` runs outside every GPU thread
    binding (it would otherwise be compiled as a host loop over device memory)."""
    loose = unbound_blocks(prim)
    if loose:
        raise UnboundKernelError(
            f"kernel {name or prim.attrs.get('global_symbol')}: block(s) {loose} are not bound "
            "to blockIdx/threadIdx; the GPU schedule left them as loops. This is a bug in the "
            "GPU schedule of this group: report it with the model (tecc.compile(..., "
            "target='cuda'))")


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
