"""The op registry: each op is defined once here with its attribute schema, its type
relation (shape and dtype inference) and its fusion pattern kind. The TE compute of
an op is registered by name in schedules/, the torch mapping in frontend/importer.py.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tecc.frontend.ir import Attrs, IRTypeError, TensorType, TupleType, Type


class Pattern(enum.IntEnum):
    """Fusion pattern kinds, ordered as TVM orders them (lower fuses more freely)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


TypeRel = Callable[[list[Type], Attrs], Type]
_REQUIRED = object()


@dataclass(frozen=True)
class OpDef:
    name: str
    num_inputs: int | None  # None: variadic
    type_rel: TypeRel
    pattern: Pattern
    attrs: dict[str, Any]  # name -> default (_REQUIRED when it has none)
    doc: str = ""

    def check_attrs(self, given: Attrs) -> Attrs:
        unknown = set(given) - set(self.attrs)
        if unknown:
            raise IRTypeError(f"{self.name}: unknown attributes {sorted(unknown)}")
        values = {}
        for key, default in self.attrs.items():
            if key in given:
                values[key] = given[key]
            elif default is _REQUIRED:
                raise IRTypeError(f"{self.name}: missing attribute {key!r}")
            else:
                values[key] = default
        return Attrs(values)


_REGISTRY: dict[str, OpDef] = {}


def register_op(
    name: str,
    type_rel: TypeRel,
    pattern: Pattern,
    num_inputs: int | None,
    attrs: dict[str, Any] | None = None,
    doc: str = "",
) -> OpDef:
    if name in _REGISTRY:
        raise ValueError(f"op {name!r} registered twice")
    opdef = OpDef(name, num_inputs, type_rel, pattern, dict(attrs or {}), doc)
    _REGISTRY[name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op named {name!r} is registered") from None


def registered_ops() -> list[str]:
    return sorted(_REGISTRY)


# ---------------------------------------------------------------- type relation helpers


def _tensor(ty: Type, what: str = "argument") -> TensorType:
    if not isinstance(ty, TensorType):
        raise IRTypeError(f"{what} must be a tensor, got {ty}")
    return ty


def _arity(types: Sequence[Type], n: int) -> list[TensorType]:
    if len(types) != n:
        raise IRTypeError(f"expected {n} arguments, got {len(types)}")
    return [_tensor(t) for t in types]


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        dims = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise IRTypeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise IRTypeError(f"axis {axis} out of range for rank {ndim}")
    return axis % max(ndim, 1)


def _same_type(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    return x


def _cast_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    return TensorType(x.shape, attrs["dtype"])


def _bool_result(rel: TypeRel) -> TypeRel:
    def bool_rel(types: list[Type], attrs: Attrs) -> Type:
        return TensorType(_tensor(rel(types, attrs)).shape, "bool")

    return bool_rel


def _broadcast_rel(n: int) -> TypeRel:
    def rel(types: list[Type], attrs: Attrs) -> Type:
        tensors = _arity(types, n)
        value_types = tensors[1:] if n == 3 else tensors  # where(cond, x, y)
        dtypes = {t.dtype for t in value_types}
        if len(dtypes) != 1:
            raise IRTypeError(f"operand dtypes differ: {sorted(dtypes)}")
        return TensorType(broadcast_shapes(*(t.shape for t in tensors)), dtypes.pop())

    return rel


def _reduce_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    axes = reduce_axes(attrs, x.ndim)
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return TensorType(shape, x.dtype)


def reduce_axes(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    """The sorted, non-negative reduction axes (all axes when `axis` is None)."""
    if attrs["axis"] is None:
        return tuple(range(ndim))
    return tuple(sorted({normalize_axis(a, ndim) for a in attrs["axis"]}))


def conv_out_size(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int,
                  dilation: int = 1, ceil_mode: bool = False) -> int:
    span = size + pad_lo + pad_hi - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_lo:
        out -= 1  # the last window must start inside the input or left padding
    return out


def _pads(padding: Sequence[int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from a 2- or 4-element padding."""
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    return tuple(padding)  # type: ignore[return-value]


def _conv_out_hw(h: int, w: int, kh: int, kw: int, attrs: Attrs, op: str,
                 data_shape: tuple[int, ...]) -> tuple[int, int]:
    """Output height and width of a conv (its padding, strides and dilation)."""
    pt, pl, pb, pr = _pads(attrs["padding"])
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    oh = conv_out_size(h, kh, sh, pt, pb, dh)
    ow = conv_out_size(w, kw, sw, pl, pr, dw)
    if oh <= 0 or ow <= 0:
        raise IRTypeError(f"{op} output would be empty for input {data_shape}")
    return oh, ow


def _conv2d_rel(types: list[Type], attrs: Attrs) -> Type:
    data, weight = _arity(types, 2)
    if data.ndim != 4 or weight.ndim != 4:
        raise IRTypeError(f"conv2d expects NCHW data and OIHW weight, got {data} and {weight}")
    n, c, h, w = data.shape
    o, i, kh, kw = weight.shape
    groups = attrs["groups"]
    if c != i * groups or o % groups:
        raise IRTypeError(f"channels {c} do not match weight {weight.shape} with groups={groups}")
    oh, ow = _conv_out_hw(h, w, kh, kw, attrs, "conv2d", data.shape)
    return TensorType((n, o, oh, ow), data.dtype)


def _bias_add_rel(types: list[Type], attrs: Attrs) -> Type:
    x, b = _arity(types, 2)
    axis = normalize_axis(attrs["axis"], x.ndim)
    if b.shape != (x.shape[axis],):
        raise IRTypeError(f"bias {b.shape} does not match axis {axis} of {x.shape}")
    return x


def _dense_rel(types: list[Type], attrs: Attrs) -> Type:
    x, w = _arity(types, 2)
    if w.ndim != 2 or x.shape[-1] != w.shape[1]:
        raise IRTypeError(f"dense: input {x.shape} and weight {w.shape} (N, K) do not match")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


def _dense_pack_rel(types: list[Type], attrs: Attrs) -> Type:
    x, w = _arity(types, 2)
    if w.ndim != 3 or x.shape[-1] != w.shape[1]:
        raise IRTypeError(f"dense_pack: input {x.shape} and packed weight {w.shape} "
                          "(N/nb, K, nb) do not match")
    return TensorType(x.shape[:-1] + (w.shape[0] * w.shape[2],), x.dtype)


def _matmul_rel(types: list[Type], attrs: Attrs) -> Type:
    a, b = _arity(types, 2)
    if a.ndim < 2 or b.ndim < 2:
        raise IRTypeError(f"matmul needs rank >= 2, got {a.shape} and {b.shape}")
    m, k = (a.shape[-1], a.shape[-2]) if attrs["transpose_a"] else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if attrs["transpose_b"] else b.shape[-2:]
    if k != k2:
        raise IRTypeError(f"matmul: inner dimensions differ ({a.shape} @ {b.shape})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (m, n), a.dtype)


def nchwc_block(layout: str) -> int | None:
    """The channel block of a layout string: None for "NCHW", c for "NCHW{c}c"."""
    if layout == "NCHW":
        return None
    if layout.startswith("NCHW") and layout.endswith("c") and layout[4:-1].isdigit():
        block = int(layout[4:-1])
        if block > 0:
            return block
    raise IRTypeError(f"unsupported layout {layout!r}: use NCHW or NCHW<c>c")


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
    (x,) = _arity(types, 1)
    n, c, h, w = _spatial_nchw(x, attrs["src_layout"], "layout_transform")
    block = nchwc_block(attrs["dst_layout"])
    if block is None:
        return TensorType((n, c, h, w), x.dtype)
    if c % block:
        raise IRTypeError(f"layout_transform: {c} channels are not divisible by {block}")
    return TensorType((n, c // block, h, w, block), x.dtype)


def _conv2d_nchwc_rel(types: list[Type], attrs: Attrs) -> Type:
    """data [N, C/ic, H, W, ic]; kernel [OC/oc, IPG/ic, KH, KW, ic, oc] (IPG: input
    channels per group; groups=1 is topi's conv2d_NCHWc layout) or, depthwise
    (groups == C == OC, ic == oc), [C/c, 1, KH, KW, 1, c] as topi's
    depthwise_conv2d_NCHWc; or, with attribute winograd_tile, a Winograd kernel (see
    winograd_tile). Output [N, OC/oc, OH, OW, oc]."""
    data, kernel = _arity(types, 2)
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


def _pool_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    n, c, h, w = _spatial_nchw(x, attrs["layout"], "pool")
    kh, kw = attrs["pool_size"]
    sh, sw = attrs["strides"]
    pt, pl, pb, pr = _pads(attrs["padding"])
    dh, dw = attrs.get("dilation", (1, 1))
    oh = conv_out_size(h, kh, sh, pt, pb, dh, attrs["ceil_mode"])
    ow = conv_out_size(w, kw, sw, pl, pr, dw, attrs["ceil_mode"])
    return _with_spatial(x, oh, ow)


def _adaptive_pool_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    _spatial_nchw(x, attrs["layout"], "adaptive_avg_pool2d")
    oh, ow = attrs["output_size"]
    return _with_spatial(x, oh, ow)


def _norm_rel(n_inputs: int) -> TypeRel:
    def rel(types: list[Type], attrs: Attrs) -> Type:
        x, *params = _arity(types, n_inputs)
        for p in params:
            if p.ndim != 1:
                raise IRTypeError(f"normalization parameter must be 1-D, got {p.shape}")
        return x

    return rel


def _softmax_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    normalize_axis(attrs["axis"], x.ndim)
    return x


def _take_rel(types: list[Type], attrs: Attrs) -> Type:
    data, indices = _arity(types, 2)
    if not indices.dtype.startswith(("int", "uint")):
        raise IRTypeError(f"take: indices must be integers, got {indices.dtype}")
    axis = normalize_axis(attrs["axis"], data.ndim)
    return TensorType(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)


def _reshape_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    shape = tuple(attrs["newshape"])
    if int(np.prod(shape, dtype=np.int64)) != x.size or any(d < 0 for d in shape):
        raise IRTypeError(f"cannot reshape {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


def _transpose_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    axes = tuple(attrs["axes"])
    if sorted(normalize_axis(a, x.ndim) for a in axes) != list(range(x.ndim)):
        raise IRTypeError(f"transpose axes {axes} are not a permutation of rank {x.ndim}")
    return TensorType(tuple(x.shape[a] for a in axes), x.dtype)


def _broadcast_to_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    shape = tuple(attrs["shape"])
    if broadcast_shapes(x.shape, shape) != shape:
        raise IRTypeError(f"cannot broadcast {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


def _strided_slice_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    shape = list(x.shape)
    for axis, begin, end, step in zip(attrs["axes"], attrs["begin"], attrs["end"],
                                      attrs["strides"], strict=True):
        axis = normalize_axis(axis, x.ndim)
        if step <= 0:
            raise IRTypeError("strided_slice: steps must be positive")
        start, stop, _ = slice(begin, end, step).indices(x.shape[axis])
        shape[axis] = max(0, -(-(stop - start) // step))
    return TensorType(tuple(shape), x.dtype)


def _concat_rel(types: list[Type], attrs: Attrs) -> Type:
    tensors = [_tensor(t) for t in types]
    if not tensors:
        raise IRTypeError("concatenate needs at least one input")
    axis = normalize_axis(attrs["axis"], tensors[0].ndim)
    ref = tensors[0]
    for t in tensors[1:]:
        if t.ndim != ref.ndim or t.dtype != ref.dtype or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, ref.shape, strict=True)) if i != axis
        ):
            raise IRTypeError(f"concatenate: {t} does not match {ref} off axis {axis}")
    total = sum(t.shape[axis] for t in tensors)
    return TensorType(ref.shape[:axis] + (total,) + ref.shape[axis + 1:], ref.dtype)


def _split_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = _arity(types, 1)
    axis = normalize_axis(attrs["axis"], x.ndim)
    sizes = tuple(attrs["sizes"])
    if sum(sizes) != x.shape[axis]:
        raise IRTypeError(f"split sizes {sizes} do not add up to {x.shape[axis]}")
    return TupleType(tuple(
        TensorType(x.shape[:axis] + (s,) + x.shape[axis + 1:], x.dtype) for s in sizes))


# ---------------------------------------------------------------- the ops

UNARY_ELEMWISE = ["negative", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "erf",
                  "relu", "reciprocal", "silu", "hardswish", "hardsigmoid", "copy"]
BINARY_BROADCAST = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
                    "floor_divide"]
COMPARISONS = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
               "logical_and", "logical_or"]

for _name in UNARY_ELEMWISE:
    register_op(_name, _same_type, Pattern.ELEMWISE, 1)
register_op("gelu", _same_type, Pattern.ELEMWISE, 1, {"approximate": "none"})
register_op("clip", _same_type, Pattern.ELEMWISE, 1, {"a_min": _REQUIRED, "a_max": _REQUIRED})
register_op("leaky_relu", _same_type, Pattern.ELEMWISE, 1, {"alpha": 0.01})
register_op("cast", _cast_rel, Pattern.ELEMWISE, 1, {"dtype": _REQUIRED})
register_op("logical_not", _bool_result(_same_type), Pattern.ELEMWISE, 1)
for _name in BINARY_BROADCAST:
    register_op(_name, _broadcast_rel(2), Pattern.BROADCAST, 2)
for _name in COMPARISONS:
    register_op(_name, _bool_result(_broadcast_rel(2)), Pattern.BROADCAST, 2)
register_op("where", _broadcast_rel(3), Pattern.BROADCAST, 3)

for _name in ["sum", "mean", "max", "min", "prod"]:
    register_op(_name, _reduce_rel, Pattern.COMM_REDUCE, 1, {"axis": None, "keepdims": False})
register_op("variance", _reduce_rel, Pattern.COMM_REDUCE, 1,
            {"axis": None, "keepdims": False, "correction": 0})

register_op("nn.conv2d", _conv2d_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
            {"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1})
register_op("nn.conv2d_NCHWc", _conv2d_nchwc_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
            {"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1,
             "data_layout": _REQUIRED, "out_layout": _REQUIRED, "winograd_tile": 0},
            doc="conv2d on channel-blocked data with a kernel packed at compile time")
register_op("nn.bias_add", _bias_add_rel, Pattern.BROADCAST, 2, {"axis": 1})
register_op("nn.dense", _dense_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
            doc="x @ w.T with w of shape (N, K), as torch's linear")
register_op("nn.dense_pack", _dense_pack_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
            doc="dense with its weight packed at compile time: w[N/nb, K, nb]")
register_op("nn.matmul", _matmul_rel, Pattern.OUT_ELEMWISE_FUSABLE, 2,
            {"transpose_a": False, "transpose_b": False},
            doc="(batched) matrix product with numpy broadcasting of the batch dimensions")
register_op("nn.max_pool2d", _pool_rel, Pattern.OUT_ELEMWISE_FUSABLE, 1,
            {"pool_size": _REQUIRED, "strides": (1, 1), "padding": (0, 0, 0, 0),
             "dilation": (1, 1), "ceil_mode": False, "layout": "NCHW"})
register_op("nn.avg_pool2d", _pool_rel, Pattern.OUT_ELEMWISE_FUSABLE, 1,
            {"pool_size": _REQUIRED, "strides": (1, 1), "padding": (0, 0, 0, 0),
             "ceil_mode": False, "count_include_pad": True, "layout": "NCHW"})
register_op("nn.adaptive_avg_pool2d", _adaptive_pool_rel, Pattern.OUT_ELEMWISE_FUSABLE, 1,
            {"output_size": _REQUIRED, "layout": "NCHW"})
register_op("nn.softmax", _softmax_rel, Pattern.OPAQUE, 1, {"axis": -1})
register_op("nn.log_softmax", _softmax_rel, Pattern.OPAQUE, 1, {"axis": -1})
register_op("nn.layer_norm", _norm_rel(3), Pattern.OPAQUE, 3,
            {"epsilon": 1e-5}, doc="normalizes the last axis; inputs x, gamma, beta")
register_op("nn.batch_norm", _norm_rel(5), Pattern.OPAQUE, 5,
            {"epsilon": 1e-5}, doc="inference batch norm over axis 1: x, gamma, beta, mean, var")

register_op("layout_transform", _layout_transform_rel, Pattern.INJECTIVE, 1,
            {"src_layout": _REQUIRED, "dst_layout": _REQUIRED},
            doc="NCHW <-> NCHW{c}c (and between blocks): out[n, C/c, h, w, c] = x[n, C, h, w]")
register_op("take", _take_rel, Pattern.INJECTIVE, 2, {"axis": 0})
register_op("reshape", _reshape_rel, Pattern.INJECTIVE, 1, {"newshape": _REQUIRED})
register_op("transpose", _transpose_rel, Pattern.INJECTIVE, 1, {"axes": _REQUIRED})
register_op("broadcast_to", _broadcast_to_rel, Pattern.BROADCAST, 1, {"shape": _REQUIRED})
register_op("strided_slice", _strided_slice_rel, Pattern.INJECTIVE, 1,
            {"begin": _REQUIRED, "end": _REQUIRED, "strides": _REQUIRED, "axes": _REQUIRED})
register_op("concatenate", _concat_rel, Pattern.INJECTIVE, None, {"axis": 0})
register_op("split", _split_rel, Pattern.INJECTIVE, 1, {"sizes": _REQUIRED, "axis": 0})
