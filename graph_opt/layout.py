"""convert_layout_nchwc: convolutions in the blocked NCHW{c}c layout for CPUs.

A conv2d on NCHW data becomes `nn.conv2d_NCHWc` on data [N, C/ic, H, W, ic] with its
weight packed at compile time (a new Constant [OC/oc, IPG/ic, KH, KW, ic, oc], or
[C/c, 1, KH, KW, 1, c] for a depthwise conv), producing [N, OC/oc, OH, OW, oc]: the
innermost oc channels are one (or two) SIMD vectors, so the conv's inner loop is a
vector FMA of a broadcast input value with a contiguous weight vector.

Every tensor of the rewritten graph has a layout: NCHW (the original) or blocked by
c. Ops known to be layout-agnostic keep a blocked tensor blocked:
  - elementwise unary ops (relu, clip, sigmoid, hardswish, cast ...);
  - broadcast binary ops (add, multiply, maximum ...) whose other operand is a
    scalar, a per-channel tensor (C,1,1) / (N,C,1,1) (reshaped to its blocked form,
    a plain reshape, constants folded; one computed in a blocked layout, as an SE
    block's gate, used as it is), or a tensor of the same shape (brought to the same
    block: residual adds of two blocked tensors stay blocked);
  - nn.bias_add over the channel axis: an add of the bias reshaped to [C/c, 1, 1, c];
  - pools (a `layout` attribute) and sum/mean/max/min over (H, W);
  - a conv consumes its input in whatever block it comes (the input block is part
    of the packed weight's layout), so consecutive convs need no transform at all.
A `layout_transform` back to NCHW is inserted only where a consumer needs NCHW (the
function output, flatten/reshape, dense, any op not listed), once per tensor.

The block size: per conv, the output block is the largest of (2, 1, 1/2) x the
vector lanes dividing the output channels (per group); a conv whose channels allow
none stays an NCHW conv2d. The lanes are the CPU target's, from the current
PassContext (no CPU target: the pass leaves the IR as it is). The context's tuning
callbacks choose per layer: `winograd_tile` (Winograd or the direct conv for a 3x3
layer) and `conv_blocks`, the (ic_bn, oc_bn) of the layer's tuned config (the blocks
are knobs of the conv templates, AutoTVM-style); the data is then transformed to the
wanted input block where its producer's block differs.
"""

from __future__ import annotations

import numpy as np
from tecc.frontend.ir import (
    Call,
    Constant,
    Expr,
    Function,
    Tuple,
    TupleGetItem,
    Var,
    post_order,
)

# The blocked layout's numpy form and Winograd's matrices are defined with their ops.
from tecc.frontend.op_defs.nn import WINOGRAD_MATRICES, layout_transform_numpy
from tecc.frontend.op_defs.nn import to_nchwc as to_nchwc  # packing helpers' callers use it
from tecc.frontend.ops import Pattern, get_op, normalize_axis, reduce_axes
from tecc.graph_opt.pass_manager import ConvBlocksFn, PassContext, WinogradFn, register_pass
from tecc.graph_opt.patterns import reshaped


def layout_name(block: int | None) -> str:
    return "NCHW" if block is None else f"NCHW{block}c"


# ---------------------------------------------------------------- numpy packing


def pack_conv_weight(w: np.ndarray, ic: int, oc: int) -> np.ndarray:
    """OIHW [O, IPG, KH, KW] -> [O/oc, IPG/ic, KH, KW, ic, oc] (topi's conv2d_NCHWc)."""
    o, ipg, kh, kw = w.shape
    packed = w.reshape(o // oc, oc, ipg // ic, ic, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    return np.ascontiguousarray(packed)


def pack_depthwise_weight(w: np.ndarray, c: int) -> np.ndarray:
    """[C, 1, KH, KW] -> [C/c, 1, KH, KW, 1, c] (topi's depthwise_conv2d_NCHWc)."""
    ch, _, kh, kw = w.shape
    packed = w.reshape(ch // c, c, 1, kh, kw).transpose(0, 2, 3, 4, 1)[:, :, :, :, None, :]
    return np.ascontiguousarray(packed)


def pack_winograd_weight(w: np.ndarray, ic: int, oc: int, tile: int) -> np.ndarray:
    """OIHW [O, I, 3, 3] -> G w G^T, blocked [alpha, alpha, O/oc, I/ic, ic, oc]."""
    o, i, _, _ = w.shape
    g = WINOGRAD_MATRICES[tile][2]
    u = np.einsum("ea,oiab,nb->enoi", g, w.astype(np.float64), g)
    alpha = g.shape[0]
    packed = u.reshape(alpha, alpha, o // oc, oc, i // ic, ic).transpose(0, 1, 2, 4, 5, 3)
    return np.ascontiguousarray(packed.astype(w.dtype))


def winograd_eligible(conv: Call) -> bool:
    """A dense 3 x 3 conv, stride 1, no dilation, on one image or more."""
    w = conv.args[1].shape
    a = conv.attrs
    return (a["groups"] == 1 and tuple(w[2:]) == (3, 3) and tuple(a["strides"]) == (1, 1)
            and tuple(a["dilation"]) == (1, 1))


WINOGRAD_DEFAULT_TILE = 4
# Above this, F(4x4)'s kernel (36 points per channel pair) is streamed from memory on
# every call and the layer is bound by it: F(2x2)'s 16 points win. Measured on AVX2 (2
# cores, fallback configs): ResNet-18's 512-channel 7x7 conv (38 MB with F(4x4)) 2.13
# ms direct, 1.57 F(4x4), 1.32 F(2x2); its 256-channel 14x14 one (9 MB) 1.62, 0.76, 0.84.
WINOGRAD_F4_MAX_KERNEL_BYTES = 16 * 2**20


def default_winograd_tile(conv: Call, lanes: int) -> int:
    """Winograd for every eligible conv with a vector of input channels and at least
    one full 4x4 output tile: F(4x4, 3x3) (4x fewer multiplies than direct), or F(2x2,
    3x3) where F(4x4)'s kernel would exceed WINOGRAD_F4_MAX_KERNEL_BYTES. On AVX2 (2
    cores, fallback configs) ResNet-18's 3x3 layers went from 1.75 to 1.3 ms (56x56),
    1.75 to 0.9 (28x28) and 1.95 to 1.15 (14x14)."""
    if lanes <= 0 or not winograd_eligible(conv):
        return 0
    o, i = conv.args[1].shape[:2]
    oh, ow = conv.shape[2:]
    # a GEMM over a few input channels (an RGB input) is no GEMM
    if i < lanes or min(oh, ow) < WINOGRAD_DEFAULT_TILE:
        return 0
    f4_bytes = 36 * o * i * np.dtype(conv.args[1].dtype).itemsize
    return WINOGRAD_DEFAULT_TILE if f4_bytes <= WINOGRAD_F4_MAX_KERNEL_BYTES else 2


# ---------------------------------------------------------------- block choice


def out_block_candidates(lanes: int) -> list[int]:
    return [b for b in (2 * lanes, lanes, lanes // 2) if b >= 1]


# With 16 lanes (AVX-512) two-vector blocks need this many vectors of channels.
WIDE_BLOCK_MIN_VECTORS = 4


def default_out_block_for(channels: int, lanes: int) -> int | None:
    """The output block of a conv with `channels` (per group), untuned, and the conv
    template's fallback: the largest of 2x, 1x, 1/2x the vector lanes dividing
    `channels`; with 16 lanes two vectors only from WIDE_BLOCK_MIN_VECTORS vectors of
    channels (64: what the models measured below have; narrower layers keep one).
    The conv's register tile is (output columns) x (vectors), each broadcast input
    used once per vector: with AVX2's 16 registers, 6 columns x 2 vectors (12
    accumulators) beat one vector x 12-14 columns on ResNet-18's 3x3 convs (2 cores:
    56x56 142 vs 127 GFLOP/s, 28x28 135 vs 115, 14x14 134 vs 114, 7x7 101 vs 93). With
    AVX-512 one vector over a 7-column output is 7 accumulators, too few to cover the
    FMA latency: two vectors made EfficientNet-B0's 1x1 convs 1.4-1.9x faster at 7x7
    and 1.2x at 14x14 (one core: 192 -> 1152 channels 0.147 vs 0.275 ms), and no slower
    at 112x112; whole models (2 cores, untuned) 10-15% faster (EfficientNet-B0,
    MobileNetV2, ResNet-18's Winograd GEMMs, whose tile is 8 rows x the vectors)."""
    for b in out_block_candidates(lanes):
        if channels % b or (b == 2 * lanes and lanes >= 16
                            and channels < WIDE_BLOCK_MIN_VECTORS * lanes):
            continue
        return b
    return None


# A conv whose output channels no vector block divides runs blocked on zero-padded
# filters where the padding is at most this fraction and its output plane has this
# many pixels; else in NCHW. SegFormer's 150-class head (1x1, 256 -> 150 at 56 x 56,
# AVX-512): 5.0 ms in NCHW and 0.5 ms to bring its input back to NCHW.
MAX_PADDED_FILTERS, MIN_PADDED_PLANE = 1.25, 64


def padded_out_channels(channels: int, plane: int, lanes: int) -> int | None:
    """The output channels a non-grouped conv is computed on: None (its own) where a
    vector block divides them, or the padding would cost too much; else the next
    multiple of the largest block within MAX_PADDED_FILTERS (150 -> 160 in blocks of
    32 on AVX-512: 152 in half vectors ran at 0.7x)."""
    if default_out_block_for(channels, lanes) is not None or plane < MIN_PADDED_PLANE:
        return None
    for step in out_block_candidates(lanes):
        padded = -(-channels // step) * step
        if padded <= channels * MAX_PADDED_FILTERS:
            return padded
    return None


def in_block(channels: int, lanes: int) -> int:
    """Block of a tensor entering the blocked layout at a conv's input: a vector
    block when the channels allow; else, fewer channels than the smallest vector
    block (the RGB input), 1: the NCHW planes read in place, with no layout_transform
    of the model's input; else the largest divisor <= 2 lanes.

    The conv broadcasts one input value per FMA whatever the block, so blocking a few
    channels buys no vector width; plane rows read along kw contiguously. Against
    the block of all 3 channels ([N, 1, H, W, 3]), fallback configs, 2 cores, 224x224
    RGB stems (benchmarks/results/input_conv.md): 7x7/2 to 64 channels 1.23x faster
    (AVX-512; AVX2 1.11x), 3x3/2 to 32 channels 1.32x (AVX2 1.20x)."""
    candidates = out_block_candidates(lanes)
    for b in candidates:
        if channels % b == 0:
            return b
    if channels < min(candidates):
        return 1
    for b in range(min(channels, 2 * lanes), 0, -1):
        if channels % b == 0:
            return b
    return 1


# ---------------------------------------------------------------- the pass


class _Converter:
    def __init__(self, lanes: int, conv_blocks_fn: ConvBlocksFn,
                 winograd_fn: WinogradFn) -> None:
        self.lanes = lanes
        self.conv_blocks_fn = conv_blocks_fn
        self.winograd_fn = winograd_fn
        self.new: dict[int, tuple[Expr, int | None]] = {}  # old id -> (expr, block)
        self.transformed: dict[tuple[int, int | None], Expr] = {}

    # -- layout conversions

    def as_layout(self, expr: Expr, block: int | None, want: int | None) -> Expr:
        """`expr` (in layout `block`) in layout `want`; one transform per tensor."""
        if block == want:
            return expr
        key = (id(expr), want)
        if key not in self.transformed:
            shape = tuple(expr.shape)
            if {block, want} == {None, 1} or shape[2:4] == (1, 1):
                # NCHW and NCHW1c are the same bytes, and so is every layout of a
                # 1x1 plane (an SE block's pooled vector): a reshape, which is no
                # kernel (a conv reading few channels, the RGB input, reads it in place)
                n, channels = shape[0], shape[1] * (shape[4] if block else 1)
                newshape = ((n, channels, *shape[2:4]) if want is None else
                            (n, channels // want, *shape[2:4], want))
                self.transformed[key] = (Constant(expr.data.reshape(newshape))
                                         if isinstance(expr, Constant) else
                                         Call("reshape", [expr], {"newshape": newshape}))
            elif isinstance(expr, Constant):
                data = layout_transform_numpy(expr.data, layout_name(block), layout_name(want))
                self.transformed[key] = Constant(data)
            else:
                self.transformed[key] = Call("layout_transform", [expr], {
                    "src_layout": layout_name(block), "dst_layout": layout_name(want)})
        return self.transformed[key]

    def nchw(self, old: Expr) -> Expr:
        expr, block = self.new[id(old)]
        return self.as_layout(expr, block, None)

    # -- per node

    def visit(self, node: Expr) -> tuple[Expr, int | None]:
        if isinstance(node, Var | Constant | Function):
            return node, None
        if isinstance(node, Tuple):
            return Tuple([self.nchw(f) for f in node.fields]), None
        if isinstance(node, TupleGetItem):
            return TupleGetItem(self.nchw(node.tuple_value), node.index), None
        assert isinstance(node, Call)
        if isinstance(node.op, str):
            converted = self.convert_call(node)
            if converted is not None:
                return converted
        return self.generic(node), None

    def generic(self, node: Call) -> Expr:
        args = [self.nchw(a) for a in node.args]
        if all(a is b for a, b in zip(args, node.args, strict=True)):
            return node
        return Call(node.op, args, node.attrs, node.span)

    def convert_call(self, node: Call) -> tuple[Expr, int | None] | None:
        op = node.op
        assert isinstance(op, str)
        if op == "nn.conv2d":
            return self.conv2d(node)
        blocks = [self.new[id(a)][1] for a in node.args]
        block = next((b for b in blocks if b is not None), None)
        if block is None:
            return None
        opdef = get_op(op)
        pattern = opdef.pattern
        if pattern == Pattern.ELEMWISE and len(node.args) == 1:
            (x,) = node.args
            return Call(op, [self.new[id(x)][0]], node.attrs, node.span), block
        if op == "nn.bias_add":
            return self.bias_add(node)
        if pattern == Pattern.BROADCAST and len(node.args) == 2:
            return self.binary(node)
        if opdef.blocked_layout and "layout" in opdef.attrs and node.attrs["layout"] == "NCHW":
            x, b = self.new[id(node.args[0])]
            return Call(op, [x], node.attrs.with_(layout=layout_name(b)), node.span), b
        if opdef.blocked_layout and pattern == Pattern.COMM_REDUCE:
            return self.spatial_reduction(node)
        return None

    def conv2d(self, node: Call) -> tuple[Expr, int | None] | None:
        data_old, weight = node.args
        if not isinstance(weight, Constant) or len(data_old.shape) != 4:
            return None
        if not np.issubdtype(weight.data.dtype, np.floating):
            return None
        x, xb = self.new[id(data_old)]
        groups = node.attrs["groups"]
        c = data_old.shape[1]
        o = node.shape[1]
        ipg, opg = c // groups, o // groups
        attrs = dict(node.attrs)
        depthwise = groups > 1 and groups == c == o
        filters = weight.data
        padded = padded_out_channels(o, node.shape[2] * node.shape[3], self.lanes) \
            if groups == 1 else None
        if padded is not None:
            # zero filters up to a vector block; the transform back to NCHW drops them.
            # The tuning callbacks see the padded conv: the kernel's workload.
            filters = np.concatenate([filters, np.zeros((padded - o, *filters.shape[1:]),
                                                        filters.dtype)])
            opg = padded
            node = Call("nn.conv2d", [data_old, Constant(filters)], node.attrs, node.span)
        tile = 0 if depthwise else self.winograd_fn(node, self.lanes)
        wanted = self.conv_blocks_fn(node, xb, tile)
        if depthwise:
            if wanted is not None and c % wanted[1] == 0:
                block = wanted[1]
            elif xb is not None and xb in out_block_candidates(self.lanes):
                block = xb
            else:
                block = default_out_block_for(c, self.lanes)
            if block is None:
                return None
            data = self.as_layout(x, xb, block)
            packed = pack_depthwise_weight(weight.data, block)
            attrs.update(data_layout=layout_name(block), out_layout=layout_name(block))
            return Call("nn.conv2d_NCHWc", [data, Constant(packed)], attrs, node.span), block
        if wanted is not None and ipg % wanted[0] == 0 and opg % wanted[1] == 0:
            ic, oc = wanted
        else:
            oc = default_out_block_for(opg, self.lanes)
            if oc is None:
                return None
            ic = xb if xb is not None and ipg % xb == 0 else in_block(ipg, self.lanes)
        data = self.as_layout(x, xb, ic)
        if tile:
            packed = pack_winograd_weight(filters, ic, oc, tile)
            attrs.update(winograd_tile=tile)
        else:
            packed = pack_conv_weight(filters, ic, oc)
        attrs.update(data_layout=layout_name(ic), out_layout=layout_name(oc))
        out = Call("nn.conv2d_NCHWc", [data, Constant(packed)], attrs, node.span)
        if padded is None:
            return out, oc
        return Call("strided_slice", [self.as_layout(out, oc, None)],
                    {"begin": (0,), "end": (o,), "strides": (1,), "axes": (1,)}), None

    def bias_add(self, node: Call) -> tuple[Expr, int | None] | None:
        x_old, b_old = node.args
        x, block = self.new[id(x_old)]
        if block is None or normalize_axis(node.attrs["axis"], len(x_old.shape)) != 1:
            return None
        channels = x_old.shape[1]
        bias = self.per_channel(self.nchw(b_old), channels, block, leading=0)
        return Call("add", [x, bias], span=node.span), block

    def per_channel(self, expr: Expr, channels: int, block: int, leading: int) -> Expr:
        """A per-channel operand ((C,), (C,1,1) or (N,C,1,1): `leading` dims before C)
        in its blocked form: [..., C/c, 1, 1, c], a plain reshape of its values."""
        shape = tuple(expr.shape[:leading]) + (channels // block, 1, 1, block)
        if isinstance(expr, Constant):
            return Constant(expr.data.reshape(shape))
        return Call("reshape", [expr], {"newshape": shape})

    def binary(self, node: Call) -> tuple[Expr, int | None] | None:
        out_shape = node.shape
        if len(out_shape) != 4:
            return None
        olds = node.args
        news = [self.new[id(a)] for a in olds]
        # The block of the first blocked operand that has the output's shape.
        block = next((b for a, (_, b) in zip(olds, news, strict=True)
                      if b is not None and a.shape == out_shape), None)
        if block is None:
            return None
        args = []
        for a_old, (a_new, a_block) in zip(olds, news, strict=True):
            converted = self.broadcast_operand(a_old, a_new, a_block, block, out_shape)
            if converted is None:
                return None
            args.append(converted)
        return Call(node.op, args, node.attrs, node.span), block

    def broadcast_operand(self, old: Expr, new: Expr, cur: int | None, block: int,
                          out_shape: tuple[int, ...]) -> Expr | None:
        shape = old.shape
        size = int(np.prod(shape, dtype=np.int64))
        if size == 1 and len(shape) <= 4:
            return self.as_layout(new, cur, None) if cur is not None else new
        if shape == out_shape:
            return self.as_layout(new, cur, block)
        if len(shape) > 4:
            return None
        full = (1,) * (4 - len(shape)) + tuple(shape)
        channels = out_shape[1]
        if cur is not None and len(shape) == 4 and full[1] == channels and full[2:] == (1, 1):
            # a blocked per-channel tensor (an SE block's gate: pooled from a blocked
            # activation) is already [N, C/c, 1, 1, c]: no round trip through NCHW
            return self.as_layout(new, cur, block)
        nchw = self.as_layout(new, cur, None)
        if full[1] == channels and full[2] == full[3] == 1:
            if full[0] == 1:
                return self.per_channel(reshaped(nchw, (channels,)), channels, block, 0)
            return self.per_channel(nchw if len(shape) == 4 else reshaped(nchw, full),
                                    channels, block, 1)
        if full[1] == 1:  # constant over channels: [N, 1, H, W, 1] broadcasts
            return reshaped(nchw, (*full, 1))
        return None

    def spatial_reduction(self, node: Call) -> tuple[Expr, int | None] | None:
        x_old = node.args[0]
        x, block = self.new[id(x_old)]
        if len(x_old.shape) != 4 or reduce_axes(node.attrs, 4) != (2, 3):
            return None
        keep = node.attrs["keepdims"]
        red = Call(node.op, [x], node.attrs.with_(axis=(2, 3)), node.span)
        if keep:
            return red, block
        # [N, C/c, c] has the bytes of [N, C]: a reshape, no transform.
        return reshaped(red, node.shape), None


@register_pass("convert_layout_nchwc", opt_level=3)
def convert_layout_nchwc(func: Function) -> Function:
    """`func` with its convolutions in NCHW{c}c (see the module docstring)."""
    ctx = PassContext.current()
    lanes = ctx.cpu_lanes()
    if lanes <= 0:
        return func
    conv = _Converter(lanes, ctx.tuning.conv_blocks, ctx.tuning.winograd_tile)
    for node in post_order(func.body):
        conv.new[id(node)] = conv.visit(node)
    body = conv.nchw(func.body)
    if body is func.body:
        return func
    return Function(func.params, body, func.attrs)
