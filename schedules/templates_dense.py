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
"""

from __future__ import annotations

import math
from typing import Any

from tecc.frontend.ir import Call
from tecc.graph_opt.dense_pack import default_dense_block, dense_block_candidates
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


def column_tiles(n: int, lanes: int, pad_n: bool) -> list[int]:
    """tile_n options: the packing blocks dividing N (dense_block_candidates), and
    where B is read in the kernel (`pad_n`), 1..4 vectors up to N rounded up to a
    vector: B and the result are padded to whole tiles (an odd N such as 197 has no
    divisor that fills a vector)."""
    exact = dense_block_candidates(n, lanes)
    if not pad_n:
        return exact
    padded_n = -(-n // lanes) * lanes
    return list(dict.fromkeys(exact + [v * lanes for v in (1, 2, 3, 4)
                                       if v * lanes <= padded_n]))


def dense_space(m: int, n: int, k: int, lanes: int, pack_choice: bool,
                pad_n: bool = False) -> ConfigSpace:
    space = ConfigSpace()
    tiles_n = column_tiles(n, lanes, pad_n)
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


def padded_waste(extent: int, tile: int) -> float:
    """The share of work a tile of `tile` wastes on `extent` padded to whole tiles."""
    return -(-extent // tile) * tile / extent - 1


def register_tile_rows(m: int, nb: int, lanes: int) -> int:
    """Rows of the register tile: what the vector registers hold after one B vector
    per column vector and a broadcast A value. M is padded to whole tiles, so a
    non-divisor costs only its padded rows: the tallest tile padding little."""
    vecs = max(1, -(-nb // lanes))
    budget = max(1, (vector_registers(lanes) - vecs - 1) // vecs)
    fits = [t for t in TILE_M if t <= min(budget, m)] or [1]
    # a tile's rows reuse each B vector: fewer rows cost more than a few padded ones
    return max(fits, key=lambda t: (t / (1 + padded_waste(m, t)), m % t == 0, t))


def default_column_tile(n: int, lanes: int, pad_n: bool) -> int:
    """The fallback's tile_n: the packing block of dense_pack (default_dense_block)
    unless no divisor of N is a whole vector and B may be padded: then two vectors
    (one where padding to two wastes more)."""
    nb = default_dense_block(n, lanes)
    if not pad_n or nb % lanes == 0 or n < lanes:
        return nb
    # two vectors reuse each A value twice: worth some padding (N=197: 224 columns
    # ran faster than 208)
    return 2 * lanes if padded_waste(n, 2 * lanes) <= padded_waste(n, lanes) + 0.1 \
        else lanes


def dense_fallback_values(m: int, n: int, k: int, lanes: int, cores: int,
                          nb: int | None = None, pad_n: bool = False) -> dict[str, Any]:
    nb = nb or default_column_tile(n, lanes, pad_n)
    mi = register_tile_rows(m, nb, lanes)
    kt = k_tiles(k)
    kb = next((t for t in kt if t <= 256), kt[-1])
    # cache tile: a few register tiles per parallel task, while enough tasks remain
    mo = 1
    while mo * 2 in TILE_MO and mi * mo * 2 * 4 <= m // max(1, cores) and mo < 4:
        mo *= 2
    if m >= 256 and n >= 256 and k >= 256:
        # large GEMMs (random search, 1024^3 on 2 AVX2 cores): k outside a tall tile
        # of register tiles, B packed, k unrolled by 4 - 1.6-2x the small-tile nest
        return {"tile_n": nb, "tile_m": mi, "tile_mo": 8, "tile_no": 2, "tile_k": kb,
                "order": "k_mn", "unroll_k": 4, "pack_b": True}
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
        if call.op == "nn.dense_pack":  # key in the unpacked terms: W[N, K]
            nc, k, nb = b_shape
            b_shape = [nc * nb, k]
        return {"template": self.name,
                "inputs": [[list(a.shape), str(a.dtype)], [b_shape, str(b.dtype)]],
                "attrs": jsonable(dict(call.attrs))}

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

    def pads_n(self, kind: str) -> bool:
        """Whether B may be padded to whole column tiles: it is read in the kernel
        (not a weight packed at compile time, whose block must divide N)."""
        return kind != "dense_pack"

    def space_for(self, m: int, n: int, k: int, lanes: int, kind: str) -> ConfigSpace:
        # the "dense" template's weight is packed at compile time (one space for its
        # packed and unpacked kernels); the matmuls read B in the kernel
        return dense_space(m, n, k, lanes, self._pack_choice(kind),
                           pad_n=self.name != "dense")

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        _, m, n, k = dense_dims(ctx)
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
                                       pad_n=self.name != "dense")
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
        if n_ext % nb and not self.pads_n(ctx.kind):
            raise ValueError(f"tile_n {nb} does not divide N={n_ext} (a weight packed at "
                             "compile time cannot be padded here)")
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
    if config is not None and "tile_n" in config and n % int(config["tile_n"]) == 0:
        return int(config["tile_n"])
    return dense_fallback_values(m, n, k, lanes, cores)["tile_n"]
