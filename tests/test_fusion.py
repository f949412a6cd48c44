"""FuseOps: which ops end up in one kernel, and that fusing changes no result."""

import numpy as np
from tecc.frontend.ir import Call, Constant, Function, TensorType, Tuple, Var, post_order
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


def attention_heads(heads: int = 2, seq: int = 8, dim: int = 4):
    """Scores of a fused query/key projection's output split into heads, and the
    heads merged into the output projection (BERT's layout ops, as imported)."""
    qk = Var("qk", TensorType((seq, 2 * heads * dim), "float32"))

    def head_split(begin: int, axes: tuple[int, ...], shape: tuple[int, ...]):
        part = Call("strided_slice", [qk], {"axes": (1,), "begin": (begin,),
                                            "end": (begin + heads * dim,), "strides": (1,)})
        part = Call("reshape", [part], {"newshape": (seq, heads, dim)})
        return Call("reshape", [Call("transpose", [part], {"axes": axes})],
                    {"newshape": shape})

    q = head_split(0, (1, 0, 2), (heads, seq, dim))
    k_t = head_split(heads * dim, (1, 2, 0), (heads, dim, seq))
    scores = Call("nn.matmul", [q, k_t])
    merged = Call("reshape", [Call("transpose", [scores], {"axes": (1, 0, 2)})],
                  {"newshape": (seq, heads * seq)})
    return Function([qk], Call("nn.dense", [merged, const(5, heads * seq)]))


def test_on_a_gpu_target_matmuls_take_their_head_splits_and_softmaxes_their_masks():
    from tecc.graph_opt.pass_manager import PassContext

    with PassContext(target="cuda:sm_90"):
        on_gpu = kernels(fuse_ops(attention_heads()))
    assert on_gpu == [["strided_slice", "reshape", "transpose", "reshape",
                       "strided_slice", "reshape", "transpose", "reshape", "nn.matmul"],
                      ["transpose", "reshape", "nn.dense"]], on_gpu
    # the CPU templates pack or pad their operands: layout kernels stay their own
    for context in (PassContext(target="llvm"), PassContext()):
        with context:
            on_cpu = kernels(fuse_ops(attention_heads()))
        assert ["nn.matmul"] in on_cpu and ["nn.dense"] in on_cpu, on_cpu
        assert len(on_cpu) == 5, on_cpu
    # a softmax on a GPU reads the mask add (a broadcast) with the scores
    scores = Var("scores", TensorType((2, 4, 8, 8), "float32"))
    masked = Call("nn.safe_softmax", [Call("add", [scores, const(2, 1, 8, 8)])])
    with PassContext(target="cuda:sm_90"):
        assert kernels(fuse_ops(Function([scores], masked))) == [["add", "nn.safe_softmax"]]
    with PassContext(target="llvm"):
        assert len(kernels(fuse_ops(Function([scores], masked)))) == 2
    # a producer that also feeds another consumer is not fused into the matmul
    func = attention_heads()
    scores = func.body.args[0].args[0].args[0]
    doubled = Function(func.params, Tuple([func.body, Call("exp", [scores.args[0]])]))
    with PassContext(target="cuda:sm_90"):
        groups = kernels(fuse_ops(doubled))
    assert ["strided_slice", "reshape", "transpose", "reshape"] in groups, groups
