"""Neural-network ops on NCHW images: convolutions (direct, channel-blocked NCHW{c}c,
depthwise, Winograd), bias_add, pools, softmax and the normalizations; and the
blocked layout itself (`layout_transform` and its numpy form)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import tvm
from tecc.frontend.ir import Call, Constant, Expr
from tecc.frontend.op_defs.common import (
    ANCHOR_ATTR,
    arity,
    exp_of,
    nan_max_reduce,
    out_tensor,
    pads4,
    te_shape,
)
from tecc.frontend.op_defs.reduce import reduce_compute
from tecc.frontend.ops import OPS, REQUIRED, Pattern, TypeRel, normalize_axis
from tecc.frontend.types import Attrs, IRTypeError, TensorType, Type
from tvm import te, topi
from tvm.tirx import const

if TYPE_CHECKING:
    from tecc.frontend.importer import ImportContext


def _c(v: float, dtype: str) -> tvm.tirx.PrimExpr:
    return const(v, dtype)


# ---------------------------------------------------------------- the NCHW{c}c layout


def nchwc_block(layout: str) -> int | None:
    """The channel block of a layout string: None for "NCHW", c for "NCHW{c}c"."""
    if layout == "NCHW":
        return None
    if layout.startswith("NCHW") and layout.endswith("c") and layout[4:-1].isdigit():
        block = int(layout[4:-1])
        if block > 0:
            return block
    raise IRTypeError(f"unsupported layout {layout!r}: use NCHW or NCHW<c>c")


def to_nchwc(x: np.ndarray, block: int) -> np.ndarray:
    """[N, C, H, W] -> [N, C/c, H, W, c]."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def from_nchwc(x: np.ndarray) -> np.ndarray:
    """[N, C/c, H, W, c] -> [N, C, H, W]."""
    n, cc, h, w, c = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cc * c, h, w))


def layout_transform_numpy(x: np.ndarray, src_layout: str, dst_layout: str) -> np.ndarray:
    """What the `layout_transform` op computes."""
    src, dst = nchwc_block(src_layout), nchwc_block(dst_layout)
    nchw = x if src is None else from_nchwc(x)
    return np.ascontiguousarray(nchw) if dst is None else to_nchwc(nchw, dst)


def _spatial_nchw(x: TensorType, layout: str, what: str) -> tuple[int, int, int, int]:
    """(n, c, h, w) of a 4-D NCHW tensor or a 5-D NCHW{c}c one (c: all channels)."""
    block = nchwc_block(layout)
    if block is None:
        if x.ndim != 4:
            raise IRTypeError(f"{what}: expected NCHW data, got {x.shape}")
        return x.shape  # type: ignore[return-value]
    if x.ndim != 5 or x.shape[4] != block:
        raise IRTypeError(f"{what}: expected {layout} data [N, C/{block}, H, W, {block}], "
                          f"got {x.shape}")
    n, cc, h, w, cb = x.shape
    return n, cc * cb, h, w


def _with_spatial(x: TensorType, oh: int, ow: int) -> TensorType:
    shape = list(x.shape)
    shape[2], shape[3] = oh, ow
    return TensorType(tuple(shape), x.dtype)


def _layout_transform_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    n, c, h, w = _spatial_nchw(x, attrs["src_layout"], "layout_transform")
    block = nchwc_block(attrs["dst_layout"])
    if block is None:
        return TensorType((n, c, h, w), x.dtype)
    if c % block:
        raise IRTypeError(f"layout_transform: {c} channels are not divisible by {block}")
    return TensorType((n, c // block, h, w, block), x.dtype)


def _layout_transform_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """NCHW <-> NCHW{c}c and between blocks, by index arithmetic (one gather)."""
    (x,) = args
    src, dst = nchwc_block(attrs["src_layout"]), nchwc_block(attrs["dst_layout"])

    def read(n, ch, y, xx):  # ch: the channel in NCHW numbering
        if src is None:
            return x[n, ch, y, xx]
        return x[n, tvm.tirx.floordiv(ch, src), y, xx, tvm.tirx.floormod(ch, src)]

    if dst is None:
        body = read
    else:
        def body(n, cc, y, xx, cb):
            return read(n, cc * dst + cb, y, xx)
    return te.compute(out_tensor(out_type).shape, body, name="layout_transform")


OPS.register("layout_transform", _layout_transform_rel, Pattern.INJECTIVE, 1,
             attrs={"src_layout": REQUIRED, "dst_layout": REQUIRED},
             compute=_layout_transform_compute,
             evaluate=lambda args, attrs, ty: layout_transform_numpy(
                 args[0], attrs["src_layout"], attrs["dst_layout"]),
             doc="NCHW <-> NCHW{c}c (and between blocks): out[n, C/c, h, w, c] = x[n, C, h, w]")


# ---------------------------------------------------------------- nn.conv2d


def conv_out_size(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int,
                  dilation: int = 1, ceil_mode: bool = False) -> int:
    span = size + pad_lo + pad_hi - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_lo:
        out -= 1  # the last window must start inside the input or left padding
    return out


def _conv_out_hw(h: int, w: int, kh: int, kw: int, attrs: Attrs, op: str,
                 data_shape: tuple[int, ...]) -> tuple[int, int]:
    """Output height and width of a conv (its padding, strides and dilation)."""
    pt, pl, pb, pr = pads4(attrs["padding"])
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    oh = conv_out_size(h, kh, sh, pt, pb, dh)
    ow = conv_out_size(w, kw, sw, pl, pr, dw)
    if oh <= 0 or ow <= 0:
        raise IRTypeError(f"{op} output would be empty for input {data_shape}")
    return oh, ow


def _conv2d_rel(types: list[Type], attrs: Attrs) -> Type:
    data, weight = arity(types, 2)
    if data.ndim != 4 or weight.ndim != 4:
        raise IRTypeError(f"conv2d expects NCHW data and OIHW weight, got {data} and {weight}")
    n, c, h, w = data.shape
    o, i, kh, kw = weight.shape
    groups = attrs["groups"]
    if c != i * groups or o % groups:
        raise IRTypeError(f"channels {c} do not match weight {weight.shape} with groups={groups}")
    oh, ow = _conv_out_hw(h, w, kh, kw, attrs, "conv2d", data.shape)
    return TensorType((n, o, oh, ow), data.dtype)


def _conv2d_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """NCHW x OIHW, any groups (depthwise is groups == C): one reduction block so one
    schedule template covers all three."""
    data, weight = args
    out = out_tensor(out_type)
    n, c, h, w = te_shape(data)
    o, ipg, kh, kw = te_shape(weight)
    groups = attrs["groups"]
    opg = o // groups
    pt, pl, pb, pr = pads4(attrs["padding"])
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    if pt or pl or pb or pr:
        data = topi.nn.pad(data, [0, 0, pt, pl], [0, 0, pb, pr], name="conv_pad")
    ric = te.reduce_axis((0, ipg), name="ric")
    rkh = te.reduce_axis((0, kh), name="rkh")
    rkw = te.reduce_axis((0, kw), name="rkw")

    def body(b, oc, y, x):
        ic = ric if groups == 1 else (oc // opg) * ipg + ric
        return te.sum(data[b, ic, y * sh + rkh * dh, x * sw + rkw * dw].astype(out.dtype)
                      * weight[oc, ric, rkh, rkw].astype(out.dtype), axis=[ric, rkh, rkw])

    return te.compute(out.shape, body, name="conv2d", attrs={ANCHOR_ATTR: "conv2d"})


def conv2d_nchw_numpy(x: np.ndarray, w: np.ndarray, strides, padding, dilation,
                      groups: int) -> np.ndarray:
    """Direct NCHW x OIHW convolution in numpy (float64 accumulation)."""
    n, c, h, wd = x.shape
    o, ipg, kh, kw = w.shape
    pt, pl, pb, pr = pads4(padding)
    sh, sw = strides
    dh, dw = dilation
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = conv_out_size(h, kh, sh, pt, pb, dh), conv_out_size(wd, kw, sw, pl, pr, dw)
    opg = o // groups
    out = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xs = xp[:, g * ipg:(g + 1) * ipg]
        ws = w[g * opg:(g + 1) * opg].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                           j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, g * opg:(g + 1) * opg] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


OPS.register("nn.conv2d", _conv2d_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
             attrs={"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1},
             compute=_conv2d_compute,
             evaluate=lambda args, attrs, ty: conv2d_nchw_numpy(
                 args[0], args[1], attrs["strides"], attrs["padding"], attrs["dilation"],
                 attrs["groups"]))


@OPS.converter("aten.convolution.default")
def _convert_convolution(ctx: ImportContext, node, args, kwargs):
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args
    if len(x.shape) not in (3, 4):
        raise ctx.unsupported(f"aten.convolution ({len(x.shape) - 2}-d)")
    if transposed and not isinstance(w, Constant):
        raise ctx.error("a transposed conv of computed weights is not supported")
    spatial = len(x.shape) - 2
    stride, padding, dilation, output_padding = (
        tuple(v) * (spatial if len(v) == 1 else 1)
        for v in (stride, padding, dilation, output_padding))
    if spatial == 1:  # a 1-d conv is a 2-d one over rows of height 1
        length = x.shape[2]
        x = ctx.call("reshape", x, newshape=(x.shape[0], x.shape[1], 1, length))
        kernel_shape = (*w.shape[:2], 1, w.shape[2])
        w = (Constant(w.data.reshape(kernel_shape)) if isinstance(w, Constant)
             else ctx.call("reshape", w, newshape=kernel_shape))
        stride, padding, dilation = (1, *stride), (0, *padding), (1, *dilation)
        output_padding = (0, *output_padding)
    if transposed:
        x, w, pads = _transposed_as_conv(ctx, x, w, stride, padding, dilation,
                                         output_padding, groups)
        stride = (1, 1)
    else:
        pads = (padding[0], padding[1], padding[0], padding[1])
        x, pads = _fold_zero_pad(x, pads)
    out = ctx.call("nn.conv2d", x, w, strides=tuple(stride), padding=pads,
                   dilation=tuple(dilation), groups=groups)
    if b is not None:
        out = ctx.call("nn.bias_add", out, ctx.expr(b), axis=1)
    if len(ctx.out_shape()) == 3:
        out = ctx.call("reshape", out, newshape=ctx.out_shape())
    return out


def _transposed_as_conv(ctx: ImportContext, x: Expr, w: Constant, stride: tuple[int, ...],
                        padding: tuple[int, ...], dilation: tuple[int, ...],
                        output_padding: tuple[int, ...], groups: int
                        ) -> tuple[Expr, Constant, tuple[int, int, int, int]]:
    """A transposed conv (ConvTranspose2d: DPT's and U-Nets' upsampling) as the direct
    conv it equals, so that it runs in the conv templates: stride - 1 zeros after each
    input row and column, the input padded by dilation * (k - 1) - padding on each
    side (output_padding more after; a negative pad crops), and the kernel with its
    input and output channels swapped within each group and flipped in space. The
    conv then multiplies the inserted zeros too: stride^2 times a direct conv's work."""
    _n, cin, height, width = x.shape
    if stride[0] > 1 or stride[1] > 1:
        # each input row and column repeated stride times (takes of constant indices),
        # then zeros selected where a repeat is: a select, not a pad's if_then_else,
        # whose modular bounds TIR's loop partitioning failed on (a 4x4 input upsampled
        # by 4); zeros, not products with a 0/1 mask, keep an inf from spreading
        rows, cols = np.arange(height * stride[0]), np.arange(width * stride[1])
        x = ctx.call("take", x, ctx.const(rows // stride[0], "int64"), axis=2)
        x = ctx.call("take", x, ctx.const(cols // stride[1], "int64"), axis=3)
        kept = (rows % stride[0] == 0)[:, None] & (cols % stride[1] == 0)[None, :]
        x = ctx.call("where", ctx.const(kept, "bool"), x, ctx.const(0.0, x.dtype))
    kernel = w.data.shape[2:]
    before = [d * (k - 1) - p for d, k, p in zip(dilation, kernel, padding, strict=True)]
    # the zeros after the last row and column are some of the padding after
    after = [b + o - (s - 1) for b, o, s in zip(before, output_padding, stride, strict=True)]
    if min(*before, *after) < 0:
        x = ctx.call("pad", x, before=(0, 0, *(min(v, 0) for v in before)),
                     after=(0, 0, *(min(v, 0) for v in after)), value=0.0)
    before, after = [max(v, 0) for v in before], [max(v, 0) for v in after]
    cout = w.data.shape[1] * groups
    per_group = w.data.reshape(groups, cin // groups, cout // groups, *kernel)
    kernel_of_conv = per_group.transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1].reshape(
        cout, cin // groups, *kernel)
    return x, Constant(np.ascontiguousarray(kernel_of_conv)), (before[0], before[1],
                                                               after[0], after[1])


def _fold_zero_pad(x: Expr, pads: tuple[int, int, int, int]
                   ) -> tuple[Expr, tuple[int, int, int, int]]:
    """A conv's input padded with zeros on H and W only (F.pad before the conv, as
    TensorFlow's "same" padding is ported) becomes the conv's own padding: the conv
    template pads inside its kernel, where a separate pad would be one more pass."""
    if not (isinstance(x, Call) and x.op == "pad" and x.attrs["value"] == 0.0):
        return x, pads
    before, after = x.attrs["before"], x.attrs["after"]
    if len(before) != 4 or any(before[:2]) or any(after[:2]) or min(*before, *after) < 0:
        return x, pads
    top, left, bottom, right = pads
    return x.args[0], (top + before[2], left + before[3], bottom + after[2], right + after[3])


# ---------------------------------------------------------------- nn.conv2d_NCHWc


def winograd_tile(attrs: Attrs) -> int:
    """The output tile m of a conv2d_NCHWc computed by Winograd's F(m x m, 3 x 3),
    whose kernel is then pre-transformed, [alpha, alpha, OC/oc, C/ic, ic, oc] with
    alpha = m + 2; 0 for the direct algorithm."""
    return int(attrs.get("winograd_tile", 0))


def nchwc_kernel_dims(kernel_shape: Sequence[int], attrs: Attrs
                      ) -> tuple[int, int, int, int, int, int]:
    """(OC/oc, IPG/ic, KH, KW, ic, oc) of a conv2d_NCHWc kernel, the Winograd layout
    [alpha, alpha, OC/oc, C/ic, ic, oc] included (KH = KW = alpha - m + 1)."""
    tile = winograd_tile(attrs)
    if tile:
        alpha, _, occ, ipc, kic, oc = kernel_shape
        return occ, ipc, alpha - tile + 1, alpha - tile + 1, kic, oc
    occ, ipc, kh, kw, kic, oc = kernel_shape
    return occ, ipc, kh, kw, kic, oc


def is_depthwise_nchwc(data_shape: Sequence[int], kernel_shape: Sequence[int],
                       groups: int) -> bool:
    """A conv2d_NCHWc call whose kernel is in the depthwise layout [C/c, 1, KH, KW, 1, c]."""
    c = data_shape[1] * data_shape[4]
    return (groups > 1 and groups == c and kernel_shape[1] == 1 and kernel_shape[4] == 1
            and kernel_shape[5] == data_shape[4] and kernel_shape[0] == data_shape[1])


def _conv2d_nchwc_rel(types: list[Type], attrs: Attrs) -> Type:
    """data [N, C/ic, H, W, ic]; kernel [OC/oc, IPG/ic, KH, KW, ic, oc] (IPG: input
    channels per group; groups=1 is topi's conv2d_NCHWc layout) or, depthwise
    (groups == C == OC, ic == oc), [C/c, 1, KH, KW, 1, c] as topi's
    depthwise_conv2d_NCHWc; or, with attribute winograd_tile, a Winograd kernel (see
    winograd_tile). Output [N, OC/oc, OH, OW, oc]."""
    data, kernel = arity(types, 2)
    n, c, h, w = _spatial_nchw(data, attrs["data_layout"], "conv2d_NCHWc")
    ic = data.shape[4]
    oc = nchwc_block(attrs["out_layout"])
    if oc is None or kernel.ndim != 6 or kernel.shape[5] != oc:
        raise IRTypeError(f"conv2d_NCHWc: kernel {kernel.shape} does not match out_layout "
                          f"{attrs['out_layout']}")
    occ, ipc, kh, kw, kic, _ = nchwc_kernel_dims(kernel.shape, attrs)
    groups = attrs["groups"]
    out_channels = occ * oc
    if winograd_tile(attrs):
        if kic != ic or c != ipc * ic or groups != 1 or kernel.shape[0] != kernel.shape[1]:
            raise IRTypeError(f"conv2d_NCHWc: data {data.shape} and Winograd kernel "
                              f"{kernel.shape} do not match")
    elif is_depthwise_nchwc(data.shape, kernel.shape, groups):
        pass
    elif kic != ic or c != ipc * ic * groups or out_channels % groups or (
            groups > 1 and (out_channels // groups) % oc):
        raise IRTypeError(f"conv2d_NCHWc: data {data.shape} and kernel {kernel.shape} do not "
                          f"match with groups={groups}")
    oh, ow = _conv_out_hw(h, w, kh, kw, attrs, "conv2d_NCHWc", data.shape)
    return TensorType((n, occ, oh, ow, oc), data.dtype)


def winograd_matrices(tile: int, kernel: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Winograd F(tile x tile, kernel x kernel)'s A (output), B (input) and G (kernel)
    transforms, from topi's Cook-Toom generator (float64; topi itself only returns
    them as TE constants)."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    a, b, g = _cook_toom_convolution(_interpolation_points(tile + kernel - 2), tile, kernel)
    return (np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64),
            np.asarray(g, dtype=np.float64))


# The tiles tecc uses: F(2x2, 3x3) and F(4x4, 3x3).
WINOGRAD_MATRICES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {
    tile: winograd_matrices(tile) for tile in (2, 4)}


def _spatial_pad(x: te.Tensor, before: Sequence[int], after: Sequence[int], name: str,
                 pad_value: float = 0.0) -> te.Tensor:
    """Pad dims 2 and 3 (H, W) of an NCHW or NCHW{c}c tensor."""
    rest = [0] * (x.ndim - 4)
    return topi.nn.pad(x, [0, 0, *before, *rest], [0, 0, *after, *rest], pad_value=pad_value,
                       name=name)


def _conv2d_nchwc_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """data [N, C/ic, H, W, ic] x kernel [OC/oc, IPG/ic, KH, KW, ic, oc] (any groups
    whose group boundaries fall on block boundaries), or the depthwise kernel
    [C/c, 1, KH, KW, 1, c]. One reduction block over (ic_chunk, kh, kw, ic)."""
    data, kernel = args
    out = out_tensor(out_type)
    groups = attrs["groups"]
    occ, ipc, kh, kw, ic, oc = te_shape(kernel)
    pt, pl, pb, pr = pads4(attrs["padding"])
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    depthwise = is_depthwise_nchwc(te_shape(data), te_shape(kernel), groups)
    tile = winograd_tile(attrs)
    if tile:
        return _winograd_nchwc(data, kernel, (pt, pl), tile, out)
    if pt or pl or pb or pr:
        data = _spatial_pad(data, [pt, pl], [pb, pr], "conv_pad")
    rkh = te.reduce_axis((0, kh), name="rkh")
    rkw = te.reduce_axis((0, kw), name="rkw")
    d = out.dtype
    if depthwise:
        def dw_body(b, cc, y, x, cb):
            return te.sum(data[b, cc, y * sh + rkh * dh, x * sw + rkw * dw, cb].astype(d)
                          * kernel[cc, 0, rkh, rkw, 0, cb].astype(d), axis=[rkh, rkw])

        return te.compute(out.shape, dw_body, name="depthwise_conv2d_NCHWc",
                          attrs={ANCHOR_ATTR: "depthwise_conv2d_NCHWc"})
    ricc = te.reduce_axis((0, ipc), name="ricc")
    ric = te.reduce_axis((0, ic), name="ric")
    opg_chunks = occ // groups  # output chunks per group

    def body(b, o, y, x, ob):
        icc = ricc if groups == 1 else tvm.tirx.floordiv(o, opg_chunks) * ipc + ricc
        return te.sum(data[b, icc, y * sh + rkh * dh, x * sw + rkw * dw, ric].astype(d)
                      * kernel[o, ricc, rkh, rkw, ric, ob].astype(d), axis=[ricc, rkh, rkw, ric])

    return te.compute(out.shape, body, name="conv2d_NCHWc", attrs={ANCHOR_ATTR: "conv2d_NCHWc"})


def _winograd_nchwc(data: te.Tensor, kernel: te.Tensor, pad_before: tuple[int, int],
                    tile: int, out: te.Tensor) -> te.Tensor:
    """Winograd F(m x m, 3 x 3) on NCHW{c}c data with the kernel transformed at compile
    time (graph_opt.layout.pack_winograd_weight), in five blocks over P = N x tile rows
    x tile columns (an m x m output tile each):
      winograd_input_rows [P, C/ic, alpha, alpha, ic]  d B, one input tile at a time
      winograd_input      [alpha, alpha, P, C/ic, ic]  B^T d B
      winograd_gemm       [alpha, alpha, P, OC/oc, oc] alpha^2 GEMMs over C (the anchor)
      winograd_output_rows, winograd_output [P, OC/oc, m, m, oc]  A^T M A
    then the output, [N, OC/oc, OH, OW, oc], gathered from the tiles. The transforms
    are separable: two passes of alpha-point sums instead of alpha^2-point ones."""
    from tvm.topi.nn.winograd_util import const_matrix

    a_np, b_np, _ = WINOGRAD_MATRICES[tile]
    alpha = tile + 2
    n, _, h, w, _ = te_shape(data)
    _, _, occ, icc, ic, oc = te_shape(kernel)
    _, _, oh, ow, _ = te_shape(out)
    th, tw = -(-oh // tile), -(-ow // tile)
    pt, pl = pad_before
    # zeros around the input, as far as the last (partly outside) tile reaches
    data = _spatial_pad(data, [pt, pl], [th * tile + 2 - h - pt, tw * tile + 2 - w - pl],
                        "conv_pad")
    d = out.dtype
    mat_a = const_matrix(a_np.astype(d), "winograd_A")
    mat_b = const_matrix(b_np.astype(d), "winograd_B")
    ra = te.reduce_axis((0, alpha), name="ra")
    rb = te.reduce_axis((0, alpha), name="rb")

    def input_rows(p, c, a, nu, cb):
        img, y, x = p // (th * tw), p % (th * tw) // tw, p % tw
        return te.sum(data[img, c, y * tile + a, x * tile + rb, cb].astype(d) * mat_b[rb, nu],
                      axis=rb)

    rows = te.compute((n * th * tw, icc, alpha, alpha, ic), input_rows,
                      name="winograd_input_rows")
    v = te.compute((alpha, alpha, n * th * tw, icc, ic),
                   lambda e, nu, p, c, cb: te.sum(mat_b[ra, e] * rows[p, c, ra, nu, cb], axis=ra),
                   name="winograd_input")
    rcc = te.reduce_axis((0, icc), name="rcc")
    rc = te.reduce_axis((0, ic), name="rc")
    gemm = te.compute(
        (alpha, alpha, n * th * tw, occ, oc),
        lambda e, nu, p, o, ob: te.sum(v[e, nu, p, rcc, rc] * kernel[e, nu, o, rcc, rc, ob]
                                       .astype(d), axis=[rcc, rc]),
        name="winograd_gemm", attrs={ANCHOR_ATTR: "conv2d_winograd_NCHWc"})
    sa = te.reduce_axis((0, alpha), name="sa")
    sb = te.reduce_axis((0, alpha), name="sb")
    out_rows = te.compute(
        (n * th * tw, occ, alpha, tile, oc),
        lambda p, o, a, x, ob: te.sum(gemm[a, sb, p, o, ob] * mat_a[sb, x], axis=sb),
        name="winograd_output_rows")
    tiles = te.compute(
        (n * th * tw, occ, tile, tile, oc),
        lambda p, o, y, x, ob: te.sum(mat_a[sa, y] * out_rows[p, o, sa, x, ob], axis=sa),
        name="winograd_output")
    return te.compute(
        out.shape,
        lambda b, o, y, x, ob: tiles[b * th * tw + y // tile * tw + x // tile, o, y % tile,
                                     x % tile, ob],
        name="winograd_gather")


OPS.register("nn.conv2d_NCHWc", _conv2d_nchwc_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
             attrs={"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1,
                    "data_layout": REQUIRED, "out_layout": REQUIRED, "winograd_tile": 0},
             compute=_conv2d_nchwc_compute,
             doc="conv2d on channel-blocked data with a kernel packed at compile time")


# ---------------------------------------------------------------- GPU Winograd


def _winograd_geometry(attrs: Attrs) -> tuple[int, int, int, int, int, int]:
    """(m, alpha, n, th, tw, P) of a GPU Winograd op: F(m x m, 3 x 3), the images and
    the output's rows and columns of m x m tiles, P = n x th x tw."""
    m = attrs["tile"]
    n, oh, ow = attrs["out_shape"]
    th, tw = -(-oh // m), -(-ow // m)
    return m, m + 2, n, th, tw, n * th * tw


def _winograd_input_rel(types: list[Type], attrs: Attrs) -> Type:
    """data [N, C, H, W] -> V [alpha^2, C, P]: B^T d B of every (padded) input tile."""
    data, = arity(types, 1)
    if data.ndim != 4 or attrs["tile"] not in WINOGRAD_MATRICES:
        raise IRTypeError(f"winograd_input: data {data.shape} (NCHW) with tile "
                          f"{attrs['tile']} (one of {sorted(WINOGRAD_MATRICES)})")
    n, c, h, w = data.shape
    pt, pl, pb, pr = pads4(attrs["padding"])
    if tuple(attrs["out_shape"]) != (n, h + pt + pb - 2, w + pl + pr - 2):
        raise IRTypeError(f"winograd_input: out_shape {attrs['out_shape']} is not a 3x3 "
                          f"conv's of data {data.shape} with padding {attrs['padding']}")
    _, alpha, _, _, _, p = _winograd_geometry(attrs)
    return TensorType((alpha * alpha, c, p), data.dtype)


def _winograd_output_rel(types: list[Type], attrs: Attrs) -> Type:
    """M [alpha^2, OC, P] -> Y [N, OC, OH, OW]: A^T M A of every tile, gathered."""
    gemm, = arity(types, 1)
    m, alpha, n, _, _, p = _winograd_geometry(attrs)
    if gemm.ndim != 3 or gemm.shape[0] != alpha * alpha or gemm.shape[2] != p:
        raise IRTypeError(f"winograd_output: input {gemm.shape} is not [{alpha * alpha}, OC, "
                          f"{p}] for tile {m} and out_shape {attrs['out_shape']}")
    _, oh, ow = attrs["out_shape"]
    return TensorType((n, gemm.shape[1], oh, ow), gemm.dtype)


def _winograd_input_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """Two separable alpha-point passes per input tile (d B, then B^T (d B)); the
    second block is the anchor, "winograd_input"."""
    from tvm.topi.nn.winograd_util import const_matrix

    data, = args
    m, alpha, _, th, tw, p = _winograd_geometry(attrs)
    _, c, h, w = te_shape(data)
    pt, pl, _, _ = pads4(attrs["padding"])
    # zeros as far as the last (partly outside) tile reaches
    data = _spatial_pad(data, [pt, pl], [th * m + 2 - h - pt, tw * m + 2 - w - pl],
                        "winograd_pad")
    d = out_tensor(out_type).dtype
    mat_b = const_matrix(WINOGRAD_MATRICES[m][1].astype(d), "winograd_B")
    ra = te.reduce_axis((0, alpha), name="ra")
    rb = te.reduce_axis((0, alpha), name="rb")

    def rows(ch, q, a, nu):
        img, y, x = q // (th * tw), q % (th * tw) // tw, q % tw
        return te.sum(data[img, ch, y * m + a, x * m + rb].astype(d) * mat_b[rb, nu], axis=rb)

    dv = te.compute((c, p, alpha, alpha), rows, name="winograd_input_rows")
    return te.compute(
        (alpha * alpha, c, p),
        lambda i, ch, q: te.sum(mat_b[ra, i // alpha] * dv[ch, q, ra, i % alpha], axis=ra),
        name="winograd_input", attrs={ANCHOR_ATTR: "winograd_input"})


def _winograd_output_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type
                             ) -> te.Tensor:
    """A^T M A per tile in two alpha-point passes (the second block is the anchor,
    "winograd_output"), then the tiles gathered into NCHW (the epilogue follows it)."""
    from tvm.topi.nn.winograd_util import const_matrix

    gemm, = args
    m, alpha, _, th, tw, _ = _winograd_geometry(attrs)
    _, oc, _ = te_shape(gemm)
    out = out_tensor(out_type)
    mat_a = const_matrix(WINOGRAD_MATRICES[m][0].astype(out.dtype), "winograd_A")
    sa = te.reduce_axis((0, alpha), name="sa")
    sb = te.reduce_axis((0, alpha), name="sb")
    out_rows = te.compute(
        (oc, gemm.shape[2], alpha, m),
        lambda k, q, a, x: te.sum(gemm[a * alpha + sb, k, q] * mat_a[sb, x], axis=sb),
        name="winograd_output_rows")
    tiles = te.compute(
        (oc, gemm.shape[2], m, m),
        lambda k, q, y, x: te.sum(mat_a[sa, y] * out_rows[k, q, sa, x], axis=sa),
        name="winograd_output", attrs={ANCHOR_ATTR: "winograd_output"})
    return te.compute(
        out.shape,
        lambda b, k, y, x: tiles[k, b * th * tw + y // m * tw + x // m, y % m, x % m],
        name="winograd_gather")


def winograd_input_numpy(data: np.ndarray, attrs: Attrs) -> np.ndarray:
    m, alpha, n, th, tw, p = _winograd_geometry(attrs)
    pt, pl, _, _ = pads4(attrs["padding"])
    _, c, h, w = data.shape
    padded = np.zeros((n, c, th * m + 2, tw * m + 2), np.float64)
    padded[:, :, pt:pt + h, pl:pl + w] = data
    # every alpha x alpha input tile, [n, c, th, tw, alpha, alpha]
    tiles = np.lib.stride_tricks.sliding_window_view(padded, (alpha, alpha), axis=(2, 3))
    tiles = tiles[:, :, ::m, ::m][:, :, :th, :tw]
    b = WINOGRAD_MATRICES[m][1]
    v = np.einsum("ae,ncyxab,bu->eucnyx", b, tiles, b)
    return v.reshape(alpha * alpha, c, p).astype(data.dtype)


def winograd_output_numpy(gemm: np.ndarray, attrs: Attrs) -> np.ndarray:
    m, alpha, n, th, tw, _ = _winograd_geometry(attrs)
    _, oh, ow = attrs["out_shape"]
    oc = gemm.shape[1]
    a = WINOGRAD_MATRICES[m][0]
    g = gemm.astype(np.float64).reshape(alpha, alpha, oc, n, th, tw)
    y = np.einsum("ay,abknij,bx->nkiyjx", a, g, a).reshape(n, oc, th * m, tw * m)
    return np.ascontiguousarray(y[:, :, :oh, :ow]).astype(gemm.dtype)


WINOGRAD_ATTRS = {"tile": REQUIRED, "padding": (1, 1, 1, 1), "out_shape": REQUIRED}
OPS.register("nn.winograd_input", _winograd_input_rel, Pattern.COMM_REDUCE, 1,
             attrs=WINOGRAD_ATTRS, compute=_winograd_input_compute,
             evaluate=lambda args, attrs, ty: winograd_input_numpy(args[0], attrs),
             doc="Winograd F(m x m, 3 x 3)'s input transform of a 3x3 conv on the GPU: "
                 "[N, C, H, W] -> [alpha^2, C, P], for a batch_matmul over alpha^2 points")
OPS.register("nn.winograd_output", _winograd_output_rel, Pattern.OUT_ELEMWISE_FUSABLE, 1,
             attrs=WINOGRAD_ATTRS, compute=_winograd_output_compute,
             evaluate=lambda args, attrs, ty: winograd_output_numpy(args[0], attrs),
             doc="Winograd F(m x m, 3 x 3)'s output transform: [alpha^2, OC, P] -> "
                 "[N, OC, OH, OW], the conv's epilogue fused after it")


# ---------------------------------------------------------------- nn.bias_add


def _bias_add_rel(types: list[Type], attrs: Attrs) -> Type:
    x, b = arity(types, 2)
    axis = normalize_axis(attrs["axis"], x.ndim)
    if b.shape != (x.shape[axis],):
        raise IRTypeError(f"bias {b.shape} does not match axis {axis} of {x.shape}")
    return x


def _bias_add_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, b = args
    out = out_tensor(out_type)
    axis = normalize_axis(attrs["axis"], x.ndim)
    return te.compute(out.shape, lambda *i: x[i] + b[i[axis]], name="bias_add")


def _bias_add_evaluate(args, attrs, ty):
    x, b = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    shape = [1] * x.ndim
    shape[axis] = b.shape[0]
    return x + b.reshape(shape)


OPS.register("nn.bias_add", _bias_add_rel, Pattern.BROADCAST, 2, attrs={"axis": 1},
             compute=_bias_add_compute, evaluate=_bias_add_evaluate)


# ---------------------------------------------------------------- pools


def _pool_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    n, c, h, w = _spatial_nchw(x, attrs["layout"], "pool")
    kh, kw = attrs["pool_size"]
    sh, sw = attrs["strides"]
    pt, pl, pb, pr = pads4(attrs["padding"])
    dh, dw = attrs.get("dilation", (1, 1))
    oh = conv_out_size(h, kh, sh, pt, pb, dh, attrs["ceil_mode"])
    ow = conv_out_size(w, kw, sw, pl, pr, dw, attrs["ceil_mode"])
    return _with_spatial(x, oh, ow)


def _adaptive_pool_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    _spatial_nchw(x, attrs["layout"], "adaptive_avg_pool2d")
    oh, ow = attrs["output_size"]
    return _with_spatial(x, oh, ow)


def _pool_geometry(x: te.Tensor, attrs: Attrs, out: TensorType):
    """Padding, extra bottom/right padding, the window's taps, strides, dilation and the
    input's (h, w). The taps are the window clipped to what can reach the input: a
    window larger than the padded input (transformers' EfficientNet pools 7x7 with a
    1280x1280 window, ceil_mode) reads padding alone past its first pt + h rows, and
    that padding (zero for a sum, the lowest value for a max) changes nothing."""
    pt, pl, pb, pr = pads4(attrs["padding"])
    sh, sw = attrs["strides"]
    dh, dw = attrs.get("dilation", (1, 1))
    h, w = te_shape(x)[2:4]
    kh, kw = (min(k, -(-(p + n) // d)) for k, p, n, d in
              zip(attrs["pool_size"], (pt, pl), (h, w), (dh, dw), strict=True))
    oh, ow = out.shape[2], out.shape[3]
    # ceil_mode windows may run past the bottom/right padding: pad far enough that every
    # window reads inside the padded buffer.
    need_h = (oh - 1) * sh + dh * (kh - 1) + 1
    need_w = (ow - 1) * sw + dw * (kw - 1) + 1
    eb = max(pb, need_h - h - pt)
    er = max(pr, need_w - w - pl)
    return (pt, pl, pb, pr), (eb, er), (kh, kw), (sh, sw), (dh, dw), (h, w)


def _pool_window(x: te.Tensor, out: TensorType, kernel: tuple[int, int],
                 strides: tuple[int, int], dilation: tuple[int, int] | None,
                 combine, name: str) -> te.Tensor:
    """out[n, c, y, x, ...] = combine over the (kh, kw) window of x at (y, x) x strides:
    the pool template's anchor block (NCHW or NCHW{c}c: trailing dims carried)."""
    (kh, kw), (sh, sw) = kernel, strides
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    dh, dw = (rh, rw) if dilation is None else (rh * dilation[0], rw * dilation[1])
    return te.compute(
        out.shape,
        lambda *i: combine(x[(i[0], i[1], i[2] * sh + dh, i[3] * sw + dw, *i[4:])],
                           axis=[rh, rw]),
        name=name, attrs={ANCHOR_ATTR: "pool"})


def _max_pool2d_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    out = out_tensor(out_type)
    (pt, pl, _, _), (eb, er), (kh, kw), (sh, sw), (dh, dw), _ = _pool_geometry(x, attrs, out)
    lowest = tvm.tirx.min_value(x.dtype)
    if pt or pl or eb or er:
        x = _spatial_pad(x, [pt, pl], [eb, er], "pool_pad", pad_value=lowest)
    return _pool_window(x, out, (kh, kw), (sh, sw), (dh, dw), nan_max_reduce, "max_pool2d")


def _avg_pool2d_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    out = out_tensor(out_type)
    (pt, pl, pb, pr), (eb, er), taps, (sh, sw), _, (h, w) = _pool_geometry(x, attrs, out)
    kh, kw = attrs["pool_size"]  # the divisor counts the whole window, as torch's
    d = x.dtype
    if pt or pl or eb or er:
        x = _spatial_pad(x, [pt, pl], [eb, er], "pool_pad")
    s = _pool_window(x, out, taps, (sh, sw), None, te.sum, "avg_pool_sum")
    include_pad = attrs["count_include_pad"]
    tmin, tmax = tvm.tirx.min, tvm.tirx.max

    def divisor(y, xx):
        # torch's avg_pool2d: the window clipped to the padded input, then (unless
        # count_include_pad) to the input itself.
        hs, ws = y * sh - pt, xx * sw - pl
        he, we = tmin(hs + kh, h + pb), tmin(ws + kw, w + pr)
        if not include_pad:
            hs, ws, he, we = tmax(hs, 0), tmax(ws, 0), tmin(he, h), tmin(we, w)
        return ((he - hs) * (we - ws)).astype(d)

    return te.compute(out.shape, lambda *i: s[i] / divisor(i[2], i[3]), name="avg_pool2d")


def _adaptive_avg_pool2d_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    out = out_tensor(out_type)
    h, w = te_shape(x)[2:4]
    oh, ow = out.shape[2], out.shape[3]
    if h % oh or w % ow:  # windows of varying size: topi's compute, generic schedule
        return topi.nn.adaptive_pool(x, tuple(attrs["output_size"]), "avg", attrs["layout"])
    # Equal windows (global pooling among them): a plain window sum, as topi computes
    # it, tagged so that the pool template schedules it.
    kh, kw = h // oh, w // ow
    s = _pool_window(x, out, (kh, kw), (kh, kw), None, te.sum, "adaptive_pool_sum")
    n = const(float(kh * kw), x.dtype)
    return te.compute(out.shape, lambda *i: s[i] / n, name="adaptive_pool_avg")


_POOL_ATTRS = {"pool_size": REQUIRED, "strides": (1, 1), "padding": (0, 0, 0, 0),
               "ceil_mode": False, "layout": "NCHW"}
OPS.register("nn.max_pool2d", _pool_rel, Pattern.OUT_ELEMWISE_FUSABLE, 1,
             attrs={**_POOL_ATTRS, "dilation": (1, 1)}, compute=_max_pool2d_compute,
             blocked_layout=True)
OPS.register("nn.avg_pool2d", _pool_rel, Pattern.OUT_ELEMWISE_FUSABLE, 1,
             attrs={**_POOL_ATTRS, "count_include_pad": True}, compute=_avg_pool2d_compute,
             blocked_layout=True)
OPS.register("nn.adaptive_avg_pool2d", _adaptive_pool_rel, Pattern.OUT_ELEMWISE_FUSABLE, 1,
             attrs={"output_size": REQUIRED, "layout": "NCHW"},
             compute=_adaptive_avg_pool2d_compute, blocked_layout=True)


def _pair(v: Sequence[int] | int, n: int = 2) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    return tuple(v * n if len(v) == 1 else v)


@OPS.converter("aten.max_pool2d_with_indices.default")
def _convert_max_pool(ctx: ImportContext, node, args, kwargs):
    x, kernel = args[0], _pair(args[1])
    stride = _pair(args[2]) if len(args) > 2 and args[2] else kernel
    pad = _pair(args[3]) if len(args) > 3 else (0, 0)
    dilation = _pair(args[4]) if len(args) > 4 else (1, 1)
    ceil = bool(args[5]) if len(args) > 5 else False
    out = ctx.call("nn.max_pool2d", x, pool_size=kernel, strides=stride,
                   padding=(pad[0], pad[1], pad[0], pad[1]), dilation=dilation, ceil_mode=ceil)
    return (out, None)


@OPS.converter("aten.avg_pool2d.default")
def _convert_avg_pool(ctx: ImportContext, node, args, kwargs):
    x, kernel = args[0], _pair(args[1])
    stride = _pair(args[2]) if len(args) > 2 and args[2] else kernel
    pad = _pair(args[3]) if len(args) > 3 else (0, 0)
    ceil = bool(args[4]) if len(args) > 4 else False
    include = bool(args[5]) if len(args) > 5 else True
    if len(args) > 6 and args[6] is not None:
        raise ctx.error("avg_pool2d with divisor_override is not supported")
    return ctx.call("nn.avg_pool2d", x, pool_size=kernel, strides=stride,
                    padding=(pad[0], pad[1], pad[0], pad[1]), ceil_mode=ceil,
                    count_include_pad=include)


# aten.adaptive_avg_pool2d is left to torch's decomposition: a global pool becomes a
# mean over (H, W), which stays channel-blocked and merges with the flatten after it.
@OPS.converter("aten._adaptive_avg_pool2d.default")
def _convert_adaptive_avg_pool(ctx: ImportContext, node, args, kwargs):
    return ctx.call("nn.adaptive_avg_pool2d", args[0], output_size=ctx.out_shape()[-2:])


# ---------------------------------------------------------------- softmax


def _softmax_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    normalize_axis(attrs["axis"], x.ndim)
    return x


def _softmax_parts(x: te.Tensor, axis: int, anchor: str):
    shape = te_shape(x)
    k1 = te.reduce_axis((0, shape[axis]), name="k1")
    k2 = te.reduce_axis((0, shape[axis]), name="k2")
    red_shape = shape[:axis] + shape[axis + 1:]

    def at(i, k):
        return x[tuple(i[:axis]) + (k,) + tuple(i[axis:])]

    mx = te.compute(red_shape, lambda *i: te.max(at(i, k1), axis=k1), name="softmax_max",
                    attrs={ANCHOR_ATTR: anchor})

    def red(i):
        return tuple(i[:axis]) + tuple(i[axis + 1:])

    # exp(x - max) as a tensor the schedule inlines into the sum and the normalize;
    # x - max <= 0: fast_exp never overflows there
    e = exp_of(te.compute(x.shape, lambda *i: x[i] - mx[red(i)], name="softmax_shifted"))

    def e_at(i, k):
        return e[tuple(i[:axis]) + (k,) + tuple(i[axis:])]

    es = te.compute(red_shape, lambda *i: te.sum(e_at(i, k2), axis=k2), name="softmax_expsum")
    return mx, es, red, e


def _softmax_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    _, es, red, e = _softmax_parts(x, axis, "softmax")
    one = const(1, x.dtype)
    # times the row's reciprocal (hoisted out of the row loop): a vector divide costs
    # several multiplies; within an ulp of the quotient
    return te.compute(x.shape, lambda *i: e[i] * (one / es[red(i)]), name="softmax")


def _log_softmax_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    mx, es, red, _ = _softmax_parts(x, axis, "log_softmax")
    return te.compute(x.shape, lambda *i: x[i] - mx[red(i)] - tvm.tirx.log(es[red(i)]),
                      name="log_softmax")


def _safe_softmax_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """torch's _safe_softmax (attention with a mask): softmax, but 0 for a row that is
    -inf everywhere. That row, and only it, has an exp-sum of 0: the max reduction
    starts at the lowest finite float, so a row holding any number (or only -FLT_MAX)
    has an element at the max, whose exp is 1, while exp(-inf - max) is exactly 0
    (fast_exp too); a NaN makes the sum NaN, which is not 0, and the result NaN as in
    eager. No third pass over the row."""
    (x,) = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    _, es, red, e = _softmax_parts(x, axis, "softmax")
    one, zero = const(1, x.dtype), const(0, x.dtype)
    # if_then_else, not Select: its condition stays one per row when the store is
    # vectorized (a vector of bools does not compile for CUDA)
    return te.compute(x.shape, lambda *i: tvm.tirx.if_then_else(
        es[red(i)] == zero, zero, e[i] * (one / es[red(i)])), name="safe_softmax")


def _safe_softmax_evaluate(args: list[np.ndarray], attrs: Attrs, out_type: Type) -> np.ndarray:
    x = args[0].astype(np.float64)
    axis = attrs["axis"]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    masked = np.all(x == -np.inf, axis=axis, keepdims=True)
    return np.where(masked, 0.0, e / e.sum(axis=axis, keepdims=True))


OPS.register("nn.softmax", _softmax_rel, Pattern.OPAQUE, 1, attrs={"axis": -1},
             compute=_softmax_compute)
OPS.register("nn.safe_softmax", _softmax_rel, Pattern.OPAQUE, 1, attrs={"axis": -1},
             compute=_safe_softmax_compute, evaluate=_safe_softmax_evaluate)
OPS.register("nn.log_softmax", _softmax_rel, Pattern.OPAQUE, 1, attrs={"axis": -1},
             compute=_log_softmax_compute)


@OPS.converter("aten._softmax.default", "aten._log_softmax.default")
def _convert_softmax(ctx: ImportContext, node, args, kwargs):
    op = "nn.log_softmax" if "log" in str(node.target) else "nn.softmax"
    return ctx.call(op, args[0], axis=args[1])


# torch.export's sdpa (scaled_dot_product_attention with a mask) calls _safe_softmax;
# decomposed it becomes softmax, a separate any-reduction over the row and a where with
# a tensor of zeros: three kernels where one reads the row once.
@OPS.converter("aten._safe_softmax.default")
def _convert_safe_softmax(ctx: ImportContext, node, args, kwargs):
    if len(args) > 2 and args[2] is not None or kwargs.get("dtype") is not None:
        raise ctx.error("_safe_softmax with a dtype is not supported")
    return ctx.call("nn.safe_softmax", args[0], axis=args[1])


# ---------------------------------------------------------------- normalizations


def _norm_rel(n_inputs: int) -> TypeRel:
    def rel(types: list[Type], attrs: Attrs) -> Type:
        x, *params = arity(types, n_inputs)
        for p in params:
            if p.ndim != 1:
                raise IRTypeError(f"normalization parameter must be 1-D, got {p.shape}")
        return x

    return rel


def _layer_norm_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, gamma, beta = args
    d = x.dtype
    axis = x.ndim - 1
    n = te_shape(x)[axis]
    s = reduce_compute(x, (axis,), False, te.sum, "ln_sum", anchor="layer_norm")
    mean = te.compute(s.shape, lambda *i: s[i] / _c(float(n), d), name="ln_mean")
    k = te.reduce_axis((0, n), name="kv")
    var = te.compute(
        s.shape,
        lambda *i: te.sum((x[i + (k,)] - mean[i]) * (x[i + (k,)] - mean[i]), axis=k),
        name="ln_varsum")
    eps = _c(attrs["epsilon"], d)
    return te.compute(
        x.shape,
        lambda *i: (x[i] - mean[i[:-1]])
        * tvm.tirx.rsqrt(var[i[:-1]] / _c(float(n), d) + eps) * gamma[i[-1]] + beta[i[-1]],
        name="layer_norm")


def _batch_norm_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, gamma, beta, mean, var = args
    eps = _c(attrs["epsilon"], x.dtype)
    return te.compute(
        x.shape,
        lambda *i: (x[i] - mean[i[1]]) / tvm.tirx.sqrt(var[i[1]] + eps) * gamma[i[1]]
        + beta[i[1]],
        name="batch_norm")


OPS.register("nn.layer_norm", _norm_rel(3), Pattern.OPAQUE, 3, attrs={"epsilon": 1e-5},
             compute=_layer_norm_compute,
             doc="normalizes the last axis; inputs x, gamma, beta")
OPS.register("nn.batch_norm", _norm_rel(5), Pattern.OPAQUE, 5, attrs={"epsilon": 1e-5},
             compute=_batch_norm_compute,
             doc="inference batch norm over axis 1: x, gamma, beta, mean, var")


@OPS.converter("aten._native_batch_norm_legit_no_training.default")
def _convert_batch_norm(ctx: ImportContext, node, args, kwargs):
    x, w, b, mean, var, _momentum, eps = args
    c = x.shape[1]
    w = ctx.expr(w) if w is not None else ctx.const(np.ones(c), x.dtype)
    b = ctx.expr(b) if b is not None else ctx.const(np.zeros(c), x.dtype)
    out = ctx.call("nn.batch_norm", x, w, b, ctx.expr(mean), ctx.expr(var), epsilon=float(eps))
    return (out, None, None)


@OPS.converter("aten.native_layer_norm.default")
def _convert_layer_norm(ctx: ImportContext, node, args, kwargs):
    x, normalized_shape, w, b, eps = args
    if len(normalized_shape) != 1:
        raise ctx.error(f"layer_norm over {len(normalized_shape)} axes is not supported")
    c = x.shape[-1]
    w = ctx.expr(w) if w is not None else ctx.const(np.ones(c), x.dtype)
    b = ctx.expr(b) if b is not None else ctx.const(np.zeros(c), x.dtype)
    return (ctx.call("nn.layer_norm", x, w, b, epsilon=float(eps)), None, None)


@OPS.converter("aten.native_group_norm.default")
def _convert_group_norm(ctx: ImportContext, node, args, kwargs):
    """Group norm as the ops it is: the channels split into groups, each group's mean
    and biased variance over its channels and positions, then the per-channel affine
    (wav2vec2's feature encoder, PoolFormer, diffusion U-Nets). The fused kernels read
    each group twice, as layer norm's do."""
    x, w, b, n, c, _hw, groups, eps = args
    x = ctx.expr(x)
    shape = tuple(x.shape)
    grouped = ctx.call("reshape", x, newshape=(n, groups, x.tensor_type.size // (n * groups)))
    mean = ctx.call("mean", grouped, axis=(2,), keepdims=True)
    var = ctx.call("variance", grouped, axis=(2,), keepdims=True, correction=0)
    rstd = ctx.call("rsqrt", ctx.call("add", var, ctx.const(float(eps), x.dtype)))
    normed = ctx.call("multiply", ctx.call("subtract", grouped, mean), rstd)
    out = ctx.call("reshape", normed, newshape=shape)
    per_channel = (c,) + (1,) * (len(shape) - 2)
    if w is not None:
        out = ctx.call("multiply", out, ctx.call("reshape", ctx.expr(w), newshape=per_channel))
    if b is not None:
        out = ctx.call("add", out, ctx.call("reshape", ctx.expr(b), newshape=per_channel))
    return (out, ctx.call("reshape", mean, newshape=(n, groups)),
            ctx.call("reshape", rstd, newshape=(n, groups)))


# ---------------------------------------------------------------- image.resize2d


def _resize2d_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    if x.ndim != 4:
        raise IRTypeError(f"image.resize2d takes NCHW data, got rank {x.ndim}")
    if attrs["method"] not in _RESIZE_MODES:
        raise IRTypeError(f"image.resize2d: unknown method {attrs['method']!r}")
    return TensorType(x.shape[:2] + tuple(attrs["size"]), x.dtype)


# (TVM's method, coordinate mode, rounding) per (tecc method, align_corners): torch's
# nearest is floor(dst * in / out); bilinear without align_corners samples at
# (dst + 0.5) * in / out - 0.5 clamped to the edge, TVM's half_pixel
_RESIZE_MODES = {
    "nearest": ("nearest_neighbor", "asymmetric", "floor"),
    "linear": ("linear", "half_pixel", ""),
    "linear_align_corners": ("linear", "align_corners", ""),
}


def _resize2d_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    method, mode, rounding = _RESIZE_MODES[attrs["method"]]
    return topi.image.resize2d(args[0], (0.0, 0.0, 0.0, 0.0), tuple(attrs["size"]),
                               layout="NCHW", method=method,
                               coordinate_transformation_mode=mode, rounding_method=rounding)


def _resize_axis(x: np.ndarray, axis: int, out: int, method: str) -> np.ndarray:
    """x resized along `axis` to `out` samples, with torch's source coordinates."""
    size = x.shape[axis]
    dst = np.arange(out, dtype=np.float64)
    if method == "nearest":
        return np.take(x, np.minimum(np.floor(dst * size / out).astype(np.int64), size - 1),
                       axis=axis)
    if method == "linear_align_corners":
        src = dst * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    else:
        src = np.maximum((dst + 0.5) * size / out - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(np.int64), size - 1)
    high = np.minimum(low + 1, size - 1)
    shape = [1] * x.ndim
    shape[axis] = out
    weight = (src - low).reshape(shape)
    return np.take(x, low, axis=axis) * (1 - weight) + np.take(x, high, axis=axis) * weight


def _resize2d_evaluate(args: list[np.ndarray], attrs: Attrs, out_type: Type) -> np.ndarray:
    x = args[0].astype(np.float64)
    for axis, out in zip((2, 3), attrs["size"], strict=True):
        x = _resize_axis(x, axis, int(out), attrs["method"])
    return x.astype(args[0].dtype)


OPS.register("image.resize2d", _resize2d_rel, Pattern.INJECTIVE, 1,
             attrs={"size": REQUIRED, "method": "linear"}, compute=_resize2d_compute,
             evaluate=_resize2d_evaluate,
             doc="torch's interpolate of NCHW data to `size`: nearest, bilinear "
                 "(linear) or bilinear with align_corners (linear_align_corners)")


@OPS.converter("aten.upsample_bilinear2d.vec", "aten.upsample_nearest2d.vec",
               "aten.upsample_bilinear2d.default", "aten.upsample_nearest2d.default")
def _convert_upsample(ctx: ImportContext, node, args, kwargs):
    x = args[0]
    size = ctx.out_shape()[2:]
    bilinear = "bilinear" in str(node.target)
    align_corners = bool(args[2]) if bilinear and len(args) > 2 else False
    scales = args[-1] if str(node.target).endswith(".vec") else None
    if scales and any(abs(s * d - o) > 1e-6 for s, d, o in zip(scales, x.shape[2:], size,
                                                                strict=True)):
        # torch samples at 1 / scale_factor then, which the output size does not give
        raise ctx.error(f"interpolate with scale_factor {tuple(scales)} from "
                        f"{x.shape[2:]} does not give a whole output size: pass size= "
                        "instead, or recompute_scale_factor=True")
    method = ("linear_align_corners" if align_corners else "linear") if bilinear else "nearest"
    return ctx.call("image.resize2d", x, size=tuple(size), method=method)
