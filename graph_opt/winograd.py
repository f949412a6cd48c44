"""winograd_gpu: 3x3 convolutions on a GPU as Winograd's F(m x m, 3 x 3), where chosen.

On a CUDA target a dense 3x3 conv (stride 1, no dilation, a constant weight) whose
per-layer choice (`PassContext.tuning.gpu_winograd_tile`: a tuning record's, else
`default_gpu_winograd_tile`) is a tile m becomes three ops, each a kernel with a
schedule of its own:

    V = nn.winograd_input(x)       [alpha^2, C, P]   B^T d B per input tile (padding in it)
    M = nn.matmul(U, V)            [alpha^2, OC, P]  alpha^2 GEMMs over C: the simt template
    y = nn.winograd_output(M)      [N, OC, OH, OW]   A^T M A per tile, the epilogue fused

with alpha = m + 2, P = N x ceil(OH/m) x ceil(OW/m) tiles and U = G w G^T computed
here once (numpy). The multiplies drop from 9 per output and input channel to
alpha^2 / m^2 (4 for F(2x2), 2.25 for F(4x4)); the transforms move V and M through
memory, which is what a layer with few channels per pixel cannot repay. The CPU's
Winograd is one kernel on blocked data (graph_opt/layout.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from tecc.frontend.ir import Call, Constant, Expr, Function, rewrite
from tecc.frontend.op_defs.nn import WINOGRAD_MATRICES
from tecc.graph_opt.layout import winograd_eligible
from tecc.graph_opt.pass_manager import PassContext, register_pass
from tecc.graph_opt.patterns import is_op

if TYPE_CHECKING:
    from tecc.target import TargetInfo

# The untuned rule (H200, fp32, TF32 off; benchmarks/results/gpu_winograd.md):
# Winograd where a layer has at least this many input and output channels and output
# rows and columns.
GPU_WINOGRAD_MIN_CHANNELS = 32
GPU_WINOGRAD_MIN_PLANE = 7
GPU_WINOGRAD_TILE = 4


def default_gpu_winograd_tile(conv: Call, info: TargetInfo) -> int:
    """F(4x4, 3x3) for an eligible conv of at least GPU_WINOGRAD_MIN_CHANNELS input and
    output channels and GPU_WINOGRAD_MIN_PLANE output rows and columns, else the
    direct conv (0)."""
    if not winograd_eligible(conv):
        return 0
    o, i = conv.args[1].shape[:2]
    oh, ow = conv.shape[2:]
    if min(o, i) < GPU_WINOGRAD_MIN_CHANNELS or min(oh, ow) < GPU_WINOGRAD_MIN_PLANE:
        return 0
    return GPU_WINOGRAD_TILE


def gpu_winograd_weight(w: np.ndarray, tile: int) -> np.ndarray:
    """OIHW [O, I, 3, 3] -> U = G w G^T as [alpha^2, O, I] (the GEMM's left operand)."""
    o, i, _, _ = w.shape
    g = WINOGRAD_MATRICES[tile][2]
    u = np.einsum("ea,oiab,nb->enoi", g, w.astype(np.float64), g)
    alpha = g.shape[0]
    return np.ascontiguousarray(u.reshape(alpha * alpha, o, i).astype(w.dtype))


def winograd_conv(conv: Call, x: Expr, w: Constant, tile: int) -> Expr:
    """The three ops computing `conv` (NCHW, 3x3, stride 1) by F(tile x tile, 3 x 3)."""
    n, _, oh, ow = conv.shape
    attrs = {"tile": tile, "padding": tuple(conv.attrs["padding"]), "out_shape": (n, oh, ow)}
    v = Call("nn.winograd_input", (x,), attrs, span=conv.span)
    gemm = Call("nn.matmul", (Constant(gpu_winograd_weight(w.data, tile)), v), {},
                span=conv.span)
    return Call("nn.winograd_output", (gemm,), attrs, span=conv.span)


@register_pass("winograd_gpu", opt_level=3)
def winograd_gpu(func: Function) -> Function:
    """`func` with the chosen 3x3 convs as Winograd ops (see the module docstring); a
    CPU target or none leaves it as it is."""
    ctx = PassContext.current()
    info = ctx.target
    if info is None or not info.is_gpu:
        return func
    choose = ctx.tuning.gpu_winograd_tile

    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        if not is_op(node, "nn.conv2d"):
            return None
        assert isinstance(node, Call)
        x, w = kids
        if not isinstance(w, Constant) or not np.issubdtype(w.data.dtype, np.floating) \
                or not winograd_eligible(node):
            return None
        tile = choose(node, info)
        return winograd_conv(node, x, w, tile) if tile in WINOGRAD_MATRICES else None

    return rewrite(func, visit)
