"""Tunable templates for pools, reductions and normalizations (CPU).

Templates (anchor kind in the "tecc.anchor" annotation -> template):
  pool                          max_pool2d / avg_pool2d / adaptive (divisible) and
                                global average pools, NCHW and NCHW{c}c
  reduce                        sum / max / min / prod / mean
  variance                      the two-pass variance
  softmax, log_softmax          max, exp-sum and normalize of every row
  layer_norm                    sum, squared deviations and normalize of every row

The reduction family shares one output-driven schedule. The group's output block
(the normalize, the mean's divide or the reduction itself) gives the row loop; every
other block of the group (row maxima, sums) is computed under it, so a row is read
from cache, not memory, by its later passes.
  row mode (the input's last axis is reduced): rows parallel; each reduction is
    rfactored by `kv` lanes (the rf block vectorized, `kv` independent accumulators);
    the normalize is vectorized by the same `kv`. When rows are few and long, the
    reduction can also be split across the cores (`p` of the k split): then every
    pass is its own parallel loop nest at the root.
  column mode (the last axis is kept, e.g. sum over axis 0, softmax over dim 1): the
    kept last axis is split (`c_split`) and its inner part vectorized under the
    reduction loops; the rest is parallel.
    A row whose length no vector width divides (197 tokens, 1500 frames) takes a
    ragged k split (ko = ceil(K / kv), the last kv chunk partial): every pass is
    rfactored at the root, keeping its predicate, and the passes' row loops are
    merged into one, so a row is still read from cache by its later passes; the
    partial chunk is partitioned off (TIR's LoopPartition), so the full chunks run
    vectorized without bounds checks.
Every knob value gives correct code: compute_at regenerates an rf block's loops
without its predicate in TVM 0.27 (wrong results over a ragged split), so an rf block
over a ragged split is never moved (its row loop is merged instead); spatial splits
may be ragged (TVM keeps the predicate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tecc.schedules.blocks import (
    ANCHOR_ATTR,
    DATA_PAR,
    PARALLEL_MIN_WORK,
    all_blocks,
    best_vector_width,
    block_name,
    divisors,
    elementwise_consumer,
    inline_injective,
    is_reduction,
    iter_types,
    output_names,
    padding_producer,
    reads_elementwise,
    reduction_loops,
    root_blocks,
    shared_exp,
    static_extent,
    static_extents,
    vars_in,
    vector_width_options,
)
from tecc.schedules.in_output import IN_OUTPUT_ATTR, same_storage
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import ScheduleContext, Template, register_template
from tvm.s_tir.schedule import Schedule

# Row reductions stream their input at a few elements per ns: measured on the 2-core
# AVX2 host, 25K-element reductions (global pool 512x7x7) ran 2-3x slower parallel.
ROW_PARALLEL_MIN_WORK = 65536


def _drop_anchor_copies(sch: Schedule, keep) -> None:
    """rfactor copies the anchor annotation onto its rf block: one anchor per group."""
    kept = sch.get(keep)
    for block in all_blocks(sch):
        stmt = sch.get(block)
        if not stmt.same_as(kept) and ANCHOR_ATTR in stmt.annotations:
            sch.unannotate(block, ANCHOR_ATTR)


# ---------------------------------------------------------------- reductions


@dataclass
class _Rows:
    """The shape of a reduction group, read off its blocks."""

    out: object          # the group's output block
    out_kind: str        # "red" (the reduction itself), "full" (input-shaped), "rows"
    reductions: list     # reduction blocks, in order
    row_mode: bool       # the input's last axis is reduced
    rows: int            # rows (product of kept extents)
    k: int               # reduced elements per row
    c: int               # column mode: the kept last axis
    trailing: bool       # the reduced axes are the input's last ones (rows contiguous)


def _elements(buffer) -> int:
    return math.prod(int(d) for d in buffer.shape)


def _reduced_dims(sch: Schedule, block) -> tuple[object, set[int]]:
    """(buffer, dims of it indexed by `block`'s reduction variables) for the largest
    input the reduction reads."""
    blk = sch.get(block)
    rvars = {iv.var for iv in blk.iter_vars if int(iv.iter_type) != DATA_PAR}
    best = None
    for region in blk.reads:
        dims = {d for d, rng in enumerate(region.region) if vars_in(rng.min) & rvars}
        # the largest by elements (a mask read with the scores may have more axes)
        if dims and (best is None or _elements(region.source) > _elements(best[0])):
            best = (region.source, dims)
    if best is None:
        raise ValueError("reduction block reads no input along its reduction axes")
    return best


def _analyze_rows(sch: Schedule, anchor) -> _Rows:
    outputs = list(sch.get_output_blocks(sch.get_sblock("root")))
    if len(outputs) != 1:
        raise ValueError("a reduction group has one output")
    out = outputs[0]
    reductions = [b for b in root_blocks(sch) if is_reduction(sch, b)]
    if not reductions:
        raise ValueError("no reduction block")
    buf, dims = _reduced_dims(sch, anchor)
    shape = [int(d) for d in buf.shape]
    k = math.prod(shape[d] for d in dims)
    rows = math.prod(shape) // k
    row_mode = (len(shape) - 1) in dims
    out_shape = [int(d) for d in sch.get(out).writes[0].source.shape]
    if is_reduction(sch, out):
        kind = "red"
    elif out_shape == shape and len(out_shape) > 0 and math.prod(out_shape) != rows:
        kind = "full"
    else:
        kind = "rows"
    for red in reductions:
        if math.prod(static_extents(sch, _red_loops(sch, red))) != k:
            raise ValueError("the group's reductions differ in length")
    trailing = dims == set(range(len(shape) - len(dims), len(shape)))
    return _Rows(out, kind, reductions, row_mode, rows, k, 1 if row_mode else shape[-1],
                 trailing)


def _red_loops(sch: Schedule, block) -> list:
    loops = sch.get_loops(block)
    types = iter_types(sch, block)
    n_sp = types.count(DATA_PAR)
    if len(loops) != len(types) or any(t != DATA_PAR for t in types[:n_sp]):
        raise ValueError("reduction loops are not innermost")
    return loops[types.count(DATA_PAR):]


def _spatial_loops(sch: Schedule, block) -> list:
    types = iter_types(sch, block)
    return sch.get_loops(block)[: types.count(DATA_PAR)]


class RowReduceTemplate(Template):
    """softmax, log_softmax, layer_norm, variance, reduce: see the module docstring.

    Knobs, row mode:    k_split  (p, ko, kv): K = p * ko * kv; p in {1, cores} splits
                                 each row across the cores, kv lanes per accumulator
                        parallel "none" | "rows"
    Knobs, column mode: c_split  (co, cv): the kept last axis, cv lanes vectorized
                        parallel "none" | "outer"
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        info = _analyze_rows(ctx.sch, ctx.block)
        space = ConfigSpace()
        if info.row_mode:
            vecs = set(vector_width_options(info.k, ctx.lanes))
            ps = {1, ctx.cores} if ctx.cores > 1 else {1}
            ragged = [(1, -(-info.k // kv), kv) for kv in ragged_widths(info.k, ctx.lanes)
                      if info.trailing]
            space.define_split("k_split", info.k, num_outputs=3,
                               filter_fn=lambda f: f[0] in ps and f[2] in vecs,
                               ragged=ragged)
            space.define_choice("parallel", ["none", "rows"] if info.rows > 1 else ["none"])
        else:
            vecs = set(vector_width_options(info.c, ctx.lanes))
            space.define_split("c_split", info.c, num_outputs=2,
                               filter_fn=lambda f: f[1] in vecs)
            space.define_choice("parallel", ["none", "outer"])
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        info = _analyze_rows(ctx.sch, ctx.block)
        work = info.rows * info.k
        big = work >= ROW_PARALLEL_MIN_WORK
        if info.row_mode:
            kv = best_vector_width(info.k, ctx.lanes)
            # Few long rows: one core would stream the whole row; split it when
            # a core's share is still at least an L1-sized block.
            p = ctx.cores if (info.rows < ctx.cores and ctx.cores > 1 and big
                              and info.k % (ctx.cores * kv) == 0
                              and info.k * 4 // ctx.cores >= ctx.info.l1d_bytes // 4) else 1
            split = (p, info.k // (p * kv), kv)
            if p == 1 and kv < ctx.lanes and info.k > 2 * ctx.lanes and info.trailing:
                # no exact width near a vector: one vector per chunk and a partial
                # last chunk (its lanes run scalar: a wider chunk has a longer tail)
                kv = ctx.lanes
                split = (1, -(-info.k // kv), kv)
            values = {"k_split": split,
                      "parallel": "rows" if big and info.rows > 1 else "none"}
        else:
            cv = best_vector_width(info.c, ctx.lanes)
            values = {"c_split": (info.c // cv, cv), "parallel": "outer" if big else "none"}
        return space.from_json(values)

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        sch = ctx.sch
        # rows that stay on one core keep a shared exp (softmax's, read by the exp-sum
        # and the normalize), computed once per element: as a row buffer where the row
        # fits a stack buffer, else in the output buffer (in_output.py), the normalize
        # rescaling it in place
        buf, dims = _reduced_dims(sch, ctx.block)
        row_bytes = math.prod(int(buf.shape[d]) for d in dims) * tvm.DataType(buf.dtype).bits // 8
        keep = None
        if "k_split" in config and config["k_split"][0] == 1:
            keep = shared_exp if row_bytes < STACK_BUFFER_BYTES else _exp_for_output
        inline_injective(sch, keep=keep)
        info = _analyze_rows(sch, ctx.block)
        if keep is _exp_for_output:
            output = sch.get(info.out).writes[0].source
            for block in _kept_blocks(sch, info):
                if _exp_for_output(sch, block):  # not a block that would not inline
                    sch.annotate(block, IN_OUTPUT_ATTR, output.name)
        if info.row_mode:
            _apply_row_mode(sch, info, config)
        else:
            _apply_column_mode(sch, info, config)
        _drop_anchor_copies(sch, ctx.block)


# TVM allocates a CPU buffer below 1 KB on the stack, a larger one from the workspace
# pool at each entry of its scope (here: each row). Measured on two AVX-512 cores,
# kept against inlined: softmax over 128 1.5x faster, over 197 1.12x, over 1500 (a
# workspace buffer per row) 0.9x; longer rows keep the exp in the output buffer.
STACK_BUFFER_BYTES = 1024


def _exp_for_output(sch: Schedule, block) -> bool:
    """A shared exp (blocks.shared_exp) whose every other reader is an output block of
    its own shape and dtype reading it elementwise: it can be stored in that output."""
    if not shared_exp(sch, block):
        return False
    written = sch.get(block).writes[0].source
    outputs = output_names(sch)
    return all(is_reduction(sch, c) or (
        block_name(sch, c) in outputs and same_storage(sch.get(c).writes[0].source, written)
        and reads_elementwise(sch, c, written)) for c in sch.get_consumers(block))


def _kept_blocks(sch: Schedule, info: _Rows) -> list:
    """The spatial blocks of the group besides its output that inlining kept."""
    return [b for b in root_blocks(sch) if not is_reduction(sch, b)
            and block_name(sch, b) != block_name(sch, info.out)]


def _vectorize_lanes(sch: Schedule, loop, kv: int, ragged: bool) -> None:
    """A row's element loop split by `kv`, the lanes vectorized; over a ragged split
    the partial chunk partitioned off (TIR's LoopPartition)."""
    if kv <= 1:
        return
    chunks, lanes = sch.split(loop, [None, kv])
    sch.vectorize(lanes)
    if ragged:
        sch.annotate(chunks, "pragma_loop_partition_hint", 1)


def _vectorize_row(sch: Schedule, block, depth: int, kv: int, ragged: bool) -> None:
    """A kept block's loops below `depth` (a row's elements) fused and vectorized by
    `kv` lanes (_vectorize_lanes)."""
    inner = sch.get_loops(block)[depth:]
    if inner:
        _vectorize_lanes(sch, sch.fuse(*inner) if len(inner) > 1 else inner[0], kv, ragged)


def ragged_widths(k: int, lanes: int) -> list[int]:
    """Vector widths (one, two and four vectors) shorter than a row of `k` that do not
    divide it: the ragged k splits offered beside the exact ones."""
    return [kv for kv in (lanes, 2 * lanes, 4 * lanes) if kv < k and k % kv]


def _rfactor(sch: Schedule, block, p: int, ko: int, kv: int):
    """Split `block`'s (fused) reduction into (p, ko, kv) and rfactor the p x kv part:
    rf[..., p * kv] accumulates kv lanes per core chunk; `block` then reduces rf."""
    # TVM's rfactor fails a block-realize check when a block without loops sits at the
    # root (the division of a mean to a scalar): a unit loop around it
    for other in root_blocks(sch):
        if not sch.get_loops(other):
            sch.add_unit_loop(other)
    red = _red_loops(sch, block)
    k = sch.fuse(*red) if len(red) > 1 else red[0]
    out_ndim = len(sch.get(block).writes[0].source.shape)
    if p == 1:
        k_o, k_v = sch.split(k, [ko, kv])
        return sch.rfactor(k_v, out_ndim)
    k_p, k_o, k_v = sch.split(k, [p, ko, kv])
    sch.reorder(k_p, k_v, k_o)
    return sch.rfactor(sch.fuse(k_p, k_v), out_ndim)


def _finish_rf(sch: Schedule, rf, depth: int, p: int, ko: int, kv: int) -> None:
    """Loop order of an rf block below `depth` enclosing loops: (ko, kv), kv
    vectorized, its init hoisted out of ko. At the root with p > 1:
    parallel(rows, p) / ko / kv."""
    loops = sch.get_loops(rf)[depth:]
    exts = static_extents(sch, loops)
    if p > 1:
        # at the root, rfactor kept the loops: rows..., (p x kv) fused, ko
        *rows, f, red = loops
        fp, fv = sch.split(f, [p, kv])
        sch.reorder(*rows, fp, red, fv)
        top = sch.fuse(*rows, fp) if rows else fp
        sch.parallel(top)
        if kv > 1:
            sch.vectorize(fv)
        sch.decompose_reduction(rf, red)
        return
    if depth == 0:
        # at the root, rfactor kept the loops: rows..., ko, kv (no rows here)
        *_, red, lane = loops
        sch.vectorize(lane)
        sch.decompose_reduction(rf, red)
        return
    # under the row loop: the loops left are kv (spatial) and ko (reduction), either
    # possibly missing when its extent is 1.
    lv = [lp for lp, e in zip(loops, exts, strict=True) if e == kv and kv > 1]
    lo = [lp for lp, e in zip(loops, exts, strict=True) if e == ko and ko > 1
          and not (lv and lp.same_as(lv[0]))]
    if kv > 1 and ko > 1:
        if len(loops) != 2:
            raise ValueError("unexpected rf loop nest")
        # compute_at regenerates loops in block-variable order: rf var first
        sch.reorder(loops[1], loops[0])
        loops = sch.get_loops(rf)[depth:]
        sch.vectorize(loops[1])
        sch.decompose_reduction(rf, loops[0])
    elif kv > 1:
        sch.vectorize(lv[0] if lv else loops[-1])
    elif ko > 1 and lo:
        sch.decompose_reduction(rf, lo[0])


def row_loops(sch: Schedule, info: _Rows) -> tuple[list, object | None]:
    """The output block's loops over the rows, and (for an input-shaped output) its
    loops over a row's elements reordered innermost and fused into one (else None)."""
    out = info.out
    if info.out_kind == "full":
        _, dims = _reduced_dims(sch, info.reductions[0])
        loops = sch.get_loops(out)
        rows = [lp for d, lp in enumerate(loops) if d not in dims]
        inner = [lp for d, lp in enumerate(loops) if d in dims]
        sch.reorder(*rows, *inner)
        return rows, sch.fuse(*inner) if len(inner) > 1 else inner[0]
    if info.out_kind == "red":
        return _spatial_loops(sch, out), None
    return list(sch.get_loops(out)), None


def _apply_row_mode(sch: Schedule, info: _Rows, config: Config) -> None:
    p, ko, kv = config["k_split"]
    par = config["parallel"] == "rows"
    if p * ko * kv != info.k:
        _apply_ragged_rows(sch, info, ko, kv, par)
        return
    out = info.out
    rfs = [_rfactor(sch, red, p, ko, kv) for red in info.reductions] if kv > 1 or p > 1 else []
    # the output's row loop
    rows, lin = row_loops(sch, info)
    if lin is not None:
        _vectorize_lanes(sch, lin, kv, False)
    row = None
    if rows:
        row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    others = [b for b in root_blocks(sch) if block_name(sch, b) != block_name(sch, out)]
    if p == 1 and row is not None:
        # one pass over each row: its reductions computed under the row loop
        kept = {block_name(sch, b) for b in _kept_blocks(sch, info)}
        for block in reversed(others):
            sch.compute_at(block, row)
        if par:
            sch.parallel(row)
        for rf in rfs:
            _finish_rf(sch, rf, 1, p, ko, kv)
        for name in kept:
            _vectorize_row(sch, sch.get_sblock(name), 1, kv, False)
        return
    # p > 1, or no rows at all: every pass is its own loop nest at the root (the rf
    # passes parallel over rows x p; the final reductions over p x kv are short)
    for rf in rfs:
        _finish_rf(sch, rf, 0, p, ko, kv)
    if row is not None and par:
        sch.parallel(row)


def _apply_ragged_rows(sch: Schedule, info: _Rows, ko: int, kv: int, par: bool) -> None:
    """Row mode over a ragged k split (ko * kv > K): see the module docstring. Every
    block stays at the root with its rows fused into one loop; those loops are merged
    (in program order, so a pass follows the passes it reads)."""
    rfs = [_rfactor(sch, red, 1, ko, kv) for red in info.reductions]
    for rf in rfs:
        # at the root: rows..., ko (reduction), then the kv lanes
        sch.vectorize(sch.get_loops(rf)[-1])
    rows, lin = row_loops(sch, info)
    n_rows = len(rows) if info.rows > 1 else 0  # a scalar's unit loop is no row loop
    for block in _kept_blocks(sch, info):
        _vectorize_row(sch, block, n_rows, kv, True)
    if lin is not None:
        _vectorize_lanes(sch, lin, kv, True)
    if n_rows:
        row_of = []
        for block in root_blocks(sch):
            loops = sch.get_loops(block)[:n_rows]
            if math.prod(static_extents(sch, loops)) != info.rows:
                raise ValueError(f"block {block_name(sch, block)} does not loop over rows")
            row_of.append(sch.fuse(*loops) if len(loops) > 1 else loops[0])
        row = sch.merge(*row_of) if len(row_of) > 1 else row_of[0]
        if par:
            sch.parallel(row)
    # The rf inits stay in their blocks (a test of ko == 0 per chunk, not per lane):
    # after a merge, TVM 0.27 takes the second rf block of the loop for no reduction
    # block and refuses to decompose it.
    for rf in rfs:  # its loops: [row,] ko, kv
        sch.annotate(sch.get_loops(rf)[-2], "pragma_loop_partition_hint", 1)


def _apply_column_mode(sch: Schedule, info: _Rows, config: Config) -> None:
    co, cv = config["c_split"]
    par = config["parallel"] == "outer"
    out = info.out
    if info.out_kind == "full":
        _, dims = _reduced_dims(sch, info.reductions[0])
        loops = sch.get_loops(out)
        rows = [lp for d, lp in enumerate(loops[:-1]) if d not in dims]
        inner = [lp for d, lp in enumerate(loops) if d in dims]
        c_o, c_v = sch.split(loops[-1], [co, cv])
        sch.reorder(*rows, c_o, *inner, c_v)
    elif info.out_kind == "red":
        spatial = _spatial_loops(sch, out)
        red = _red_loops(sch, out)
        rows = spatial[:-1]
        c_o, c_v = sch.split(spatial[-1], [co, cv])
        sch.reorder(*rows, c_o, *red, c_v)
    else:
        loops = sch.get_loops(out)
        rows = loops[:-1]
        c_o, c_v = sch.split(loops[-1], [co, cv])
    outer = sch.fuse(*rows, c_o) if rows else c_o
    others = [b for b in root_blocks(sch) if block_name(sch, b) != block_name(sch, out)]
    for block in reversed(others):
        sch.compute_at(block, outer)
    if par:
        sch.parallel(outer)
    for block in [*others, out]:
        _vectorize_column(sch, block, cv)


def _vectorize_column(sch: Schedule, block, cv: int) -> None:
    """Below the outer loop: reduction loops first, the cv lane loop innermost and
    vectorized, the init hoisted before the reduction loops."""
    loops = sch.get_loops(block)[1:]
    if not loops:
        return
    exts = static_extents(sch, loops)
    if is_reduction(sch, block):
        # which loops reduce is read off the bindings: after the reorder above, the
        # lane loop is innermost and may be as long as the reduction
        reducing = {sch.get(lp).loop_var for lp in reduction_loops(sch, block)}
        red = [lp for lp in loops if sch.get(lp).loop_var in reducing]
        spatial = [lp for lp in loops if sch.get(lp).loop_var not in reducing]
        if spatial and red:
            sch.reorder(*red, *spatial)
        if spatial and cv > 1:
            lane = spatial[-1]
            if static_extent(sch, lane) == cv:
                sch.vectorize(lane)
        if red:
            sch.decompose_reduction(block, red[0])
        return
    if cv > 1 and exts[-1] == cv:
        sch.vectorize(loops[-1])


for _kind in ("reduce", "variance", "softmax", "log_softmax", "layer_norm"):
    register_template(RowReduceTemplate(_kind))


# ---------------------------------------------------------------- pools


def _is_global_pool(sch: Schedule, block) -> bool:
    loops = sch.get_loops(block)
    exts = static_extents(sch, loops)
    return exts[2] == 1 and exts[3] == 1 and padding_producer(sch, block) is None


class PoolTemplate(Template):
    """Window reductions (max / avg / adaptive pools), NCHW (n, c, oh, ow, rh, rw) and
    NCHW{c}c (n, cc, oh, ow, cb, rh, rw):
        parallel(n, c[, oh]) / ow_o / rh, rw / ow_i / [cb]
    NCHW vectorizes ow_i; NCHW{c}c vectorizes cb and unrolls ow_i (ow_i x cb
    accumulators in registers). The elementwise epilogue (the average's division,
    a fused relu) runs under ow_o on the finished tile.
    Knobs: ow_split (ow_o, ow_i) exact; parallel 0 (serial) | 2 (n x c) | 3 (n x c x oh);
    unroll_window bool; pad "root" | "inline" | "compute_at" (padded pools only: the
    padded plane materialized once, read in place with a bounds check, or produced
    under the parallel loop, while it is in cache).
    A global pool (one output per channel, no padding) is a row reduction: it takes the
    reduction template's knobs (k_split / c_split, parallel)."""

    name = "pool"

    def __init__(self) -> None:
        self._rows = RowReduceTemplate("pool")

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        sch, block = ctx.sch, ctx.block
        if _is_global_pool(sch, block):
            return self._rows.define_space(ctx)
        loops = sch.get_loops(block)
        exts = static_extents(sch, loops)
        nchwc = len(loops) == 7
        ow = exts[3]
        limit = 8 if nchwc else 2 * ctx.lanes
        space = ConfigSpace()
        space.define_split("ow_split", ow, num_outputs=2, max_factor=limit)
        space.define_choice("parallel", [0, 2, 3])
        space.define_bool("unroll_window")
        if padding_producer(sch, block) is not None:
            space.define_choice("pad", ["root", "inline", "compute_at"])
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        sch, block = ctx.sch, ctx.block
        if _is_global_pool(sch, block):
            return self._rows.fallback(space, ctx)
        loops = sch.get_loops(block)
        exts = static_extents(sch, loops)
        nchwc = len(loops) == 7
        ow = exts[3]
        if nchwc:
            inner = max(d for d in divisors(ow) if d <= 4)  # a few vectors of cb
        else:
            inner = best_vector_width(ow, ctx.lanes) if ow >= 4 else 1
            inner = inner if inner <= 2 * ctx.lanes else 1
        work = math.prod(exts)
        nc = exts[0] * exts[1]
        parallel = 0 if work < PARALLEL_MIN_WORK else (2 if nc >= 4 * ctx.cores else 3)
        values = {"ow_split": (ow // inner, inner), "parallel": parallel,
                  "unroll_window": exts[-1] * exts[-2] <= 16}
        if "pad" in space:
            # a plane that fits in L2 is best padded under the (n, c) loop
            h_pad = exts[2] * exts[-2] * (4 if nchwc else 1)
            values["pad"] = "compute_at" if parallel == 2 and h_pad * 4 < ctx.info.l2_bytes else "root"
        return space.from_json(values)

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        sch, block = ctx.sch, ctx.block
        if _is_global_pool(sch, block):
            self._rows.apply(ctx, config)
            return
        pad = padding_producer(sch, block)
        pad_mode = config["pad"] if "pad" in config else "root"
        if pad is not None and pad_mode == "inline":
            sch.compute_inline(pad)
            pad = None
        loops = sch.get_loops(block)
        nchwc = len(loops) == 7
        if nchwc:
            n, c, oh, ow, cb, rh, rw = loops
        elif len(loops) == 6:
            n, c, oh, ow, rh, rw = loops
            cb = None
        else:
            raise ValueError("pool template expects (n, c, oh, ow, [cb,] rh, rw)")
        _, inner = config["ow_split"]
        owo, owi = sch.split(ow, [None, inner])
        sch.reorder(n, c, oh, owo, rh, rw, owi, *([cb] if cb is not None else []))
        depth = config["parallel"]
        nc = sch.fuse(n, c)
        outer = sch.fuse(nc, oh) if depth == 3 else nc
        epilogue = elementwise_consumer(sch, block)
        if epilogue is not None:
            sch.reverse_compute_at(epilogue, owo, preserve_unit_loops=True)
            tail = sch.get_loops(epilogue)[-1]
            if static_extent(sch, tail) > 1 and (nchwc or inner > 1):
                sch.vectorize(tail)
        if pad is not None:
            if pad_mode == "compute_at":
                sch.compute_at(pad, outer)
            elif depth:
                ploops = sch.get_loops(pad)
                sch.parallel(sch.fuse(ploops[0], ploops[1]))
            # the padded copy along cb, its contiguous axis: a scalar copy of the
            # plane took as long as the pool itself
            pad_tail = sch.get_loops(pad)[-1]
            if nchwc and static_extent(sch, pad_tail) > 1:
                sch.vectorize(pad_tail)
        if depth:
            sch.parallel(outer)
        if config["unroll_window"]:
            sch.unroll(rh)
            sch.unroll(rw)
        if nchwc:
            if inner > 1:
                sch.unroll(owi)
            sch.vectorize(cb)
        elif inner > 1:
            sch.vectorize(owi)  # before decompose: the update block alone is not "complete"
        init = sch.decompose_reduction(block, rh)
        tail = sch.get_loops(init)[-1]
        if static_extent(sch, tail) > 1 and (nchwc or inner > 1):
            sch.vectorize(tail)


register_template(PoolTemplate())
