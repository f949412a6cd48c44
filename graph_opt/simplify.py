"""simplify: drop identities and no-ops, merge chains of data movement, and put the
importer's linear layers into the canonical `nn.bias_add(nn.dense(x, W), b)` form
that the dense schedules and fusion expect.

Every rule looks at the already-simplified children (the rewrite is bottom-up), so
chains collapse in one pass: reshape(reshape(reshape(x))) -> reshape(x).
"""

from __future__ import annotations

import numpy as np
from tecc.frontend.ir import Call, Constant, Expr, Function, Tuple, TupleGetItem, rewrite
from tecc.frontend.ops import normalize_axis, reduce_axes
from tecc.graph_opt.pass_manager import register_pass
from tecc.graph_opt.patterns import is_op, is_scalar, use_counts


def _strided_slice_is_identity(node: Call, x: Expr) -> bool:
    # Same shape and every slice starting at 0 means every element is kept in place
    # (a step > 1 can only keep the shape on an axis of extent 1).
    if node.shape != x.shape:
        return False
    for axis, begin, end, step in zip(node.attrs["axes"], node.attrs["begin"],
                                      node.attrs["end"], node.attrs["strides"], strict=True):
        dim = x.shape[normalize_axis(axis, len(x.shape))]
        if slice(begin, end, step).indices(dim)[0] != 0 and dim > 0:
            return False
    return True


def _transpose_axes(node: Call) -> tuple[int, ...]:
    ndim = len(node.args[0].shape)
    return tuple(normalize_axis(a, ndim) for a in node.attrs["axes"])


class _Linear:
    """Dense rewrites, with one transposed copy per weight Constant so that every
    use of a weight shares the new constant (CSE can then merge the denses)."""

    def __init__(self) -> None:
        self.transposed: dict[int, Constant] = {}
        self.sliced: dict[int, Constant] = {}

    def weight_t(self, w: Constant) -> Constant:
        if id(w) not in self.transposed:
            self.transposed[id(w)] = Constant(np.ascontiguousarray(w.data.T))
        return self.transposed[id(w)]

    def one_batch_slice(self, w: Constant, node: Call, a: Expr) -> Constant | None:
        """The 2-D weight of a batched constant whose batch slices are all equal:
        torch exports a linear layer on a non-contiguous 3-d input as bmm with the
        weight expanded over the batch, which would store and read B copies of it."""
        k_n = w.shape[-2:]
        if node.shape != a.shape[:-1] + (k_n[0] if node.attrs["transpose_b"] else k_n[1],):
            return None
        flat = w.data.reshape((-1,) + k_n)
        if not (flat == flat[:1]).all():
            return None
        if id(w) not in self.sliced:
            self.sliced[id(w)] = Constant(np.ascontiguousarray(flat[0]))
        return self.sliced[id(w)]

    def matmul_to_dense(self, node: Call, a: Expr, w: Expr) -> Expr | None:
        """nn.matmul(x, W) with W a 2-D constant (or a batched one of equal slices) is
        x @ W == dense(x, W.T): the same product, as the op whose schedule takes a
        constant (N, K) weight."""
        if not isinstance(w, Constant) or len(w.shape) < 2 or node.attrs["transpose_a"]:
            return None
        if len(w.shape) > 2:
            w = self.one_batch_slice(w, node, a)
            if w is None:
                return None
        if node.attrs["transpose_b"]:  # already (N, K)
            return Call("nn.dense", (a, w), span=node.span)
        return Call("nn.dense", (a, self.weight_t(w)), span=node.span)


def _bias_of_dense(node: Call, dense: Expr, bias: Expr) -> Expr | None:
    """add(dense(x, W), b) with b a constant of shape (N,), (1, N), (1, 1, N)...:
    the bias is per output feature, i.e. nn.bias_add on the last axis."""
    if not is_op(dense, "nn.dense") or not isinstance(bias, Constant):
        return None
    n = dense.shape[-1]
    if node.ty != dense.ty or len(bias.shape) < 1 or bias.shape[-1] != n:
        return None
    if any(d != 1 for d in bias.shape[:-1]):
        return None
    b = bias if bias.shape == (n,) else Constant(bias.data.reshape(n))
    return Call("nn.bias_add", (dense, b), {"axis": -1}, span=node.span)


_REDUCTIONS = ("sum", "mean", "max", "min", "prod", "variance")


def _drop_kept_dims(node: Call, x: Expr, x_uses: int) -> Expr | None:
    """reshape(reduce(y, keepdims=True)) that only removes the kept 1-dims is
    reduce(y, keepdims=False): one call less (the global pooling + flatten of CNN
    heads). Only when the reduction has no other user, else it would run twice."""
    if not is_op(x, *_REDUCTIONS) or not x.attrs["keepdims"] or x_uses != 1:  # type: ignore[union-attr]
        return None
    assert isinstance(x, Call)
    y = x.args[0]
    axes = reduce_axes(x.attrs, len(y.shape))
    if node.shape != tuple(d for i, d in enumerate(y.shape) if i not in axes):
        return None
    return Call(x.op, (y,), x.attrs.with_(keepdims=False), span=x.span)


def _dense_on_nd(node: Call, x: Expr, x_uses: int) -> Expr | None:
    """reshape([bias_add](dense(x2, W)), lead + (N,)) with prod(lead) == M is dense on
    x2 reshaped to lead + (K,) (dense takes N-d input, as torch's linear does): the
    epilogue after it (a residual add) can then fuse. A reshape feeding x2 merges
    into the new one, so no copy appears."""
    if x_uses != 1:
        return None
    bias = None
    dense = x
    if is_op(x, "nn.bias_add"):
        dense, bias = x.args  # type: ignore[union-attr]
    if not is_op(dense, "nn.dense"):
        return None
    assert isinstance(dense, Call)
    x2, n = dense.args[0], dense.shape[-1]
    lead = node.shape[:-1]
    if len(x2.shape) != 2 or not lead or node.shape[-1] != n:
        return None
    if int(np.prod(lead)) != x2.shape[0]:
        return None
    source = x2.args[0] if is_op(x2, "reshape") else x2  # type: ignore[union-attr]
    shape = lead + (x2.shape[1],)
    data = source if source.shape == shape else Call("reshape", (source,),
                                                       {"newshape": shape}, span=x2.span)
    out: Expr = Call("nn.dense", (data, dense.args[1]), span=dense.span)
    if bias is not None:
        out = Call("nn.bias_add", (out, bias), {"axis": -1}, span=x.span)
    return out


@register_pass("simplify", opt_level=1)
def simplify(func: Function) -> Function:
    linear = _Linear()
    uses = use_counts(func)  # of the old nodes: the rewrite passes old node and new kids

    def visit(node: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        if isinstance(node, TupleGetItem):
            # (a, b, c).1 -> b
            if isinstance(kids[0], Tuple):
                return kids[0].fields[node.index]
            return None
        if not isinstance(node, Call) or not isinstance(node.op, str):
            return None
        op, attrs = node.op, node.attrs
        if op == "copy":
            return kids[0]
        if op == "cast" and kids[0].dtype == attrs["dtype"]:
            return kids[0]
        if op == "reshape":
            x = kids[0]
            old = node.args[0]  # its use count is only meaningful for the same op
            same = isinstance(old, Call) and isinstance(x, Call) and old.op == x.op
            dropped = _drop_kept_dims(node, x, uses[id(old)] if same else 0)
            if dropped is not None:
                return dropped
            direct = _dense_on_nd(node, x, uses[id(old)] if same else 0)
            if direct is not None:
                return direct
            if is_op(x, "reshape"):  # reshape of reshape: only the last shape matters
                x = x.args[0]
            if x.shape == node.shape:
                return x
            if x is not kids[0]:
                return Call("reshape", (x,), attrs, span=node.span)
            return None
        if op == "transpose":
            x, axes = kids[0], _transpose_axes(node)
            if is_op(x, "transpose"):  # out[i] = inner[axes[i]] = x[inner_axes[axes[i]]]
                inner = _transpose_axes(x)
                x, axes = x.args[0], tuple(inner[a] for a in axes)
            if axes == tuple(range(len(axes))):
                return x
            if x is not kids[0] or axes != tuple(attrs["axes"]):
                return Call("transpose", (x,), {"axes": axes}, span=node.span)
            return None
        if op in ("broadcast_to", "image.resize2d") and kids[0].shape == node.shape:
            # a resize to the size it has samples every pixel at itself, in every mode
            # (SegFormer's decode head interpolates its 56 x 56 map to 56 x 56)
            return kids[0]
        if op == "strided_slice" and _strided_slice_is_identity(node, kids[0]):
            return kids[0]
        if op in ("multiply", "add"):
            neutral = 1 if op == "multiply" else 0
            a, b = kids
            # x * 1, 1 * x, x + 0, 0 + x, unless the constant broadcasts or promotes
            if is_scalar(b, neutral) and a.ty == node.ty:
                return a
            if is_scalar(a, neutral) and b.ty == node.ty:
                return b
            if op == "add":
                return _bias_of_dense(node, a, b) or _bias_of_dense(node, b, a)
            return None
        if op in ("subtract", "divide"):
            a, b = kids
            if is_scalar(b, 0 if op == "subtract" else 1) and a.ty == node.ty:
                return a
            return None
        if op == "nn.matmul":
            return linear.matmul_to_dense(node, *kids)
        return None

    return rewrite(func, visit)
