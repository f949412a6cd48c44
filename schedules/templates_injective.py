"""The template of a group of injective ops (elementwise, broadcast, transpose,
reshape, layout_transform, slices): a kernel without an anchor block.

The group's intermediates are inlined into its output blocks; every output block
then gets the same loop nest:
    [fuse "inner": outer axes fused | "all": every axis fused]
      parallel chunks (chunks) / unrolled vectors (unroll) / vector lanes (vec)
The template's anchor is the group's last output block (blocks.injective_anchor).
Its workload is the template name and the group's input and output shapes and dtypes
(not its ops: every config is valid for any group, and groups of one shape are
scheduled alike), so a model's many elementwise kernels of one shape share a record.
"""

from __future__ import annotations

import math
from typing import Any

from tecc.frontend.ir import Call, TupleType
from tecc.schedules.blocks import (
    PARALLEL_MIN_WORK,
    inline_injective,
    is_reduction,
    root_blocks,
    static_extents,
)
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import INJECTIVE_KIND, ScheduleContext, Template, register_template
from tvm.s_tir.schedule import Schedule

# Rows (the outer axes' product) that keep the parallel loop busy without the last
# axis's steps fused into it.
RAGGED_MIN_ROWS = 8


class InjectiveTemplate(Template):
    """Knobs:
      fuse    "all" (one flat loop) | "inner" (the last axis kept apart: its vector is
              contiguous even when a transpose makes the flat index strided)
      vec     lanes of the innermost split (1: scalar): lanes/2, lanes, 2 x lanes
      unroll  vectors per step, unrolled (1, 2, 4)
      chunks  parallel chunking of the outer loop: 0 serial, -1 one task per
              iteration, n: n contiguous chunks (cores, 4 x cores)
    Ragged splits keep TVM's predicate: every value is valid for every shape. With
    "inner" over enough rows, the partial step of a ragged last axis is partitioned
    off (only the tail tests its index)."""

    name = INJECTIVE_KIND
    lane_knobs = ("vec",)

    def workload(self, call: Call, kind: str) -> dict[str, Any]:
        """`call`: a call of the group's primitive Function (on its own params)."""
        out = call.ty
        fields = out.fields if isinstance(out, TupleType) else (out,)
        return {"template": self.name,
                "inputs": [[list(a.shape), str(a.dtype)] for a in call.args],
                "outputs": [[list(t.shape), str(t.dtype)] for t in fields]}

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        space = ConfigSpace()
        space.define_choice("fuse", ["all", "inner"])
        space.define_choice("vec", [1, ctx.lanes // 2, ctx.lanes, 2 * ctx.lanes])
        space.define_choice("unroll", [1, 2, 4])
        space.define_choice("chunks", [0, -1, ctx.cores, 4 * ctx.cores])
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        exts = static_extents(ctx.sch, ctx.sch.get_loops(ctx.block))
        total = math.prod(exts) if exts else 1
        last = exts[-1] if exts else 1
        inner_ok = last % ctx.lanes == 0 or last >= 4 * ctx.lanes
        values = {"fuse": "inner" if inner_ok and len(exts) > 1 else "all",
                  "vec": ctx.lanes if total >= ctx.lanes else 1,
                  "unroll": 2 if total >= 64 * ctx.lanes else 1,
                  "chunks": -1 if total >= PARALLEL_MIN_WORK else 0}
        return space.from_json(values)

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        """Every root block of the group gets the config's nest (not only the anchor:
        a split has one output block per part)."""
        inline_injective(ctx.sch)
        for block in root_blocks(ctx.sch):
            schedule_spatial(ctx.sch, block, config)


def schedule_spatial(sch: Schedule, block, config: Config) -> None:
    """The injective nest of `config` on one spatial block (see InjectiveTemplate)."""
    loops = sch.get_loops(block)
    if not loops or is_reduction(sch, block):
        return
    exts = static_extents(sch, loops)
    vec, unroll, chunks = config["vec"], config["unroll"], config["chunks"]
    if config["fuse"] == "inner" and len(loops) > 1:
        *outer, last = loops
        inner_ext = exts[-1]
    else:
        outer, last = [], sch.fuse(*loops) if len(loops) > 1 else loops[0]
        inner_ext = math.prod(exts)
    vec = min(vec, inner_ext)
    factors = [None, unroll, vec] if unroll > 1 and inner_ext >= unroll * vec else [None, vec]
    parts = sch.split(last, factors) if vec > 1 else [last]
    lane = parts[-1] if vec > 1 else None
    if vec > 1 and len(parts) == 3:
        sch.unroll(parts[1])
    step = math.prod(f for f in factors if f is not None) if vec > 1 else 1
    top_parts = [*outer, parts[0]]
    if outer and inner_ext % step and math.prod(exts[:-1]) >= RAGGED_MIN_ROWS:
        # A ragged last axis (1500 = 46 x 32 + 28): its step loop stays out of the
        # parallel fuse and its partial step is partitioned off (TIR's LoopPartition),
        # so the full steps run without the predicate that would otherwise sit in every
        # vector (exp on 1x6x60x1500: 0.58 ns an element against 0.27 at 1504).
        sch.annotate(parts[0], "pragma_loop_partition_hint", 1)
        top_parts = list(outer)
    top = sch.fuse(*top_parts) if len(top_parts) > 1 else top_parts[0]
    if chunks > 0 and static_extents(sch, [top])[0] > chunks:
        top, _ = sch.split(top, [chunks, None])
    if chunks != 0 and static_extents(sch, [top])[0] > 1:
        sch.parallel(top)
    if lane is not None:
        sch.vectorize(lane)


INJECTIVE = register_template(InjectiveTemplate())
