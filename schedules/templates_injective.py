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

import tvm
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
from tvm import sym, tirx
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
        run = contiguous_run(ctx.sch) if values["vec"] > 2 and len(exts) > 1 else 0
        if 2 <= run < values["vec"]:
            # An input read in runs shorter than a vector (a layout_transform from 16-
            # to 8-channel blocks reads 8 floats, then jumps): vectors of the run
            # along the last axis, not a gather across runs (RegNetY's 48x112x112
            # 16c -> 8c on AVX-512: 0.45 ms with 16 lanes gathered).
            values["fuse"] = "inner"
            values["vec"] = max(v for v in space.options("vec") if v <= run)
        return space.from_json(values)

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        """Every root block of the group gets the config's nest (not only the anchor:
        a split has one output block per part)."""
        inline_injective(ctx.sch)
        for block in root_blocks(ctx.sch):
            schedule_spatial(ctx.sch, block, config)


def contiguous_run(sch: Schedule) -> int:
    """Output elements that every input of the group reads in one unit-stride run
    (or as one broadcast value) along the flat output index, with the group's
    injective ops inlined: the product of the trailing output extents over which each
    read's flat offset moves as the output's does (or not at all). 1 where the last
    axis is read strided or a read is not affine in it."""
    probe = sch.copy()
    inline_injective(probe)
    run = None
    for block in root_blocks(probe):
        stmt = probe.get(block)
        ivars = [iv.var for iv in stmt.iter_vars]
        extents = [iv.dom.extent for iv in stmt.iter_vars]
        if not ivars or any(not isinstance(e, tirx.IntImm) for e in extents):
            return 1
        out_strides = [math.prod(int(e) for e in extents[i + 1:]) for i in range(len(ivars))]
        ranges = {iv.var: iv.dom for iv in stmt.iter_vars}
        analyzer = sym.Analyzer()
        for var, dom in ranges.items():
            analyzer.bind(var, dom)
        for read in stmt.reads:
            shape = [int(d) for d in read.source.shape]
            flat = sum((rng.min * math.prod(shape[i + 1:])
                        for i, rng in enumerate(read.region)), tirx.const(0, "int32"))
            flat = analyzer.simplify(flat)
            read_run = 1
            for first in range(len(ivars) - 1, -1, -1):
                coefficients = sym.detect_linear_equation(flat, ivars[first:])
                if len(coefficients) != len(ivars) - first + 1:
                    if first == len(ivars) - 1:  # not affine in the last axis
                        read_run = _last_axis_run(flat, ivars[-1], int(extents[-1]), ranges)
                    break
                steps = [int(c) if isinstance(c, tirx.IntImm) else None
                         for c in coefficients[:-1]]
                if steps != out_strides[first:] and any(step != 0 for step in steps):
                    break
                read_run = math.prod(int(e) for e in extents[first:])
            run = read_run if run is None else min(run, read_run)
    return run or 1


def _last_axis_run(flat: Any, var: Any, extent: int, ranges: dict[Any, Any]) -> int:
    """The longest power-of-two run of the last axis (a divisor of its extent) along
    which `flat` steps by one or not at all, where the index is not affine in the
    whole axis (an 8-channel block read into a 16-channel one: c * 2 + l // 8, l % 8)."""
    run = 1 << (extent.bit_length() - 1)
    while run > 1:
        if extent % run == 0:
            outer, lane = tirx.Var("outer", var.ty), tirx.Var("lane", var.ty)
            analyzer = sym.Analyzer()
            for other, dom in ranges.items():
                if not other.same_as(var):
                    analyzer.bind(other, dom)
            analyzer.bind(outer, tvm.ir.Range(0, extent // run))
            analyzer.bind(lane, tvm.ir.Range(0, run))
            analyzer.bind(var, outer * run + lane)  # substitutes var in what follows
            split = analyzer.simplify(flat)
            coefficients = sym.detect_linear_equation(split, [lane])
            if len(coefficients) == 2 and isinstance(coefficients[0], tirx.IntImm) \
                    and int(coefficients[0]) in (0, 1):
                return run
        run //= 2
    return 1


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
    if "if_then_else" in str(sch.get(block).body):
        # A concatenate's branches (or a pad's) select on the outer indices: TIR's
        # LoopPartition splits the loop at their bounds, so each part computes its own
        # branch instead of every vector computing all of them (SegFormer's decode head,
        # three bilinear resizes and a copy concatenated: 3.3 ms with every branch).
        sch.annotate(top, "pragma_loop_partition_hint", 1)
    if chunks > 0 and static_extents(sch, [top])[0] > chunks:
        top, _ = sch.split(top, [chunks, None])
    if chunks != 0 and static_extents(sch, [top])[0] > 1:
        sch.parallel(top)
    if lane is not None:
        sch.vectorize(lane)


INJECTIVE = register_template(InjectiveTemplate())
