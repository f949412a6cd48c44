"""The SIMT matmul schedule of the GPU matmul and conv templates (fp32 on CUDA cores).

Any dense-like group is first normalized as dlight does, to C[S, I, J] += A[S, I, K] *
B[S, J, K] (reindex blocks that later inline into the fetches), padded to whole
tiles. Then, per thread block a BM x BN tile of C, per thread a register tile of
(vm * mm) x (vn * mn) accumulators:

- each step of the k loop stages a BK slice of A and of B in shared memory, stored
  k-major (As[k][i], Bs[k][j]) so that a thread's fragment of a row of its register
  tile is contiguous: one 128-bit shared load per 4 values; the cooperative global
  loads run along the operand's contiguous dimension in memory (k for x @ w.T, j for
  x @ w, the output column for conv's im2col), vectorized where that is unit-stride;
- the fragments of A and B for one k are copied into registers, then the outer
  product updates the accumulators (every shared value read once per thread);
- threadIdx.x runs along J (the output's contiguous dimension: stores coalesce),
  virtual threads spread a thread's columns by tn * mn so that a warp's fragment
  loads fall in distinct banks;
- the k loop is software-pipelined by the `pipeline` knob ("double": two shared
  buffers, "async": cp.async copies on sm_80+);
- the epilogue (bias, activation, residual) runs on the accumulators before the store.
"""

from __future__ import annotations

from typing import Any

from tecc.schedules.blocks import reduction_loops
from tvm import sym, tirx
from tvm.s_tir import Schedule
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.matmul import (
    auto_inline_consumer_chain,
    auto_inline_consumers,
    auto_inline_producers,
    get_index_map,
    get_reduction_blocks,
)


def _contiguous_axis(sch: Schedule, block: Any, index: int) -> str | None:
    """Whether the read `index` of the matmul block walks memory with unit stride
    along a spatial axis ("s": i for A, j for B) or along k ("k"). Where the operand
    is computed in the kernel (a head split fused into attention's matmul: it is
    inlined into the fetch), the memory is its source's, read through the composed
    index; else the operand's own last index."""
    stmt = sch.get(block)
    kinds = {iv.var: ("k" if iv.iter_type == tirx.IterVar.CommReduce else "s")
             for iv in stmt.iter_vars}
    source = _source_index(sch, block, index, kinds)
    if source is not None:
        return source
    last = stmt.reads[index].region[-1].min
    used = {kinds[v] for v in tirx.analysis.undefined_vars(last) if v in kinds}
    # conv's im2col reads x[.., oh * s + kh, ow * s + kw]: unit stride along ow
    return "s" if "s" in used else "k" if used else None


def _source_index(sch: Schedule, block: Any, index: int,
                  kinds: dict[Any, str]) -> str | None:
    """The contiguous axis of operand `index` in the memory of the one buffer its
    producers read, or None where it has no producer, or several sources, or is not
    read at plain loop indices. A unit stride along an own spatial axis wins over
    one along k; without a provable unit stride, the axes the last index uses
    (batch axes, read by both operands, do not count)."""
    stmt = sch.get(block)
    reads = stmt.reads
    region = reads[index].region
    if not all(isinstance(r.min, tirx.Var) for r in region):
        return None
    buffer = reads[index].source
    if not any(buffer.same_as(w.source) for b in sch.get_producers(block)
               for w in sch.get(b).writes):
        return None  # a parameter of the kernel: its own layout is the memory's
    other = {v for r in reads[1 - index].region for v in tirx.analysis.undefined_vars(r.min)}
    axis_kinds = ["batch" if r.min in other and kinds.get(r.min) == "s"
                  else kinds.get(r.min) for r in region]
    probe = sch.copy()
    fetch = probe.cache_read(block, index, "shared")
    auto_inline_producers(probe, fetch)
    fetched = probe.get(fetch)
    if len(fetched.reads) != 1:
        return None
    analyzer = sym.Analyzer()
    for iv in fetched.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    last = analyzer.simplify(fetched.reads[0].region[-1].min)
    axis_vars = [iv.var for iv in fetched.iter_vars]
    unit = set()
    for var, kind in zip(axis_vars, axis_kinds, strict=True):
        coefficients = sym.detect_linear_equation(last, [var])
        if len(coefficients) == 2 and analyzer.can_prove_equal(coefficients[0], 1):
            unit.add(kind)
    if not unit:
        used = set(tirx.analysis.undefined_vars(last))
        unit = {kind for var, kind in zip(axis_vars, axis_kinds, strict=True) if var in used}
    return "s" if "s" in unit else "k" if "k" in unit else None


def _by_thread(tile_x: int, tile_k: int, inner_is_x: bool, per_step: int) -> Any:
    """The index map of a register-staged operand (s, x, k) -> (s, tile of x, tile of
    k, step, lane): the cooperative load's flat position in its tile split into its
    steps and the lanes of one step, so that each thread's values compact to a dense
    (steps, vector) array, i.e. registers."""
    def index(s: Any, x: Any, kk: Any) -> tuple[Any, ...]:
        xi, ki = x % tile_x, kk % tile_k
        flat = ki * tile_x + xi if inner_is_x else xi * tile_k + ki
        return s, x // tile_x, kk // tile_k, flat // per_step, flat % per_step

    return index


def schedule_simt_matmul(func: tirx.PrimFunc, tile: tuple[int, ...], block_k: int,
                         vector: int, unroll: int, pipeline: str,
                         split_k: int = 1) -> Schedule | None:
    """The schedule described in the module docstring, or None when `func` holds no
    dense-like reduction. `tile` = (threads along I, along J, vthreads I, J,
    micro tile I, J). `split_k` > 1: the k loop split into that many slices, one grid
    of blocks each (rfactor), whose partial sums a second kernel adds up, an output
    element per thread; the epilogue's last block, where one is left, gets the plain
    binding (gpu_default.bind_unbound)."""
    tm, tn, vm, vn, mm, mn = tile
    sch = Schedule(func)
    root = get_root_block(sch)
    blocks = sch.get_child_blocks(root)
    reductions = get_reduction_blocks(sch, blocks)
    if reductions is None or len(reductions) != 1:
        return None
    main = reductions[0]
    if not get_index_map(sch.get(main)):
        return None
    # Memory contiguity of the operands, read before normalization renames them.
    a_axis = _contiguous_axis(sch, main, 0)
    b_axis = _contiguous_axis(sch, main, 1)
    # whether each operand is read at its loop indices as they are (no im2col gather)
    plain = all(isinstance(r.min, tirx.Var | tirx.IntImm)
                for read in sch.get(main).reads[:2] for r in read.region)

    reindex_a = sch.reindex(main, ("read", 0))
    reindex_b = sch.reindex(main, ("read", 1))
    reindex_c = sch.reindex(main, ("write", 0))
    matmul_map, a_map, b_map, c_map = get_index_map(sch.get(main))
    sch.transform_layout(reindex_a, ("write", 0), a_map)
    sch.transform_layout(reindex_b, ("write", 0), b_map)
    sch.transform_layout(reindex_c, ("read", 0), c_map)
    sch.transform_block_layout(main, matmul_map)

    block_m, block_n = tm * vm * mm, tn * vn * mn
    extents = [sch.get(loop).extent for loop in sch.get_loops(main)]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    _, size_m, size_n, size_k = (int(e) for e in extents)
    sch.pad_einsum(main, [1, block_m, block_n, block_k * split_k])
    batch, i, j, k = sch.get_loops(main)
    slices, write_back = [], None
    if split_k > 1:
        write_back = main
        kz, k = sch.split(k, [split_k, None])
        # rf[kz, s, i, j]: the partial sums; `main` from here on computes them
        main = sch.rfactor(kz, 0)
        # rfactor rebuilt the nest: the rf block's loops, kz now among them
        batch, i, j, kz, k = sch.get_loops(main)
        slices = [kz]
    bi, vi, ti, ii = sch.split(i, [None, vm, tm, mm])
    bj, vj, tj, ji = sch.split(j, [None, vn, tn, mn])
    ko, ki = sch.split(k, [None, block_k])
    sch.reorder(*slices, batch, bi, bj, vi, vj, ti, tj, ko, ki, ii, ji)
    bz = sch.fuse(*slices, batch, bi)
    sch.bind(bz, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(vi, "vthread.y")
    sch.bind(vj, "vthread.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    if unroll > 0:
        sch.annotate(tj, "pragma_auto_unroll_max_step", unroll)
        sch.annotate(tj, "pragma_unroll_explicit", 1)

    accumulate = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(accumulate, tj, preserve_unit_loops=True)

    threads = tm * tn

    def load_width(axis: str | None, operand: str) -> int:
        # 128-bit loads where the unit-stride axis has whole vectors, without padding
        tile_x, size_x = (block_m, size_m) if operand == "i" else (block_n, size_n)
        along = (tile_x, size_x) if axis == "s" else (block_k, size_k)
        return vector if (along[0] % vector == 0 and along[1] % vector == 0
                          and tile_x * block_k % (threads * vector) == 0) else 1

    operands = ((a_axis, "i"), (b_axis, "j"))
    widths = [load_width(axis, operand) for axis, operand in operands]
    # Register staging needs each thread's staged values at indices nvcc can keep in
    # registers: vectorized plain loads give that; a gather (conv's im2col) or an
    # unvectorized edge would leave the staging array in local memory (measured on the
    # H200: ResNet-18's 512x7x7 conv at batch 16 at half the speed), so it keeps
    # the two-buffer pipeline.
    stage = pipeline == "double" and plain and min(widths) > 1
    fetches = []
    for index, (axis, operand) in enumerate(operands):
        fetch = sch.cache_read(main, index, "shared")
        sch.compute_at(fetch, ko, preserve_unit_loops=True)
        # k-major in shared memory: a thread's fragment along i (or j) is contiguous
        sch.transform_layout(fetch, ("write", 0), lambda s, x, kk: (s, kk, x))
        s_loop, x_loop, k_loop = sch.get_loops(fetch)[-3:]
        inner = x_loop if axis == "s" else k_loop  # the global unit-stride axis
        tile_x = block_m if operand == "i" else block_n
        width = widths[index]
        staged = None
        if stage:
            # Register staging: the next tile's global loads go to registers before
            # this tile's FMAs and reach shared memory after them (the pipeline's
            # order below), so their latency hides behind a whole k step.
            staged = sch.cache_read(fetch, 0, "local")
            sch.compute_at(staged, ko, preserve_unit_loops=True)
            # each thread's values in a dense (steps, vector) array: registers
            sch.transform_layout(staged, ("write", 0), _by_thread(
                tile_x, block_k, inner is x_loop, threads * width))
        for block, is_staged in ([(staged, True)] if staged is not None else []) + [
                (fetch, False)]:
            s_loop, x_loop, k_loop = sch.get_loops(block)[-3:]
            if is_staged:
                inner, outer = (x_loop, k_loop) if axis == "s" else (k_loop, x_loop)
            else:
                inner = x_loop if axis == "s" else k_loop
                outer = k_loop if inner is x_loop else x_loop
            sch.reorder(s_loop, outer, inner)
            fused = sch.fuse(s_loop, outer, inner)
            _, ty, tx, vec = sch.split(fused, [None, tm, tn, width])
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")
            if width > 1:
                sch.vectorize(vec)
        sch.storage_align(fetch, 0, axis=1, factor=32, offset=4)
        fetches.append(staged if staged is not None else fetch)  # reads the operand
        # the fragment of this k in registers
        fragment = sch.cache_read(main, index, "local")
        sch.compute_at(fragment, ki, preserve_unit_loops=True)
        frag_loop = sch.get_loops(fragment)[-1]
        if sch.get(frag_loop).extent.value % 4 == 0 and \
                (mm if operand == "i" else mn) % 4 == 0:
            _, v = sch.split(frag_loop, [None, 4])
            sch.vectorize(v)

    for fetch in fetches:
        auto_inline_producers(sch, fetch)
    if write_back is None:
        auto_inline_consumer_chain(sch, accumulate)
    else:
        # the sum of the slices (a reduction: nothing inlines into it) and after it the
        # epilogue, its injective blocks inlined into the last one: two kernels more
        auto_inline_consumers(sch, write_back)
        _bind_slice_sum(sch, write_back)
    sch.decompose_reduction(main, ko)
    # the whole k step unrolled: fragment loads at constant shared offsets, no loop
    # counter between the FMA blocks (auto-unroll stops at the register tile)
    sch.unroll(ki)
    if stage:
        # ko's body: A to registers, A to shared, B to registers, B to shared, FMAs;
        # run as loads (k + 1), FMAs (k), stores (k + 1): one shared tile, two syncs
        sch.annotate(ko, "software_pipeline_stage", [0, 0, 0, 0, 1])
        sch.annotate(ko, "software_pipeline_order", [0, 3, 1, 4, 2])
    elif pipeline != "none":
        sch.annotate(ko, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
        if pipeline == "async":
            sch.annotate(ko, "software_pipeline_async_stages", [0])
    return sch


def _bind_slice_sum(sch: Schedule, block: Any, threads: int = 256) -> None:
    """The sum of the k slices: one output element per thread, its slices in a serial
    loop (rfactor put the slice loop outermost, where the plain binding would see no
    spatial loop and give the whole sum to one thread)."""
    red = reduction_loops(sch, block)
    red_loops = [sch.get(lp) for lp in red]
    spatial = [lp for lp in sch.get_loops(block)
               if not any(sch.get(lp).same_as(r) for r in red_loops)]
    sch.reorder(*spatial, *red)
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")

