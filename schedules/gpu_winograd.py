"""GPU templates of Winograd's transforms (graph_opt/winograd.py): one thread per tile.

- "winograd_input": a thread per (input channel, tile) reads its alpha x alpha patch
  (the zero padding inlined as a bounds test), computes d B and B^T (d B) in
  registers and writes the alpha^2 values, consecutive threads on consecutive tiles
  (coalesced stores into V[alpha^2, C, P]).
- "winograd_output": a thread per (image, output channel, tile) reads the alpha^2
  values of its tile from M[alpha^2, OC, P] (coalesced across threads), computes
  A^T M A in registers and writes its m x m outputs through the fused epilogue (bias,
  activation, residual add).
All loops of a thread are unrolled: the transform matrices are constants, so each
value is a fixed sum. The one knob is the threads of a block; the fallback takes
the most that still give about two blocks per multiprocessor.
"""

from __future__ import annotations

import math

from tecc.schedules.blocks import block_name, inline_injective, output_names, root_blocks
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import ScheduleContext, Template, register_template
from tvm.s_tir.schedule import Schedule

THREADS = (32, 64, 128, 256)
BLOCKS_PER_SM = 2  # the fallback's grid: about two blocks per multiprocessor


def fallback_threads(work: int, sms: int) -> int:
    """The most threads of THREADS whose grid over `work` threads still has about
    BLOCKS_PER_SM blocks per multiprocessor, else the fewest."""
    for threads in reversed(THREADS):
        if -(-work // threads) >= BLOCKS_PER_SM * sms:
            return threads
    return THREADS[0]


def _named(sch: Schedule, blocks: list, name: str):
    for block in blocks:
        if block_name(sch, block) == name:
            return block
    raise ValueError(f"the Winograd group has no block {name!r}")


class _WinogradTemplate(Template):
    target_kind = "cuda"

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        space = ConfigSpace()
        space.define_choice("threads", list(THREADS))
        return space

    # the anchor's axes a thread each: (channel, tile) of V [alpha^2, C, P] and of
    # the output tiles [OC, P, m, m]
    thread_axes: slice = slice(0)

    def work(self, ctx: ScheduleContext) -> int:
        """Threads the kernel runs: one per tile and channel."""
        return math.prod(int(iv.dom.extent)
                         for iv in ctx.sch.get(ctx.block).iter_vars[self.thread_axes])

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        sms = ctx.info.multiprocessors or 108
        return space.from_json({"threads": fallback_threads(self.work(ctx), sms)})

    @staticmethod
    def blocks(ctx: ScheduleContext, first_pass: str) -> tuple[Schedule, object, object]:
        """The schedule with the group's injective blocks inlined, the anchor (the
        transform's second pass) and its first pass."""
        sch = ctx.sch
        inline_injective(sch)
        anchor = sch.get_sblock(ctx.block_name)
        return sch, anchor, _named(sch, sch.get_producers(anchor), first_pass)


def _in_registers(sch: Schedule, tx, *blocks) -> None:
    """Each of `blocks` computed under the thread loop `tx` into local memory (all its
    loops unrolled below: registers), consumers first."""
    for block in blocks:
        sch.compute_at(block, tx, preserve_unit_loops=True)
        sch.set_scope(block, 0, "local")


def _thread_loops(sch: Schedule, loops: list, threads: int):
    """Fuse `loops`, split by `threads` and bind: the thread loop."""
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return tx


def _unroll_below(sch: Schedule, block, depth: int) -> None:
    for loop in sch.get_loops(block)[depth:]:
        sch.unroll(loop)


class GpuWinogradInputTemplate(_WinogradTemplate):
    name = "winograd_input"
    thread_axes = slice(1, 3)

    def apply(self, ctx: ScheduleContext, config: Config) -> Schedule:
        sch, anchor, rows = self.blocks(ctx, "winograd_input_rows")
        i, ch, q, ra = sch.get_loops(anchor)
        sch.reorder(ch, q, i, ra)
        tx = _thread_loops(sch, [ch, q], config["threads"])
        out = sch.cache_write(anchor, 0, "local")
        sch.reverse_compute_at(out, tx, preserve_unit_loops=True)
        _in_registers(sch, tx, rows)
        for block in (rows, anchor, out):
            _unroll_below(sch, block, 2)
        return sch


class GpuWinogradOutputTemplate(_WinogradTemplate):
    name = "winograd_output"
    thread_axes = slice(0, 2)

    def apply(self, ctx: ScheduleContext, config: Config) -> Schedule:
        sch, tiles, rows = self.blocks(ctx, "winograd_output_rows")
        outputs = output_names(sch)
        out = [b for b in root_blocks(sch) if block_name(sch, b) in outputs]
        if len(out) != 1:
            raise ValueError("the Winograd output group has more than one output")
        out = out[0]
        m = int(sch.get(tiles).iter_vars[2].dom.extent)
        n, k, h, w = sch.get_loops(out)
        ho, hi = sch.split(h, [None, m])
        wo, wi = sch.split(w, [None, m])
        sch.reorder(n, k, ho, wo, hi, wi)
        tx = _thread_loops(sch, [n, k, ho, wo], config["threads"])
        _in_registers(sch, tx, tiles, rows)
        for block in (rows, tiles, out):
            _unroll_below(sch, block, 2)
        return sch


WINOGRAD_INPUT = register_template(GpuWinogradInputTemplate())
WINOGRAD_OUTPUT = register_template(GpuWinogradOutputTemplate())
