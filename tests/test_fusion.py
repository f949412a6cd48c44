"""FuseOps: which ops end up in one kernel, and that fusing changes no result."""

import numpy as np
from tecc.frontend.ir import Call, Constant, Function, TensorType, Var, post_order
from tecc.graph_opt.fuse_ops import fuse_ops, is_primitive_call
from tecc.graph_opt.pipeline import optimize
from tecc.runtime import Executor

from tecc.build import build, ops_of
from tecc.target import resolve_target

RNG = np.random.default_rng(0)


def const(*shape):
    return Constant(RNG.standard_normal(shape).astype("float32"))


def kernels(func):
    return [ops_of(n.op) for n in post_order(func.body) if is_primitive_call(n)]


def run(func, inputs):
    result = build(func, resolve_target("llvm"), [p.name for p in func.params], ["out"],
                   {"kind": "tensor", "index": 0}, {})
    return Executor(result.executable, result.plan, result.params).run_flat(*inputs)[0]


def residual_block():
    x = Var("x", TensorType((1, 8, 12, 12), "float32"))
    y = Call("nn.conv2d", [x, const(8, 8, 3, 3)], {"padding": (1, 1, 1, 1)})
    gamma = Constant(RNG.uniform(0.5, 1.5, 8).astype("float32"))
    var = Constant(RNG.uniform(0.5, 1.5, 8).astype("float32"))
    y = Call("nn.batch_norm", [y, gamma, const(8), const(8), var])
    y = Call("relu", [y])
    y = Call("nn.conv2d", [y, const(8, 8, 3, 3)], {"padding": (1, 1, 1, 1)})
    return Function([x], Call("relu", [Call("add", [y, x])]))


def test_conv_bn_relu_and_residual_add_become_one_kernel_each():
    func = residual_block()
    fused = fuse_ops(optimize(func))  # no target: NCHW convs
    groups = kernels(fused)
    assert groups == [["nn.conv2d", "nn.bias_add", "relu"],
                      ["nn.conv2d", "add", "relu"]], groups
    x = RNG.standard_normal((1, 8, 12, 12)).astype("float32")
    np.testing.assert_allclose(run(fused, [x]), run(fuse_ops(func, max_depth=1), [x]),
                               rtol=1e-4, atol=1e-4)


def test_injective_chain_fuses_and_reduction_takes_its_inputs():
    x = Var("x", TensorType((4, 6, 10), "float32"))
    t = Call("transpose", [Call("multiply", [x, Constant(np.float32(2.0))])], {"axes": (0, 2, 1)})
    r = Call("reshape", [t], {"newshape": (4, 60)})
    s = Call("sum", [Call("exp", [r])], {"axis": (1,), "keepdims": False})
    func = Function([x], Call("nn.softmax", [Call("reshape", [s], {"newshape": (2, 2)})]))
    fused = fuse_ops(func)
    assert kernels(fused) == [["multiply", "transpose", "reshape", "exp", "sum"],
                              ["reshape"], ["nn.softmax"]]
    xv = RNG.standard_normal((4, 6, 10)).astype("float32")
    expected = np.exp(2 * xv).sum(axis=(1, 2)).reshape(2, 2)
    expected = np.exp(expected - expected.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    # atol: float32 exp flushes results below the normal range (1e-38) to 0 (README)
    np.testing.assert_allclose(run(fused, [xv]), expected, rtol=1e-4, atol=1e-30)


def test_max_depth_bounds_a_group():
    x = Var("x", TensorType((64,), "float32"))
    y = x
    for _ in range(10):
        y = Call("sigmoid", [y])
    assert len(kernels(fuse_ops(Function([x], y), max_depth=4))) == 3
    assert len(kernels(fuse_ops(Function([x], y), max_depth=64))) == 1


def test_a_value_used_twice_ends_its_group():
    # conv output feeds two consumers: its post-dominator is the add joining them
    x = Var("x", TensorType((1, 4, 6, 6), "float32"))
    c = Call("nn.conv2d", [x, const(4, 4, 1, 1)])
    out = Call("add", [Call("relu", [c]), Call("sigmoid", [c])])
    groups = kernels(fuse_ops(Function([x], out)))
    assert groups == [["nn.conv2d", "relu", "sigmoid", "add"]]
