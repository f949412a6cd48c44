"""The GPU template (target kind "cuda") of a group of injective ops (elementwise,
broadcast, reshape, transpose, slices, concatenation): a kernel without an anchor.

The group (blocks.injective_anchor: no anchor, no reduction) has its intermediates
inlined into its output blocks; each output block's
loops are fused into one flat index and split as
    blockIdx.x / threadIdx.x (threads) / vector lanes (vector, vectorized)
The lanes split is exact (vector divides the output's last axis), so no predicate
sits inside a vector and only the thread split of a ragged grid tests its bound; a
vector of 4 makes each thread's stores one 128-bit transaction, and loads along the
input's contiguous axis (a slice, a transpose that keeps the last axis, a broadcast)
become 128-bit loads too where TVM proves their alignment (it falls back to scalar
loads where it cannot).

Knobs: threads (per block), vector (1, 2, 4 lanes; only 32-bit buffers take more than
one). The fallback: the widest vector that divides the last axis, 256 threads, fewer
where the grid would not give every multiprocessor a block. Injective kernels are
memory-bound and their configs move little, so they are no tuning tasks.
"""

from __future__ import annotations

import math
from typing import Any

from tecc.frontend.ir import Call
from tecc.schedules.blocks import inline_injective, root_blocks, static_extents
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import INJECTIVE_KIND, ScheduleContext, Template, register_template
from tecc.schedules.templates_injective import INJECTIVE
from tvm.s_tir.schedule import Schedule

THREADS = (64, 128, 256, 512, 1024)
VECTORS = (1, 2, 4)
FALLBACK_THREADS = 256
VECTOR_BITS = 32  # the element width that takes vectors (float32, int32): 4 x 32 = 128 bits


class GpuInjectiveTemplate(Template):
    """See the module docstring."""

    name = INJECTIVE_KIND
    target_kind = "cuda"

    def workload(self, call: Call, kind: str) -> dict[str, Any]:
        # the CPU template's key: a group's input and output shapes and dtypes
        return INJECTIVE.workload(call, kind)

    def tunable(self, workload: dict[str, Any]) -> bool:
        return False

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        space = ConfigSpace()
        space.define_choice("threads", list(THREADS))
        space.define_choice("vector", vector_options(_inlined(ctx.sch)))
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        sch = _inlined(ctx.sch)
        total = max(_flat_size(sch, b) for b in root_blocks(sch))
        vector = max(space.options("vector"))
        return space.from_json(fallback_values(total, vector,
                                               ctx.info.multiprocessors or 108))

    def apply(self, ctx: ScheduleContext, config: Config) -> Schedule:
        sch = ctx.sch
        inline_injective(sch)
        if config["vector"] not in vector_options(sch):
            # lanes that do not divide a last axis would put the bound test in the vector
            raise ValueError(f"{config['vector']} lanes do not fit this group's buffers")
        for block in root_blocks(sch):
            schedule_flat(sch, block, config["threads"], config["vector"])
        return sch


def fallback_values(total: int, vector: int, sms: int) -> dict[str, int]:
    """The fallback config of an output of `total` elements taking `vector` lanes:
    FALLBACK_THREADS, halved (down to 64) while the grid has fewer blocks than the GPU
    has multiprocessors."""
    threads = FALLBACK_THREADS
    while threads > THREADS[0] and -(-total // (vector * threads)) < sms:
        threads //= 2
    return {"threads": threads, "vector": vector}


def vector_options(sch: Schedule) -> list[int]:
    """Lanes that divide the last axis of every output block, when every buffer of the
    kernel is 32-bit (other widths and booleans stay scalar: a 4-lane int64 or bool
    vector is no single transaction); [1] otherwise."""
    blocks = root_blocks(sch)
    buffers = [r.source for b in blocks for r in sch.get(b).reads]
    buffers += [w.source for b in blocks for w in sch.get(b).writes]
    if any(buf.dtype.bits != VECTOR_BITS or buf.dtype.lanes != 1 for buf in buffers):
        return [1]
    lasts = []
    for block in blocks:
        exts = static_extents(sch, sch.get_loops(block))
        lasts.append(exts[-1] if exts else 1)
    return [v for v in VECTORS if all(last % v == 0 for last in lasts)]


def schedule_flat(sch: Schedule, block, threads: int, vector: int) -> None:
    """One block's loops fused, split into vector lanes (exact), threads and blocks."""
    loops = sch.get_loops(block)
    if not loops:
        loops = [sch.add_unit_loop(block)]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if vector > 1:
        fused, lanes = sch.split(fused, [None, vector])
    total = static_extents(sch, [fused])[0]
    bx, tx = sch.split(fused, [None, min(threads, total)])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if vector > 1:
        sch.vectorize(lanes)


def _inlined(sch: Schedule) -> Schedule:
    """A copy of `sch` with the group's intermediates inlined (what apply schedules)."""
    copy = sch.copy()
    inline_injective(copy)
    return copy


def _flat_size(sch: Schedule, block) -> int:
    return math.prod(static_extents(sch, sch.get_loops(block)))


GPU_INJECTIVE = register_template(GpuInjectiveTemplate())
