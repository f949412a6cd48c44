"""Data movement: gather (`take`), reshape, transpose, broadcast_to, strided_slice,
concatenate, split; and the ATen ops that are no computation (copies, views,
assertions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import tvm
from tecc.frontend.ir import Constant, Expr, TupleGetItem
from tecc.frontend.op_defs.common import (
    arity,
    broadcast_shapes,
    out_tensor,
    read_broadcast,
    te_shape,
    tensor_arg,
    typed_const,
)
from tecc.frontend.ops import OPS, REQUIRED, Pattern, normalize_axis
from tecc.frontend.types import Attrs, IRTypeError, TensorType, TupleType, Type
from tvm import te, topi
from tvm.tirx import const

if TYPE_CHECKING:
    import torch
    from tecc.frontend.importer import ImportContext


@OPS.converter("aten.clone.default", "aten.alias.default", "aten.detach.default",
               "aten.lift_fresh_copy.default", "aten.contiguous.default")
def _convert_identity(ctx: ImportContext, node, args, kwargs):
    return args[0]


@OPS.converter("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
               "aten.sym_constrain_range_for_size.default")
def _convert_assertion(ctx: ImportContext, node, args, kwargs):
    return None


# ---------------------------------------------------------------- take


def _take_rel(types: list[Type], attrs: Attrs) -> Type:
    data, indices = arity(types, 2)
    if not indices.dtype.startswith(("int", "uint")):
        raise IRTypeError(f"take: indices must be integers, got {indices.dtype}")
    axis = normalize_axis(attrs["axis"], data.ndim)
    return TensorType(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)


def _take_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    data, indices = args
    out = out_tensor(out_type)
    axis = normalize_axis(attrs["axis"], data.ndim)
    dim = te_shape(data)[axis]
    ni = indices.ndim

    def body(*i):
        idx = indices[tuple(i[axis:axis + ni])] if ni else indices()
        idx = idx.astype("int64")
        # python-style negative indices, then clamp: never read out of bounds
        idx = tvm.tirx.Select(idx < 0, idx + dim, idx)
        idx = tvm.tirx.min(tvm.tirx.max(idx, const(0, "int64")), const(dim - 1, "int64"))
        return data[tuple(i[:axis]) + (idx,) + tuple(i[axis + ni:])]

    return te.compute(out.shape, body, name="take")


def _take_evaluate(args, attrs, ty):
    data, indices = args
    axis = normalize_axis(attrs["axis"], data.ndim)
    dim = data.shape[axis]
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)  # python-style negative indices...
    idx = np.clip(idx, 0, dim - 1)  # ...then clamp, as the kernel: never out of bounds
    return np.take(data, idx, axis=axis)


OPS.register("take", _take_rel, Pattern.INJECTIVE, 2, attrs={"axis": 0},
             compute=_take_compute, evaluate=_take_evaluate)


@OPS.converter("aten.embedding.default")
def _convert_embedding(ctx: ImportContext, node, args, kwargs):
    return ctx.call("take", args[0], args[1], axis=0)


@OPS.converter("aten.index_select.default")
def _convert_index_select(ctx: ImportContext, node, args, kwargs):
    return ctx.call("take", args[0], args[2], axis=args[1])


@OPS.converter("aten.index.Tensor")
def _convert_index(ctx: ImportContext, node, args, kwargs):
    """Advanced indexing by integer index tensors on leading axes: one `take` over
    the flattened indexed axes. Constant indices are folded into flat ones now;
    computed ones (CLIP's pooled token, x[arange(n), ids.argmax(-1)]) are combined by
    the graph: each made non-negative, times its axis's stride, summed (take clamps
    the sum, so an index out of range reads a bound, never past the tensor; a model
    input indexing one axis alone is checked before each run, as for embeddings, one
    of several is not)."""
    x, indices = args
    k = len(indices)
    if any(i is None for i in indices) or k > len(x.shape):
        raise ctx.error("advanced indexing after a sliced axis (x[:, i]) is not supported")
    lead = x.shape[:k]
    merged = ctx.call("reshape", x, newshape=(int(np.prod(lead)),) + x.shape[k:])
    if all(isinstance(i, Constant) for i in indices):
        grids = np.broadcast_arrays(*[np.asarray(i.data) % d for i, d in zip(indices, lead,
                                                                               strict=True)])
        flat = np.ravel_multi_index(tuple(grids), lead).astype("int64")
        return ctx.call("take", merged, Constant(flat), axis=0)
    if any(i.dtype == "bool" for i in indices):
        raise ctx.error("indexing by a boolean mask is not supported (its result's shape "
                        "depends on the data)")
    if k == 1:  # take's own index: an input indexing directly is checked before a run
        return ctx.call("take", merged, ctx.expr(indices[0]), axis=0)
    strides = [int(np.prod(lead[j + 1:])) for j in range(k)]
    flat = None
    for index, dim, stride in zip(indices, lead, strides, strict=True):
        index = ctx.cast(ctx.expr(index), "int64")
        index = ctx.call("where", ctx.call("less", index, ctx.const(0, "int64")),
                         ctx.call("add", index, ctx.const(dim, "int64")), index)
        if stride != 1:
            index = ctx.call("multiply", index, ctx.const(stride, "int64"))
        flat = index if flat is None else ctx.call("add", flat, index)
    return ctx.call("take", merged, flat, axis=0)


# ---------------------------------------------------------------- reshape


def _reshape_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    shape = tuple(attrs["newshape"])
    if int(np.prod(shape, dtype=np.int64)) != x.size or any(d < 0 for d in shape):
        raise IRTypeError(f"cannot reshape {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


def _reshape_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return topi.reshape(args[0], out_tensor(out_type).shape)


OPS.register("reshape", _reshape_rel, Pattern.INJECTIVE, 1, attrs={"newshape": REQUIRED},
             compute=_reshape_compute,
             evaluate=lambda args, attrs, ty: args[0].reshape(tuple(attrs["newshape"])))


@OPS.converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
               "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
               "aten.squeeze.default", "aten.flatten.using_ints")
def _convert_reshape(ctx: ImportContext, node, args, kwargs):
    x, shape = args[0], ctx.out_shape()
    return x if x.shape == shape else ctx.call("reshape", x, newshape=shape)


# ---------------------------------------------------------------- transpose


def _transpose_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    axes = tuple(attrs["axes"])
    if sorted(normalize_axis(a, x.ndim) for a in axes) != list(range(x.ndim)):
        raise IRTypeError(f"transpose axes {axes} are not a permutation of rank {x.ndim}")
    return TensorType(tuple(x.shape[a] for a in axes), x.dtype)


def _transpose_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return topi.transpose(args[0], [normalize_axis(a, args[0].ndim) for a in attrs["axes"]])


def _transpose_evaluate(args, attrs, ty):
    (x,) = args
    return np.transpose(x, [normalize_axis(a, x.ndim) for a in attrs["axes"]])


OPS.register("transpose", _transpose_rel, Pattern.INJECTIVE, 1, attrs={"axes": REQUIRED},
             compute=_transpose_compute, evaluate=_transpose_evaluate)


@OPS.converter("aten.permute.default")
def _convert_permute(ctx: ImportContext, node, args, kwargs):
    axes = tuple(a % len(args[0].shape) for a in args[1])
    if axes == tuple(range(len(axes))):
        return args[0]
    return ctx.call("transpose", args[0], axes=axes)


@OPS.converter("aten.t.default", "aten.transpose.int")
def _convert_transpose(ctx: ImportContext, node, args, kwargs):
    x = args[0]
    axes = list(range(x.tensor_type.ndim))
    d0, d1 = (args[1], args[2]) if len(args) > 2 else (0, 1)
    if axes:
        axes[d0], axes[d1] = axes[d1], axes[d0]
    return ctx.call("transpose", x, axes=tuple(axes))


# ---------------------------------------------------------------- broadcast_to


def _broadcast_to_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    shape = tuple(attrs["shape"])
    if broadcast_shapes(x.shape, shape) != shape:
        raise IRTypeError(f"cannot broadcast {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


def _broadcast_to_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    shape = out_tensor(out_type).shape
    return te.compute(shape, lambda *i: read_broadcast(x, i, shape), name="broadcast_to")


OPS.register("broadcast_to", _broadcast_to_rel, Pattern.BROADCAST, 1, attrs={"shape": REQUIRED},
             compute=_broadcast_to_compute,
             evaluate=lambda args, attrs, ty: np.broadcast_to(args[0], tuple(attrs["shape"])))


@OPS.converter("aten.expand.default")
def _convert_expand(ctx: ImportContext, node, args, kwargs):
    x, shape = args[0], ctx.out_shape()
    return x if x.shape == shape else ctx.call("broadcast_to", x, shape=shape)


# ---------------------------------------------------------------- strided_slice


def _strided_slice_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    shape = list(x.shape)
    for axis, begin, end, step in zip(attrs["axes"], attrs["begin"], attrs["end"],
                                      attrs["strides"], strict=True):
        axis = normalize_axis(axis, x.ndim)
        if step <= 0:
            raise IRTypeError("strided_slice: steps must be positive")
        start, stop, _ = slice(begin, end, step).indices(x.shape[axis])
        shape[axis] = max(0, -(-(stop - start) // step))
    return TensorType(tuple(shape), x.dtype)


def _strided_slice_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    shape = te_shape(x)
    starts = [0] * x.ndim
    steps = [1] * x.ndim
    for axis, begin, end, step in zip(attrs["axes"], attrs["begin"], attrs["end"],
                                      attrs["strides"], strict=True):
        axis = normalize_axis(axis, x.ndim)
        starts[axis], _, _ = slice(begin, end, step).indices(shape[axis])
        steps[axis] = step
    return te.compute(
        out_tensor(out_type).shape,
        lambda *i: x[tuple(starts[a] + i[a] * steps[a] for a in range(x.ndim))],
        name="strided_slice")


def _strided_slice_evaluate(args, attrs, ty):
    (x,) = args
    index = [slice(None)] * x.ndim
    for axis, begin, end, step in zip(attrs["axes"], attrs["begin"], attrs["end"],
                                      attrs["strides"], strict=True):
        index[normalize_axis(axis, x.ndim)] = slice(begin, end, step)
    return x[tuple(index)]


OPS.register("strided_slice", _strided_slice_rel, Pattern.INJECTIVE, 1,
             attrs={"begin": REQUIRED, "end": REQUIRED, "strides": REQUIRED, "axes": REQUIRED},
             compute=_strided_slice_compute, evaluate=_strided_slice_evaluate)


@OPS.converter("aten.slice.Tensor")
def _convert_slice(ctx: ImportContext, node, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else 0
    start = args[2] if len(args) > 2 and args[2] is not None else 0
    end = args[3] if len(args) > 3 and args[3] is not None else x.shape[dim]
    step = args[4] if len(args) > 4 else 1
    start, end, step = slice(start, end, step).indices(x.shape[dim % len(x.shape)])
    if (start, end, step) == (0, x.shape[dim], 1):
        return x
    return ctx.call("strided_slice", x, begin=(start,), end=(end,), strides=(step,),
                    axes=(dim,))


@OPS.converter("aten.slice_scatter.default")
def _convert_slice_scatter(ctx: ImportContext, node, args, kwargs):
    """x with x[start:end:step] along `dim` replaced by src (Funnel's relative
    positions, in-place writes into a slice): src's rows taken to their places along
    dim (a take of constant indices), then a select by a constant mask. A take, not
    pads spreading src, whose modular conditions TIR's loop partitioning failed on."""
    x, src = ctx.expr(args[0]), ctx.cast(ctx.expr(args[1]), ctx.expr(args[0]).dtype)
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % len(x.shape)
    start = args[3] if len(args) > 3 else kwargs.get("start")
    end = args[4] if len(args) > 4 else kwargs.get("end")
    step = args[5] if len(args) > 5 else kwargs.get("step", 1)
    n = x.shape[dim]
    start, end, step = slice(start, end, step).indices(n)
    positions = np.arange(n)[start:end:step]
    if len(positions) == 0:
        return x
    # each of x's positions reads the src row written there (any row elsewhere: masked)
    rows = np.clip((np.arange(n) - start) // step, 0, len(positions) - 1)
    placed = ctx.call("take", src, ctx.const(rows, "int64"), axis=dim)
    mask = np.zeros(n, dtype=bool)
    mask[positions] = True
    mask = mask.reshape((n,) + (1,) * (len(x.shape) - dim - 1))
    return ctx.call("where", ctx.const(mask, "bool"), placed, x)


@OPS.converter("aten.select.int")
def _convert_select(ctx: ImportContext, node, args, kwargs):
    x, dim, index = args
    index = index % x.shape[dim]
    sliced = ctx.call("strided_slice", x, begin=(index,), end=(index + 1,), strides=(1,),
                      axes=(dim,))
    return ctx.call("reshape", sliced, newshape=ctx.out_shape())


# ---------------------------------------------------------------- concatenate


def _concat_rel(types: list[Type], attrs: Attrs) -> Type:
    tensors = [tensor_arg(t) for t in types]
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


def _concatenate_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    axis = normalize_axis(attrs["axis"], args[0].ndim)
    return topi.concatenate(list(args), axis)


OPS.register("concatenate", _concat_rel, Pattern.INJECTIVE, None, attrs={"axis": 0},
             compute=_concatenate_compute,
             evaluate=lambda args, attrs, ty: np.concatenate(
                 args, axis=normalize_axis(attrs["axis"], args[0].ndim)))


@OPS.converter("aten.cat.default", "aten.concat.default")
def _convert_cat(ctx: ImportContext, node, args, kwargs):
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    dtype = ctx.out_dtype()
    parts = [ctx.cast(ctx.expr(t), dtype) for t in args[0] if t.tensor_type.size > 0]
    return ctx.call("concatenate", *parts, axis=dim)


# ---------------------------------------------------------------- split


def _split_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    axis = normalize_axis(attrs["axis"], x.ndim)
    sizes = tuple(attrs["sizes"])
    if sum(sizes) != x.shape[axis]:
        raise IRTypeError(f"split sizes {sizes} do not add up to {x.shape[axis]}")
    return TupleType(tuple(
        TensorType(x.shape[:axis] + (s,) + x.shape[axis + 1:], x.dtype) for s in sizes))


def _shifted(x: te.Tensor, axis: int, offset: int) -> Callable:
    # a closure per field: te.compute rejects keyword-default arguments
    def body(*i):
        return x[tuple(i[:axis]) + (i[axis] + offset,) + tuple(i[axis + 1:])]

    return body


def _split_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> list[te.Tensor]:
    (x,) = args
    assert isinstance(out_type, TupleType)
    axis = normalize_axis(attrs["axis"], x.ndim)
    outs = []
    offset = 0
    for j, field_ty in enumerate(out_type.fields):
        outs.append(te.compute(out_tensor(field_ty).shape, _shifted(x, axis, offset),
                               name=f"split{j}"))
        offset += out_tensor(field_ty).shape[axis]
    return outs


def _split_evaluate(args, attrs, ty):
    (x,) = args
    axis = normalize_axis(attrs["axis"], x.ndim)
    bounds = np.cumsum(attrs["sizes"])[:-1]
    return list(np.split(x, bounds, axis=axis))


OPS.register("split", _split_rel, Pattern.INJECTIVE, 1, attrs={"sizes": REQUIRED, "axis": 0},
             compute=_split_compute, evaluate=_split_evaluate)


@OPS.converter("aten.split_with_sizes.default", "aten.split.Tensor")
def _convert_split(ctx: ImportContext, node, args, kwargs):
    x, sizes = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    if isinstance(sizes, int):
        full = x.shape[dim]
        sizes = [min(sizes, full - i) for i in range(0, full, sizes)]
    parts = ctx.call("split", x, sizes=tuple(sizes), axis=dim)
    return tuple(TupleGetItem(parts, i) for i in range(len(sizes)))


# ---------------------------------------------------------------- roll


def _roll_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    if len(attrs["shifts"]) != len(attrs["axes"]):
        raise IRTypeError(f"roll: {len(attrs['shifts'])} shifts for {len(attrs['axes'])} axes")
    for axis in attrs["axes"]:
        normalize_axis(axis, x.ndim)
    return x


def _roll_shifts(attrs: Attrs, shape: tuple[int, ...]) -> list[int]:
    """The shift of every axis, in [0, extent): shifts of a repeated axis add up."""
    total = [0] * len(shape)
    for shift, axis in zip(attrs["shifts"], attrs["axes"], strict=True):
        total[normalize_axis(axis, len(shape))] += shift
    return [s % d if d else 0 for s, d in zip(total, shape, strict=True)]


def _roll_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    shape = te_shape(x)
    shifts = _roll_shifts(attrs, shape)
    # i - s wrapped by a select, not floormod(i + d - s, d): TVM's simplifier rewrote the
    # floormods of two rolled axes, with a reshape inlined before them, into wrong
    # indices (Swin's shifted windows)
    return te.compute(
        shape,
        lambda *i: x[tuple(tvm.tirx.Select(i[a] >= s, i[a] - s, i[a] + (d - s)) if s else i[a]
                           for a, (s, d) in enumerate(zip(shifts, shape, strict=True)))],
        name="roll")


OPS.register("roll", _roll_rel, Pattern.INJECTIVE, 1,
             attrs={"shifts": REQUIRED, "axes": REQUIRED}, compute=_roll_compute,
             evaluate=lambda args, attrs, ty: np.roll(args[0], attrs["shifts"], attrs["axes"]),
             doc="torch.roll: out[..., i, ...] = x[..., (i - shift) mod extent, ...]")


@OPS.converter("aten.roll.default")
def _convert_roll(ctx: ImportContext, node, args, kwargs):
    x, shifts = args[0], args[1]
    dims = args[2] if len(args) > 2 else kwargs.get("dims", [])
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if dims:
        return ctx.call("roll", x, shifts=tuple(shifts), axes=tuple(dims))
    # no dims: torch rolls the flattened tensor
    flat = ctx.call("reshape", x, newshape=(x.tensor_type.size,))
    rolled = ctx.call("roll", flat, shifts=tuple(shifts), axes=(0,))
    return ctx.call("reshape", rolled, newshape=x.shape)


# ---------------------------------------------------------------- pad


def _pad_rel(types: list[Type], attrs: Attrs) -> Type:
    (x,) = arity(types, 1)
    before, after = tuple(attrs["before"]), tuple(attrs["after"])
    if len(before) != x.ndim or len(after) != x.ndim:
        raise IRTypeError(f"pad: {len(before)} and {len(after)} pads for rank {x.ndim}")
    shape = tuple(d + b + a for d, b, a in zip(x.shape, before, after, strict=True))
    if any(d < 0 for d in shape):
        raise IRTypeError(f"pad: pads {before}, {after} crop {x.shape} below zero")
    return TensorType(shape, x.dtype)


def _pad_compute(args: list[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = args
    shape = te_shape(x)
    before, after = attrs["before"], attrs["after"]
    value = typed_const(attrs["value"], x.dtype)

    def body(*i):
        # a negative pad crops: that side reads from an offset and needs no bound check
        src = tuple(i[a] - before[a] for a in range(x.ndim))
        inside = [src[a] >= 0 for a in range(x.ndim) if before[a] > 0]
        inside += [src[a] < shape[a] for a in range(x.ndim) if after[a] > 0]
        if not inside:
            return x[src]
        return tvm.tirx.if_then_else(tvm.tirx.all(*inside), x[src], value)

    return te.compute(out_tensor(out_type).shape, body, name="pad")


def _pad_evaluate(args, attrs, ty):
    (x,) = args
    crop = tuple(slice(max(-b, 0), d - max(-a, 0))
                 for d, b, a in zip(x.shape, attrs["before"], attrs["after"], strict=True))
    widths = [(max(b, 0), max(a, 0)) for b, a in zip(attrs["before"], attrs["after"],
                                                       strict=True)]
    return np.pad(x[crop], widths, constant_values=np.asarray(attrs["value"], x.dtype))


OPS.register("pad", _pad_rel, Pattern.INJECTIVE, 1,
             attrs={"before": REQUIRED, "after": REQUIRED, "value": 0.0},
             compute=_pad_compute, evaluate=_pad_evaluate,
             doc="constant padding per axis; a negative pad crops that side")


def pad_widths(pad: list[int], ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(before, after) per axis from torch's pad list: (last axis before, after, the
    axis before it ...), the leading axes unpadded."""
    if len(pad) % 2 or len(pad) // 2 > ndim:
        raise IRTypeError(f"pad list {pad} for rank {ndim}")
    before, after = [0] * ndim, [0] * ndim
    for k in range(len(pad) // 2):
        before[ndim - 1 - k], after[ndim - 1 - k] = pad[2 * k], pad[2 * k + 1]
    return tuple(before), tuple(after)


@OPS.converter("aten.constant_pad_nd.default")
def _convert_constant_pad_nd(ctx: ImportContext, node, args, kwargs):
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0.0)
    before, after = pad_widths(pad, len(x.shape))
    if not any(before) and not any(after):
        return x
    return ctx.call("pad", x, before=before, after=after, value=float(value))


# ---------------------------------------------------------------- as_strided


def _storage_of(ctx: ImportContext, x: Expr, meta: torch.Tensor) -> Expr | None:
    """`x` as its torch storage laid out: the flat array as_strided's strides index.
    tecc's values are contiguous; a dense permutation of one (a transpose) is
    transposed back first."""
    shape, strides = tuple(meta.shape), tuple(meta.stride())
    order = sorted(range(len(shape)), key=lambda a: -strides[a])
    permuted = [shape[a] for a in order]
    dense = [int(np.prod(permuted[k + 1:], dtype=np.int64)) for k in range(len(order))]
    if meta.storage_offset() != 0 or any(
            shape[a] > 1 and strides[a] != dense[k] for k, a in enumerate(order)):
        return None
    if order != sorted(order):
        x = ctx.call("transpose", x, axes=tuple(order))
    return ctx.call("reshape", x, newshape=(x.tensor_type.size,))


@OPS.converter("aten.as_strided.default")
def _convert_as_strided(ctx: ImportContext, node, args, kwargs):
    """as_strided as reshapes, slices, a transpose and a broadcast of the input's
    storage, where the sizes, strides and offset describe such a view: the dims of
    size > 1 sorted by stride, each stride a multiple of the next one and each dim
    within its outer stride (no overlapping windows)."""
    x, size, stride = args[0], tuple(args[1]), tuple(args[2])
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset") or 0
    what = f"as_strided with sizes {size}, strides {stride}, offset {offset} on {x.shape}"
    flat = _storage_of(ctx, x, node.args[0].meta["val"])
    if flat is None:
        raise ctx.error(f"{what}: its input is no dense view of a tensor, so the strides "
                        "have no tensor tecc can index; make it contiguous() first")
    kept = sorted((a for a in range(len(size)) if size[a] > 1 and stride[a] != 0),
                  key=lambda a: -stride[a])
    ks, kn = [stride[a] for a in kept], [size[a] for a in kept]
    for k in range(1, len(kept)):
        if ks[k - 1] % ks[k] or kn[k] * ks[k] > ks[k - 1]:
            raise ctx.error(f"{what}: the strides overlap or do not nest (dim {kept[k]}), "
                            "which is no reshape, transpose, slice or expand of the input; "
                            "write the view with those ops (or unfold) instead")
    numel = flat.tensor_type.size
    outer = ks[0] * kn[0] if kept else 1
    if offset + outer > numel:  # the last row reaches past the end, but is never read there
        flat = ctx.call("pad", flat, before=(0,), after=(offset + outer - numel,), value=0.0)
    view = ctx.call("strided_slice", flat, begin=(offset,), end=(offset + outer,),
                    strides=(1,), axes=(0,))
    # rows of the outer stride, each split by the next stride, keeping its first sizes
    shape = [kn[0], ks[0]] if kept else [1]
    view = ctx.call("reshape", view, newshape=tuple(shape))
    for k in range(1, len(kept)):
        shape[-1:] = [ks[k - 1] // ks[k], ks[k]]
        view = ctx.call("reshape", view, newshape=tuple(shape))
        view = ctx.call("strided_slice", view, begin=(0,), end=(kn[k],), strides=(1,),
                        axes=(len(shape) - 2,))
        shape[-2] = kn[k]
    if kept and ks[-1] > 1:
        view = ctx.call("strided_slice", view, begin=(0,), end=(1,), strides=(1,),
                        axes=(len(shape) - 1,))
    view = ctx.call("reshape", view, newshape=tuple(kn))
    # back to the requested order, the size-1 and stride-0 dims in their places
    in_order = sorted(range(len(kept)), key=lambda k: kept[k])
    if in_order != list(range(len(kept))):
        view = ctx.call("transpose", view, axes=tuple(in_order))
    squeezed = tuple(size[a] if a in kept else 1 for a in range(len(size)))
    view = ctx.call("reshape", view, newshape=squeezed)
    return view if squeezed == size else ctx.call("broadcast_to", view, shape=size)


@OPS.converter("aten.gather.default")
def _convert_gather(ctx: ImportContext, node, args, kwargs):
    """torch.gather as one `take` from the flattened input: the flat index of each
    element is its index along `dim` times that dim's stride plus its other
    coordinates' offset (folded now)."""
    x, dim, index = ctx.expr(args[0]), args[1], args[2]
    dim = normalize_axis(dim, len(x.shape))
    strides = [int(np.prod(x.shape[a + 1:], dtype=np.int64)) for a in range(len(x.shape))]
    grids = np.indices(index.shape, dtype=np.int64)
    base = sum(grids[a] * strides[a] for a in range(len(x.shape)) if a != dim)
    flat_index = ctx.call("add", ctx.call("multiply", ctx.cast(index, "int64"),
                                          ctx.const(strides[dim], "int64")),
                          Constant(np.asarray(base, dtype=np.int64)))
    flat = ctx.call("reshape", x, newshape=(x.tensor_type.size,))
    return ctx.call("take", flat, flat_index, axis=0)
