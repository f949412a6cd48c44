"""Templates for the dense-like anchors: C[b..., m, n] = sum_k A[b..., m, k] * B[..].

    dense         x[..., K] x W[N, K]; "dense_pack": W packed at compile time to
                  Wp[N/nb, K, nb] (graph_opt/dense_pack.py), nb = the "tile_n" knob
    matmul        A[M, K] x B[K, N] (B non-constant: attention); "matmul_nt": B[N, K]
    batch_matmul  the same with batch dimensions

Loop nest (order "mn_k"):
    parallel(batch, m_outer, n_outer)       fused
      m_tile (tile_mo register tiles), n_tile (tile_no register tiles)
        k_outer / k_inner (tile_k) [/ k unrolled by unroll_k]
          m_reg (tile_m, unrolled) / n_reg (tile_n, vectorized)
    accumulator in a local buffer; the fused epilogue runs under n_tile on the
    finished tile. Order "k_mn" puts k_outer above the m/n tiles (a bigger
    accumulator, each k panel of B reused across the tile); the epilogue then runs
    under n_outer.
B is read as [N/nb, K, nb] panels: packed at compile time (dense_pack), packed in the
kernel when B is [N, K] (matmul_nt, a dense on a non-constant weight), optionally
("pack_b") when B is [K, N].
Tiles need not divide the extents (197 rows, 1000 or 197 columns): the rows are padded
to whole register tiles (tile_m), the columns to whole blocks (tile_n), so that no
bounds test sits in the micro-kernel. A and B read in the kernel get zero-padded copies
(B's is its packing), a weight packed at compile time has zero rows to whole blocks
(graph_opt/dense_pack.py), and the result is sliced in the epilogue under the tile
(blocks.pad_iteration). A tail tile predicated instead ran at half the speed.
"""

from __future__ import annotations

import math
from typing import Any

from tecc.frontend.ir import Call
from tecc.graph_opt.dense_pack import default_dense_block, padded_dense_blocks, padded_waste
from tecc.schedules.blocks import (
    ANCHOR_ATTR,
    COMM_REDUCE,
    iter_types,
    pad_iteration,
    parallel_copy,
    tile_epilogue_parallel,
    vector_registers,
    vectorize_tail,
)
from tecc.schedules.space import Config, ConfigSpace, nearest_config
from tecc.schedules.template import ScheduleContext, Template, jsonable, register_template
from tvm.s_tir.schedule import Schedule

TILE_M = (1, 2, 3, 4, 6, 8)
TILE_MO = (1, 2, 4, 8, 16)
TILE_NO = (1, 2, 4, 8)


def dense_dims(ctx: ScheduleContext) -> tuple[int, int, int, int]:
    """(batch, M, N, K) from the anchor's loops (batch: the product of leading axes)."""
    exts = ctx.loop_extents()
    types = iter_types(ctx.sch, ctx.block)
    if any(e is None for e in exts):
        raise ValueError("symbolic extents")
    if types[-1] != COMM_REDUCE or types.count(COMM_REDUCE) != 1:
        raise ValueError("dense template needs exactly one reduction axis, innermost")
    if len(exts) < 3:
        raise ValueError("dense template needs an M and an N axis")
    return math.prod(exts[:-3]), exts[-3], exts[-2], exts[-1]


def k_tiles(k: int) -> list[int]:
    """Inner k extents: divisors of K from 4 to 512, K itself when it is at most 1024."""
    out = [d for d in (512, 256, 128, 64, 32, 16, 8, 4) if d < k and k % d == 0]
    if k <= 1024 or not out:
        out.insert(0, k)
    return out[:6]


def column_tiles(n: int, lanes: int) -> list[int]:
    """tile_n options: the blocks dividing N, then 1..4 vectors up to N rounded up
    to a vector (padded_dense_blocks): B and the result are padded to whole tiles,
    a weight packed at compile time with zero rows, B read in the kernel by its
    packing copy."""
    return padded_dense_blocks(n, lanes)


def dense_space(m: int, n: int, k: int, lanes: int, pack_choice: bool) -> ConfigSpace:
    space = ConfigSpace()
    tiles_n = column_tiles(n, lanes)
    space.define_choice("tile_n", tiles_n)
    space.define_choice("tile_m", [t for t in TILE_M if t <= m] or [1])
    space.define_choice("tile_mo", [t for t in TILE_MO if t <= max(1, m // 2)] or [1])
    space.define_choice("tile_no", [t for t in TILE_NO if t * tiles_n[0] <= n] or [1])
    space.define_choice("tile_k", k_tiles(k))
    space.define_choice("order", ["mn_k", "k_mn"])
    space.define_choice("unroll_k", [1, 4])
    if pack_choice:
        space.define_bool("pack_b")
    return space


# A row's time in a register tile of t rows, relative to an endless tile: 1 + this / t
# (each k step's B vectors are loaded once for the t rows). Fitted on 2 AVX-512 cores
# (znver4) on ConvNeXt's denses, whose M is one image row (7-56: the leading axes are
# the batch): 4 rows beat 6 at M = 7 (1.45x, 12 padded rows against 8), 28 and 56
# (1.05-1.19x), 3 beat 6 at M = 14 (1.07-1.14x); at M = 197, 6 rows stay.
ROW_LOAD_SHARE = 0.5

# Accumulator vectors an untuned register tile may hold, by LLVM's CPU name, where
# fewer than the registers allow ran faster. Zen 4 executes a 512-bit FMA as two 256-bit
# halves: on 2 znver4 cores, 4 rows of 4 vectors (16 accumulators) beat 6 rows (24)
# model by model, untuned (BERT 1.11x, GPT-2 1.08x, ConvNeXt 1.03x, Whisper's encoder
# 1.02x, MobileViT 1.01x, ViT and SegFormer 1.00x, none slower;
# benchmarks/results/dense_tile_rows_znver4.md). On an AVX-512 Xeon (two full 512-bit
# FMA pipes; LLVM calls the host rocketlake) the same limit is no rule: BERT 1.04x and
# GPT-2 1.03x, but ViT 0.92x, ConvNeXt 0.97x, Whisper's encoder 0.90x
# (benchmarks/results/dense_tile_rows_rocketlake.md), so Intel CPUs have no entry.
# Zen 5, whose EPYC parts have full 512-bit FMA units, has none either: on 2 znver5
# cores the limit ran BERT 0.99x, GPT-2 0.97x, ViT 0.97x, Whisper's encoder 0.95x,
# ConvNeXt 1.01x (benchmarks/results/dense_tile_rows_znver5.md).
TILE_ACCUMULATORS = {"znver4": 16}


def tile_accumulators(cpu: str) -> int | None:
    """The accumulator limit of an untuned register tile on `cpu`, None for none."""
    return TILE_ACCUMULATORS.get(cpu)


def register_tile_rows(m: int, nb: int, lanes: int, accumulators: int | None = None) -> int:
    """Rows of the register tile: what the vector registers hold after one B vector
    per column vector and a broadcast A value (at most `accumulators` vectors where
    given). M is padded to whole tiles: the tile with the least time per useful row,
    padded rows (computed and copied) counted."""
    vecs = max(1, -(-nb // lanes))
    budget = max(1, (vector_registers(lanes) - vecs - 1) // vecs)
    if accumulators is not None:
        budget = min(budget, max(1, accumulators // vecs))
    fits = [t for t in TILE_M if t <= min(budget, m)] or [1]
    return min(fits, key=lambda t: ((1 + padded_waste(m, t)) * (1 + ROW_LOAD_SHARE / t), -t))


def dense_fallback_values(m: int, n: int, k: int, lanes: int, cores: int,
                          nb: int | None = None, cpu: str = "") -> dict[str, Any]:
    nb = nb or default_dense_block(n, lanes)
    mi = register_tile_rows(m, nb, lanes, tile_accumulators(cpu))
    kt = k_tiles(k)
    kb = next((t for t in kt if t <= 256), kt[-1])
    if m >= 128 and n >= 256 and k >= 256:
        # large GEMMs (random search, 1024^3 on 2 AVX2 cores): k outside a 2 x 2 block
        # of register tiles, B packed, k unrolled by 4 - 1.6-2x the small-tile nest;
        # from 128 rows on (BERT's and ViT's 128-197 x 768 x 3072 on 2 AVX-512 cores:
        # 1.15-1.6x; at 77 rows both nests ran alike). Two register tiles down, not
        # eight: the C block the k loop revisits stays in L1 (128-197 x 384-3072 x
        # 384-3072: 1.07-1.25x on AVX-512, 1.05-1.22x on AVX2; 1024^3 alike)
        return {"tile_n": nb, "tile_m": mi, "tile_mo": 2, "tile_no": 2, "tile_k": kb,
                "order": "k_mn", "unroll_k": 4, "pack_b": True}
    # cache tile: a few register tiles per parallel task, while enough tasks remain
    mo = 1
    while mo * 2 in TILE_MO and mi * mo * 2 * 4 <= m // max(1, cores) and mo < 4:
        mo *= 2
    return {"tile_n": nb, "tile_m": mi, "tile_mo": mo, "tile_no": 1, "tile_k": kb,
            "order": "mn_k", "unroll_k": 1, "pack_b": False}


class DenseLikeTemplate(Template):
    lane_knobs = ("tile_n",)
    packs_always: tuple[str, ...] = ()  # kinds whose B must be packed in the kernel
    pack_choice_kinds: tuple[str, ...] = ()  # kinds where packing B is a knob

    def __init__(self, name: str, aliases: tuple[str, ...], packs_always: tuple[str, ...],
                 pack_choice_kinds: tuple[str, ...]) -> None:
        self.name = name
        self.aliases = aliases
        self.packs_always = packs_always
        self.pack_choice_kinds = pack_choice_kinds

    # -- workload
    def workload(self, call: Call, kind: str) -> dict[str, Any]:
        a, b = call.args
        b_shape = list(b.shape)
        attrs = dict(call.attrs)
        if call.op == "nn.dense_pack":  # key in the unpacked terms: W[N, K]
            nc, k, nb = b_shape
            b_shape = [attrs.pop("units") or nc * nb, k]
        return {"template": self.name,
                "inputs": [[list(a.shape), str(a.dtype)], [b_shape, str(b.dtype)]],
                "attrs": jsonable(attrs)}

    @staticmethod
    def mnk_of_workload(workload: dict[str, Any]) -> tuple[int, int, int]:
        (a_shape, _), (b_shape, _) = workload["inputs"]
        attrs = workload.get("attrs", {})
        if workload["template"] == "dense":
            m = a_shape[-2] if len(a_shape) >= 2 else 1
            return m, b_shape[0], b_shape[1]
        ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)
        m, k = (a_shape[-1], a_shape[-2]) if ta else (a_shape[-2], a_shape[-1])
        n = b_shape[-2] if tb else b_shape[-1]
        return m, n, k

    # -- space
    def _pack_choice(self, kind: str) -> bool:
        return kind in self.pack_choice_kinds

    def space_for(self, m: int, n: int, k: int, lanes: int, kind: str) -> ConfigSpace:
        return dense_space(m, n, k, lanes, self._pack_choice(kind))

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        # N of the workload: a padded packed weight's kernel computes whole blocks
        m, n, k = (self.mnk_of_workload(ctx.workload) if ctx.workload is not None
                   else dense_dims(ctx)[1:])
        return self.space_for(m, n, k, ctx.lanes, ctx.kind)

    def packed_block(self, ctx: ScheduleContext) -> int | None:
        """nb of a weight packed at compile time (dense_pack), else None."""
        if ctx.kind != "dense_pack":
            return None
        _, _, n, k = dense_dims(ctx)
        block = ctx.sch.get(ctx.block)
        for region in block.reads:  # Wp[N/nb, K, nb] (x[..., K] may be 3-D as well)
            shape = [int(d) for d in region.source.shape]
            if len(shape) == 3 and shape[1] == k and shape[0] * shape[2] == n and (
                    shape[2] != k or shape[0] * k == n):
                return shape[2]
        return None

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        _, m, n, k = dense_dims(ctx)
        values = dense_fallback_values(m, n, k, ctx.lanes, ctx.cores, self.packed_block(ctx),
                                       ctx.info.cpu)
        return nearest_config(space, values)

    def accepts(self, ctx: ScheduleContext, config: Config) -> bool:
        nb = self.packed_block(ctx)
        return nb is None or config["tile_n"] == nb

    # -- schedule
    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        sch, block = ctx.sch, ctx.block
        batch_ext, m_ext, n_ext, k_ext = dense_dims(ctx)
        nb, mi, mt = config["tile_n"], config["tile_m"], config["tile_mo"]
        nt, kb, order = config["tile_no"], config["tile_k"], config["order"]
        if k_ext % kb:
            raise ValueError(f"tile_k {kb} does not divide K={k_ext}")
        if n_ext % nb and ctx.kind == "dense_pack":  # its packing pads N, not the kernel
            raise ValueError(f"tile_n {nb} does not divide the packed weight's N={n_ext}")
        if not self.accepts(ctx, config):
            raise ValueError(f"tile_n {nb} differs from the packed weight's block")
        pack = ctx.kind in self.packs_always or bool(config.get("pack_b", False))
        # rows and columns padded to whole register tiles: no bounds test in the
        # micro-kernel (B, read in the kernel, is padded with its copy)
        operand_b = sch.get(block).reads[1].source
        copies = pad_iteration(sch, block, [1] * (len(ctx.loop_extents()) - 3) + [mi, nb, 1])
        if pack:
            pad_b = _copy_of(sch, block, operand_b)
            if pad_b is None:  # B as given: the packing is a copy of it
                pack_block = sch.cache_read(block, 1, "global")
            else:  # B's padded copy is the packing
                pack_block = pad_b
                copies = [c for c in copies if not sch.get(c).same_as(sch.get(pad_b))]
            b_index = next(i for i, r in enumerate(sch.get(block).reads)
                           if r.source.same_as(sch.get(pack_block).writes[0].source))
            sch.transform_layout(block, ("read", b_index), _pack_map(sch.get(block), nb))
        acc = sch.cache_write(block, 0, "local")
        *batch, m, n, k = sch.get_loops(block)
        no, ni = sch.split(n, [None, nb])
        noo, nti = sch.split(no, [None, nt])
        mo, mii = sch.split(m, [None, mi])
        moo, mti = sch.split(mo, [None, mt])
        ko, ki = sch.split(k, [None, kb])
        kinner = []
        unroll_k = config["unroll_k"]
        if unroll_k > 1 and kb % unroll_k == 0 and kb > unroll_k:
            ki, ku = sch.split(ki, [None, unroll_k])
            kinner = [ku]
        if order == "mn_k":
            sch.reorder(*batch, moo, noo, mti, nti, ko, ki, *kinner, mii, ni)
            at = nti
        else:
            sch.reorder(*batch, moo, noo, ko, mti, nti, ki, *kinner, mii, ni)
            at = noo
        target, _ = tile_epilogue_parallel(sch, acc, at, [*batch, moo, noo],
                                           batch_ext * m_ext * n_ext * k_ext)
        for lp in kinner:
            sch.unroll(lp)
        sch.unroll(mii)
        sch.vectorize(ni)
        init = sch.decompose_reduction(block, ko)
        vectorize_tail(sch, target, ctx.lanes)
        vectorize_tail(sch, init, ctx.lanes)
        for copy in copies + ([pack_block] if pack else []):
            parallel_copy(sch, copy)


def _copy_of(sch: Schedule, block, buffer):
    """The producer of `block` that copies `buffer` (its padded copy), else None."""
    for producer in sch.get_producers(block):
        if any(r.source.same_as(buffer) for r in sch.get(producer).reads):
            return producer
    return None


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


DENSE = register_template(DenseLikeTemplate(
    "dense", ("dense_pack",), packs_always=("dense",), pack_choice_kinds=()))
MATMUL = register_template(DenseLikeTemplate(
    "matmul", ("matmul_nt",), packs_always=("matmul_nt",), pack_choice_kinds=("matmul",)))
BATCH_MATMUL = register_template(DenseLikeTemplate(
    "batch_matmul", ("batch_matmul_nt",), packs_always=("batch_matmul_nt",),
    pack_choice_kinds=("batch_matmul",)))


def dense_pack_block(workload: dict[str, Any], config: dict[str, Any] | None, lanes: int,
                     cores: int) -> int:
    """The nb a dense workload's weight is packed with: the config's tile_n, else the
    fallback's (for graph_opt's pack_dense_weights nb_fn)."""
    m, n, k = DenseLikeTemplate.mnk_of_workload(workload)
    if config is not None and "tile_n" in config:
        return int(config["tile_n"])
    return dense_fallback_values(m, n, k, lanes, cores)["tile_n"]
