"""The direct schedule of an NCHW conv2d on CUDA (the conv template's rule "direct").

The implicit GEMM (gpu_matmul.py) gathers its A tile from the input once per kernel
tap: a 3x3 conv loads each input value nine times into shared memory. The direct
schedule tiles the conv's own loops instead, as AutoTVM's conv2d_nchw and
MetaSchedule's multi-level tiling do:

- output channels, rows and columns each split four ways (`tile_oc`, `tile_y`,
  `tile_x`: blocks, virtual threads, threads, per-thread): a block computes an
  oc x rows x columns tile, a thread a register tile of it;
- input channels split in two (`tile_rc`): per step of the outer loop the block stages
  rc channels of its input patch (the tile's rows and columns plus the kernel's halo)
  and of the weights in shared memory, and the taps read the patch from there, so an
  input value is loaded once for all taps that use it; the kernel's rows and columns
  (`tile_ry`, `tile_rx`) are either inside the step (one patch with its halo) or
  outside it (a shifted patch per tap, no halo);
- the threads of a block are one threadIdx.x with the columns innermost (output
  stores and patch loads coalesce along a row); the patch is read through the padding
  (zeros outside the image, no padded copy in global memory);
- the epilogue (bias, activation, residual) runs on the accumulators before the store.
"""

from __future__ import annotations

from typing import Any

from tecc.schedules.templates_conv import conv_dims
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain, auto_inline_producers

# Per-knob bounds of the four-way splits (blocks, virtual threads, threads, inner):
# virtual threads at most 4, threads at most 64, a thread's own extent at most 8.
MAX_VTHREADS, MAX_THREADS_AXIS, MAX_INNER = 4, 64, 8
# Whole blocks: 32 to 1024 threads, at most 128 accumulators a thread (the register
# tile), the shared tiles within the target's per-block limit.
MIN_THREADS, MAX_THREADS, MAX_ACCUMULATORS = 32, 1024, 128
# Input channels staged per step: at most 64.
MAX_RC_STEP = 64


def _four_way(split: tuple[int, ...]) -> bool:
    _, vthreads, threads, inner = split
    return vthreads <= MAX_VTHREADS and threads <= MAX_THREADS_AXIS and inner <= MAX_INNER


def _rc_step(split: tuple[int, ...]) -> bool:
    return split[1] <= MAX_RC_STEP


def define_direct_knobs(space: Any, workload: dict[str, Any], when: tuple[str, tuple]) -> None:
    """The direct rule's knobs on `space`, applying `when` (the rule knob's value)."""
    d = conv_dims(workload)
    space.define_split("tile_oc", d["o"], num_outputs=4, filter_fn=_four_way, when=when)
    space.define_split("tile_y", d["oh"], num_outputs=4, filter_fn=_four_way, when=when)
    space.define_split("tile_x", d["ow"], num_outputs=4, filter_fn=_four_way, when=when)
    space.define_split("tile_rc", d["ipg"], num_outputs=2, filter_fn=_rc_step, when=when)
    space.define_split("tile_ry", d["kh"], num_outputs=2, when=when)
    space.define_split("tile_rx", d["kw"], num_outputs=2, when=when)


def direct_shape(workload: dict[str, Any], config: dict[str, Any]) -> dict[str, int]:
    """Sizes of `config`'s direct kernel: threads, accumulators and an estimate of
    registers per thread, the block's output tile (oc, rows, columns), blocks, k steps,
    shared floats (the input patch and the weights)."""
    d = conv_dims(workload)
    (bo, vo, to, io), (by, vy, ty, iy), (bx, vx, tx, ix) = (
        config["tile_oc"], config["tile_y"], config["tile_x"])
    rc_outer, rc = config["tile_rc"]
    ry_outer, ry = config["tile_ry"]
    rx_outer, rx = config["tile_rx"]
    tile_oc, tile_y, tile_x = vo * to * io, vy * ty * iy, vx * tx * ix
    sh, sw = workload["strides"]
    dh, dw = workload["dilation"]
    patch_y = (tile_y - 1) * sh + (ry - 1) * dh + 1
    patch_x = (tile_x - 1) * sw + (rx - 1) * dw + 1
    accumulators = vo * io * vy * iy * vx * ix
    return {
        "threads": to * ty * tx, "accumulators": accumulators,
        # the accumulators, a thread's weights and inputs of one tap, ~24 for addresses
        "registers": accumulators + vo * io + vy * iy * vx * ix + 24,
        "tile_oc": tile_oc, "tile_y": tile_y, "tile_x": tile_x,
        "blocks": d["n"] * bo * by * bx, "k_steps": rc_outer * ry_outer * rx_outer,
        "patch": rc * patch_y * patch_x, "weights": tile_oc * rc * ry * rx,
    }


def direct_fits(workload: dict[str, Any], config: dict[str, Any], shared_limit: int) -> bool:
    """Whether `config`'s direct kernel is a kernel the GPU runs well at all: 32 to
    1024 threads, at most MAX_ACCUMULATORS a thread, shared tiles within the limit."""
    shape = direct_shape(workload, config)
    return (MIN_THREADS <= shape["threads"] <= MAX_THREADS
            and shape["accumulators"] <= MAX_ACCUMULATORS
            and 4 * (shape["patch"] + shape["weights"]) <= shared_limit)


def direct_features(workload: dict[str, Any], config: dict[str, Any]) -> dict[str, float]:
    """The kernel features of a direct config that its shape decides, in the matmul
    rules' terms (block_m: the output pixels of a block, block_n: its channels; a k
    step stages rc channels of the patch and the weights); the template adds the
    occupancy ones (gpu_templates.occupancy)."""
    shape = direct_shape(workload, config)
    shared = 4 * (shape["patch"] + shape["weights"])
    pixels = shape["tile_y"] * shape["tile_x"]
    return {
        "blocks": shape["blocks"], "threads": shape["threads"], "block_m": pixels,
        "block_n": shape["tile_oc"], "k_steps": shape["k_steps"], "shared_bytes": shared,
        "registers": shape["registers"], "bytes_per_step": shared,
        # weights: tile_oc x rc x taps, each a multiply-add per pixel
        "flops_per_byte": 2 * pixels * shape["weights"] / shared,
        "global_bytes": shape["blocks"] * shape["k_steps"] * shared,
        "padding": 1.0, "vector_bytes": 4 * int(config["vector"]),
        "unroll": int(config["unroll"]), "double_buffered": 0.0, "dlight_rule": 0.0,
    }


def schedule_direct_conv(func: tirx.PrimFunc, anchor: str, config: dict[str, Any],
                         workload: dict[str, Any]) -> Schedule:
    """The schedule of the module docstring for the group `func` whose conv block is
    named `anchor` (loops n, oc, y, x, rc, ry, rx)."""
    sch = Schedule(func)
    conv = sch.get_sblock(anchor)
    loops = sch.get_loops(conv)
    if len(loops) != 7:
        raise ValueError("the direct conv schedule expects n, oc, y, x, rc, ry, rx")
    n, oc, y, x, rc, ry, rx = loops
    bo, vo, to, io = sch.split(oc, list(config["tile_oc"]))
    by, vy, ty, iy = sch.split(y, list(config["tile_y"]))
    bx, vx, tx, ix = sch.split(x, list(config["tile_x"]))
    rco, rci = sch.split(rc, list(config["tile_rc"]))
    ryo, ryi = sch.split(ry, list(config["tile_ry"]))
    rxo, rxi = sch.split(rx, list(config["tile_rx"]))
    sch.reorder(n, bo, by, bx, vo, vy, vx, to, ty, tx, rco, ryo, rxo, rci, ryi, rxi,
                io, iy, ix)
    sch.bind(sch.fuse(n, bo), "blockIdx.z")
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(vo, "vthread.z")
    sch.bind(vy, "vthread.y")
    sch.bind(vx, "vthread.x")
    thread = sch.fuse(to, ty, tx)
    sch.bind(thread, "threadIdx.x")
    threads = direct_shape(workload, config)["threads"]
    unroll = int(config["unroll"])
    if unroll > 0:
        sch.annotate(thread, "pragma_auto_unroll_max_step", unroll)
        sch.annotate(thread, "pragma_unroll_explicit", 1)

    accumulate = sch.cache_write(conv, 0, "local")
    sch.reverse_compute_at(accumulate, thread, preserve_unit_loops=True)

    kernel_row = config["tile_rc"][1] * config["tile_ry"][1] * config["tile_rx"][1]
    ipg_taps = conv_dims(workload)["ipg"] * workload["kernel"][2] * workload["kernel"][3]
    fetches = []
    for index in (0, 1):  # the (padded) input patch, then the weights
        fetch = sch.cache_read(conv, index, "shared")
        sch.compute_at(fetch, rxo, preserve_unit_loops=True)
        fetches.append(fetch)
        fused = sch.fuse(*sch.get_loops(fetch)[-4:])
        # Weights in whole vectors where a block's rows of them stay aligned (the
        # input patch starts at any column: scalar loads).
        vector = int(config["vector"]) if index == 1 else 1
        extent = sch.get(fused).extent
        if vector > 1 and (kernel_row % vector or ipg_taps % vector
                           or config["tile_ry"][0] * config["tile_rx"][0] > 1
                           or int(extent) % (threads * vector)):
            vector = 1
        if vector > 1:
            _, lane, vec = sch.split(fused, [None, threads, vector])
            sch.vectorize(vec)
        else:
            _, lane = sch.split(fused, [None, threads])
        sch.bind(lane, "threadIdx.x")
    for fetch in fetches:
        auto_inline_producers(sch, fetch)  # the padding reads the image in the fetch
    auto_inline_consumer_chain(sch, accumulate)
    sch.decompose_reduction(conv, rco)
    return sch
