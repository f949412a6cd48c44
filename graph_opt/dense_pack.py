"""pack_dense_weights: dense layers with a constant weight get it packed at compile time.

`nn.dense(x, W[N, K])` with W a float Constant becomes `nn.dense_pack(x, Wp)` with
Wp[N/nb, K, nb] = W[no * nb + ni, k] (numpy, once): the kernel's inner loop then reads
nb contiguous weights per k (one to four SIMD vectors) and a tile's panel of the
weight is one contiguous block. Before, the kernel packed W itself on every call.

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
    """Packing blocks for N output features: 1..4 vectors dividing N, else the
    divisors of N up to 4 vectors (odd N: a short vector and LLVM's tail)."""
    vec = [v * lanes for v in (1, 2, 3, 4) if n % (v * lanes) == 0]
    if vec:
        return vec
    return [d for d in range(1, min(n, 4 * lanes) + 1) if n % d == 0][-3:]


def default_dense_block(n: int, lanes: int) -> int:
    """Two vectors when they divide N (the register tile of 4-6 rows x 2 vectors fits
    AVX2's 16 registers), else one vector, else the largest candidate."""
    cands = dense_block_candidates(n, lanes)
    for want in (2 * lanes, lanes, 3 * lanes, 4 * lanes):
        if want in cands:
            return want
    return cands[-1]


def pack_dense_weight(w: np.ndarray, nb: int) -> np.ndarray:
    """W[N, K] -> Wp[N/nb, K, nb]."""
    n, k = w.shape
    return np.ascontiguousarray(w.reshape(n // nb, nb, k).transpose(0, 2, 1))


def unpack_dense_weight(wp: np.ndarray) -> np.ndarray:
    nc, k, nb = wp.shape
    return np.ascontiguousarray(wp.transpose(0, 2, 1).reshape(nc * nb, k))


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
        if nb is None or nb <= 0 or n % nb:
            return None
        key = (id(w), nb)
        if key not in packed:  # one packed constant per (weight, block): shared uses
            packed[key] = Constant(pack_dense_weight(w.data, nb))
        return Call("nn.dense_pack", (x, packed[key]), span=node.span)

    return rewrite(func, visit)
