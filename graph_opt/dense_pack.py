"""pack_dense_weights: dense layers with a constant weight get it packed at compile time.

`nn.dense(x, W[N, K])` with W a float Constant becomes `nn.dense_pack(x, Wp)` with
Wp[N/nb, K, nb] = W[no * nb + ni, k] (numpy, once): the kernel's inner loop then reads
nb contiguous weights per k (one to four SIMD vectors) and a tile's panel of the
weight is one contiguous block. Before, the kernel packed W itself on every call.
A block that does not divide N pads the weight with zero rows to whole blocks (the
call's "units" attribute keeps N): the kernel's column tiles are then all full.

The block nb is a knob of the dense template ("tile_n"): the current PassContext's
`tuning.dense_block(dense call, lanes) -> nb | None` chooses it (the driver's answers
the tuned config's, else the template's fallback; untuned, the heuristic here, which
the template's fallback shares). Lanes are the CPU target's, as for the layout pass
(no CPU target: the pass leaves the IR as it is).
"""

from __future__ import annotations

import numpy as np
from tecc.frontend.ir import Call, Constant, Expr, Function, rewrite
from tecc.graph_opt.pass_manager import PassContext, register_pass
from tecc.graph_opt.patterns import is_op


def dense_block_candidates(n: int, lanes: int) -> list[int]:
    """Packing blocks dividing N output features: 1..4 vectors dividing N, else the
    divisors of N up to 4 vectors (odd N: a short vector and LLVM's tail)."""
    vec = [v * lanes for v in (1, 2, 3, 4) if n % (v * lanes) == 0]
    if vec:
        return vec
    return [d for d in range(1, min(n, 4 * lanes) + 1) if n % d == 0][-3:]


def padded_dense_blocks(n: int, lanes: int) -> list[int]:
    """Every packing block for N: those dividing N, then 1..4 vectors up to N rounded
    up to a vector, with zero rows padding the weight to whole blocks (N = 1000 or
    197 has no divisor that fills a vector)."""
    padded_n = -(-n // lanes) * lanes
    return list(dict.fromkeys(dense_block_candidates(n, lanes) + [
        v * lanes for v in (1, 2, 3, 4) if v * lanes <= padded_n]))


def padded_waste(extent: int, block: int) -> float:
    """The share of work a block of `block` wastes on `extent` padded to whole blocks."""
    return -(-extent // block) * block / extent - 1


def default_dense_block(n: int, lanes: int) -> int:
    """Two vectors when they divide N (the register tile of 4-6 rows x 2 vectors fits
    AVX2's 16 registers), else one vector, else three or four; with AVX-512's 16
    lanes and 32 registers four vectors first (6 rows x 4 vectors: each broadcast
    input value feeds four FMAs; on 2 cores 1.05-1.4x the two-vector tile on dense
    layers of 64-1500 rows, 1.4x on attention's 1500x1500 @ 1500x64). Where no vector
    block divides N, N is padded: two vectors unless one wastes much less (a block of
    50 for N = 1000 ran 25x slower than 32 with 24 zero rows)."""
    cands = dense_block_candidates(n, lanes)
    prefer = (4 * lanes,) if lanes >= 16 else ()
    for want in (*prefer, 2 * lanes, lanes, 3 * lanes, 4 * lanes):
        if want in cands:
            return want
    if n < lanes:
        return cands[-1]
    # two vectors reuse each input value twice: worth some padding (N=197: 224
    # columns ran faster than 208)
    two = padded_waste(n, 2 * lanes) <= padded_waste(n, lanes) + 0.1
    return 2 * lanes if two else lanes


def pack_dense_weight(w: np.ndarray, nb: int) -> np.ndarray:
    """W[N, K] -> Wp[ceil(N/nb), K, nb], zero rows padding N to whole blocks."""
    n, k = w.shape
    nc = -(-n // nb)
    if nc * nb != n:
        w = np.concatenate([w, np.zeros((nc * nb - n, k), w.dtype)])
    return np.ascontiguousarray(w.reshape(nc, nb, k).transpose(0, 2, 1))


def unpack_dense_weight(wp: np.ndarray, units: int = 0) -> np.ndarray:
    """Wp[N/nb, K, nb] -> W[N, K] (`units`: N of a padded packing)."""
    nc, k, nb = wp.shape
    w = wp.transpose(0, 2, 1).reshape(nc * nb, k)
    return np.ascontiguousarray(w[:units or nc * nb])


def dense_pack_attrs(n: int, nb: int) -> dict[str, int]:
    """nn.dense_pack's attributes for N features packed by blocks of nb."""
    return {"units": n} if n % nb else {}


@register_pass("pack_dense_weights", opt_level=3)
def pack_dense_weights(func: Function) -> Function:
    """`func` with the weights of its dense layers packed (see the module docstring)."""
    ctx = PassContext.current()
    lanes = ctx.cpu_lanes()
    if lanes <= 0:
        return func
    dense_block = ctx.tuning.dense_block
    packed: dict[int, Constant] = {}

    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        if not is_op(node, "nn.dense"):
            return None
        assert isinstance(node, Call)
        x, w = kids
        if not isinstance(w, Constant) or w.data.ndim != 2:
            return None
        if not np.issubdtype(w.data.dtype, np.floating):
            return None
        n = w.data.shape[0]
        nb = dense_block(node, lanes)
        if nb is None or nb <= 0:
            return None
        key = (id(w), nb)
        if key not in packed:  # one packed constant per (weight, block): shared uses
            packed[key] = Constant(pack_dense_weight(w.data, nb))
        return Call("nn.dense_pack", (x, packed[key]), dense_pack_attrs(n, nb),
                    span=node.span)

    return rewrite(func, visit)
