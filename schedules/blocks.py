"""What every schedule (default.py and each template) asks of a TensorIR schedule,
written once: block queries, loop extents, divisors and vector widths, inlining, and
the tail every tiled anchor nest shares (epilogue under the tile, parallel outer
loops, vectorized last loop).

Semantics, one each:
  loop_extent(sch, loop)       int, or None when the extent is symbolic
  static_extents(sch, loops)   list of ints; raises ValueError on a symbolic extent
                               (a template that needs numbers refuses the kernel)
  divisors(n)                  every divisor of n, ascending
  reduction_loops(sch, block)  the loops whose variable a reduction iter of `block`
                               binds, read off the bindings (never guessed from
                               positions or extents)
Every helper takes the Schedule and block/loop RVs; none reads the build host.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import tvm
from tecc.schedules.computes import ANCHOR_ATTR, KEEP_ATTR
from tvm.s_tir import SBlockRealize
from tvm.s_tir.schedule import Schedule, ScheduleError

__all__ = [
    "ANCHOR_ATTR", "COMM_REDUCE", "DATA_PAR", "KEEP_ATTR", "PARALLEL_MIN_WORK",
    "PADDED_ANCHORS",
    "accumulator_budget", "all_blocks", "anchor_kind", "best_vector_width", "block_name",
    "divisors", "elementwise_consumer", "epilogue_block", "injective_anchor",
    "inline_injective", "is_reduction", "iter_types", "largest_divisor", "loop_extent",
    "output_names", "pad_iteration", "padding_producer", "parallel_copy", "reads_elementwise",
    "reduction_loops", "shared_exp",
    "root_blocks", "static_extent", "static_extents", "tile_epilogue_parallel", "vector_registers",
    "vars_in", "vector_width_options", "vectorize_tail",
]

DATA_PAR, COMM_REDUCE = 0, 2  # tirx IterVar types
PARALLEL_MIN_WORK = 16384  # elements: below, thread-pool start-up costs more than it saves
# Anchors whose padding producer stays a buffer (see inline_injective).
PADDED_ANCHORS = ("conv2d", "pool", "conv2d_NCHWc", "depthwise_conv2d_NCHWc")


# ---------------------------------------------------------------- block queries


def root_blocks(sch: Schedule) -> list:
    """The blocks directly under the root block, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def all_blocks(sch: Schedule) -> list:
    """Every block of the function, nested ones too (rf blocks under a row loop)."""
    out = []

    def walk(parent) -> None:
        for child in sch.get_child_blocks(parent):
            out.append(child)
            walk(child)

    walk(sch.get_sblock("root"))
    for block in root_blocks(sch):
        for loop in sch.get_loops(block)[:1]:
            for child in sch.get_child_blocks(loop):
                if child not in out:
                    out.append(child)
    return out


def block_name(sch: Schedule, block) -> str:
    return sch.get(block).name_hint


def iter_types(sch: Schedule, block) -> list[int]:
    return [int(iv.iter_type) for iv in sch.get(block).iter_vars]


def is_reduction(sch: Schedule, block) -> bool:
    return any(t != DATA_PAR for t in iter_types(sch, block))


def anchor_kind(sch: Schedule, block) -> str | None:
    """The block's "tecc.anchor" annotation (computes.py), None when it has none."""
    value = sch.get(block).annotations.get(ANCHOR_ATTR)
    return None if value is None else str(value)


def output_names(sch: Schedule) -> set[str]:
    return {block_name(sch, b) for b in sch.get_output_blocks(sch.get_sblock("root"))}


def injective_anchor(sch: Schedule):
    """The block that stands for a group of injective ops (no anchor, no reduction at
    the root): its last output block. None for any other group."""
    blocks = root_blocks(sch)
    if not blocks or any(anchor_kind(sch, b) is not None or is_reduction(sch, b)
                         for b in blocks):
        return None
    outputs = list(sch.get_output_blocks(sch.get_sblock("root")))
    return outputs[-1] if outputs else None


def padding_producer(sch: Schedule, block):
    """The padding block `block` reads (kept materialized by inline_injective), or None."""
    pads = [p for p in sch.get_producers(block)
            if not is_reduction(sch, p) and "pad" in block_name(sch, p)]
    return pads[0] if pads else None


def reads_elementwise(sch: Schedule, consumer, buffer) -> bool:
    """Whether `consumer` reads `buffer` at its own index (same index, same shape).
    reverse_compute_at relaxes a consumer's region to a bounding box; unless it reads
    elementwise, that box can cover elements other tiles have not produced yet."""
    block = sch.get(consumer)
    ivars = [iv.var for iv in block.iter_vars]
    for region in block.reads:
        if not region.source.same_as(buffer):
            continue
        # a buffer padded past the consumer's domain (pad_iteration) is still read
        # elementwise: each iteration reads its own index, inside the buffer
        if len(region.region) != len(ivars) or any(
                int(d) < int(iv.dom.extent)
                for d, iv in zip(region.source.shape, block.iter_vars, strict=True)):
            return False
        for rng, var in zip(region.region, ivars, strict=True):
            if not (rng.min.same_as(var) and int(rng.extent) == 1):
                return False
    return True


def elementwise_consumer(sch: Schedule, producer):
    """The single spatial consumer of `producer` if it reads the producer's result
    elementwise (it can then be computed under the producer's tile loops), else None."""
    consumers = list(sch.get_consumers(producer))
    if len(consumers) != 1 or is_reduction(sch, consumers[0]):
        return None
    buffer = sch.get(producer).writes[0].source
    return consumers[0] if reads_elementwise(sch, consumers[0], buffer) else None


def vars_in(expr) -> set:
    """The variables `expr` uses."""
    return set(tvm.tirx.analysis.undefined_vars(expr, []))


def reduction_loops(sch: Schedule, block) -> list:
    """The loops of `block` whose variable appears in the binding of a reduction iter
    (in loop order): read off the block's bindings, not guessed from loop positions or
    extents (a reordered nest, or a lane loop as long as the reduction, fools both)."""
    red_vars: set = set()
    for iv, value in _bindings(sch, block):
        if int(iv.iter_type) != DATA_PAR:
            red_vars |= vars_in(value)
    return [lp for lp in sch.get_loops(block) if sch.get(lp).loop_var in red_vars]


def _bindings(sch: Schedule, block) -> list:
    """(iter var, bound value) pairs of `block`'s SBlockRealize, found below its
    innermost loop (next to sibling blocks a compute_at put there)."""
    loops = sch.get_loops(block)
    target = sch.get(block)
    stack = [sch.get(loops[-1]).body if loops else sch.get(sch.get_sblock("root")).body]
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, SBlockRealize):
            if stmt.block.same_as(target):
                return list(zip(stmt.block.iter_vars, stmt.iter_values, strict=True))
        elif isinstance(stmt, tvm.tirx.SeqStmt):
            stack.extend(stmt.seq)
        elif hasattr(stmt, "body"):
            stack.append(stmt.body)
    raise ValueError(f"no realize of block {target.name_hint} below its loops")


# ---------------------------------------------------------------- loop extents


def loop_extent(sch: Schedule, loop) -> int | None:
    """The loop's extent; None when it is symbolic."""
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tvm.tirx.IntImm) else None


def static_extent(sch: Schedule, loop) -> int:
    """The loop's extent; a symbolic one raises ValueError (the template refuses)."""
    return static_extents(sch, [loop])[0]


def static_extents(sch: Schedule, loops: Sequence) -> list[int]:
    """The loops' extents; a symbolic one raises ValueError (the template refuses)."""
    out = []
    for lp in loops:
        ext = loop_extent(sch, lp)
        if ext is None:
            raise ValueError("symbolic loop extent")
        out.append(ext)
    return out


# ---------------------------------------------------------------- divisors, widths


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def largest_divisor(n: int, limit: int, pow2: bool = False) -> int:
    """Largest d <= limit dividing n (a power of two when pow2)."""
    for d in range(min(limit, n), 0, -1):
        if n % d == 0 and (not pow2 or d & (d - 1) == 0):
            return d
    return 1


def vector_width_options(n: int, lanes: int) -> list[int]:
    """Exact divisors of `n` usable as a vector width: up to four vectors."""
    return [d for d in divisors(n) if d <= 4 * lanes] or [1]


def best_vector_width(n: int, lanes: int) -> int:
    """Default vector width for an extent n: two vectors when a power of two divides n
    that far (two independent accumulators), else the widest divisor up to two
    vectors, preferring powers of two."""
    opts = vector_width_options(n, lanes)
    pow2 = [d for d in opts if d & (d - 1) == 0 and d <= 2 * lanes]
    if pow2 and pow2[-1] >= min(lanes, 4):
        return pow2[-1]
    small = [d for d in opts if d <= 2 * lanes]
    return small[-1] if small and small[-1] >= 3 else (pow2[-1] if pow2 else 1)


def vector_registers(lanes: int) -> int:
    """Vector registers of the ISA with `lanes` float32 lanes: 32 with AVX-512, 16 with
    AVX2 (and for narrower units)."""
    return 32 if lanes >= 16 else 16


def accumulator_budget(lanes: int, vecs: int) -> int:
    """Accumulator vectors of a register tile: the vector registers less the `vecs`
    weight vectors and one broadcast input value."""
    return max(vecs, min(28, vector_registers(lanes) - vecs - 1))


# ---------------------------------------------------------------- inlining


def inline_injective(sch: Schedule, keep: Callable[[Schedule, Any], bool] | None = None
                     ) -> None:
    """compute_inline every spatial block that is not an output into its consumers
    (elementwise chains, broadcasts, reshapes, scalar constants), repeating until
    nothing changes (inlining one block can make its producer inlinable). Padding read
    by a conv or pool stays a buffer: inlined, it puts a bounds check in the anchor's
    innermost loop (the templates decide where it is produced); so does a block that
    `keep` names (the template computes it once for its consumers) and one its compute
    marked KEEP_ATTR (its op's template places it)."""
    outputs = output_names(sch)
    changed = True
    while changed:
        changed = False
        for block in root_blocks(sch):
            name = block_name(sch, block)
            if is_reduction(sch, block) or name in outputs or _padding_of_anchor(sch, block):
                continue
            if KEEP_ATTR in sch.get(block).annotations:
                continue
            if keep is not None and keep(sch, block):
                continue
            try:
                sch.compute_inline(block)
                changed = True
            except ScheduleError:  # not inlinable (e.g. a non-affine store): stays
                pass


# the blocks of common.exp_of: fast_exp for float32, exp otherwise
EXP_BLOCKS = ("T_fast_exp", "exp")


def shared_exp(sch: Schedule, block) -> bool:
    """An exp read by a reduction and another block (softmax's, by the exp-sum and the
    normalize): inlined, it is computed once per reader. The CPU's row-reduction
    template keeps it as a row buffer in L1 (`inline_injective(keep=shared_exp)`),
    cheaper there than a second exp per element."""
    if block_name(sch, block) not in EXP_BLOCKS:
        return False
    consumers = sch.get_consumers(block)
    return len(consumers) > 1 and any(is_reduction(sch, c) for c in consumers)


def _padding_of_anchor(sch: Schedule, block) -> bool:
    if "pad" not in block_name(sch, block):
        return False
    return any(anchor_kind(sch, c) in PADDED_ANCHORS for c in sch.get_consumers(block))


# ---------------------------------------------------------------- tiled anchors


def epilogue_block(sch: Schedule, write_back):
    """The block to compute under an anchor's tile: the write-back block, or (when the
    anchor's result feeds one elementwise epilogue) the write-back inlined into the
    epilogue. A reshaping epilogue stays at the root (generic schedule)."""
    consumers = list(sch.get_consumers(write_back))
    if len(consumers) == 1 and not is_reduction(sch, consumers[0]):
        if not reads_elementwise(sch, consumers[0], sch.get(write_back).writes[0].source):
            return write_back
        sch.compute_inline(write_back)
        return consumers[0]
    return write_back


def parallel_copy(sch: Schedule, block) -> None:
    """Schedule a copy block (a packing, a padded copy): its outer loops fused and
    parallel when large enough; the row stays a plain loop LLVM vectorizes (rows of
    odd length included, where a split by the vector width would leave a tail)."""
    loops = sch.get_loops(block)
    extents = static_extents(sch, loops)
    if len(loops) < 2 or math.prod(extents) < PARALLEL_MIN_WORK:
        return
    sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])


def pad_iteration(sch: Schedule, block, factors: Sequence[int]) -> list:
    """Pad `block`'s iteration domain up to multiples of `factors` (one per block
    iter, 1: unpadded), so that tiles of those sizes are all full: the inner loops of
    a tiled nest then carry no bounds test. The inputs indexed by a padded iter are
    copied into zero-padded buffers, the block writes a padded buffer, and the
    original result is its slice (TVM's pad_einsum); that slice is inlined into its
    consumer, so an epilogue computed under the tile reads the padded result at its
    own index. A read that is not indexed by plain iters (a weight packed as
    W[n // nb, k, n % nb]) is reindexed for pad_einsum and inlined back: it stays the
    caller's buffer, as long as the iters it uses are not padded. Returns the blocks
    writing the padded copies of inputs (none when every extent is a multiple)."""
    stmt = sch.get(block)
    extents = [int(iv.dom.extent) for iv in stmt.iter_vars]
    padding = [f if f > 1 and e % f else 1 for e, f in zip(extents, factors, strict=True)]
    if all(f == 1 for f in padding):
        return []
    plain = {iv.var for iv in stmt.iter_vars}
    reindexed = [sch.reindex(block, ("read", i)) for i, region in enumerate(stmt.reads)
                 if not all(int(r.extent) == 1 and (isinstance(r.min, tvm.tirx.IntImm)
                                                    or any(r.min.same_as(v) for v in plain))
                            for r in region.region)]
    out = sch.get(block).writes[0].source
    inputs = [r.source for r in sch.get(block).reads]
    sch.pad_einsum(block, padding)
    for copy in reindexed:
        sch.compute_inline(copy)
    copies = [p for p in sch.get_producers(block)
              if not any(buf.same_as(sch.get(p).writes[0].source) for buf in inputs)]
    # the slice block writes the original result; a result that is no output is
    # folded into the block reading it
    slice_block = next(b for b in sch.get_consumers(block)
                       if sch.get(b).writes[0].source.same_as(out))
    if block_name(sch, slice_block) not in output_names(sch) and sch.get_consumers(slice_block):
        try:
            sch.compute_inline(slice_block)
        except ScheduleError:  # a consumer that cannot take it: the slice stays a copy
            pass
    return copies


def tile_epilogue_parallel(sch: Schedule, write_back, at, outer: Sequence, work: int):
    """The tail every tiled anchor nest shares: the epilogue (or write-back) computed
    under loop `at` on the finished tile, the `outer` loops fused and made parallel when
    there is enough work. Returns the epilogue block and the fused outer loop."""
    target = epilogue_block(sch, write_back)
    sch.reverse_compute_at(target, at, preserve_unit_loops=True)
    top = sch.fuse(*outer)
    if work >= PARALLEL_MIN_WORK:
        sch.parallel(top)
    return target, top


def vectorize_tail(sch: Schedule, block, lanes: int) -> None:
    """Vectorize the last of `block`'s loops (under the tile) when its extent allows."""
    last = sch.get_loops(block)[-1]
    ext = loop_extent(sch, last)
    if ext is None or ext < 2:
        return
    vec = largest_divisor(ext, lanes, pow2=True)
    if vec == ext or 4 <= ext <= 2 * lanes:  # short odd rows: one vector + LLVM's tail
        sch.vectorize(last)
    elif vec > 1:
        _, vi = sch.split(last, [None, vec])
        sch.vectorize(vi)
