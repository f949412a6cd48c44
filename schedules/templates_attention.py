"""The CPU template of nn.attention (frontend/op_defs/attention.py): flash attention
with the scores of a block of query rows kept in cache.

Loop nest (one kernel):
    attention_keys at the root: K^T with the keys padded to whole KEY_BLOCKs, parallel
    parallel(batch x heads, block of `rows` query rows)
      scores (rows x padded keys): register tiles of score_rows x score_width keys,
        the keys vectorized, the head dimension reduced innermost but for the tile;
        the logits (scale, mask, -inf on the padded keys) computed on the finished tile
      row max, exp, exp-sum over the block's logits (vectorized, max and sum by
        lanes: rfactor)
      P V: register tiles of out_rows x out_width (head dimension vectorized), the keys
        reduced (unroll_keys at a time); the division by the exp-sum on the finished tile
The block's logits and exps (rows x padded keys, 4 bytes each) stay in L2: one pass
over the keys, no rescaling (online softmax) needed. Q K^T reads K^T[D, N] along the
keys and P V reads V[N, Dv] along its rows, both contiguous.

Knobs: rows (query rows per block: divisors of the padded M), score_rows / out_rows
(register rows of the two products: divisors of rows, a space constraint),
score_width (keys per score tile: whole vectors dividing the padded keys),
score_order ("keys": the key tiles outside the row tiles, a K^T panel in L1 for every
row tile; "rows": the reverse), out_width (columns of V per tile: divisors of Dv of
one to four vectors), unroll_keys (P V's key loop: 1, 2 or 4 dividing N).
The fallback: the register tiles the vector registers hold, and the most rows whose
logits and exps fit half the target's L2 while every core gets a few blocks.
"""

from __future__ import annotations

import math

from tecc.frontend.op_defs.attention import padded_keys
from tecc.schedules.blocks import (
    EXP_BLOCKS,
    PARALLEL_MIN_WORK,
    accumulator_budget,
    block_name,
    divisors,
    reduction_loops,
    root_blocks,
    static_extents,
    vector_width_options,
    vectorize_tail,
)
from tecc.schedules.space import Config, ConfigSpace, nearest_config
from tecc.schedules.template import ScheduleContext, Template, register_template
from tvm.s_tir.schedule import Schedule

ROW_TILES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 14)
# query rows per block offered to the tuner: divisors of M in this range (M itself
# where none is)
MAX_BLOCK_ROWS = 256


def attention_dims(ctx: ScheduleContext) -> tuple[int, int, int, int, int]:
    """(batch x heads, M, N, D, Dv) from the anchor's loops (batch..., M, Dv, N) and
    the scores block's reduction (D)."""
    *batch, m, dv, n = static_extents(ctx.sch, ctx.sch.get_loops(ctx.block))
    d = static_extents(ctx.sch, ctx.sch.get_loops(ctx.sch.get_sblock("attention_scores")))[-1]
    return math.prod(batch), m, n, d, dv


def row_blocks(m: int) -> list[int]:
    """Query rows per block: the divisors of M up to MAX_BLOCK_ROWS (M itself, one
    block per head, where no divisor above 1 is that small)."""
    opts = [r for r in divisors(m) if r <= MAX_BLOCK_ROWS]
    return opts if len(opts) > 1 else sorted({1, m})


def score_widths(npad: int, lanes: int) -> list[int]:
    """Keys per score tile: one to four vectors dividing the padded keys."""
    return [w * lanes for w in (1, 2, 3, 4) if npad % (w * lanes) == 0] or [npad]


def out_widths(dv: int, lanes: int) -> list[int]:
    """Columns of V per P V tile: divisors of Dv of one to four vectors (Dv itself
    where it is narrower than a vector)."""
    return [w for w in vector_width_options(dv, lanes) if w >= min(lanes, dv)]


def _tile_fits(config: Config) -> bool:
    return (config["rows"] % config["score_rows"] == 0
            and config["rows"] % config["out_rows"] == 0)


def tile_rows(rows: int, vecs: int, lanes: int) -> int:
    """Register rows for a tile of `vecs` vectors: the most the accumulators' budget
    holds that divide `rows`."""
    budget = accumulator_budget(lanes, vecs) // vecs
    return max(t for t in ROW_TILES if t <= budget and rows % t == 0) if rows > 1 else 1


class AttentionTemplate(Template):
    name = "attention"

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        _, m, n, _, dv = attention_dims(ctx)
        lanes = ctx.lanes
        space = ConfigSpace()
        rows = row_blocks(m)
        space.define_choice("rows", rows)
        tiles = [t for t in ROW_TILES if any(r % t == 0 for r in rows)]
        space.define_choice("score_rows", tiles)
        space.define_choice("score_width", score_widths(padded_keys(n), lanes))
        space.define_choice("score_order", ["rows", "keys"])
        space.define_choice("out_rows", tiles)
        space.define_choice("out_width", out_widths(dv, lanes))
        space.define_choice("unroll_keys", [u for u in (1, 2, 4) if n % u == 0])
        space.add_constraint(_tile_fits, "register rows must divide the block's rows")
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        bh, m, n, _, dv = attention_dims(ctx)
        lanes, npad = ctx.lanes, padded_keys(n)
        widths = space.options("score_width")
        width = max(w for w in widths if w <= 2 * lanes) if min(widths) <= 2 * lanes \
            else widths[0]
        out_width = max(out_widths(dv, lanes))
        # the block's logits and exps in half the L2, and at least 4 blocks per core
        budget = ctx.info.l2_bytes // 2 // (2 * npad * 4)
        rows_opts = space.options("rows")
        enough = [r for r in rows_opts if r <= budget and bh * (m // r) >= 4 * ctx.cores]
        # a block of rows a multiple of the register tiles: prefer rows with a tall
        # divisor for both products
        def merit(r: int) -> tuple:
            s = tile_rows(r, max(1, width // lanes), lanes)
            o = tile_rows(r, max(1, -(-out_width // lanes)), lanes)
            return (min(s, 6) + min(o, 6), r)

        rows = max(enough or [min(rows_opts)], key=merit)
        values = {"rows": rows,
                  "score_rows": tile_rows(rows, max(1, width // lanes), lanes),
                  "score_width": width,
                  "score_order": "keys",
                  "out_rows": tile_rows(rows, max(1, -(-out_width // lanes)), lanes),
                  "out_width": out_width,
                  "unroll_keys": max(u for u in (1, 2, 4) if n % u == 0)}
        return nearest_config(space, values)

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        if not _tile_fits(config):
            raise ValueError(f"register rows do not divide {config['rows']} rows")
        sch, anchor = ctx.sch, ctx.block
        bh, m, n, _, dv = attention_dims(ctx)
        npad = padded_keys(n)
        rows, width, out_width = config["rows"], config["score_width"], config["out_width"]
        if m % rows or npad % width or dv % out_width or n % config["unroll_keys"]:
            raise ValueError(f"config {config.to_json()} does not divide the extents")
        lanes = ctx.lanes
        names = {block_name(sch, b): b for b in root_blocks(sch)}
        exp_name = next(b for b in names if b in EXP_BLOCKS)

        # The output drives the nest (TVM places a block under a loop only where its
        # producers, or its consumers, already are): its rows split into blocks
        # (parallel with batch x heads) and register tiles; P V's accumulator tile
        # computed under each output tile, the block's softmax and scores under the
        # block loop.
        out = sch.get_sblock("attention_out")
        sch.compute_inline(sch.cache_write(anchor, 0, "local"))
        *batch, i, d = sch.get_loops(out)
        io, ii = sch.split(i, [None, rows])
        i_o, i_r = sch.split(ii, [None, config["out_rows"]])
        d_o, d_v = sch.split(d, [None, out_width])
        sch.reorder(*batch, io, i_o, d_o, i_r, d_v)
        outer = sch.fuse(*batch, io) if batch else io
        sch.compute_at(anchor, d_o, preserve_unit_loops=True)
        # the row max and exp-sum by `lanes` partial results (rfactor, at the root:
        # TVM rfactors only a block alone under its loops)
        partials = {name: _rfactor_lanes(sch, sch.get_sblock(name), lanes)
                    for name in ("softmax_max", "softmax_expsum")}
        for block in (sch.get_sblock("softmax_expsum"), partials["softmax_expsum"],
                      sch.get_sblock(exp_name), sch.get_sblock("softmax_max"),
                      partials["softmax_max"], sch.get_sblock("attention_logits")):
            sch.compute_at(block, outer, preserve_unit_loops=True)
        if bh * m * n * dv >= PARALLEL_MIN_WORK:
            sch.parallel(outer)
        sch.unroll(i_r)
        sch.vectorize(d_v)
        # P V's tile: the keys reduced outermost (unroll_keys at a time), the tile's
        # rows unrolled, its columns vectorized
        a_r, a_d, a_j = sch.get_loops(anchor)[-3:]
        key_loops = [a_j]
        if config["unroll_keys"] > 1:
            key_loops = list(sch.split(a_j, [None, config["unroll_keys"]]))
        sch.reorder(*key_loops, a_r, a_d)
        for lp in key_loops[1:]:
            sch.unroll(lp)
        sch.unroll(a_r)
        sch.vectorize(a_d)
        init = sch.decompose_reduction(anchor, key_loops[0])
        vectorize_tail(sch, init, lanes)
        _schedule_scores(sch, config, lanes, ragged=npad != n)
        for rf in partials.values():
            _finish_partials(sch, rf)
        _vectorize_last(sch, sch.get_sblock(exp_name), lanes)
        _schedule_keys(sch, sch.get_sblock("attention_keys"), lanes, ragged=npad != n)


def _schedule_scores(sch: Schedule, config: Config, lanes: int, ragged: bool) -> None:
    """Q K^T of the block in register tiles (score_rows x score_width keys, the keys
    vectorized) under the logits' tiles, which take the finished tile from registers;
    over padded keys the last tile (with its -inf test) is partitioned off, the
    others have no test."""
    scores = sch.get_sblock("attention_scores")
    logits = sch.get_sblock("attention_logits")
    sch.compute_inline(sch.cache_write(scores, 0, "local"))
    r, k = sch.get_loops(logits)[-2:]
    r_o, r_i = sch.split(r, [None, config["score_rows"]])
    k_o, k_v = sch.split(k, [None, config["score_width"]])
    if config["score_order"] == "keys":  # a K^T panel in L1 for every row tile
        sch.reorder(k_o, r_o, r_i, k_v)
        sch.compute_at(scores, r_o, preserve_unit_loops=True)
    else:  # a tile's Q rows in L1 for every key panel
        sch.reorder(r_o, k_o, r_i, k_v)
        sch.compute_at(scores, k_o, preserve_unit_loops=True)
    sch.unroll(r_i)
    vectorize_tail(sch, logits, lanes)
    s_r, s_k, s_d = sch.get_loops(scores)[-3:]
    sch.reorder(s_d, s_r, s_k)
    sch.unroll(s_r)
    sch.vectorize(s_k)
    init = sch.decompose_reduction(scores, s_d)
    vectorize_tail(sch, init, lanes)
    if ragged:
        sch.annotate(k_o, "pragma_loop_partition_hint", 1)


def _rfactor_lanes(sch: Schedule, block, lanes: int):
    """A row reduction over the padded keys (a multiple of the lanes): `lanes` partial
    results per row (the rfactor block, returned), then reduced."""
    k = sch.get_loops(block)[-1]
    _, k_v = sch.split(k, [None, lanes])
    return sch.rfactor(k_v, len(sch.get(block).writes[0].source.shape))


def _finish_partials(sch: Schedule, rf) -> None:
    """An rfactor block under the block loop: its lanes innermost and vectorized, its
    init before the key loop."""
    # compute_at regenerated its loops in block-variable order: the lanes (the rf
    # variable) first, then the rows, then the keys
    _, lane, *rows = sch.get_loops(rf)
    (k_o,) = reduction_loops(sch, rf)
    rows = [lp for lp in rows if not sch.get(lp).same_as(sch.get(k_o))]
    sch.reorder(*rows, k_o, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(rf, k_o)


def _vectorize_last(sch: Schedule, block, lanes: int) -> None:
    *_, k = sch.get_loops(block)
    _, k_v = sch.split(k, [None, lanes])
    sch.vectorize(k_v)


def _schedule_keys(sch: Schedule, block, lanes: int, ragged: bool) -> None:
    """K^T padded, at the root: parallel over batch x heads, vectorized along the keys
    (the padded tail partitioned off)."""
    *batch, dd, k = sch.get_loops(block)
    k_o, k_v = sch.split(k, [None, lanes])
    sch.vectorize(k_v)
    if ragged:
        sch.annotate(k_o, "pragma_loop_partition_hint", 1)
    if batch:
        top = sch.fuse(*batch) if len(batch) > 1 else batch[0]
        if math.prod(static_extents(sch, sch.get_loops(block))) >= PARALLEL_MIN_WORK:
            sch.parallel(top)


register_template(AttentionTemplate())

