"""fold_batch_norm: inference batch norm is a per-channel affine map,
y = x * scale + shift with scale = gamma / sqrt(var + eps), shift = beta - mean * scale.

After a convolution with a constant weight (and optional constant bias) whose output
feeds only the batch norm, the map folds into the conv's weight and bias: one
conv + bias_add, and the batch norm costs nothing. Any other batch norm with constant
parameters becomes `add(multiply(x, scale), shift)`: broadcast elementwise ops that
fuse into the producer's kernel, unlike the opaque nn.batch_norm.
The folding is computed in float64 and rounded once to the weight's dtype.
"""

from __future__ import annotations

import numpy as np
from tecc.frontend.ir import Call, Constant, Expr, Function, rewrite
from tecc.frontend.ops import normalize_axis
from tecc.graph_opt.pass_manager import register_pass
from tecc.graph_opt.patterns import is_op, use_counts


def _bn_affine(bn: Call, params: tuple[Expr, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) in float64, or None when a parameter is not a constant."""
    if not all(isinstance(p, Constant) for p in params):
        return None
    gamma, beta, mean, var = (p.data.astype(np.float64) for p in params)  # type: ignore[union-attr]
    scale = gamma / np.sqrt(var + bn.attrs["epsilon"])
    return scale, beta - mean * scale


def _foldable_conv(bn: Call, y_old: Expr, y_new: Expr, uses) -> tuple[Call, Constant | None] | None:
    """(conv, bias or None) when the batch norm input is conv2d(x, W const), possibly
    followed by bias_add(., b const, axis=1), and used by nothing else. The old nodes
    give the use counts, the new ones the (already rewritten) graph."""
    if uses[id(y_old)] != 1:
        return None
    bias = None
    if is_op(y_new, "nn.bias_add"):
        assert isinstance(y_old, Call) and isinstance(y_new, Call)
        b = y_new.args[1]
        if normalize_axis(y_new.attrs["axis"], len(y_new.shape)) != 1 or not isinstance(b, Constant):
            return None
        if uses[id(y_old.args[0])] != 1:
            return None
        y_old, y_new, bias = y_old.args[0], y_new.args[0], b
    if not is_op(y_new, "nn.conv2d") or not isinstance(y_new.args[1], Constant):  # type: ignore[union-attr]
        return None
    assert isinstance(y_new, Call)
    return y_new, bias


@register_pass("fold_batch_norm", opt_level=1)
def fold_batch_norm(func: Function) -> Function:
    uses = use_counts(func)

    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        if not is_op(node, "nn.batch_norm"):
            return None
        assert isinstance(node, Call)
        x, *params = kids
        affine = _bn_affine(node, tuple(params))
        if affine is None:
            return None
        scale, shift = affine
        found = _foldable_conv(node, node.args[0], x, uses)
        if found is not None:
            conv, bias = found
            w = conv.args[1]
            assert isinstance(w, Constant)
            dtype = w.dtype
            w_new = w.data.astype(np.float64) * scale[:, None, None, None]
            b_new = shift if bias is None else shift + bias.data.astype(np.float64) * scale
            new_conv = Call("nn.conv2d", (conv.args[0], Constant(w_new.astype(dtype))),
                            conv.attrs, span=conv.span)
            return Call("nn.bias_add", (new_conv, Constant(b_new.astype(dtype))), {"axis": 1},
                        span=node.span)
        # Not after a foldable conv: a per-channel scale and shift over axis 1.
        if len(x.shape) < 2:
            return None
        dtype = x.dtype
        bshape = (x.shape[1],) + (1,) * (len(x.shape) - 2)
        scaled = Call("multiply", (x, Constant(scale.reshape(bshape).astype(dtype))),
                      span=node.span)
        return Call("add", (scaled, Constant(shift.reshape(bshape).astype(dtype))),
                    span=node.span)

    return rewrite(func, visit)
