"""Templates for the blocked (NCHW{c}c) convolutions, direct algorithm.

conv2d (NCHW, without the layout pass): a register tile of output channels x columns.
conv2d_NCHWc: data [N, C/ic, H, W, ic] x kernel [OC/oc, IPG/ic, KH, KW, ic, oc].
    Loop nest: parallel(n, oc_chunk, oh_outer) / ow_outer /
               reduction (ic_chunk, kh, kw | kh, kw, ic_chunk) / ic /
               oh_inner (tile_oh, unrolled) / ow_inner (tile_ow, unrolled) /
               oc (vectorized)
    The tile_oh x tile_ow x (oc_bn / lanes) accumulators stay in registers; the fused
    epilogue runs under ow_outer on the finished tile. tile_ow need not divide the
    output width: the last column tile is partitioned off (TIR's LoopPartition, from
    a hint on ow_outer), so the full tiles run without bounds checks and the widths
    of ResNet (56, 28, 14, 7) all get the 6-column x 2-vector (12 accumulator) tile
    AVX2's 16 registers hold.
depthwise_conv2d_NCHWc: data [N, C/c, H, W, c] x kernel [C/c, 1, KH, KW, 1, c]:
    parallel(n, c_chunk, oh_outer) / ow_outer / kh, kw / oh_inner / ow_inner / c.
    Its zero padding is a knob ("pad", PAD_MODES): read through a bounds check by
    default, since a depthwise conv is bound by memory and a padded copy doubles it.

As AutoTVM did, the workload key is in NCHW terms (data NCHW shape, OIHW kernel
shape, dtype, strides, padding, dilation, groups) and the channel blocks are knobs
("ic_bn", "oc_bn"; "c_bn" for depthwise). The blocks are decided before the kernel
exists, by the layout pass (graph_opt/layout.py), which the driver asks through a
callback for the blocks of the layer's tuned config; a config whose blocks differ
from the kernel's actual layout is refused (Template.accepts) and the fallback,
which reads the actual blocks, used instead.
"""

from __future__ import annotations

import math
from typing import Any

from tecc.frontend.ir import Call
from tecc.frontend.op_defs.nn import nchwc_kernel_dims, winograd_tile
from tecc.graph_opt.layout import default_out_block_for, in_block, out_block_candidates
from tecc.schedules.blocks import (
    accumulator_budget,
    divisors,
    largest_divisor,
    padding_producer,
    tile_epilogue_parallel,
    vectorize_tail,
)
from tecc.schedules.space import Config, ConfigSpace, nearest_config
from tecc.schedules.template import ScheduleContext, Template, register_template

MAX_TILE_OW = 28  # AVX-512's accumulator budget with one vector per column
# Where the zero padding of a padded conv is produced: "root" (the whole padded
# input, once, before the conv), "rows" (the rows one parallel task reads, under that
# task's loop: in cache when the conv reads them), "inline" (no buffer; a bounds check
# on each read).
PAD_MODES = ["root", "rows", "inline"]


def _pad4(padding: Any) -> list[int]:
    p = [int(v) for v in padding]
    return [p[0], p[1], p[0], p[1]] if len(p) == 2 else p


def conv_workload(name: str, call: Call, tile: int | None = None) -> dict[str, Any]:
    """NCHW-terms workload of an nn.conv2d (NCHW) or nn.conv2d_NCHWc call; a Winograd
    conv2d_NCHWc (or an NCHW conv given its Winograd `tile`) adds "winograd_tile"."""
    data, kernel = call.args
    if call.op == "nn.conv2d_NCHWc":
        n, cc, h, w, ic = data.shape
        tile = winograd_tile(call.attrs)
        occ, ipc, kh, kw, kic, oc = nchwc_kernel_dims(kernel.shape, call.attrs)
        data_shape = [n, cc * ic, h, w]
        kernel_shape = [occ * oc, ipc * kic, kh, kw]
    else:
        data_shape, kernel_shape = list(data.shape), list(kernel.shape)
    attrs = call.attrs
    extra = {"winograd_tile": tile} if tile else {}
    return {
        "template": name,
        "data": [int(d) for d in data_shape],
        "kernel": [int(d) for d in kernel_shape],
        "dtype": str(data.dtype),
        "strides": [int(s) for s in attrs["strides"]],
        "padding": _pad4(attrs["padding"]),
        "dilation": [int(d) for d in attrs["dilation"]],
        "groups": int(attrs["groups"]),
        **extra,
    }


def conv_dims(wl: dict[str, Any]) -> dict[str, int]:
    n, c, h, w = wl["data"]
    o, ipg, kh, kw = wl["kernel"]
    pt, pl, pb, pr = wl["padding"]
    sh, sw = wl["strides"]
    dh, dw = wl["dilation"]
    g = wl["groups"]
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    return {"n": n, "c": c, "o": o, "ipg": ipg, "opg": o // g, "kh": kh, "kw": kw,
            "oh": oh, "ow": ow, "groups": g}


def block_options(channels: int, lanes: int) -> list[int]:
    return [b for b in sorted(out_block_candidates(lanes)) if channels % b == 0]


def ow_tiles(ow: int) -> list[int]:
    return list(range(1, min(ow, MAX_TILE_OW) + 1))


# A depthwise conv loads a data vector for each FMA (no broadcast value shared by the
# tile): past 8 accumulators its register tile only adds spills and loads in flight.
# Single core, fallback configs, EfficientNet-B0's and MobileNetV2's layers: AVX-512
# (one vector per column) 8 columns beat 28 by 1.3-2.6x (3x3 on 112x112x32 0.157 vs
# 0.235 ms, 5x5 on 28x28x240 0.125 vs 0.226); AVX2 (two) 4 columns beat 6 by 1.1-1.8x.
DEPTHWISE_ACCUMULATORS = 8


# A conv that reads one input channel per step (ic_bn 1: the stem convs on RGB) with
# its unrolled kw taps overlapping from column to column (kw > stride) loads each
# input value once for several taps; LLVM keeps those values live across the tile, so
# a full accumulator tile spills. Half the budget measured faster on AVX-512 (2
# threads, fallback configs, results/input_conv_tiles.md): ResNet's 7x7/2 stem 1.20x,
# MobileNetV2's 3x3/2 1.21x. Not below MIN_FMAS_IN_FLIGHT accumulators (two FMA ports
# of 4 cycles' latency): AVX2's half tile, 6, ran its 7x7 stem 0.84x.
TAP_SHARING_SHARE = 0.5
MIN_FMAS_IN_FLIGHT = 8


def default_ow_tile(ow: int, oc_bn: int, lanes: int, accumulators: int | None = None,
                    share: float = 1.0) -> int:
    """The widest column tile the accumulator budget (or `accumulators` vectors)
    allows, evened out over the width so that the tail tile is not a sliver (7
    columns: 4 + 3, not 6 + 1); `share` of the budget where that keeps
    MIN_FMAS_IN_FLIGHT accumulators."""
    vecs = max(1, -(-oc_bn // lanes))
    budget = accumulator_budget(lanes, vecs) if accumulators is None else accumulators
    if int(budget * share) >= MIN_FMAS_IN_FLIGHT:
        budget = int(budget * share)
    widest = max(1, min(ow, budget // vecs))
    tiles = -(-ow // widest)
    return -(-ow // tiles)


def _define_blocks(space: ConfigSpace, d: dict[str, int], lanes: int) -> None:
    """The channel-block knobs ic_bn and oc_bn of a (non-depthwise) NCHWc conv."""
    oc_opts = block_options(d["opg"], lanes)
    if not oc_opts:
        raise ValueError(f"{d['opg']} output channels per group have no vector block")
    # No vector block: the layout pass's block, or one, which reads NCHW data in
    # place (no layout_transform of the model's input); for the few channels of an
    # RGB input one is the layout pass's block, and all of them the other choice.
    block = in_block(d["ipg"], lanes)
    space.define_choice("ic_bn", block_options(d["ipg"], lanes)
                        or sorted({block if block > 1 else d["ipg"], 1}))
    space.define_choice("oc_bn", oc_opts)


def _default_blocks(d: dict[str, int], lanes: int) -> tuple[int, int]:
    """(ic_bn, oc_bn) the layout pass picks for an NCHWc conv without a record."""
    return in_block(d["ipg"], lanes), default_out_block_for(d["opg"], lanes) or lanes


class _ConvBase(Template):
    def workload(self, call: Call, kind: str) -> dict[str, Any]:
        return conv_workload(self.name, call)

    def _workload(self, ctx: ScheduleContext) -> dict[str, Any]:
        if ctx.workload is None:
            raise ValueError(f"{self.name} needs the anchor's workload (lower from IR)")
        return ctx.workload

    def _buffer_blocks(self, ctx: ScheduleContext) -> tuple[int, int]:
        """(input block, output block) of the kernel at hand."""
        block = ctx.sch.get(ctx.block)
        out_block = int(block.writes[0].source.shape[-1])
        kernel = max(block.reads, key=lambda r: len(r.source.shape)).source
        return int(kernel.shape[4]), out_block


class Conv2dNCHWcTemplate(_ConvBase):
    name = "conv2d_NCHWc"
    lane_knobs = ("ic_bn", "oc_bn")

    def space_for(self, wl: dict[str, Any], lanes: int) -> ConfigSpace:
        d = conv_dims(wl)
        space = ConfigSpace()
        _define_blocks(space, d, lanes)
        space.define_choice("tile_ow", ow_tiles(d["ow"]))
        space.define_choice("tile_oh", [1, 2] if d["oh"] % 2 == 0 else [1])
        space.define_bool("unroll_kw")
        space.define_choice("reduce_order", ["icc_kh_kw", "kh_kw_icc"])
        return space

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        return self.space_for(self._workload(ctx), ctx.lanes)

    def fallback_values(self, wl: dict[str, Any], lanes: int,
                        blocks: tuple[int, int] | None = None) -> dict[str, Any]:
        d = conv_dims(wl)
        ic_bn, oc_bn = blocks or _default_blocks(d, lanes)
        taps_share_inputs = ic_bn == 1 and d["kw"] > wl["strides"][1]
        share = TAP_SHARING_SHARE if taps_share_inputs else 1.0
        return {"ic_bn": ic_bn, "oc_bn": oc_bn,
                "tile_ow": default_ow_tile(d["ow"], oc_bn, lanes, share=share),
                "tile_oh": 1, "unroll_kw": d["kw"] <= 7, "reduce_order": "icc_kh_kw"}

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        values = self.fallback_values(self._workload(ctx), ctx.lanes, self._buffer_blocks(ctx))
        return nearest_config(space, values)

    def accepts(self, ctx: ScheduleContext, config: Config) -> bool:
        return (config["ic_bn"], config["oc_bn"]) == self._buffer_blocks(ctx)

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        sch, block = ctx.sch, ctx.block
        if not self.accepts(ctx, config):
            raise ValueError("config blocks differ from the kernel's layout")
        loops = sch.get_loops(block)
        if len(loops) != 9:
            raise ValueError("conv2d_NCHWc template expects n, occ, oh, ow, oc, icc, kh, kw, ic")
        n, occ, oh, ow, ocb, icc, kh, kw, ic = loops
        red = [icc, kh, kw] if config["reduce_order"] == "icc_kh_kw" else [kh, kw, icc]
        _register_tile(ctx, config, n, occ, oh, ow, ocb, red, [ic], kw)


class DepthwiseNCHWcTemplate(_ConvBase):
    name = "depthwise_conv2d_NCHWc"
    lane_knobs = ("c_bn",)

    def space_for(self, wl: dict[str, Any], lanes: int) -> ConfigSpace:
        d = conv_dims(wl)
        space = ConfigSpace()
        opts = block_options(d["c"], lanes)
        if not opts:
            raise ValueError(f"{d['c']} channels have no vector block")
        space.define_choice("c_bn", opts)
        space.define_choice("tile_ow", ow_tiles(d["ow"]))
        space.define_choice("tile_oh", [1, 2] if d["oh"] % 2 == 0 else [1])
        space.define_bool("unroll_kw")
        if any(wl["padding"]):
            space.define_choice("pad", PAD_MODES)
        return space

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        return self.space_for(self._workload(ctx), ctx.lanes)

    def fallback_values(self, wl: dict[str, Any], lanes: int,
                        block: int | None = None) -> dict[str, Any]:
        d = conv_dims(wl)
        if block is None:
            block = default_out_block_for(d["c"], lanes) or lanes
        values = {"c_bn": block,
                  "tile_ow": default_ow_tile(d["ow"], block, lanes, DEPTHWISE_ACCUMULATORS),
                  "tile_oh": 1, "unroll_kw": d["kw"] <= 7}
        if any(wl["padding"]):
            # nine loads per output vector: the bounds check is cheaper than a second
            # pass over memory (3-4x on MobileNetV2's stride-2 layers)
            values["pad"] = "inline"
        return values

    def _block(self, ctx: ScheduleContext) -> int:
        return int(ctx.sch.get(ctx.block).writes[0].source.shape[-1])

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        return nearest_config(space, self.fallback_values(self._workload(ctx), ctx.lanes,
                                                               self._block(ctx)))

    def accepts(self, ctx: ScheduleContext, config: Config) -> bool:
        return config["c_bn"] == self._block(ctx)

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        sch, block = ctx.sch, ctx.block
        if not self.accepts(ctx, config):
            raise ValueError("config block differs from the kernel's layout")
        loops = sch.get_loops(block)
        if len(loops) != 7:
            raise ValueError("depthwise template expects n, cc, oh, ow, c, kh, kw")
        n, cc, oh, ow, cb, kh, kw = loops
        _register_tile(ctx, config, n, cc, oh, ow, cb, [kh, kw], [], kw)


def _rows_first(sch, block) -> bool:
    """Whether the cores split the output by rows (each core reads its band of the
    input and the whole kernel) rather than by channel blocks (the whole input and its
    share of the kernel): rows unless the kernel is the larger of the two. Split by
    rows, consecutive layers also give each core the same band of every activation,
    which it then finds in its own L2."""
    reads = [r.source for r in sch.get(block).reads]
    kernel = max(reads, key=lambda b: len(b.shape))
    data = next(b for b in reads if len(b.shape) == 5 and not b.same_as(kernel))
    return math.prod(int(d) for d in kernel.shape) <= math.prod(int(d) for d in data.shape)


def _register_tile(ctx: ScheduleContext, config: Config, n, c_outer, oh, ow, c_block,
                   reduction: list, inner: list, kw) -> None:
    """The loop nest both NCHWc templates share: parallel(n, oh_o, c_outer) (or
    n, c_outer, oh_o, see _rows_first) / ow_o /
    reduction / inner / oh_i, ow_i (unrolled register tile) / c_block (vectorized),
    the fused epilogue computed per tile."""
    sch, block = ctx.sch, ctx.block
    exts = ctx.loop_extents()
    if any(e is None for e in exts):
        raise ValueError("symbolic extents")
    pad = padding_producer(sch, block)
    pad_mode = config["pad"] if "pad" in config else "root"
    if pad is not None and pad_mode == "inline":
        sch.compute_inline(pad)
    owb, ohb = config["tile_ow"], config["tile_oh"]
    if exts[2] % ohb:
        raise ValueError("tile_oh must divide the output height")
    acc = sch.cache_write(block, 0, "local")
    owo, owi = sch.split(ow, [None, owb])
    oho, ohi = sch.split(oh, [None, ohb])
    outer = [n, oho, c_outer] if _rows_first(sch, block) else [n, c_outer, oho]
    sch.reorder(*outer, owo, *reduction, *inner, ohi, owi, c_block)
    target, top = tile_epilogue_parallel(sch, acc, owo, outer, math.prod(exts))
    if pad is not None and pad_mode == "rows":
        sch.compute_at(pad, top, preserve_unit_loops=True)
        vectorize_tail(sch, pad, ctx.lanes)
    if exts[3] % owb:
        # the bounds check of the tail tile would sit on every FMA of every tile
        sch.annotate(owo, "pragma_loop_partition_hint", 1)
    sch.unroll(owi)
    if ohb > 1:
        sch.unroll(ohi)
    if config["unroll_kw"]:
        sch.unroll(kw)
    sch.vectorize(c_block)
    init = sch.decompose_reduction(block, reduction[0])
    vectorize_tail(sch, target, ctx.lanes)
    vectorize_tail(sch, init, ctx.lanes)


class WinogradNCHWcTemplate(Conv2dNCHWcTemplate):
    """conv2d_NCHWc by Winograd's F(m x m, 3 x 3) (frontend/op_defs/nn.py). The anchor is
    the alpha^2 GEMMs: parallel(alpha, alpha, oc_chunk) / tile rows / C (reduction) /
    tile_p rows (unrolled) / oc (vectorized), tile_p x oc_bn / lanes accumulators in
    registers. The input transform runs before it, a parallel task per (tile, input
    chunk) with its d B rows in cache; the output transform after it, per (tile,
    output chunk); both unrolled over the transform's points and vectorized."""

    name = "conv2d_winograd_NCHWc"

    def space_for(self, wl: dict[str, Any], lanes: int) -> ConfigSpace:
        space = ConfigSpace()
        _define_blocks(space, conv_dims(wl), lanes)
        space.define_choice("tile_p", list(range(1, 9)))
        space.define_choice("input_order", ["tile_chunk", "chunk_tile"])
        return space

    def fallback_values(self, wl: dict[str, Any], lanes: int,
                        blocks: tuple[int, int] | None = None) -> dict[str, Any]:
        ic_bn, oc_bn = blocks or _default_blocks(conv_dims(wl), lanes)
        vecs = max(1, -(-oc_bn // lanes))
        tile_p = max(1, min(8, accumulator_budget(lanes, vecs) // vecs))
        return {"ic_bn": ic_bn, "oc_bn": oc_bn, "tile_p": tile_p, "input_order": "tile_chunk"}

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        sch, gemm = ctx.sch, ctx.block
        if not self.accepts(ctx, config):
            raise ValueError("config blocks differ from the kernel's layout")
        inp = _block_named(sch, sch.get_producers(gemm), "winograd_input")
        rows = _block_named(sch, sch.get_producers(inp), "winograd_input_rows")
        out = _block_named(sch, sch.get_consumers(gemm), "winograd_output_rows")
        tiles = _block_named(sch, sch.get_consumers(out), "winograd_output")
        _transform(sch, inp, rows, True, config["input_order"] == "chunk_tile")
        if not _output_in_consumer(sch, tiles, out):
            _transform(sch, tiles, out, False, False)
        # the GEMMs
        e, nu, p, o, ob, rcc, rc = sch.get_loops(gemm)
        tile_rows = int(sch.get(p).extent)
        p_out, p_in = sch.split(p, [None, config["tile_p"]])
        if tile_rows % config["tile_p"]:
            # the bounds check of the last tile rows would sit on every FMA
            sch.annotate(p_out, "pragma_loop_partition_hint", 1)
        acc = sch.cache_write(gemm, 0, "local")
        sch.reorder(e, nu, o, p_out, rcc, rc, p_in, ob)
        sch.reverse_compute_at(acc, p_out, preserve_unit_loops=True)
        sch.parallel(sch.fuse(e, nu, o))
        sch.unroll(p_in)
        sch.vectorize(ob)
        init = sch.decompose_reduction(gemm, rcc)
        vectorize_tail(sch, init, ctx.lanes)
        vectorize_tail(sch, acc, ctx.lanes)


def _block_named(sch, blocks, name: str):
    for b in blocks:
        if sch.get(b).name_hint == name:
            return b
    raise ValueError(f"no {name} block next to the Winograd GEMM")


def _output_in_consumer(sch, tiles, rows) -> bool:
    """The output transform computed tile by tile inside its consumer (the gather of
    output tiles, with the fused epilogue inlined), so that each finished m x m tile
    goes through the epilogue from cache. False (nothing changed) when the consumer
    is not a single 5-loop NCHWc block."""
    consumers = sch.get_consumers(tiles)
    if len(consumers) != 1 or len(sch.get_loops(consumers[0])) != 5:
        return False
    (final,) = consumers
    m = int(sch.get(tiles).writes[0].source.shape[2])
    b, o, y, x, ob = sch.get_loops(final)
    yo, yi = sch.split(y, [None, m])
    xo, xi = sch.split(x, [None, m])
    sch.reorder(b, o, yo, xo, yi, xi, ob)
    top = sch.fuse(b, o, yo)
    sch.parallel(top)
    sch.compute_at(tiles, xo, preserve_unit_loops=True)
    sch.compute_at(rows, xo, preserve_unit_loops=True)
    for block in (rows, tiles):
        *_, pt0, pt1, block_loop, red = sch.get_loops(block)
        _unroll_points(sch, pt0, pt1, red, block_loop)
    sch.unroll(yi)
    sch.unroll(xi)
    sch.vectorize(ob)
    return True


def _transform(sch, second, first, points_first: bool, chunk_outer: bool) -> None:
    """One Winograd transform: `second` (the second pass, loops (pt0, pt1, tile, chunk,
    block, reduction) if `points_first`, else (tile, chunk, pt0, pt1, block,
    reduction)) made parallel over (tile, chunk), `first` computed under it; both
    unrolled over the points, the channel block vectorized."""
    loops = sch.get_loops(second)
    if points_first:
        pt0, pt1, tile, chunk, block, red = loops
    else:
        tile, chunk, pt0, pt1, block, red = loops
    outer = [chunk, tile] if chunk_outer else [tile, chunk]
    sch.reorder(*outer, pt0, pt1, red, block)
    top = sch.fuse(*outer)
    sch.parallel(top)
    sch.compute_at(first, top, preserve_unit_loops=True)
    # first's loops under top: (tile, chunk, a, point, block, reduction)
    *_, fa, fpt, fblock, fred = sch.get_loops(first)
    _unroll_points(sch, fa, fpt, fred, fblock)
    _unroll_points(sch, pt0, pt1, red, block)


def _unroll_points(sch, pt0, pt1, red, block) -> None:
    """A transform pass's loops ordered (point, point, reduction, channel block): the
    points and the reduction unrolled (the matrices' zeros and ones fold away), the
    channel block vectorized."""
    sch.reorder(pt0, pt1, red, block)
    for lp in (pt0, pt1, red):
        sch.unroll(lp)
    sch.vectorize(block)


class Conv2dNCHWTemplate(_ConvBase):
    """The plain NCHW conv (what a graph without the layout pass keeps, e.g. at
    opt_level 0): parallel(n, oc_o, oh) / ow_o / ic, kh, kw / oc_i (unrolled) /
    ow_i (vectorized); the accumulator local, the epilogue under ow_o.
    Knobs: oc_block (output channels per tile, a divisor of OC up to 16), ow_block
    (output columns per tile, a divisor of OW up to two vectors)."""

    name = "conv2d"

    def _dims(self, ctx: ScheduleContext) -> list[int]:
        exts = ctx.loop_extents()
        if len(exts) != 7 or any(e is None for e in exts):
            raise ValueError("conv2d template expects n, oc, oh, ow, ic, kh, kw (static)")
        return exts  # type: ignore[return-value]

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        _, oc, _, ow, *_ = self._dims(ctx)
        space = ConfigSpace()
        space.define_choice("oc_block", [d for d in divisors(oc) if d <= 16])
        space.define_choice("ow_block", [d for d in divisors(ow) if d <= 2 * ctx.lanes])
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        _, oc, _, ow, *_ = self._dims(ctx)
        # One vector of output columns (7 of 14, 8 of 56 on AVX2) times 8 output
        # channels: 8 accumulators; wider column tiles measured 2-5x slower (spills).
        return space.from_json({"oc_block": largest_divisor(oc, 8),
                                "ow_block": largest_divisor(ow, ctx.lanes)})

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        sch, block = ctx.sch, ctx.block
        exts = self._dims(ctx)
        n, oc, oh, ow, ic, kh, kw = sch.get_loops(block)
        ocb, owb = config["oc_block"], config["ow_block"]
        acc = sch.cache_write(block, 0, "local")
        oco, oci = sch.split(oc, [None, ocb])
        owo, owi = sch.split(ow, [None, owb])
        sch.reorder(n, oco, oh, owo, ic, kh, kw, oci, owi)
        target, _ = tile_epilogue_parallel(sch, acc, owo, [n, oco, oh], math.prod(exts))
        sch.unroll(oci)
        if owb >= 4:  # odd widths (7, 14) become LLVM vectors with a short tail
            sch.vectorize(owi)
        init = sch.decompose_reduction(block, ic)
        vectorize_tail(sch, target, ctx.lanes)
        vectorize_tail(sch, init, ctx.lanes)


CONV2D_NCHW = register_template(Conv2dNCHWTemplate())
CONV2D = register_template(Conv2dNCHWcTemplate())
DEPTHWISE = register_template(DepthwiseNCHWcTemplate())
WINOGRAD = register_template(WinogradNCHWcTemplate())


def conv_blocks(workload: dict[str, Any], config: dict[str, Any] | None, lanes: int
                ) -> tuple[int, int] | None:
    """(ic_bn, oc_bn) a conv workload's config wants (None: no config)."""
    if config is None:
        return None
    if workload["template"] == DepthwiseNCHWcTemplate.name:
        if "c_bn" not in config:
            return None
        return int(config["c_bn"]), int(config["c_bn"])
    if "ic_bn" not in config or "oc_bn" not in config:
        return None
    return int(config["ic_bn"]), int(config["oc_bn"])
