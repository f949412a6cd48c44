"""fold_dense_rows: a dense layer computes on all rows of its input as one matrix (CPU).

`nn.dense(x[a, b, ..., M, K], W)` with more than one row block above the rows
(prod(a, b, ...) > 1; ConvNeXt's pointwise layers run on [1, H, W, C]) becomes
`reshape(nn.dense(x[P, K], W), [a, b, ..., M, N])` with P = a * b * ... * M, as torch's
linear flattens its input. The dense template takes the leading axes as a batch that
shares the weight: [1, 7, 7, 768] was 7 matrices of 7 rows, each padded to whole
register tiles (8 rows of 4); as 49 rows, the tiles pad 49 once (2 Zen 4 cores,
untuned: ConvNeXt 1.06x end to end; ConvNeXt-style MLPs at 7x7x768 1.09x, 14x14x384
1.08x, 28x28x192 1.02x, 56x56x96 1.03x; benchmarks/dense_rows.py).

The reshape back to the N-d shape is then moved below the elementwise ops that
follow (bias, GELU, a per-channel scale, a residual add), so that they still fuse into
the dense's kernel as its epilogue; a following dense takes the 2-D rows as they are.
Their other operands must vary along the last axis only (a vector of N, a scalar) or
have the N-d shape (then their rows are read: a reshape, which is a view of the same
bytes, no kernel). The reshape back stays where the N-d shape is needed (a transpose)
and is a view there too.

Only on CPU targets (the GPU dense rules tile rows and batch alike), after the
attention patterns are fused (they match denses on [B, S, K]) and before the weights
are packed.
"""

from __future__ import annotations

import math

from tecc.frontend.ir import Call, Expr, Function, rewrite
from tecc.frontend.ops import Pattern, get_op
from tecc.graph_opt.pass_manager import PassContext, register_pass
from tecc.graph_opt.patterns import is_op, reshaped, use_counts

# elementwise ops whose attributes name no axis (broadcast_to names a shape)
_AXIS_FREE_EXCLUDED = ("broadcast_to",)


def _row_operand(arg: Expr, shape: tuple[int, ...]) -> Expr | None:
    """`arg` broadcast against `shape` as an operand of the 2-D rows [P, N]: a scalar
    as it is, a tensor varying along the last axis only as its last axis; None when
    it varies along another axis."""
    arg_shape = tuple(arg.shape)
    if len(arg_shape) > len(shape) or any(d != 1 for d in arg_shape[:-1]):
        return None
    if not arg_shape:
        return arg
    if math.prod(arg_shape) == 1:
        return reshaped(arg, (1,))
    if arg_shape[-1] != shape[-1]:
        return None
    return reshaped(arg, (shape[-1],))


def _below(node: Call, kids: tuple[Expr, ...], folded: Call) -> Expr | None:
    """`node` with its new operands `kids`, an elementwise op of the N-d view `folded`
    of 2-D rows, computed on the rows instead; None where that would change what it
    computes."""
    op, rows = node.op, folded.args[0]
    if not isinstance(op, str) or op in _AXIS_FREE_EXCLUDED:
        return None
    if get_op(op).pattern > Pattern.BROADCAST or tuple(node.shape) != tuple(folded.shape):
        return None
    attrs = node.attrs
    if op == "nn.bias_add":
        if attrs["axis"] not in (-1, len(node.shape) - 1):
            return None
        attrs = attrs.with_(axis=-1)
    args: list[Expr] = []
    for arg in kids:
        if arg is folded:
            args.append(rows)
            continue
        if tuple(arg.shape) == tuple(folded.shape):
            # a tensor of the same shape (a residual): its rows, a view of its bytes
            args.append(reshaped(arg, tuple(rows.shape), span=node.span))
            continue
        row_arg = _row_operand(arg, tuple(node.shape))
        if row_arg is None:
            return None
        args.append(row_arg)
    return Call(op, tuple(args), attrs, span=node.span)


@register_pass("fold_dense_rows", opt_level=3)
def fold_dense_rows(func: Function) -> Function:
    """`func` with its N-d denses on 2-D rows (see the module docstring)."""
    if PassContext.current().cpu_lanes() <= 0:
        return func
    uses = use_counts(func)
    views: set[int] = set()  # the reshapes this pass made: rows viewed as N-d

    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        if not isinstance(node, Call):
            return None
        if is_op(node, "nn.dense"):
            x, w = kids
            lead = tuple(x.shape[:-2])
            if len(w.shape) != 2 or math.prod(lead) <= 1:
                return None
            rows = Call("nn.dense", (reshaped(x, (math.prod(x.shape[:-1]), x.shape[-1]),
                                              span=node.span), w), node.attrs,
                        span=node.span)
            view = Call("reshape", (rows,), {"newshape": tuple(node.shape)}, span=node.span)
            views.add(id(view))
            return view
        # an elementwise op on a view this pass made, its only use: below the view
        folded = next((k for k, old in zip(kids, node.args, strict=True)
                       if id(k) in views and uses[id(old)] == 1), None)
        if folded is None:
            return None
        assert isinstance(folded, Call)
        below = _below(node, kids, folded)
        if below is None:
            return None
        view = Call("reshape", (below,), {"newshape": tuple(node.shape)}, span=node.span)
        views.add(id(view))
        return view

    return rewrite(func, visit)
