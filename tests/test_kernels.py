"""Kernel layer: every registered op lowered, scheduled, built and compared with torch."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import tvm
from tecc.frontend.ir import Call, Constant, Expr, Function, TensorType, Tuple, TupleGetItem, Var
from tecc.frontend.ops import registered_ops
from tecc.schedules.computes import registered_computes
from tecc.schedules.lower import lower_primitive

from tecc.target import host_llvm_cpu, resolve_target, target_info, target_to_json

# The CI host may lack AVX-512: core-avx2 runs on every deployment target.
TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2})
DEV = tvm.cpu()


def rand(shape, dtype="float32", seed=0, lo=-2.0, hi=2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(int(lo), int(hi), size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def build(func: Function, name: str = "kernel", target=TARGET):
    prim = lower_primitive(func, name, target)
    return prim, tvm.compile(tvm.IRModule({name: prim}), target=target)


def run_func(func: Function, inputs: list[np.ndarray], name: str = "kernel") -> list[np.ndarray]:
    _, ex = build(func, name)
    out_types = func.body.ty.fields if isinstance(func.body, Tuple) else (func.body.ty,)
    outs = [tvm.runtime.tensor(np.empty(t.shape, t.dtype), DEV) for t in out_types]
    ex[name](*[tvm.runtime.tensor(np.array(a, order="C"), DEV) for a in inputs], *outs)
    return [o.numpy() for o in outs]


def check(build_body: Callable[..., Expr], inputs: list[np.ndarray],
          ref: Callable[..., torch.Tensor | tuple], rtol: float = 1e-4, atol: float = 1e-5
          ) -> None:
    params = [Var(f"a{i}", TensorType(a.shape, str(a.dtype))) for i, a in enumerate(inputs)]
    func = Function(params, build_body(*params))
    got = run_func(func, inputs)
    want = ref(*[torch.from_numpy(np.array(a)) for a in inputs])
    want = list(want) if isinstance(want, tuple | list) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = w.numpy()
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype == bool or np.issubdtype(w.dtype, np.integer):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def call(op: str, **attrs) -> Callable[..., Expr]:
    return lambda *args: Call(op, list(args), attrs)


# ---------------------------------------------------------------- coverage


def test_every_op_has_a_compute():
    missing = set(registered_ops()) - set(registered_computes())
    assert not missing, f"ops without a TE compute: {sorted(missing)}"


# ---------------------------------------------------------------- elementwise

UNARY = {
    "negative": torch.neg, "abs": torch.abs, "exp": torch.exp, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "erf": torch.erf, "relu": torch.relu, "silu": F.silu,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "copy": lambda x: x.clone(),
}
POSITIVE = {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
            "reciprocal": torch.reciprocal}
SHAPES = [(3, 5, 7), (2, 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, shape):
    check(call(op), [rand(shape, lo=-5, hi=5)], UNARY[op])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", sorted(POSITIVE))
def test_unary_positive(op, shape):
    check(call(op), [rand(shape, lo=0.1, hi=4)], POSITIVE[op])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate, shape):
    check(call("gelu", approximate=approximate), [rand(shape, lo=-4, hi=4)],
          lambda x: F.gelu(x, approximate=approximate))


@pytest.mark.parametrize("shape", SHAPES)
def test_clip_leaky_relu(shape):
    x = rand(shape, lo=-3, hi=3)
    check(call("clip", a_min=-0.5, a_max=1.5), [x], lambda t: torch.clamp(t, -0.5, 1.5))
    check(call("leaky_relu", alpha=0.2), [x], lambda t: F.leaky_relu(t, 0.2))


def test_clip_int():
    check(call("clip", a_min=-3, a_max=4), [rand((5, 9), "int64", lo=-10, hi=10)],
          lambda t: torch.clamp(t, -3, 4))


@pytest.mark.parametrize("src,dst", [("float32", "int64"), ("int64", "float32"),
                                     ("bool", "float32"), ("float32", "bool"),
                                     ("int64", "bool"), ("bool", "int64")])
def test_cast(src, dst):
    x = rand((4, 7), src, lo=-5, hi=5)
    if src == "float32":
        x[0, :3] = 0.0  # exact zeros: cast to bool must give False
    check(call("cast", dtype=dst), [x], lambda t: t.to(getattr(torch, dst)))


def test_logical_not():
    check(call("logical_not"), [rand((3, 11), "bool")], torch.logical_not)


BINARY = {
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "maximum": torch.maximum,
    "minimum": torch.minimum, "floor_divide": torch.floor_divide,
    "equal": torch.eq, "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le,
    "greater": torch.gt, "greater_equal": torch.ge,
}
BROADCAST_SHAPES = [((3, 5, 7), (3, 5, 7)), ((2, 1, 6), (4, 1)), ((5, 8), ())]


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary(op, shapes):
    a = rand(shapes[0], seed=1)
    b = rand(shapes[1], seed=2)
    if op in ("equal", "not_equal", "less_equal", "greater_equal"):
        b = np.round(b)
        a = np.round(a)  # make ties happen
    if op == "floor_divide":
        b = np.where(np.abs(b) < 0.3, 0.7, b).astype(b.dtype)
    check(call(op), [a, b], BINARY[op])


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_divide_power(shapes):
    a = rand(shapes[0], seed=1, lo=0.5, hi=3)
    b = rand(shapes[1], seed=2, lo=0.5, hi=3)
    check(call("divide"), [a, b], torch.div)
    check(call("power"), [a, b], torch.pow, rtol=1e-4)


@pytest.mark.parametrize("op", ["add", "multiply", "floor_divide", "less", "maximum",
                                "subtract", "equal"])
def test_binary_int64(op):
    a = rand((4, 9), "int64", seed=3, lo=-20, hi=20)
    b = rand((9,), "int64", seed=4, lo=1, hi=7)
    b[::2] *= -1
    check(call(op), [a, b], BINARY[op])


def test_divide_int_truncates():
    a = rand((6, 5), "int64", seed=3, lo=-20, hi=20)
    b = rand((6, 5), "int64", seed=4, lo=1, hi=7)
    check(call("divide"), [a, b], lambda x, y: torch.div(x, y, rounding_mode="trunc"))


@pytest.mark.parametrize("op,ref", [("logical_and", torch.logical_and),
                                    ("logical_or", torch.logical_or)])
def test_logical(op, ref):
    check(call(op), [rand((3, 8), "bool", seed=1), rand((3, 8), "bool", seed=2)], ref)
    check(call(op), [rand((2, 1, 5), "bool", seed=3), rand((4, 1), "bool", seed=4)], ref)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_where(dtype):
    cond = rand((2, 1, 7), "bool")
    check(call("where"), [cond, rand((3, 7), dtype, 1, -9, 9), rand((2, 3, 1), dtype, 2, -9, 9)],
          torch.where)
    check(call("where"), [rand((4, 5), "bool", 5), rand((4, 5), dtype, 6, -9, 9),
                          rand((), dtype, 7, -9, 9)], torch.where)


def test_bias_add():
    check(call("nn.bias_add"), [rand((2, 5, 3, 3)), rand((5,), seed=1)],
          lambda x, b: x + b.view(1, 5, 1, 1))
    check(call("nn.bias_add", axis=-1), [rand((3, 7, 9)), rand((9,), seed=1)],
          lambda x, b: x + b)


# ---------------------------------------------------------------- reductions

REDUCE = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin,
          "prod": torch.prod}
REDUCE_CASES = [((3, 5, 7), (1,), False), ((2, 6, 9), (-1, 0), True), ((4, 33), None, False),
                ((5, 6, 7), (2,), True)]


@pytest.mark.parametrize("shape,axis,keepdims", REDUCE_CASES)
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduce(op, shape, axis, keepdims):
    lo, hi = (0.8, 1.2) if op == "prod" else (-2, 2)

    def ref(x):
        if axis is None:
            y = REDUCE[op](x) if op != "max" and op != "min" else REDUCE[op](x, dim=(0, 1))
            return y.reshape([1] * x.ndim) if keepdims else y
        dims = tuple(axis)
        if op == "prod":
            for d in sorted((a % x.ndim for a in dims), reverse=True):
                x = torch.prod(x, dim=d, keepdim=keepdims)
            return x
        return REDUCE[op](x, dim=dims, keepdim=keepdims)

    check(call(op, axis=axis, keepdims=keepdims), [rand(shape, lo=lo, hi=hi)], ref,
          rtol=1e-3, atol=1e-4)


def test_reduce_int():
    check(call("sum", axis=(1,)), [rand((3, 9), "int64", lo=-9, hi=9)],
          lambda x: torch.sum(x, dim=1))
    check(call("max", axis=(0,), keepdims=True), [rand((3, 9), "int64", lo=-9, hi=9)],
          lambda x: torch.amax(x, dim=0, keepdim=True))


@pytest.mark.parametrize("shape,axis,keepdims,correction", [
    ((3, 5, 7), (1,), False, 0), ((2, 6, 9), (-1,), True, 1), ((4, 3, 5), (0, 2), False, 1)])
def test_variance(shape, axis, keepdims, correction):
    check(call("variance", axis=axis, keepdims=keepdims, correction=correction),
          [rand(shape, lo=1, hi=3)],
          lambda x: torch.var(x, dim=axis, keepdim=keepdims, correction=correction),
          rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- nn anchors

CONV_CASES = [
    # (N, C, H, W), (O, C/g, KH, KW), strides, padding, dilation, groups
    ((2, 3, 17, 15), (8, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 16, 14, 14), (24, 16, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((2, 8, 13, 11), (8, 8, 3, 3), (2, 2), (1, 0, 2, 1), (1, 1), 1),
    ((1, 6, 12, 12), (6, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 6),  # depthwise
    ((2, 4, 10, 9), (8, 1, 5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 4),  # depthwise x2
    ((1, 8, 16, 16), (12, 2, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 4),  # grouped, dilated
    ((1, 3, 32, 32), (16, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),  # resnet stem
]


@pytest.mark.parametrize("data,weight,strides,padding,dilation,groups", CONV_CASES)
def test_conv2d(data, weight, strides, padding, dilation, groups):
    pt, pl, pb, pr = padding

    def ref(x, w):
        x = F.pad(x, (pl, pr, pt, pb))
        return F.conv2d(x, w, stride=strides, dilation=dilation, groups=groups)

    check(call("nn.conv2d", strides=strides, padding=padding, dilation=dilation,
               groups=groups), [rand(data), rand(weight, seed=1)], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,ws", [((7, 33), (19, 33)), ((2, 5, 64), (48, 64)), ((1, 16), (10, 16)),
                                   ((64, 128), (96, 128))])
def test_dense(xs, ws):
    check(call("nn.dense"), [rand(xs), rand(ws, seed=1)], lambda x, w: F.linear(x, w),
          rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a,b,ta,tb", [
    ((7, 9), (9, 5), False, False),
    ((3, 13, 17), (3, 17, 32), False, False),
    ((2, 3, 10, 8), (3, 8, 16), False, False),  # broadcast batch
    ((4, 8, 6), (4, 16, 6), False, True),
    ((4, 8, 6), (1, 8, 16), True, False),
    ((5, 7), (11, 5), True, True),
])
def test_matmul(a, b, ta, tb):
    def ref(x, y):
        return torch.matmul(x.transpose(-1, -2) if ta else x, y.transpose(-1, -2) if tb else y)

    check(call("nn.matmul", transpose_a=ta, transpose_b=tb), [rand(a), rand(b, seed=1)], ref,
          rtol=1e-4, atol=1e-4)


POOL_CASES = [
    # shape, kernel, stride, padding (t, l, b, r), ceil_mode, dilation
    ((2, 3, 13, 11), (3, 3), (2, 2), (1, 1, 1, 1), False, (1, 1)),
    ((1, 4, 14, 15), (3, 2), (2, 2), (1, 0, 1, 0), True, (1, 1)),
    ((2, 2, 9, 9), (2, 2), (2, 2), (0, 0, 0, 0), True, (1, 1)),
    ((1, 3, 16, 16), (3, 3), (1, 1), (0, 0, 0, 0), False, (2, 2)),
]


@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode,dilation", POOL_CASES)
def test_max_pool2d(shape, kernel, stride, padding, ceil_mode, dilation):
    check(call("nn.max_pool2d", pool_size=kernel, strides=stride, padding=padding,
               ceil_mode=ceil_mode, dilation=dilation), [rand(shape)],
          lambda x: F.max_pool2d(x, kernel, stride, padding[:2], dilation, ceil_mode))


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode,_", POOL_CASES[:3])
def test_avg_pool2d(shape, kernel, stride, padding, ceil_mode, _, count_include_pad):
    check(call("nn.avg_pool2d", pool_size=kernel, strides=stride, padding=padding,
               ceil_mode=ceil_mode, count_include_pad=count_include_pad), [rand(shape)],
          lambda x: F.avg_pool2d(x, kernel, stride, padding[:2], ceil_mode, count_include_pad))


@pytest.mark.parametrize("shape,out", [((2, 3, 7, 7), (1, 1)), ((1, 4, 10, 13), (3, 5)),
                                       ((2, 2, 6, 6), (6, 6))])
def test_adaptive_avg_pool2d(shape, out):
    check(call("nn.adaptive_avg_pool2d", output_size=out), [rand(shape)],
          lambda x: F.adaptive_avg_pool2d(x, out))


@pytest.mark.parametrize("shape,axis", [((3, 17), -1), ((2, 5, 7), 1), ((2, 4, 9, 33), -1)])
def test_softmax(shape, axis):
    x = rand(shape, lo=-6, hi=6)
    check(call("nn.softmax", axis=axis), [x], lambda t: torch.softmax(t, axis))
    check(call("nn.log_softmax", axis=axis), [x], lambda t: torch.log_softmax(t, axis),
          atol=1e-4)


@pytest.mark.parametrize("shape", [(3, 17), (2, 7, 64)])
def test_layer_norm(shape):
    n = shape[-1]
    check(call("nn.layer_norm", epsilon=1e-5),
          [rand(shape, lo=-3, hi=5), rand((n,), seed=1), rand((n,), seed=2)],
          lambda x, g, b: F.layer_norm(x, (n,), g, b, 1e-5), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 5, 7, 3), (3, 4)])
def test_batch_norm(shape):
    c = shape[1]
    check(call("nn.batch_norm", epsilon=1e-3),
          [rand(shape), rand((c,), seed=1), rand((c,), seed=2), rand((c,), seed=3),
           rand((c,), seed=4, lo=0.5, hi=2)],
          lambda x, g, b, m, v: F.batch_norm(x, m, v, g, b, False, 0.0, 1e-3))


# ---------------------------------------------------------------- injective


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("idx_shape", [(5,), (2, 7)])
def test_take(axis, idx_shape):
    data = rand((6, 9, 4))
    idx = rand(idx_shape, "int64", seed=1, lo=-data.shape[axis], hi=data.shape[axis])

    def ref(d, i):
        i = torch.where(i < 0, i + d.shape[axis], i)
        return torch.index_select(d, axis, i.reshape(-1)).reshape(
            d.shape[:axis] + i.shape + d.shape[axis + 1:])

    check(call("take", axis=axis), [data, idx], ref)


def test_take_int_data():  # embedding ids through take of an int table
    check(call("take", axis=0), [rand((10, 3), "int64", lo=-9, hi=9),
                                 rand((2, 5), "int32", 1, 0, 10)],
          lambda d, i: d[i.long()])


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_reshape_transpose(dtype):
    x = rand((2, 3, 4, 5), dtype, lo=-9, hi=9)
    check(call("reshape", newshape=(6, 20)), [x], lambda t: t.reshape(6, 20))
    check(call("transpose", axes=(0, 2, 3, 1)), [x], lambda t: t.permute(0, 2, 3, 1))
    check(call("transpose", axes=(-1, 0, 2, 1)), [x], lambda t: t.permute(3, 0, 2, 1))


def test_broadcast_to():
    check(call("broadcast_to", shape=(4, 3, 5)), [rand((3, 1))],
          lambda t: t.broadcast_to(4, 3, 5))
    check(call("broadcast_to", shape=(2, 7)), [rand((1,), "int64", lo=-5, hi=5)],
          lambda t: t.broadcast_to(2, 7))


@pytest.mark.parametrize("begin,end,strides,axes", [
    ((1,), (4,), (1,), (1,)),
    ((0, -5), (100, -1), (2, 2), (0, 2)),
    ((-3,), (9223372036854775807,), (1,), (-1,)),
])
def test_strided_slice(begin, end, strides, axes):
    x = rand((5, 6, 11))

    def ref(t):
        sl = [slice(None)] * t.ndim
        for a, b, e, s in zip(axes, begin, end, strides, strict=True):
            sl[a] = slice(b, e, s)
        return t[tuple(sl)]

    check(call("strided_slice", begin=begin, end=end, strides=strides, axes=axes), [x], ref)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate(axis):
    shapes = [[3, 4, 5], [3, 4, 5], [3, 4, 5]]
    for i, s in enumerate(shapes):
        s[axis] += i
    check(lambda *a: Call("concatenate", list(a), {"axis": axis}),
          [rand(s, seed=i) for i, s in enumerate(shapes)], lambda *t: torch.cat(t, axis))


@pytest.mark.parametrize("sizes,axis", [((2, 3, 1), 1), ((4, 3), -1)])
def test_split(sizes, axis):
    x = rand((3, 6, 7))
    if axis == -1:
        sizes = (4, 3)

    def body(a):
        s = Call("split", [a], {"sizes": sizes, "axis": axis})
        return Tuple([TupleGetItem(s, i) for i in range(len(sizes))])

    check(body, [x], lambda t: tuple(t.split(list(sizes), axis)))


def test_split_one_field_used():
    check(lambda a: TupleGetItem(Call("split", [a], {"sizes": (2, 4), "axis": 0}), 1),
          [rand((6, 5))], lambda t: t[2:])


# ---------------------------------------------------------------- fused bodies


def test_fused_conv_bias_relu_add():
    def body(x, w, b, r):
        y = Call("nn.conv2d", [x, w], {"padding": (1, 1, 1, 1)})
        y = Call("relu", [Call("nn.bias_add", [y, b])])
        return Call("add", [y, r])

    check(body, [rand((2, 16, 14, 14)), rand((32, 16, 3, 3), seed=1), rand((32,), seed=2),
                 rand((2, 32, 14, 14), seed=3)],
          lambda x, w, b, r: torch.relu(F.conv2d(x, w, b, padding=1)) + r, atol=1e-4)


def test_fused_dense_bias_gelu():
    def body(x, w, b):
        return Call("gelu", [Call("add", [Call("nn.dense", [x, w]), b])])

    check(body, [rand((2, 9, 64)), rand((48, 64), seed=1), rand((48,), seed=2)],
          lambda x, w, b: F.gelu(F.linear(x, w, b)), atol=1e-4)


def test_fused_matmul_scale_const():
    def body(a, b):
        scale = Constant(np.array(0.125, dtype="float32"))
        return Call("multiply", [Call("nn.matmul", [a, b], {"transpose_b": True}), scale])

    check(body, [rand((2, 3, 16, 8)), rand((2, 3, 16, 8), seed=1)],
          lambda a, b: (a @ b.transpose(-1, -2)) * 0.125, atol=1e-4)


def test_fused_reshape_transpose_chain():
    def body(x):
        y = Call("reshape", [x], {"newshape": (2, 7, 4, 8)})
        y = Call("transpose", [y], {"axes": (0, 2, 1, 3)})
        return Call("reshape", [y], {"newshape": (8, 7, 8)})

    check(body, [rand((2, 7, 32))],
          lambda x: x.reshape(2, 7, 4, 8).permute(0, 2, 1, 3).reshape(8, 7, 8))


def test_fused_softmax_of_masked_add():
    def body(s, mask):
        neg = Constant(np.array([-1e4], dtype="float32"))
        zero = Constant(np.array(0.0, dtype="float32"))
        bias = Call("where", [mask, zero, neg])
        return Call("nn.softmax", [Call("add", [s, bias])], {"axis": -1})

    check(body, [rand((2, 4, 9, 9), lo=-3, hi=3), rand((2, 1, 1, 9), "bool", 1)],
          lambda s, m: torch.softmax(s + torch.where(m, 0.0, -1e4), -1))


def test_fused_pool_relu_and_tuple_output():
    def body(x):
        p = Call("nn.max_pool2d", [x], {"pool_size": (3, 3), "strides": (2, 2),
                                         "padding": (1, 1, 1, 1)})
        return Tuple([Call("relu", [p]), Call("sigmoid", [p])])

    check(body, [rand((2, 8, 17, 17))],
          lambda x: (torch.relu(F.max_pool2d(x, 3, 2, 1)), torch.sigmoid(F.max_pool2d(x, 3, 2, 1))))


def test_fused_anchor_with_reshaping_epilogue():
    # An epilogue that is not elementwise in the anchor's result must not be tiled
    # under the anchor (its region would be over-approximated): still correct.
    def body(x, w):
        y = Call("nn.conv2d", [x, w], {"padding": (1, 1, 1, 1)})
        return Call("transpose", [Call("relu", [y])], {"axes": (0, 2, 3, 1)})

    check(body, [rand((2, 8, 9, 9)), rand((16, 8, 3, 3), seed=1)],
          lambda x, w: torch.relu(F.conv2d(x, w, padding=1)).permute(0, 2, 3, 1), atol=1e-4)

    def body2(x, w):
        return Call("reshape", [Call("nn.dense", [x, w])], {"newshape": (10, 4, 8)})

    check(body2, [rand((2, 5, 64)), rand((32, 64), seed=1)],
          lambda x, w: F.linear(x, w).reshape(10, 4, 8), atol=1e-4)


def test_identity_and_duplicate_outputs():
    check(lambda x: Tuple([x, x]), [rand((3, 4))], lambda t: (t, t))


# ---------------------------------------------------------------- schedules


def _script(func: Function) -> str:
    prim, _ = build(func)
    return prim.script()


@pytest.mark.parametrize("make", [
    lambda: Call("nn.dense", [Var("x", TensorType((128, 256), "float32")),
                              Var("w", TensorType((192, 256), "float32"))]),
    lambda: Call("nn.conv2d", [Var("x", TensorType((1, 32, 28, 28), "float32")),
                               Var("w", TensorType((32, 32, 3, 3), "float32"))],
                 {"padding": (1, 1, 1, 1)}),
    lambda: Call("nn.matmul", [Var("a", TensorType((4, 64, 96), "float32")),
                               Var("b", TensorType((4, 96, 64), "float32"))]),
])
def test_anchor_schedule_is_parallel_and_vectorized(make):
    body = make()
    params = [a for a in body.args if isinstance(a, Var)]
    script = _script(Function(params, body))
    assert "T.parallel" in script
    assert "T.vectorized" in script


def test_elementwise_schedule_is_vectorized():
    x = Var("x", TensorType((64, 512), "float32"))
    script = _script(Function([x], Call("relu", [x])))
    assert "T.parallel" in script and "T.vectorized" in script


def test_avx512_lanes_in_schedule():
    # Lowering only (no run): AVX-512 machines get 16-lane vectors.
    tgt = resolve_target("llvm:skylake-avx512")
    x = Var("x", TensorType((64, 256), "float32"))
    w = Var("w", TensorType((64, 256), "float32"))
    prim = lower_primitive(Function([x, w], Call("nn.dense", [x, w])), "k", tgt)
    assert "T.vectorized(32)" in prim.script() or "T.vectorized(16)" in prim.script()


# ---------------------------------------------------------------- targets


def test_resolve_target():
    host = resolve_target("llvm")
    assert host.kind.name == "llvm"
    assert str(host.attrs["mcpu"]) == host_llvm_cpu()
    assert target_info(host).cores >= 1
    skx = resolve_target("llvm:skylake-avx512")
    assert str(skx.attrs["mcpu"]) == "skylake-avx512" and target_info(skx).vector_lanes() == 16
    assert target_info(resolve_target("llvm:core-avx2")).vector_lanes() == 8
    cuda = resolve_target("cuda:sm_90")
    assert cuda.kind.name == "cuda" and str(cuda.attrs["arch"]) == "sm_90"
    assert target_to_json(resolve_target("cuda")) == {"kind": "cuda", "arch": "sm_90"}
    js = target_to_json(skx)
    assert js["kind"] == "llvm" and js["mcpu"] == "skylake-avx512" and js["num-cores"] >= 1
    with pytest.raises(ValueError):
        resolve_target("vulkan")


def test_host_target_runs():
    host = resolve_target("llvm")
    x = Var("x", TensorType((8, 33), "float32"))
    w = Var("w", TensorType((16, 33), "float32"))
    prim = lower_primitive(Function([x, w], Call("nn.dense", [x, w])), "k", host)
    ex = tvm.compile(tvm.IRModule({"k": prim}), target=host)
    a, b = rand((8, 33)), rand((16, 33), seed=1)
    out = tvm.runtime.tensor(np.empty((8, 16), "float32"), DEV)
    ex["k"](tvm.runtime.tensor(a, DEV), tvm.runtime.tensor(b, DEV), out)
    np.testing.assert_allclose(out.numpy(), a @ b.T, rtol=1e-4, atol=1e-4)
    assert math.isfinite(float(out.numpy().sum()))


@pytest.mark.parametrize("op, ref", [("sigmoid", torch.sigmoid), ("silu", F.silu),
                                     ("erf", torch.erf), ("gelu", F.gelu)])
def test_transcendental_epilogues_vectorize_and_stay_accurate(op, ref):
    """sigmoid/silu/erf/gelu go through polynomial exp/erf: no scalar libm call per
    element in the machine code, and accurate far into the tails."""
    x = np.concatenate([rand((1, 2000), seed=3, lo=-12, hi=12),
                        np.array([[-100.0, -88.0, -30.0, 0.0, 30.0, 88.0, 100.0, 1e-6]],
                                 dtype="float32")], axis=1)
    attrs = {"approximate": "none"} if op == "gelu" else {}
    check(lambda a: Call(op, [a], attrs), [x], ref, rtol=1e-5, atol=1e-6)
    param = Var("a0", TensorType(x.shape, "float32"))
    _, ex = build(Function([param], Call(op, [param], attrs)))
    asm = ex.mod.inspect_source("asm")
    calls = [line for line in asm.splitlines() if "call" in line and ("exp" in line or "erf" in line)]
    assert not calls, f"scalar libm calls left in the kernel: {calls[:3]}"
    assert "vmulps" in asm and "ymm" in asm
