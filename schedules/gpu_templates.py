"""GPU schedule templates (target kind "cuda").

dense / matmul / batch_matmul (and their _nt forms), and NCHW conv2d as an implicit
GEMM, are scheduled by one of these rules (a knob):
- "simt" (gpu_matmul.py, the fallback for M > 16): block tiles staged k-major
  through shared memory with loads along each operand's contiguous axis, register
  fragments and an outer product per thread, optionally double-buffered;
- "tiled": TVM's dlight Matmul rule run with the knobs' tile (kept for comparison
  and as a second choice: 0.46x cuBLAS on 1024^3 where simt's 256-thread tiles
  reach 0.86x and its 128-thread 64 x 128 tile 0.98x);
- "gemv" / "low_batch_gemv": dlight's GEMV rules for M = 1 or M <= 16 (K split
  across the threads of a block).

The fallback config picks the largest block tile that still gives about two blocks
per multiprocessor (else one) without padding the matrix by more than a third; k is
split into slices (split_k_tile) where even 64 x 64 tiles are too few for that, or
where a larger tile's slices stay long; a small grid of small tiles over a long k loop (ResNet-18's late convs at
batch 1) gets longer, double-buffered k steps. Measured on the H200 (fp32, TF32 off,
benchmarks/gpu_gemm_configs.py): the fallback does 26.2 TFLOP/s on 1024^3 (cuBLAS
37.6; the best simt config 28.5), 38.2 on 4096^3 (51.4; best 40.8) and 6.7 on
128x768x768 (cuBLAS 6.3).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import tvm
from tecc.schedules.gpu_conv import (
    define_direct_knobs,
    direct_features,
    direct_fits,
    schedule_direct_conv,
)
from tecc.schedules.gpu_matmul import schedule_simt_matmul
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import ScheduleContext, Template, get_template, register_template
from tecc.schedules.templates_conv import conv_dims, conv_workload
from tvm.s_tir.schedule import Schedule

from tecc.target import target_info

# (threads along M, threads along N, vthreads M, vthreads N, micro M, micro N):
# largest block tile first. The fallback picks among these.
FALLBACK_TILES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (16, 16, 2, 2, 4, 4),  # 128 x 128, 256 threads, 64 accumulators each
    (16, 16, 1, 2, 4, 4),  # 64 x 128
    (16, 16, 2, 1, 4, 4),  # 128 x 64
    (16, 16, 1, 1, 4, 4),  # 64 x 64
    (8, 16, 1, 1, 4, 4),   # 32 x 64 (dlight's default)
    (8, 8, 1, 1, 4, 4),    # 32 x 32
    (8, 8, 1, 1, 2, 2),    # 16 x 16, 64 threads
    (16, 16, 1, 1, 1, 1),  # 16 x 16, 256 threads (for plain GEMMs a knob value only:
                           # 0.6-0.8x of the 64-thread tile on the H200's small grids)
)
# Knob values only: 64 accumulators a thread on block tiles of 64 or 128 threads, for
# grids that barely fill the GPU with the larger tiles (1024^3: 128 blocks of 64 x
# 128), where a thread holding more of the tile issues more FMAs per shared load.
FEW_THREAD_TILES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (8, 16, 2, 2, 4, 4),   # 64 x 128, 128 threads
    (16, 8, 2, 2, 4, 4),   # 128 x 64, 128 threads
    (8, 8, 2, 2, 4, 4),    # 64 x 64, 64 threads
)
# Knob values only: block tiles 96 or 192 wide, whose grids on N = 768 or 2304 come to
# whole waves on 132 multiprocessors (2048 x 768 in 128 x 96: 128 blocks, where 128 x
# 128 leaves 36 idle and 64 x 128 runs 1.45 waves).
WAVE_TILES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (16, 8, 2, 3, 4, 4),   # 128 x 96, 128 threads, 96 accumulators each
    (8, 8, 2, 3, 4, 4),    # 64 x 96, 64 threads
    (8, 16, 2, 3, 4, 4),   # 64 x 192, 128 threads
)
TILES = FALLBACK_TILES + FEW_THREAD_TILES + WAVE_TILES
SMALL_TILE, WIDE_SMALL_TILE = (8, 8, 1, 1, 2, 2), (16, 16, 1, 1, 1, 1)
# The fallback's tile: the largest of at least 64 x 64 whose grid fills the GPU about
# twice (a block waiting on its loads has another to switch to), else the largest
# that fills it once (measured on the H200: 2048x768x3072 at 64 x 64 28 TFLOP/s,
# at 64 x 128 22).
WAVES = ((1.8, 64 * 64), (0.9, 0))
RULES = ("simt", "tiled", "gemv", "low_batch_gemv")
# The conv template's rules: the implicit GEMM's two, and the direct conv (gpu_conv.py)
# with knobs of its own.
CONV_RULES = ("simt", "tiled", "direct")
# How the simt rule's k loop stages its tiles through shared memory: "none" (load,
# sync, compute, sync) or "double" (register double buffering: the next tile's global
# loads go to registers before this tile's FMAs and are stored to shared memory after
# them, so their latency hides behind a whole k step). TVM's cp.async path does not take
# the k-major (transposed) store of A: it fails to build or faults with a misaligned
# address on the H200, so it is not offered.
PIPELINES = ("none", "double")
MICRO_K = (8, 16, 32, 64)
# Slices of the k loop, a grid of blocks each (the simt rule): a grid of large tiles
# too small to fill the GPU gets more blocks without smaller tiles.
SPLIT_K = (1, 2, 4, 8)
# The fallback's slices: at least MIN_SLICE long, at least LONG_SLICE to trade a grid
# that already fills the GPU for a larger tile, and tiles split down to 32 x 64
# (split_k_tile).
MIN_SLICE, LONG_SLICE, SMALL_SPLIT_AREA = 384, 768, 32 * 64
MAX_PADDING = 4 / 3


def tile_name(tile: tuple[int, ...]) -> str:
    """A tile as the knob spells it: threads M, N, vthreads M, N, micro tile M, N."""
    return ",".join(str(v) for v in tile)


def tile_shape(tile: tuple[int, ...]) -> tuple[int, int]:
    tm, tn, vm, vn, mm, mn = tile
    return tm * vm * mm, tn * vn * mn


def matmul_dims(ctx: ScheduleContext) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of the anchor from its workload (the IR call's shapes)."""
    return workload_dims(ctx.workload or {})


def workload_dims(workload: dict[str, Any]) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a matmul-template workload, or of an NCHW conv's implicit
    GEMM (M = N*OH*OW, N = OC, K = IC*KH*KW)."""
    if "kernel" in workload:
        d = conv_dims(workload)
        return 1, d["n"] * d["oh"] * d["ow"], d["o"], d["ipg"] * d["kh"] * d["kw"]
    template = get_template(workload.get("template", "dense"))
    if template is None or not workload:
        raise ValueError("the GPU matmul template needs the anchor's workload")
    m, n, k = template.mnk_of_workload(workload)
    a_shape = workload["inputs"][0][0]
    batch = math.prod(a_shape[:-2]) if workload["template"] != "dense" else 1
    if workload["template"] == "dense":  # x[..., K]: the leading dims are rows
        m = math.prod(a_shape[:-1]) if len(a_shape) >= 2 else 1
    return batch, m, n, k


def grid_blocks(tile: tuple[int, ...], batch: int, m: int, n: int) -> int:
    """Thread blocks of a batch x m x n output in `tile`'s block tiles."""
    tm, tn = tile_shape(tile)
    return batch * -(-m // tm) * -(-n // tn)


def padding_of(tile: tuple[int, ...], m: int, n: int) -> float:
    """The padded m x n output's area over the output's, in `tile`'s block tiles."""
    tm, tn = tile_shape(tile)
    return (-(-m // tm) * tm * -(-n // tn) * tn) / (m * n)


def padded_grids(batch: int, m: int, n: int, min_area: int = 0
                 ) -> list[tuple[tuple[int, ...], int, int]]:
    """(tile, block tile area, blocks) of each tile of FALLBACK_TILES (largest first)
    of at least `min_area` that pads the matrix by at most MAX_PADDING."""
    grids = []
    for tile in FALLBACK_TILES:
        tm, tn = tile_shape(tile)
        if tm * tn >= min_area and padding_of(tile, m, n) <= MAX_PADDING:
            grids.append((tile, tm * tn, grid_blocks(tile, batch, m, n)))
    return grids


def fallback_tile(batch: int, m: int, n: int, sms: int) -> tuple[int, ...]:
    """The first tile of FALLBACK_TILES (largest first) that pads the matrix by at most
    MAX_PADDING and passes WAVES[0], else WAVES[1], else the 16 x 16 tile of 64
    threads."""
    grids = padded_grids(batch, m, n)
    for waves, min_area in WAVES:
        for tile, area, blocks in grids:
            if area >= min_area and blocks >= waves * sms:
                return tile
    return SMALL_TILE


def _direct_fits(config: Config, workload: dict[str, Any], shared_limit: int) -> bool:
    # a module-level function: configs travel to build workers with their space
    return config["rule"] != "direct" or direct_fits(workload, config, shared_limit)


def split_k_tile(batch: int, m: int, n: int, k: int, sms: int
                 ) -> tuple[tuple[int, ...], int] | None:
    """A tile and a number of k slices for the fallback, or None to leave k whole.
    Each slice is at least MIN_SLICE long and a whole number of 16-steps; the split
    grid must reach WAVES[0].

    - Where no tile of at least 64 x 64 reaches WAVES[0] unsplit: the fewest slices
      that make one do (largest tile first), else the same with tiles down to 32 x 64
      (ResNet-18's 512x7x7 convs at batch 16, 784 x 512 x 4608: 64 x 64 in 4 slices;
      BERT-base's FFN output at batch 1, 128 x 768 x 3072: 32 x 64 in 8 slices, 18.9
      TFLOP/s on the H200 against 7.7 unsplit).
    - Where one does: a larger tile with slices of at least LONG_SLICE, if one reaches
      WAVES[0] (BERT-base's FFN output at batch 16, 2048 x 768 x 3072: 128 x 128 in 4
      slices, 36.8 TFLOP/s against 28.9 for 64 x 64 whole; with shorter slices the
      partial sums cost more than the larger tile gains: 2048 x 768 x 768 in 64 x 128
      halves, 26.5 against 28.7)."""
    waves, large_area = WAVES[0]
    target = waves * sms
    splits = [s for s in SPLIT_K[1:] if k % (16 * s) == 0 and k // s >= MIN_SLICE]
    large = padded_grids(batch, m, n, large_area)
    whole = [area for _, area, blocks in large if blocks >= target]
    if whole:
        for tile, area, blocks in large:
            if area <= whole[0]:
                return None
            for split_k in splits:
                if k // split_k >= LONG_SLICE and blocks * split_k >= target:
                    return tile, split_k
        return None
    for grids in (large, padded_grids(batch, m, n, SMALL_SPLIT_AREA)):
        for split_k in splits:
            for tile, _, blocks in grids:
                if blocks * split_k >= target:
                    return tile, split_k
    return None


# Per-multiprocessor limits the occupancy estimate uses (sm_70 and later).
THREADS_PER_SM, BLOCKS_PER_SM, REGISTERS_PER_SM = 2048, 32, 65536
KERNEL_FEATURES = ("blocks", "threads", "block_m", "block_n", "k_steps", "shared_bytes",
                   "registers", "blocks_per_sm", "occupancy", "waves", "wave_efficiency",
                   "bytes_per_step", "flops_per_byte", "global_bytes", "padding",
                   "vector_bytes", "unroll", "double_buffered", "dlight_rule")


def shared_bytes(tile: tuple[int, ...], micro_k: int, two_tiles: bool) -> int:
    """Shared memory of a simt block: the k-major A and B tiles, whose rows
    gpu_matmul.py aligns to 32 floats plus 4 (storage_align, against bank conflicts),
    twice when double-buffered in shared memory (`two_tiles`: not register_staged)."""
    def row(extent: int) -> int:
        return -(-extent // 32) * 32 + 4

    bm, bn = tile_shape(tile)
    return (row(bm) + row(bn)) * micro_k * 4 * (2 if two_tiles else 1)


def register_staged(workload: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether gpu_matmul.py double-buffers `config` in registers (one shared tile):
    pipeline "double" where both operands load in whole vectors; a conv's im2col
    gather never does (it keeps two shared tiles)."""
    if config["pipeline"] != "double" or config["rule"] != "simt" or "kernel" in workload:
        return False
    vector = int(config["vector"])
    _, _, n, k = workload_dims(workload)
    tile = tuple(int(v) for v in str(config["tile"]).split(","))
    bm, bn = tile_shape(tile)
    per_step = tile[0] * tile[1] * vector
    micro_k = int(config["micro_k"])
    # A (x[..., K]) loads along k; B along k for w[N, K] (dense, transpose_b), else n
    b_along_k = workload.get("template") == "dense" or workload.get("attrs", {}).get(
        "transpose_b", False)
    return (vector > 1 and k % vector == 0 and (b_along_k or n % vector == 0)
            and bm * micro_k % per_step == 0 and bn * micro_k % per_step == 0)


def staged_registers(tile: tuple[int, ...], micro_k: int, double: bool) -> int:
    """Registers per thread that hold the next k step's A and B values when
    register double-buffered (a thread's share of both tiles), else 0."""
    if not double:
        return 0
    tm, tn = tile[0], tile[1]
    bm, bn = tile_shape(tile)
    return -(-(bm + bn) * micro_k // (tm * tn))


def occupancy(blocks: int, threads: int, shared: int, registers: int,
              info: Any) -> dict[str, float]:
    """Blocks resident per multiprocessor (by its thread, block, shared-memory and
    register limits), the occupancy they give, and the waves of `blocks` over the
    multiprocessors."""
    smem_sm = info.max_shared_memory_per_sm or 228 * 1024
    per_sm = min(BLOCKS_PER_SM, THREADS_PER_SM // threads, smem_sm // max(shared, 1),
                 REGISTERS_PER_SM // (threads * min(registers, 255)))
    per_sm = max(per_sm, 1)
    waves = blocks / ((info.multiprocessors or 108) * per_sm)
    return {"blocks_per_sm": per_sm, "occupancy": per_sm * threads / THREADS_PER_SM,
            "waves": waves, "wave_efficiency": waves / math.ceil(waves)}


def kernel_features(workload: dict[str, Any], config: dict[str, Any],
                    info: Any) -> dict[str, float]:
    """What decides a matmul-rule kernel's speed, from the workload and the config
    without scheduling it: its grid and block, shared memory and an estimate of
    registers per thread (accumulators, fragments, the staged next k step and ~24 for
    addresses), occupancy by
    the multiprocessor's thread, block, shared-memory and register limits, waves of
    blocks over the multiprocessors, bytes staged per k step and in all, arithmetic
    intensity, padding. With k in `split_k` slices the grid is that many times larger,
    each block's k loop that many times shorter, and the slices' partial sums go out to
    global memory and back (`global_bytes`). The dlight rules (gemv, tiled) fix some of
    these themselves; they are then the tile's estimate."""
    batch, m, n, k = workload_dims(workload)
    split_k = int(config.get("split_k", 1)) if config["rule"] == "simt" else 1
    tile = tuple(int(v) for v in str(config["tile"]).split(","))
    tm, tn, vm, vn, mm, mn = tile
    bm, bn = tile_shape(tile)
    micro_k = int(config["micro_k"])
    double = config["pipeline"] == "double" and config["rule"] == "simt"
    threads = tm * tn
    blocks = grid_blocks(tile, batch, m, n) * split_k
    k_steps = -(-k // (micro_k * split_k))
    staged = register_staged(workload, config)
    shared = shared_bytes(tile, micro_k, double and not staged)
    registers = (vm * vn * mm * mn + vm * mm + vn * mn + 24
                 + staged_registers(tile, micro_k, staged))
    step_bytes = (bm + bn) * micro_k * 4
    return {
        "blocks": blocks, "threads": threads, "block_m": bm, "block_n": bn,
        "k_steps": k_steps, "shared_bytes": shared, "registers": registers,
        **occupancy(blocks, threads, shared, registers, info),
        "bytes_per_step": step_bytes, "flops_per_byte": 2 * bm * bn / ((bm + bn) * 4),
        # the partial sums, written by the slices and read by the sum kernel
        "global_bytes": blocks * k_steps * step_bytes + (
            2 * split_k * batch * m * n * 4 if split_k > 1 else 0),
        "padding": padding_of(tile, m, n),
        "vector_bytes": 4 * int(config["vector"]), "unroll": int(config["unroll"]),
        "double_buffered": float(double), "dlight_rule": float(config["rule"] != "simt"),
    }


class GpuMatmulTemplate(Template):
    target_kind = "cuda"

    def __init__(self, name: str, aliases: tuple[str, ...]) -> None:
        self.name = name
        self.aliases = aliases

    def workload(self, call: Any, kind: str) -> dict[str, Any]:
        cpu = get_template(self.name)
        return cpu.workload(call, kind) if cpu is not None else super().workload(call, kind)

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        return self.matmul_space(RULES)

    @staticmethod
    def matmul_space(rules: tuple[str, ...]) -> ConfigSpace:
        """The matmul rules' knobs; where `rules` has others (the conv's "direct"),
        the tile's knobs apply to the matmul rules only."""
        space = ConfigSpace()
        space.define_choice("rule", list(rules))
        gemm = ("rule", tuple(r for r in rules if r in RULES))
        space.define_choice("tile", [tile_name(t) for t in TILES], when=gemm)
        space.define_choice("micro_k", list(MICRO_K), when=gemm)
        space.define_choice("vector", [1, 2, 4])
        space.define_choice("unroll", [64, 256])
        space.define_choice("pipeline", list(PIPELINES), when=gemm)
        # simt only; records from before the knob schedule unsplit
        space.define_choice("split_k", list(SPLIT_K), default=1, when=("rule", ("simt",)))
        return space

    def dims(self, ctx: ScheduleContext) -> tuple[int, int, int, int]:
        return matmul_dims(ctx)

    def kernel_features(self, workload: dict[str, Any], config: dict[str, Any],
                        info: Any) -> list[float]:
        """The cost model's features of a config beyond its knobs (KERNEL_FEATURES),
        log-scaled so that workloads of other sizes share a scale (transfer)."""
        if config["rule"] == "direct":
            values = direct_features(workload, config)
            values.update(occupancy(values["blocks"], values["threads"],
                                    values["shared_bytes"], values["registers"], info))
        else:
            values = kernel_features(workload, config, info)
        return [math.log2(1 + values[name]) for name in KERNEL_FEATURES]

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        batch, m, n, k = self.dims(ctx)
        info = target_info(ctx.target)
        sms = info.multiprocessors or 108
        rule = "gemv" if m == 1 and batch == 1 else "low_batch_gemv" if m <= 16 else "simt"
        tile = fallback_tile(batch, m, n, sms)
        if "kernel" in (ctx.workload or {}) and tile == SMALL_TILE \
                and grid_blocks(tile, batch, m, n) < 2 * sms:
            # a conv's im2col gather on a small grid: four times the threads on the same
            # 16 x 16 tile hide its loads (H200, ResNet-18 at batch 1: 512x7x7 1.89
            # TFLOP/s against 0.80, 256x14x14 3.07 against 1.79)
            tile = WIDE_SMALL_TILE
        vector = 4 if k % 4 == 0 and n % 4 == 0 else 2 if k % 2 == 0 and n % 2 == 0 else 1
        workload = ctx.workload or {}

        def config(micro_k: int, pipeline: str, split_k: int = 1) -> dict[str, Any]:
            return {"rule": rule, "tile": tile_name(tile), "micro_k": micro_k,
                    "vector": vector, "unroll": 256, "pipeline": pipeline,
                    "split_k": split_k}

        split = split_k_tile(batch, m, n, k, sms) if rule == "simt" else None
        if split is not None:
            # Measured on the H200: a plain GEMM's slices in steps of 32, register
            # double-buffered where each slice's loop is long (768 and more); a conv's
            # im2col gather in steps of 16, unpipelined.
            tile, split_k = split
            micro_k = 16 if "kernel" in workload else 32
            pipeline = "double" if k // split_k >= LONG_SLICE and register_staged(
                workload, config(micro_k, "double", split_k)) else "none"
            return space.from_json(config(micro_k, pipeline, split_k))
        tm, tn = tile_shape(tile)
        if grid_blocks(tile, batch, m, n) < 4 * sms and tm * tn <= 32 * 64 and k >= 256:
            # A small grid with a long k loop is bound by each step's load latency
            # (ResNet-18's 7x7 convs at batch 1: 288 steps of 16): fewer, longer steps,
            # the next one's loads in flight, within the shared memory of a block
            # (H200: 49x512x4608 4.3 TFLOP/s against 2.6, 128x768x768 7.8 against 5.8).
            smem = info.max_shared_memory_per_block or 49152
            micro_k = 64 if k >= 1024 else 32
            two_tiles = not register_staged(workload, config(micro_k, "double"))
            while micro_k > 16 and shared_bytes(tile, micro_k, two_tiles) > smem:
                micro_k //= 2
            return space.from_json(config(micro_k, "double"))
        micro_k = 16 if k >= 64 else 8
        if rule == "simt" and k >= 256 and register_staged(workload, config(micro_k, "double")):
            # A plain GEMM whose operands load in whole vectors: the next k step's
            # loads wait in registers while this one's FMAs run, at no shared memory
            # (H200: 4096^3 at 128 x 128, 49.8 TFLOP/s against 36.0).
            return space.from_json(config(micro_k, "double"))
        return space.from_json(config(micro_k, "none"))

    def apply(self, ctx: ScheduleContext, config: Config) -> Schedule:
        import tvm.s_tir.dlight as dl

        func = ctx.sch.mod["main"]
        rule = config["rule"]
        refused = config.space.why_not(config) if config.space is not None else None
        if refused:  # a config given by hand or from an edited record
            raise ValueError(f"config {config.to_json()} refused: {refused}")
        with ctx.target:
            if rule == "gemv":
                result = dl.gpu.GEMV().apply(func, ctx.target, False)
            elif rule == "low_batch_gemv":
                result = dl.gpu.LowBatchGEMV().apply(func, ctx.target, False)
            else:
                result = None
            if rule == "direct":
                result = schedule_direct_conv(func, ctx.block_name, config, ctx.workload)
            if rule == "simt":
                tile = tuple(int(v) for v in config["tile"].split(","))
                double = config["pipeline"] == "double"
                shared = shared_bytes(tile, config["micro_k"], double and not register_staged(
                    ctx.workload or {}, config))
                limit = target_info(ctx.target).max_shared_memory_per_block or 49152
                if shared > limit:  # refused here, not after nvcc
                    raise ValueError(f"the tile needs {shared} bytes of shared memory; "
                                     f"a block may use {limit}")
                result = schedule_simt_matmul(func, tile, config["micro_k"], config["vector"],
                                              config["unroll"], config["pipeline"],
                                              config["split_k"])
            if result is None:  # the GEMV rules refuse some forms: the tiled one then
                result = _ConfiguredMatmul(config).apply(func, ctx.target, False)
        if result is None:
            raise ValueError(f"the {rule} rule does not apply to this group")
        return result[0] if isinstance(result, list) else result


class _ConfiguredMatmul:
    """dlight's Matmul rule with the template's config instead of its fixed one."""

    def __new__(cls, config: Config):
        import tvm.s_tir.dlight as dl

        tm, tn, vm, vn, mm, mn = (int(v) for v in config["tile"].split(","))
        vector = config["vector"]
        if mn % vector:
            vector = math.gcd(mn, vector)
        rule_config = dl.gpu.Matmul.Config(
            block_size_x=tm, block_size_y=tn, vthread_x=vm, vthread_y=vn, micro_size_x=mm,
            micro_size_y=mn, micro_size_k=config["micro_k"], vector_size=vector,
            unroll=config["unroll"], use_shared=True, storage_align=True, inner_x=False)

        class Configured(dl.gpu.Matmul):
            def get_configs(self, target: tvm.target.Target):
                return rule_config

        return Configured()


class GpuConvTemplate(GpuMatmulTemplate):
    """An NCHW conv2d as an implicit GEMM (M = N*OH*OW, N = OC, K = IC*KH*KW) with
    the matmul template's tiles. Depthwise and grouped convs are no single GEMM: the
    rule refuses them and the group gets the direct schedule (gpu_default.py)."""

    def workload(self, call: Any, kind: str) -> dict[str, Any]:
        return conv_workload(self.name, call)

    def tunable(self, workload: dict[str, Any]) -> bool:
        return workload.get("groups", 1) == 1

    def dims(self, ctx: ScheduleContext) -> tuple[int, int, int, int]:
        extents = ctx.loop_extents()
        if len(extents) != 7 or any(e is None for e in extents):
            raise ValueError("the GPU conv template expects n, oc, oh, ow, ic, kh, kw")
        n, oc, oh, ow, ic, kh, kw = extents
        return 1, n * oh * ow, oc, ic * kh * kw

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        workload = ctx.workload
        if not workload or "kernel" not in workload:  # a hand-made PrimFunc
            return self.matmul_space(("simt", "tiled"))
        space = self.matmul_space(CONV_RULES)
        define_direct_knobs(space, workload, ("rule", ("direct",)))
        limit = ctx.info.max_shared_memory_per_block or 49152
        space.add_constraint(functools.partial(_direct_fits, workload=workload,
                                               shared_limit=limit),
                             "the direct conv's block exceeds the GPU's limits (threads, "
                             "registers or shared memory)")
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        config = super().fallback(space, ctx).to_json()
        return space.from_json({**config, "rule": "simt"})


CONV2D = register_template(GpuConvTemplate("conv2d", ()))
DENSE = register_template(GpuMatmulTemplate("dense", ("dense_pack",)))
MATMUL = register_template(GpuMatmulTemplate("matmul", ("matmul_nt",)))
BATCH_MATMUL = register_template(GpuMatmulTemplate("batch_matmul", ("batch_matmul_nt",)))
