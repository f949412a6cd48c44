"""GPU templates (target kind "cuda") for row reductions: softmax (and the masked
softmax of attention, nn.safe_softmax), log_softmax, layer_norm, variance, sum / mean
/ max / min / prod over the innermost axes, and global pools.

A group's rows (the kept axes) are spread over the grid, `rows` of them per thread
block (threadIdx.y), each row reduced by `threads` threads (threadIdx.x): a
reduction loop bound to threadIdx.x is lowered by TVM to a cross-thread reduction,
warp shuffles alone while `threads` is at most a warp (one row per warp), a shuffle
tree through shared memory for a block-wide row. With `cache` "shared" the row is
loaded into shared memory once, by all threads of the block with `vector`-wide
(128-bit for 4) coalesced loads, and every pass of the group (softmax: the maximum,
the sum of exponentials and the normalized store; layer_norm: mean, variance and
the normalized store) reads it from there: the row comes from global memory once.
The output block's stores are `vector`-wide as well.

Knobs: threads (per row: 1 to 1024, powers of two), rows (per block), vector (1, 2,
4: the widths dividing the row), cache ("none" | "shared"). The fallback takes about
eight elements per thread (a warp for rows up to 256), rows per block up to 256
threads while the grid still fills the multiprocessors twice, the widest vector that
divides the row and the shared cache when the row is read more than once and fits.
Reductions over outer axes (column mode) and reducers TVM's cross-thread lowering
does not know (a NaN-keeping combiner; amax / amin reduce with plain ones, see
op_defs/reduce.py) are refused: dlight's rules take them.
"""

from __future__ import annotations

import math
from typing import Any

from tecc.schedules.blocks import (
    block_name,
    inline_injective,
    reduction_loops,
    root_blocks,
)
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import ScheduleContext, Template, register_template
from tecc.schedules.templates_reduce import (
    _analyze_rows,
    _drop_anchor_copies,
    _is_global_pool,
    _reduced_dims,
    _Rows,
    row_loops,
)
from tvm.s_tir.schedule import Schedule

THREADS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
ROWS = (1, 2, 4, 8, 16)
VECTORS = (1, 2, 4)
CACHES = ("none", "shared")
ELEMENTS_PER_THREAD = 8  # the fallback's share of a row per thread
BLOCK_THREADS = 256      # the fallback's threads per block, at most
WAVES = 2                # blocks per multiprocessor the fallback keeps, when it can
KERNEL_FEATURES = ("rows", "k", "threads", "rows_per_block", "block_threads", "blocks",
                   "waves", "wave_efficiency", "elements_per_thread", "vector_bytes",
                   "shared_bytes", "cached", "passes", "warp_reduce", "idle_lanes")


def _reducer_names(sch: Schedule, info: _Rows) -> list[str]:
    """The combiner of each reduction of the group: "sum", "max", "min", "prod", or
    "other" for a combiner TVM's cross-thread lowering does not match (a select)."""
    import tvm

    names = []
    for red in info.reductions:
        body = sch.get(red).body
        value = getattr(body, "value", None)
        if isinstance(value, tvm.tirx.Add):
            names.append("sum")
        elif isinstance(value, tvm.tirx.Max):
            names.append("max")
        elif isinstance(value, tvm.tirx.Min):
            names.append("min")
        elif isinstance(value, tvm.tirx.Mul):
            names.append("prod")
        else:
            names.append("other")
    return names


def _row_facts(sch: Schedule, anchor) -> _Rows:
    """The group's row structure; column mode and unknown reducers are refused."""
    info = _analyze_rows(sch, anchor)
    if not info.row_mode:
        raise ValueError("the GPU row template reduces innermost axes only (column mode: "
                         "dlight's rules)")
    if "other" in _reducer_names(sch, info):
        raise ValueError("a reducer TVM's cross-thread reduction does not know (the "
                         "NaN-keeping max)")
    return info


def _vector_options(k: int) -> list[int]:
    return [v for v in VECTORS if k % v == 0]


def _cached_bytes(sch: Schedule, info: _Rows, rows: int) -> int:
    buffer, _ = _reduced_dims(sch, info.reductions[0])
    return rows * info.k * buffer.dtype.bits // 8


def row_fallback(rows: int, k: int, passes: int, sms: int, shared_limit: int,
                 warp: int = 32, period: int | None = None) -> dict[str, Any]:
    """The fallback config of a group of `rows` rows of `k` elements read by `passes`
    passes (reductions and a row-shaped store), from the target's facts; `period`:
    row_period (None: the rows are one axis)."""
    threads = 1 << max(0, math.ceil(math.log2(max(1, math.ceil(k / ELEMENTS_PER_THREAD)))))
    threads = min(1024, max(min(warp, 1 << math.ceil(math.log2(k))), threads))
    per_block = max(1, BLOCK_THREADS // threads)
    # rows per block dividing the row axis: no predicate around the block's syncs
    period = rows if period is None else period
    per_block = max(r for r in ROWS if r <= per_block and period % r == 0)
    while per_block > 1 and math.ceil(rows / per_block) < WAVES * sms:
        per_block //= 2
    vector = max(_vector_options(k))
    cache = "shared" if passes > 1 and per_block * k * 4 <= shared_limit else "none"
    return {"threads": threads, "rows": per_block, "vector": vector, "cache": cache}


def row_features(rows: int, k: int, passes: int, config: dict[str, Any],
                 info: Any) -> dict[str, float]:
    """What decides a row kernel's speed, without scheduling it (KERNEL_FEATURES)."""
    threads, per_block = int(config["threads"]), int(config["rows"])
    vector = int(config["vector"])
    sms = info.multiprocessors or 108
    blocks = math.ceil(rows / per_block)
    waves = blocks / sms
    cached = config["cache"] == "shared"
    return {
        "rows": rows, "k": k, "threads": threads, "rows_per_block": per_block,
        "block_threads": threads * per_block, "blocks": blocks, "waves": waves,
        "wave_efficiency": waves / math.ceil(waves), "elements_per_thread": k / threads,
        "vector_bytes": 4 * vector, "shared_bytes": per_block * k * 4 if cached else 0,
        "cached": float(cached), "passes": passes,
        "warp_reduce": float(threads <= (info.warp_size or 32)),
        "idle_lanes": (math.ceil(k / threads) * threads - k) / max(k, 1),
    }


def _passes(info: _Rows) -> int:
    """How often the group reads a row: each reduction, and the store of a
    row-shaped output."""
    return len(info.reductions) + (1 if info.out_kind == "full" else 0)


class GpuRowReduceTemplate(Template):
    """See the module docstring."""

    target_kind = "cuda"

    def __init__(self, name: str) -> None:
        self.name = name

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        info = _row_facts(ctx.sch, ctx.block)
        limit = ctx.info.max_threads_per_block or 1024
        space = ConfigSpace()
        space.define_choice("threads", [t for t in THREADS if t <= limit])
        space.define_choice("rows", list(ROWS))
        space.define_choice("vector", _vector_options(info.k))
        space.define_choice("cache", list(CACHES))
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        info = _row_facts(ctx.sch, ctx.block)
        values = row_fallback(info.rows, info.k, _passes(info), ctx.info.multiprocessors or 108,
                              ctx.info.max_shared_memory_per_block or 49152,
                              ctx.info.warp_size or 32, row_period(ctx.sch, info))
        return space.from_json(values)

    def kernel_features(self, workload: dict[str, Any], config: dict[str, Any],
                        info: Any) -> list[float]:
        """The cost model's features beyond the knobs, log-scaled like the matmul
        template's. The row shape is read from the workload's first input (the rows
        are its leading axes, the reduced ones its last)."""
        shape = workload["inputs"][0][0]
        k = shape[-1] if shape else 1
        passes = 3 if self.name in ("softmax", "log_softmax", "layer_norm") else 1
        values = row_features(math.prod(shape) // max(k, 1), k, passes, config, info)
        return [math.log2(1 + values[name]) for name in KERNEL_FEATURES]

    def apply(self, ctx: ScheduleContext, config: Config) -> Schedule:
        sch = ctx.sch
        inline_injective(sch)
        info = _row_facts(sch, ctx.block)
        threads, per_block = config["threads"], config["rows"]
        vector, cache = config["vector"], config["cache"]
        limit = ctx.info.max_threads_per_block or 1024
        if threads * per_block > limit:
            raise ValueError(f"{threads} x {per_block} threads; a block may have {limit}")
        if info.k % vector:
            raise ValueError(f"vector {vector} does not divide the row of {info.k}")
        shared_limit = ctx.info.max_shared_memory_per_block or 49152
        if cache == "shared" and _cached_bytes(sch, info, per_block) > shared_limit:
            raise ValueError(f"{per_block} rows of {info.k} do not fit in shared memory")
        if row_period(sch, info) % per_block:  # a predicate around the block's syncs
            raise ValueError(f"{per_block} rows per block do not divide the row axis of "
                             f"{row_period(sch, info)}")
        schedule_rows(sch, info, threads, per_block, vector, cache)
        _drop_anchor_copies(sch, ctx.block)
        return sch


def schedule_rows(sch: Schedule, info: _Rows, threads: int, per_block: int, vector: int,
                  cache: str) -> None:
    """The row schedule of the module docstring on `sch` (injective blocks inlined)."""
    out = info.out
    # every loop of the kernel bound to threadIdx.x has this extent: TVM launches a
    # kernel with one extent per axis (see gpu_default.uneven_thread_extents)
    threads = min(threads, info.k)
    rows, inner = row_loops(sch, info)
    if not rows:  # one row: a unit loop stands for it
        rows = [sch.add_unit_loop(sch.get_loops(out)[0])]
    bx, ty = _split_rows(sch, rows, per_block)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    name = block_name(sch, out)
    others = [b for b in root_blocks(sch) if block_name(sch, b) != name]
    for block in reversed(others):
        sch.compute_at(block, ty, preserve_unit_loops=True)
        # a row's maximum or sum, read by every thread of the row
        sch.set_scope(block, 0, "local")
    if cache == "shared":
        _cache_row(sch, info, bx, threads, per_block, vector)
    for red in info.reductions:
        _bind_reduction(sch, sch.get_sblock(block_name(sch, red)), threads)
    if inner is not None:
        _bind_row_loop(sch, inner, threads, vector)
    elif info.out_kind == "rows" and threads > 1:
        # one value per row: thread 0 of the row stores it
        _, tx = sch.split(sch.add_unit_loop(out), [1, threads])
        sch.bind(tx, "threadIdx.x")


def _split_rows(sch: Schedule, rows: list, per_block: int) -> tuple:
    """(blocks, rows of a block): the innermost row axis longer than 1 split by
    `per_block`, the loops around fused. A block's rows then differ in that axis
    alone: the region of its rows (the shared cache spans every threadIdx.y of the
    block) is `per_block` rows, not the bounding box of a fused index's rows (four
    rows of a (batch, head, query) index that cross a head would span two heads)."""
    extents = [int(sch.get(lp).extent) for lp in rows]
    axis = max((i for i, e in enumerate(extents) if e > 1), default=len(rows) - 1)
    if extents[axis] % per_block:
        raise ValueError(f"{per_block} rows per block do not divide the row axis of "
                         f"{extents[axis]}")
    outer, inner = sch.split(rows[axis], [extents[axis] // per_block, per_block])
    after = rows[axis + 1:]  # unit loops
    if after:
        sch.reorder(outer, *after, inner)
    loops = [*rows[:axis], outer, *after]
    return (sch.fuse(*loops) if len(loops) > 1 else loops[0]), inner


def _bind_row_loop(sch: Schedule, loop, threads: int, vector: int, rows: int = 0) -> None:
    """A spatial loop over a row: (outer, threadIdx.x, vector lanes), the lanes an
    exact split so that the vector loop carries no predicate; with `rows`, a loop over
    a block's rows, spread over threadIdx.y too: (outer, threadIdx.y, threadIdx.x,
    lanes)."""
    extent = int(sch.get(loop).extent)
    outer, lanes = sch.split(loop, [extent // vector, vector])
    if rows:
        _, ty, tx = sch.split(outer, [None, rows, threads])
        sch.bind(ty, "threadIdx.y")
    else:
        _, tx = sch.split(outer, [None, threads])
    sch.bind(tx, "threadIdx.x")
    if vector > 1:
        sch.vectorize(lanes)


def _bind_reduction(sch: Schedule, block, threads: int) -> None:
    """The reduction loops of `block` fused and split over `threads` threads
    (threadIdx.x): TVM lowers it to a cross-thread reduction."""
    red = reduction_loops(sch, block)
    if not red:
        return
    k = sch.fuse(*red) if len(red) > 1 else red[0]
    _, tx = sch.split(k, [None, threads])
    sch.bind(tx, "threadIdx.x")


def _cache_row(sch: Schedule, info: _Rows, at, threads: int, per_block: int,
               vector: int) -> None:
    """The rows of the input the reductions read, loaded into shared memory under the
    block loop `at` by all threads of the block (threadIdx.y and threadIdx.x,
    `vector`-wide) and read from there by every pass."""
    buffer, _ = _reduced_dims(sch, info.reductions[0])
    first = sch.get_sblock(block_name(sch, info.reductions[0]))
    index = next(i for i, r in enumerate(sch.get(first).reads) if r.source.same_as(buffer))
    cached = sch.cache_read(first, index, "shared")
    sch.compute_at(cached, at, preserve_unit_loops=True)
    below = sch.get_loops(cached)[_depth_of(sch, at, cached):]
    row = sch.fuse(*below) if len(below) > 1 else below[0]
    _bind_row_loop(sch, row, threads, vector, rows=per_block)


def row_period(sch: Schedule, info: _Rows) -> int:
    """The innermost kept extent longer than 1 (1: a single row): the row axis that
    the rows per block split (_split_rows)."""
    buffer, dims = _reduced_dims(sch, info.reductions[0])
    kept = [int(d) for i, d in enumerate(buffer.shape) if i not in dims and int(d) > 1]
    return kept[-1] if kept else 1


def _depth_of(sch: Schedule, loop, block) -> int:
    """How many of `block`'s loops enclose `loop`, `loop` included."""
    loops = sch.get_loops(block)
    for i, lp in enumerate(loops):
        if sch.get(lp).same_as(sch.get(loop)):
            return i + 1
    raise ValueError("the loop does not enclose the block")


class GpuPoolTemplate(GpuRowReduceTemplate):
    """Global pools (one output per channel, no padding) are row reductions; windowed
    pools are refused here and get the direct schedule (gpu_default.py)."""

    def __init__(self) -> None:
        super().__init__("pool")

    def tunable(self, workload: dict[str, Any]) -> bool:
        # the pool's own attrs say whether it is global (a windowed one is no task)
        (shape, _), = workload["inputs"]
        attrs = workload["attrs"]
        if "output_size" in attrs:  # adaptive
            return list(attrs["output_size"]) == [1, 1]
        return list(attrs["pool_size"]) == list(shape[-2:]) and not any(attrs["padding"])

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        if not _is_global_pool(ctx.sch, ctx.block):
            raise ValueError("a windowed pool: the direct schedule")
        return super().define_space(ctx)


for _kind in ("reduce", "variance", "softmax", "log_softmax", "layer_norm"):
    register_template(GpuRowReduceTemplate(_kind))
register_template(GpuPoolTemplate())
