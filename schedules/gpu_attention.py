"""The GPU template of nn.attention (frontend/op_defs/attention.py): one kernel per
attention, a thread block per `rows` query rows of one (batch, head), the block's
scores and probabilities kept in shared memory.

Loop nest of a thread block (threads_y x threads_x threads; a thread owns rows / threads_y
query rows, blocked, in every stage):
    Q K^T: the head dimension in steps of d_step, each step's Q slice ([d][row]) and
      K^T slice ([d][key]) staged in shared memory (k-major, rows padded against
      bank conflicts); per thread a register tile of its rows x keys / threads_x
      keys (blocked: its fragment of a K^T row is contiguous, read 128 bits at a
      time); the scale and the mask applied on the finished tile, the logits stored
      to shared memory
    row max, exp, exp-sum: each row's keys spread over threads_x threads (strided:
      conflict-free), reduced across them (warp shuffles); the probabilities stored
      to shared memory
    P V: the keys in steps of n_step, each step's V slice staged in shared memory;
      per thread a register tile of its rows x Dv / threads_x columns (blocked:
      128-bit V fragment loads and 128-bit coalesced stores); divided by the exp-sum
      on the finished tile and stored.
Nothing of the [M, N] scores reaches global memory: BERT-base's unfused chain (two
batched matmuls and the masked softmax between them) writes and reads them twice.

Knobs: rows (query rows per block: divisors of the padded M from 8 to 64), threads_y,
threads_x (threads along rows and along keys / value columns), d_step, n_step (the
two products' staged steps). Every config must fit the block's shared memory: the
logits and probabilities (2 x rows x padded keys), the Q, K^T and V steps.
The fallback: 128 threads, as many along the keys as the key count and Dv allow (up
to 32), the most rows (up to 32) whose shared memory fits and whose grid fills the
multiprocessors twice, else the fewest rows (the most blocks).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from tecc.frontend.op_defs.attention import padded_keys
from tecc.schedules.blocks import (
    EXP_BLOCKS,
    block_name,
    inline_injective,
    root_blocks,
    shared_exp,
    static_extents,
)
from tecc.schedules.space import Config, ConfigSpace, nearest_config
from tecc.schedules.template import ScheduleContext, Template, register_template
from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers
from tvm.s_tir.schedule import Schedule

ROWS = (8, 16, 32, 64)
THREADS_Y = (2, 4, 8, 16)
THREADS_X = (8, 16, 32)
D_STEPS = (4, 8, 16, 32)
N_STEPS = (8, 16, 32)
MIN_THREADS, MAX_THREADS = 64, 512
FALLBACK_THREADS = 128
FALLBACK_MAX_ROWS = 32
WAVES = 2  # blocks per multiprocessor the fallback keeps, where it can
# shared rows padded by this many floats: a row stride of 4 mod 32 banks keeps the
# k-major stores of a step conflict-free and 128-bit fragment loads aligned
PAD = 4
KERNEL_FEATURES = ("blocks", "waves", "threads", "rows_per_thread", "keys_per_thread",
                   "columns_per_thread", "shared_bytes", "d_step", "n_step")


def gpu_attention_dims(sch: Schedule, anchor: Any) -> tuple[int, int, int, int, int]:
    """(batch x heads, padded M, N, D, Dv) from the anchor's loops (batch..., M, Dv, N)
    and the scores block's reduction (D)."""
    *batch, m, dv, n = static_extents(sch, sch.get_loops(anchor))
    d = static_extents(sch, sch.get_loops(sch.get_sblock("attention_scores")))[-1]
    return math.prod(batch), m, n, d, dv


def shared_bytes(rows: int, npad: int, dv: int, d_step: int, n_step: int) -> int:
    """Shared memory of a block: logits and probabilities, and the three staged steps."""
    return 4 * (2 * rows * (npad + PAD) + d_step * (rows + PAD) + d_step * (npad + PAD)
                + n_step * dv)


def _fits(config: Config, dims: tuple[int, int, int, int, int], shared_limit: int) -> bool:
    _, m, n, d, dv = dims
    rows, ty, tx = config["rows"], config["threads_y"], config["threads_x"]
    return (m % rows == 0 and rows % ty == 0 and padded_keys(n) % tx == 0 and dv % tx == 0
            and MIN_THREADS <= ty * tx <= MAX_THREADS and d % config["d_step"] == 0
            and n % config["n_step"] == 0
            and shared_bytes(rows, padded_keys(n), dv, config["d_step"],
                             config["n_step"]) <= shared_limit)


def attention_features(dims: tuple[int, int, int, int, int], config: dict[str, Any],
                       sms: int) -> dict[str, float]:
    """What decides the kernel's speed, without scheduling it (KERNEL_FEATURES)."""
    bh, m, n, _, dv = dims
    rows, ty, tx = int(config["rows"]), int(config["threads_y"]), int(config["threads_x"])
    blocks = bh * m // rows
    return {"blocks": blocks, "waves": blocks / sms, "threads": ty * tx,
            "rows_per_thread": rows / ty, "keys_per_thread": padded_keys(n) / tx,
            "columns_per_thread": dv / tx,
            "shared_bytes": shared_bytes(rows, padded_keys(n), dv, int(config["d_step"]),
                                         int(config["n_step"])),
            "d_step": int(config["d_step"]), "n_step": int(config["n_step"])}


class GpuAttentionTemplate(Template):
    name = "attention"
    target_kind = "cuda"

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        dims = gpu_attention_dims(ctx.sch, ctx.block)
        _, m, n, d, dv = dims
        limit = ctx.info.max_shared_memory_per_block or 49152
        space = ConfigSpace()
        space.define_choice("rows", [r for r in ROWS if m % r == 0] or [m])
        space.define_choice("threads_y", list(THREADS_Y))
        space.define_choice("threads_x", [t for t in THREADS_X
                                          if padded_keys(n) % t == 0 and dv % t == 0] or [1])
        space.define_choice("d_step", [s for s in D_STEPS if d % s == 0] or [d])
        space.define_choice("n_step", [s for s in N_STEPS if n % s == 0] or [n])
        space.add_constraint(functools.partial(_fits, dims=dims, shared_limit=limit),
                             "rows, threads and steps divide the extents and fit shared memory")
        if all(space.why_not(c) for c in space):
            raise ValueError(f"no config of the GPU attention fits {dims} in {limit} bytes "
                             "of shared memory")
        return space

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        dims = gpu_attention_dims(ctx.sch, ctx.block)
        bh, m, _, _, _ = dims
        sms = ctx.info.multiprocessors or 108
        limit = ctx.info.max_shared_memory_per_block or 49152
        tx = max(space.options("threads_x"))
        ty = max(1, FALLBACK_THREADS // tx)
        best = None
        for rows in sorted(space.options("rows"), reverse=True):
            values = {"rows": rows, "threads_y": ty, "threads_x": tx,
                      "d_step": max(s for s in space.options("d_step") if s <= 8)
                      if min(space.options("d_step")) <= 8 else space.options("d_step")[0],
                      "n_step": max(s for s in space.options("n_step") if s <= 16)
                      if min(space.options("n_step")) <= 16 else space.options("n_step")[0]}
            config = space.from_json(values) if _valid(space, values) else None
            if config is None or not _fits(config, dims, limit) or rows > FALLBACK_MAX_ROWS:
                continue
            if bh * m // rows >= WAVES * sms:
                return config
            best = config  # no block size fills the GPU twice: the most blocks
        return best if best is not None else nearest_config(space, {"rows": min(
            space.options("rows")), "threads_y": ty, "threads_x": tx, "d_step": 8,
            "n_step": 16})

    def kernel_features(self, workload: dict[str, Any], config: dict[str, Any],
                        info: Any) -> list[float]:
        """The cost model's features beyond the knobs (log-scaled), from the workload's
        q, k, v shapes."""
        (q, _), (k, _), (v, _) = workload["inputs"][:3]
        transposed = workload.get("attrs", {}).get("k_transposed", False)
        m = -(-q[-2] // 4) * 4
        dims = (math.prod(q[:-2]), m, k[-1] if transposed else k[-2], q[-1], v[-1])
        values = attention_features(dims, config, info.multiprocessors or 108)
        return [math.log2(1 + values[name]) for name in KERNEL_FEATURES]

    def apply(self, ctx: ScheduleContext, config: Config) -> Schedule:
        sch = ctx.sch
        dims = gpu_attention_dims(sch, ctx.block)
        limit = ctx.info.max_shared_memory_per_block or 49152
        if not _fits(config, dims, limit):
            raise ValueError(f"config {config.to_json()} does not fit {dims}")
        # Q, K and V (head splits of a QKV dense) are inlined into their shared-memory
        # fetches, not into the products: the fetch's index is then affine in its own
        # loops (inlined into the product, the reshape's division kept the fetch's
        # region from being bounded)
        operands = _operand_buffers(sch, ctx.block)
        inline_injective(sch, keep=lambda s, b: shared_exp(s, b) or any(
            w.source.same_as(o) for w in s.get(b).writes for o in operands))
        schedule_attention(sch, ctx.block, config, dims)
        return sch


def _operand_buffers(sch: Schedule, anchor: Any) -> list:
    """The buffers the two products read as Q, K and V (before inlining)."""
    scores = sch.get(sch.get_sblock("attention_scores"))
    keys = sch.get(sch.get_sblock("attention_keys"))
    kept = {block_name(sch, b) for b in root_blocks(sch)} & set(EXP_BLOCKS)
    exp_buffers = [sch.get(sch.get_sblock(n)).writes[0].source for n in kept]
    keys_buffer = keys.writes[0].source
    buffers = [r.source for r in scores.reads if not r.source.same_as(keys_buffer)]
    buffers += [r.source for r in keys.reads]
    buffers += [r.source for r in sch.get(anchor).reads
                if not any(r.source.same_as(e) for e in exp_buffers)]
    return buffers


def _valid(space: ConfigSpace, values: dict[str, Any]) -> bool:
    return all(values[name] in space.options(name) for name in values)


def _bind_rows_keys(sch: Schedule, loops: list, ty: int, tx: int, rows_first: bool = True
                    ) -> tuple[Any, Any]:
    """A block's (rows, keys) loops over the threads: rows blocked per threadIdx.y,
    keys strided over threadIdx.x (a warp's accesses to a row are consecutive)."""
    r, k = loops[-2:]
    r_y, r_i = sch.split(r, [ty, None])
    k_o, k_x = sch.split(k, [None, tx])
    # reductions: TVM's cross-thread lowering wants the reduced loops innermost
    sch.reorder(r_y, r_i, k_o, k_x)
    sch.bind(r_y, "threadIdx.y")
    sch.bind(k_x, "threadIdx.x")
    return r_i, k_o


def _below(sch: Schedule, block: Any, depth: int) -> list:
    """The loops of `block` below its first `depth` ones."""
    return list(sch.get_loops(block)[depth:])


def _cooperative(sch: Schedule, block: Any, depth: int, ty: int, tx: int,
                 vector: int) -> None:
    """A staging block's loops below `depth` fused and spread over all threads, the
    innermost `vector` elements one vector load."""
    loops = _below(sch, block, depth)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    _, y, x, v = sch.split(fused, [None, ty, tx, vector])
    sch.bind(y, "threadIdx.y")
    sch.bind(x, "threadIdx.x")
    if vector > 1:
        sch.vectorize(v)


def _depth(sch: Schedule, loop: Any, block: Any) -> int:
    loops = sch.get_loops(block)
    for i, lp in enumerate(loops):
        if sch.get(lp).same_as(sch.get(loop)):
            return i + 1
    raise ValueError("the loop does not enclose the block")


def _ndim(buffer: Any) -> int:
    return len(buffer.shape)


def _reads_along_first(sch: Schedule, block: Any) -> bool:
    """Whether the one read of a 2-d staging block (over its last two iteration
    variables (a, b)) walks memory along `a`: its last index uses a's variable."""
    from tvm import tirx

    stmt = sch.get(block)
    first = stmt.iter_vars[-2].var
    last = stmt.reads[0].region[-1].min
    return any(v.same_as(first) for v in tirx.analysis.undefined_vars(last))


def _read_index(sch: Schedule, block: Any, not_buffer: Any) -> int:
    """The read of `block` that is not of `not_buffer` (the staged operand)."""
    reads = sch.get(block).reads
    return next(i for i, r in enumerate(reads) if not r.source.same_as(not_buffer))


def schedule_attention(sch: Schedule, anchor: Any, config: Config,
                       dims: tuple[int, int, int, int, int]) -> None:
    """The nest of the module docstring on `sch` (injective producers inlined)."""
    _, m, n, d, dv = dims
    npad = padded_keys(n)
    rows, ty, tx = config["rows"], config["threads_y"], config["threads_x"]
    d_step, n_step = config["d_step"], config["n_step"]
    threads = ty * tx
    names = {block_name(sch, b) for b in root_blocks(sch)}
    exp_name = next(b for b in names if b in EXP_BLOCKS)

    # The output drives the grid: (batch, row blocks) over blockIdx.x; per thread its
    # rows (blocked) and Dv / threads_x columns (blocked: 128-bit stores); P V's
    # accumulators in registers under it, the keys in staged steps.
    out = sch.get_sblock("attention_out")
    *batch, i, c = sch.get_loops(out)
    i_b, i_y, i_r = sch.split(i, [None, ty, rows // ty])
    c_x, c_r = sch.split(c, [tx, None])
    sch.reorder(*batch, i_b, i_y, c_x, i_r, c_r)
    bx = sch.fuse(*batch, i_b) if batch else i_b
    sch.bind(bx, "blockIdx.x")
    sch.bind(i_y, "threadIdx.y")
    sch.bind(c_x, "threadIdx.x")
    columns = dv // tx
    if columns % 4 == 0:
        _, lanes = sch.split(c_r, [None, 4])
        sch.vectorize(lanes)
    sch.set_scope(anchor, 0, "local")
    sch.compute_at(anchor, c_x, preserve_unit_loops=True)
    a_i, a_c, j = sch.get_loops(anchor)[-3:]
    j_o, j_i = sch.split(j, [None, n_step])
    sch.reorder(j_o, j_i, a_i, a_c)
    # V's step in shared memory, 128-bit loads where Dv allows
    exp_buffer = sch.get(sch.get_sblock(exp_name)).writes[0].source
    # consumer_blocks: Q, K and V may be slices of one buffer (the QKV dense's output,
    # its head splits inlined): each stage stages only its own reads
    v_shared = sch.cache_read(anchor, _read_index(sch, anchor, exp_buffer), "shared",
                              consumer_blocks=[anchor])
    sch.compute_at(v_shared, j_o, preserve_unit_loops=True)
    auto_inline_producers(sch, v_shared)
    vector = 4 if dv % 4 == 0 and n_step * dv % (threads * 4) == 0 else 1
    _cooperative(sch, v_shared, _depth(sch, j_o, v_shared), ty, tx, vector)
    # P's fragment: four keys of each of the thread's rows, one 128-bit shared load a
    # row (read by every thread of the row: broadcast), where the step has whole fours
    key_loops = [j_i]
    if n_step % 4 == 0:
        j_4, j_v = sch.split(j_i, [None, 4])
        key_loops = [j_4, j_v]
        p_index = next(i for i, r in enumerate(sch.get(anchor).reads)
                       if r.source.same_as(exp_buffer))
        p_frag = sch.cache_read(anchor, p_index, "local", consumer_blocks=[anchor])
        sch.compute_at(p_frag, j_4, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(p_frag)[-1])
    v_frag = sch.cache_read(anchor, _read_index(sch, anchor, exp_buffer), "local")
    sch.compute_at(v_frag, key_loops[-1], preserve_unit_loops=True)
    if columns % 4 == 0:
        _, lanes = sch.split(sch.get_loops(v_frag)[-1], [None, 4])
        sch.vectorize(lanes)
    sch.decompose_reduction(anchor, j_o)
    for loop in (*key_loops, a_i, a_c):
        sch.unroll(loop)

    # The softmax under the block loop, its rows blocked per threadIdx.y as P V's: a
    # thread's row maxima and exp-sums are its own (registers).
    expsum = sch.get_sblock("softmax_expsum")
    exp = sch.get_sblock(exp_name)
    row_max = sch.get_sblock("softmax_max")
    logits = sch.get_sblock("attention_logits")
    for block in (expsum, exp, row_max, logits):
        sch.compute_at(block, bx, preserve_unit_loops=True)
    depth = _depth(sch, bx, logits)
    for block in (expsum, row_max):
        sch.set_scope(block, 0, "local")
        _bind_rows_keys(sch, _below(sch, block, depth), ty, tx)
    sch.set_scope(exp, 0, "shared")
    # rows padded: a warp of 2 ty reads two rows in distinct banks; by 4 where P V
    # loads four keys at once (16-byte aligned rows)
    sch.storage_align(exp, 0, axis=_ndim(exp_buffer) - 2, factor=32,
                      offset=PAD if n_step % 4 == 0 else 1)
    _bind_rows_keys(sch, _below(sch, exp, depth), ty, tx)

    # Q K^T: the logits tile per thread (rows blocked, keys blocked), the scores in
    # registers under it, the head dimension in staged steps.
    sch.set_scope(logits, 0, "shared")
    r, k = _below(sch, logits, depth)[-2:]
    r_y, r_i = sch.split(r, [ty, None])
    k_x, k_i = sch.split(k, [tx, None])
    sch.reorder(r_y, k_x, r_i, k_i)
    sch.bind(r_y, "threadIdx.y")
    sch.bind(k_x, "threadIdx.x")
    scores = sch.get_sblock("attention_scores")
    sch.set_scope(scores, 0, "local")
    sch.compute_at(scores, k_x, preserve_unit_loops=True)
    s_r, s_k, s_d = sch.get_loops(scores)[-3:]
    d_o, d_i = sch.split(s_d, [None, d_step])
    sch.reorder(d_o, d_i, s_r, s_k)
    keys = sch.get_sblock("attention_keys")
    sch.set_scope(keys, 0, "shared")
    keys_buffer = sch.get(keys).writes[0].source
    sch.compute_at(keys, d_o, preserve_unit_loops=True)
    auto_inline_producers(sch, keys)
    sch.storage_align(keys, 0, axis=_ndim(keys_buffer) - 2, factor=32, offset=PAD)
    # where K's rows in memory run along the head dimension (K not transposed), the
    # staging loops read it innermost (coalesced) and store k-major
    k_loops = _below(sch, keys, _depth(sch, d_o, keys))
    if _reads_along_first(sch, keys):
        sch.reorder(k_loops[-1], k_loops[-2])
    _cooperative(sch, keys, _depth(sch, d_o, keys), ty, tx, 1)
    q_shared = sch.cache_read(scores, _read_index(sch, scores, keys_buffer), "shared",
                              consumer_blocks=[scores])
    sch.compute_at(q_shared, d_o, preserve_unit_loops=True)
    auto_inline_producers(sch, q_shared)
    sch.transform_layout(q_shared, ("write", 0), lambda *ax: (*ax[:-2], ax[-1], ax[-2]))
    sch.storage_align(q_shared, 0, axis=_ndim(sch.get(q_shared).writes[0].source) - 2,
                      factor=32, offset=PAD)
    _cooperative(sch, q_shared, _depth(sch, d_o, q_shared), ty, tx, 1)
    for index, extent in ((_read_index(sch, scores, keys_buffer), rows // ty),
                          (None, npad // tx)):
        if index is None:
            index = next(i for i, rd in enumerate(sch.get(scores).reads)
                         if rd.source.same_as(keys_buffer))
        frag = sch.cache_read(scores, index, "local")
        sch.compute_at(frag, d_i, preserve_unit_loops=True)
        if extent % 4 == 0:
            _, lanes = sch.split(sch.get_loops(frag)[-1], [None, 4])
            sch.vectorize(lanes)
    sch.decompose_reduction(scores, d_o)
    for loop in (d_i, s_r, s_k):
        sch.unroll(loop)


register_template(GpuAttentionTemplate())
