"""Graph passes (graph_opt/): the structure each rewrite leaves, and the same numbers
before and after, both graphs built and run by tecc's own kernels."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from tecc.frontend.importer import from_torch
from tecc.frontend.ir import (
    Call,
    Constant,
    Expr,
    Function,
    TensorType,
    Tuple,
    TupleGetItem,
    Var,
    post_order,
    structural_equal,
)
from tecc.frontend.ops import Pattern, get_op
from tecc.graph_opt.evaluate import EVALUATORS, evaluate_call, evaluate_function
from tecc.graph_opt.fuse_ops import primitive_per_op
from tecc.graph_opt.pass_manager import (
    PassContext,
    PassTrace,
    TuningCallbacks,
    check_types,
    get_pass,
    run_passes,
)
from tecc.graph_opt.passes import (
    combine_parallel_dense,
    eliminate_common_subexpr,
    eliminate_dead_code,
    fold_batch_norm,
    fold_constants,
    fold_dense_rows,
    fuse_ops,
    simplify,
)
from tecc.graph_opt.patterns import is_reshape_only
from tecc.graph_opt.pipeline import compile_pipeline, optimization_pipeline, optimize
from tecc.runtime import Executor

from tecc.build import build
from tecc.target import resolve_target
from tests import models
from tests.util import flatten, max_rel_error

F32 = "float32"


# ---------------------------------------------------------------- helpers


def var(name: str, shape: tuple[int, ...], dtype: str = F32) -> Var:
    return Var(name, TensorType(shape, dtype))


def const(value, dtype: str = F32) -> Constant:
    return Constant(np.asarray(value, dtype=dtype))


def call(op: str, *args: Expr, **attrs) -> Call:
    return Call(op, args, attrs)


def rand(shape: tuple[int, ...], seed: int, dtype: str = F32) -> np.ndarray:
    """Random values away from zero (a zero hides a wrong scale or a dropped term)."""
    rng = np.random.default_rng(seed)
    mag = rng.uniform(0.5, 1.5, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(dtype)


def op_counts(func: Function) -> collections.Counter:
    return collections.Counter(n.op for n in post_order(func.body)
                               if isinstance(n, Call) and isinstance(n.op, str))


def n_calls(func: Function) -> int:
    return sum(op_counts(func).values())


def run_ir(func: Function, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Build `func` one kernel per op with tecc's real pipeline and run it."""
    n = len(func.body.fields) if isinstance(func.body, Tuple) else 1
    if isinstance(func.body, Tuple):
        structure = {"kind": "tuple", "items": [{"kind": "tensor", "index": i} for i in range(n)]}
    else:
        structure = {"kind": "tensor", "index": 0}
    res = build(primitive_per_op(func), resolve_target("llvm"), [p.name for p in func.params],
                [f"out{i}" for i in range(n)], structure, {})
    return Executor(res.executable, res.plan, res.params).run_flat(*inputs)


def random_inputs(func: Function, seed: int = 0) -> list[np.ndarray]:
    return [rand(p.shape, seed + i, p.dtype) for i, p in enumerate(func.params)]


def assert_same_outputs(before: Function, after: Function, rtol: float = 1e-5,
                        atol: float = 1e-5, seed: int = 0) -> None:
    check_types(after)
    assert after.ty == before.ty
    inputs = random_inputs(before, seed)
    want, got = run_ir(before, inputs), run_ir(after, inputs)
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- simplify


def test_simplify_drops_noops():
    x = var("x", (2, 3, 4))
    y = call("copy", x)
    y = call("cast", y, dtype=F32)
    y = call("reshape", y, newshape=(2, 3, 4))
    y = call("transpose", y, axes=(0, 1, 2))
    y = call("broadcast_to", y, shape=(2, 3, 4))
    y = call("strided_slice", y, begin=(0,), end=(3,), strides=(1,), axes=(1,))
    y = call("reshape", y, newshape=(1, 2, 3, 4))
    for method in ("nearest", "linear", "linear_align_corners"):
        y = call("image.resize2d", y, size=(3, 4), method=method)
    y = call("reshape", y, newshape=(2, 3, 4))
    y = call("multiply", y, const(1.0))
    y = call("add", const([0.0]), y)
    y = call("subtract", y, const(0.0))
    y = call("divide", y, const(1.0))
    y = call("relu", y)
    f = Function([x], y)
    out = simplify(f)
    assert op_counts(out) == {"relu": 1}
    assert out.body.args[0] is x
    assert_same_outputs(f, out)


def test_simplify_keeps_what_changes_values():
    x = var("x", (4,))
    kept = [
        call("cast", x, dtype="float64"),
        call("reshape", x, newshape=(2, 2)),
        call("transpose", call("reshape", x, newshape=(2, 2)), axes=(1, 0)),
        call("strided_slice", x, begin=(1,), end=(4,), strides=(1,), axes=(0,)),
        call("strided_slice", x, begin=(0,), end=(4,), strides=(2,), axes=(0,)),
        call("multiply", x, const([[1.0]])),  # broadcasts (4,) to (1, 4)
        call("multiply", x, const(2.0)),
        call("add", x, const(1.0)),
        call("broadcast_to", x, shape=(3, 4)),
        call("image.resize2d", call("reshape", x, newshape=(1, 1, 2, 2)), size=(2, 3)),
    ]
    for expr in kept:
        f = Function([x], expr)
        assert op_counts(simplify(f)) == op_counts(f), expr.op


def test_simplify_merges_reshape_chains():
    x = var("x", (2, 3, 4))
    y = call("reshape", call("reshape", call("reshape", x, newshape=(6, 4)), newshape=(24,)),
             newshape=(4, 6))
    f = Function([x], call("relu", y))
    out = simplify(f)
    assert op_counts(out) == {"reshape": 1, "relu": 1}
    assert out.body.args[0].args[0] is x
    assert_same_outputs(f, out)
    # reshape there and back: nothing left
    back = Function([x], call("reshape", call("reshape", x, newshape=(6, 4)), newshape=(2, 3, 4)))
    assert simplify(back).body is x


def test_simplify_merges_transpose_pairs():
    x = var("x", (2, 3, 4, 5))
    t = call("transpose", x, axes=(2, 0, 1, 3))
    t = call("transpose", t, axes=(1, 2, 0, 3))
    t = call("transpose", t, axes=(0, 2, 1, 3))
    f = Function([x], call("negative", t))
    out = simplify(f)
    assert op_counts(out) == {"transpose": 1, "negative": 1}
    assert out.body.args[0].args[0] is x
    assert_same_outputs(f, out)
    inverse = Function([x], call("transpose", call("transpose", x, axes=(0, 2, 3, 1)),
                                 axes=(0, 3, 1, 2)))
    assert simplify(inverse).body is x
    negative_axes = Function([x], call("transpose", call("transpose", x, axes=(-1, 0, 1, 2)),
                                       axes=(1, 2, 3, 0)))
    assert simplify(negative_axes).body is x


def test_simplify_tuple_get_item_of_tuple():
    x, y = var("x", (3,)), var("y", (4,))
    t = Tuple([call("relu", x), call("exp", y)])
    f = Function([x, y], call("negative", TupleGetItem(t, 1)))
    out = simplify(f)
    assert op_counts(out) == {"exp": 1, "negative": 1}
    assert not any(isinstance(n, Tuple | TupleGetItem) for n in post_order(out.body))


@pytest.mark.parametrize("bias_shape,bias_left", [((6,), False), ((1, 6), False), ((6,), True)])
def test_simplify_linear_becomes_bias_add_dense(bias_shape, bias_left):
    x = var("x", (3, 5))
    w = rand((5, 6), 1)
    b = const(rand(bias_shape, 2))
    mm = call("nn.matmul", x, const(w))
    f = Function([x], call("add", b, mm) if bias_left else call("add", mm, b))
    out = simplify(f)
    assert op_counts(out) == {"nn.bias_add": 1, "nn.dense": 1}
    bias_add = out.body
    assert bias_add.op == "nn.bias_add" and bias_add.args[1].shape == (6,)
    dense = bias_add.args[0]
    assert dense.op == "nn.dense" and dense.args[0] is x
    np.testing.assert_array_equal(dense.args[1].data, w.T)
    assert_same_outputs(f, out)


def test_simplify_matmul_const_alone_and_batched():
    x = var("x", (2, 3, 5))
    w = const(rand((5, 4), 3))
    wt = const(rand((4, 5), 4))
    f = Function([x], Tuple([call("nn.matmul", x, w),
                             call("nn.matmul", x, wt, transpose_b=True)]))
    out = simplify(f)
    assert op_counts(out) == {"nn.dense": 2}
    assert out.body.fields[1].args[1] is wt  # already (N, K): used as is
    assert_same_outputs(f, out)


def test_simplify_a_weight_expanded_over_the_batch_is_one_dense():
    # torch exports linear on a non-contiguous 3-d input as bmm with the weight
    # expanded over the batch: one (K, N) weight, not B copies
    x = var("x", (3, 5, 4))
    w = rand((4, 6), 64)
    f = Function([x], call("nn.matmul", x, const(np.broadcast_to(w, (3, 4, 6)).copy())))
    out = simplify(f)
    assert op_counts(out) == {"nn.dense": 1} and out.body.args[1].shape == (6, 4)
    assert_same_outputs(f, out)
    # slices that differ, or a batch the input does not have: a real batched product
    different = np.stack([w, w, w + 1])
    g = Function([x], call("nn.matmul", x, const(different)))
    assert op_counts(simplify(g)) == {"nn.matmul": 1}
    y = var("y", (5, 4))
    h = Function([y], call("nn.matmul", y, const(np.broadcast_to(w, (3, 4, 6)).copy())))
    assert op_counts(simplify(h)) == {"nn.matmul": 1}


def test_simplify_shares_the_transposed_weight():
    x = var("x", (3, 5))
    w = const(rand((5, 4), 5))
    mm = call("nn.matmul", x, w)
    f = Function([x], Tuple([call("add", mm, const(rand((4,), 6))), call("relu", mm)]))
    out = simplify(f)
    assert op_counts(out) == {"nn.dense": 1, "nn.bias_add": 1, "relu": 1}
    assert_same_outputs(f, out)


def test_simplify_leaves_other_matmuls():
    a, b = var("a", (2, 3, 4)), var("b", (2, 4, 5))
    batched_const = const(rand((2, 4, 5), 7))
    for f in [Function([a, b], call("nn.matmul", a, b)),
              Function([a], call("nn.matmul", a, batched_const)),
              Function([a], call("add", call("nn.matmul", a, batched_const), const(rand((5,), 8))))]:
        assert "nn.dense" not in op_counts(simplify(f))
    # a bias that broadcasts the result is not a per-feature bias
    x = var("x", (1, 5))
    f = Function([x], call("add", call("nn.matmul", x, const(rand((5, 4), 9))),
                           const(rand((3, 1), 10))))
    assert "nn.bias_add" not in op_counts(simplify(f))


# ---------------------------------------------------------------- fold_constants


def test_fold_constants_folds_all_constant_chains():
    x = var("x", (4, 3))
    w = const(rand((3, 4), 11))
    wt = call("transpose", w, axes=(1, 0))  # (4, 3)
    scaled = call("multiply", call("sqrt", call("abs", wt)), const(2.0))
    f = Function([x], call("add", x, scaled))
    out = fold_constants(f)
    assert op_counts(out) == {"add": 1}
    folded = out.body.args[1]
    assert isinstance(folded, Constant) and folded.dtype == F32 and folded.shape == (4, 3)
    np.testing.assert_allclose(folded.data, np.sqrt(np.abs(w.data.T)) * 2, rtol=1e-6)
    assert_same_outputs(f, out)


def test_fold_constants_split_and_tuple_items():
    x = var("x", (2, 3))
    parts = call("split", const(rand((2, 7), 12)), sizes=(3, 4), axis=1)
    f = Function([x], call("add", x, TupleGetItem(parts, 0)))
    out = fold_constants(f)
    assert op_counts(out) == {"add": 1} and isinstance(out.body.args[1], Constant)
    assert_same_outputs(f, out)


def test_fold_constants_does_not_blow_up_broadcasts():
    x = var("x", (1000, 1000))
    big = call("broadcast_to", const([1.5]), shape=(1000, 1000))
    f = Function([x], call("add", x, big))
    assert op_counts(fold_constants(f)) == {"add": 1, "broadcast_to": 1}
    y = var("y", (8, 8))  # a small broadcast folds
    f2 = Function([y], call("add", y, call("broadcast_to", const([1.5]), shape=(8, 8))))
    assert op_counts(fold_constants(f2)) == {"add": 1}


def test_fold_constants_leaves_unfoldable_ops():
    x = var("x", (1, 2, 4, 4))
    c = const(rand((1, 2, 4, 4), 13))
    int_div0 = call("divide", const([4, 5], "int32"), const([2, 0], "int32"))
    f = Function([x], Tuple([call("add", x, call("nn.softmax", c)), int_div0]))
    out = fold_constants(f)
    assert op_counts(out) == {"add": 1, "nn.softmax": 1, "divide": 1}


def _evaluator_cases() -> list[tuple[str, list[np.ndarray], dict]]:
    a, b = rand((2, 3, 4), 20), rand((3, 1), 21)
    pos = np.abs(a) + 0.1
    ints, ints2 = np.array([7, -7, 9, -9], "int64"), np.array([2, 2, -4, -4], "int64")
    mask = a > 0
    cases: list[tuple[str, list[np.ndarray], dict]] = []
    for op in ["negative", "abs", "exp", "sigmoid", "tanh", "erf", "relu", "reciprocal",
               "silu", "hardswish", "hardsigmoid", "copy"]:
        cases.append((op, [a], {}))
    for op in ["log", "sqrt", "rsqrt"]:
        cases.append((op, [pos], {}))
    cases += [("gelu", [a], {}), ("gelu", [a], {"approximate": "tanh"}),
              ("clip", [a], {"a_min": -0.7, "a_max": 0.8}),
              ("leaky_relu", [a], {"alpha": 0.2}),
              ("cast", [a * 3], {"dtype": "int32"}), ("cast", [a], {"dtype": "bool"}),
              ("cast", [ints], {"dtype": F32}), ("logical_not", [mask], {})]
    for op in ["add", "subtract", "multiply", "divide", "maximum", "minimum", "floor_divide",
               "equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]:
        cases.append((op, [a, b], {}))
    cases += [("power", [pos, b], {}), ("divide", [ints, ints2], {}),
              ("floor_divide", [ints, ints2], {}), ("power", [ints2, np.array([2], "int64")], {}),
              ("logical_and", [mask, b > 0], {}), ("logical_or", [mask, b > 0], {}),
              ("where", [mask, a, b], {})]
    for op in ["sum", "mean", "max", "min", "prod"]:
        cases += [(op, [a], {"axis": (1, -1), "keepdims": True}), (op, [a], {})]
    cases += [("sum", [ints], {"axis": (0,)}),
              ("variance", [a], {"axis": (2,), "correction": 1}),
              ("nn.bias_add", [a, rand((3,), 22)], {"axis": 1}),
              ("nn.dense", [a, rand((5, 4), 23)], {}),
              ("nn.matmul", [a, rand((2, 5, 4), 24)], {"transpose_b": True}),
              ("take", [a, np.array([[0, 2], [-1, 1]], "int64")], {"axis": 1}),
              ("reshape", [a], {"newshape": (6, 4)}),
              ("transpose", [a], {"axes": (2, 0, -2)}),
              ("broadcast_to", [b], {"shape": (2, 3, 4)}),
              ("strided_slice", [a], {"begin": (1, -3), "end": (3, 4), "strides": (1, 2),
                                      "axes": (1, 2)}),
              ("concatenate", [a, a * 2], {"axis": -1})]
    # the GPU Winograd transforms, partial tiles (7 rows, 6 columns) and uneven padding
    image = rand((2, 3, 7, 6), 25)
    for tile in (2, 4):
        attrs = {"tile": tile, "padding": (1, 0, 2, 1), "out_shape": (2, 8, 5)}
        points = ((8 + tile - 1) // tile) * ((5 + tile - 1) // tile) * 2
        cases += [("nn.winograd_input", [image], attrs),
                  ("nn.winograd_output", [rand(((tile + 2) ** 2, 4, points), 26)], attrs)]
    return cases


@pytest.mark.parametrize("case", _evaluator_cases(), ids=lambda c: c[0])
def test_evaluator_matches_kernel(case):
    """The numpy evaluator computes what the op's kernel computes."""
    op, arrays, attrs = case
    params = [var(f"p{i}", a.shape, str(a.dtype)) for i, a in enumerate(arrays)]
    node = Call(op, params, attrs)
    got = evaluate_call(op, arrays, node.attrs, node.ty)
    assert got.dtype == np.dtype(node.dtype) and got.shape == node.shape
    (want,) = run_ir(Function(params, node), arrays)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def test_every_pure_op_with_a_simple_definition_has_an_evaluator():
    # What is left unfolded on purpose: anchors with windows and normalizations.
    unfolded = {"nn.conv2d", "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d",
                "nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.batch_norm",
                "nn.conv2d_NCHWc"}
    from tecc.frontend.ops import registered_ops
    missing = set(registered_ops()) - set(EVALUATORS) - unfolded
    assert not missing, missing


# ---------------------------------------------------------------- fold_batch_norm


def _bn_params(c: int, seed: int) -> list[Constant]:
    rng = np.random.default_rng(seed)
    return [const(1 + 0.3 * rng.standard_normal(c)), const(0.2 * rng.standard_normal(c)),
            const(0.2 * rng.standard_normal(c)), const(1 + 0.5 * rng.random(c))]


def _conv(x: Expr, cout: int, seed: int, groups: int = 1) -> Call:
    cin = x.shape[1] // groups
    return call("nn.conv2d", x, const(rand((cout, cin, 3, 3), seed) * 0.3), padding=(1, 1, 1, 1),
                groups=groups)


@pytest.mark.parametrize("with_bias,groups", [(False, 1), (True, 1), (False, 2)])
def test_fold_batch_norm_into_conv(with_bias, groups):
    x = var("x", (1, 4, 6, 6))
    y = _conv(x, 6, 30, groups)
    if with_bias:
        y = call("nn.bias_add", y, const(rand((6,), 31)), axis=1)
    f = Function([x], call("relu", call("nn.batch_norm", y, *_bn_params(6, 32), epsilon=1e-3)))
    out = fold_batch_norm(f)
    assert op_counts(out) == {"nn.conv2d": 1, "nn.bias_add": 1, "relu": 1}
    assert all(isinstance(a, Constant) and a.dtype == F32
               for n in post_order(out.body) if isinstance(n, Call) for a in n.args[1:])
    assert_same_outputs(f, out, rtol=1e-4, atol=1e-4)


def test_batch_norm_after_a_shared_conv_becomes_scale_and_shift():
    x = var("x", (1, 4, 5, 5))
    conv = _conv(x, 4, 33)
    bn = call("nn.batch_norm", conv, *_bn_params(4, 34))
    f = Function([x], Tuple([bn, call("sigmoid", conv)]))  # the conv has a second user
    out = fold_batch_norm(f)
    assert op_counts(out) == {"nn.conv2d": 1, "multiply": 1, "add": 1, "sigmoid": 1}
    assert_same_outputs(f, out, rtol=1e-4, atol=1e-4)
    # the conv being a function output counts as a use too
    g = Function([x], Tuple([call("nn.batch_norm", conv, *_bn_params(4, 35)), conv]))
    assert "multiply" in op_counts(fold_batch_norm(g))


@pytest.mark.parametrize("shape", [(2, 3, 4, 4), (5, 3)])
def test_batch_norm_alone_becomes_scale_and_shift(shape):
    x = var("x", shape)
    f = Function([x], call("nn.batch_norm", call("exp", x), *_bn_params(3, 36)))
    out = fold_batch_norm(f)
    assert op_counts(out) == {"exp": 1, "multiply": 1, "add": 1}
    assert_same_outputs(f, out, rtol=1e-4, atol=1e-4)


def test_batch_norm_with_computed_params_is_kept():
    x, g = var("x", (1, 3, 2, 2)), var("g", (3,))
    params = _bn_params(3, 37)
    f = Function([x, g], call("nn.batch_norm", _conv(x, 3, 38), g, *params[1:]))
    assert op_counts(fold_batch_norm(f))["nn.batch_norm"] == 1


# ---------------------------------------------------------------- CSE and DCE


def test_cse_merges_identical_subexpressions():
    x = var("x", (2, 8))
    c = rand((8,), 40)
    # built twice, with distinct but equal constants, as the importer does
    r1 = call("relu", call("add", x, const(c)))
    r2 = call("relu", call("add", x, const(c.copy())))
    s1 = call("multiply", x, const(0.5))
    s2 = call("multiply", x, const(0.5))
    f = Function([x], Tuple([call("add", r1, r2), call("subtract", s1, s2)]))
    out = eliminate_common_subexpr(f)
    assert op_counts(out) == {"relu": 1, "add": 2, "multiply": 1, "subtract": 1}
    total = out.body.fields[0]
    assert total.args[0] is total.args[1]
    assert_same_outputs(f, out)


def test_cse_keeps_different_calls_apart():
    x = var("x", (2, 8))
    f = Function([x], Tuple([
        call("sum", x, axis=(0,)), call("sum", x, axis=(1,)),  # attrs differ
        call("add", x, const(1.0)), call("add", x, const(2.0)),  # constants differ
        call("add", x, const(1.0, "float32")), call("add", const(1.0), x),  # argument order
        call("relu", x), call("relu", var("x", (2, 8))),  # another variable of that name
    ]))
    out = eliminate_common_subexpr(f)
    assert op_counts(out) == {"sum": 2, "add": 3, "relu": 2}


def test_cse_chains_merge_transitively():
    x = var("x", (4,))

    def branch():
        return call("tanh", call("exp", call("negative", x)))

    f = Function([x], call("add", branch(), branch()))
    out = eliminate_common_subexpr(f)
    assert op_counts(out) == {"negative": 1, "exp": 1, "tanh": 1, "add": 1}


def test_dce_forwards_tuple_items_and_keeps_outputs():
    x, unused = var("x", (3,)), var("unused", (2,))
    t = Tuple([call("relu", x), call("exp", x)])
    f = Function([x, unused], Tuple([TupleGetItem(t, 0), call("negative", x)]))
    out = eliminate_dead_code(f)
    assert out.params == f.params  # the interface stays
    assert out.ty == f.ty and isinstance(out.body, Tuple) and len(out.body.fields) == 2
    assert op_counts(out) == {"relu": 1, "negative": 1}  # exp was only in the dropped field
    assert_same_outputs(f, out)
    # the output tuple itself is never taken apart
    g = Function([x], t)
    assert eliminate_dead_code(g).body is t


# ---------------------------------------------------------------- pipeline


def test_pipeline_order_and_levels(capsys):
    names = [p.name for p in optimization_pipeline()]
    assert names == ["simplify", "fold_batch_norm", "fold_constants", "simplify",
                     "eliminate_common_subexpr", "combine_parallel_dense", "eliminate_dead_code",
                     "fuse_attention", "convert_layout_nchwc", "winograd_gpu",
                     "fold_dense_rows", "pack_dense_weights"]
    x = var("x", (2, 3))
    f = Function([x], call("reshape", call("copy", call("add", x, call("negative", const(
        rand((3,), 50))))), newshape=(2, 3)))
    with PassContext(opt_level=0):
        level0 = optimize(f)
    assert structural_equal(level0, f)
    trace = PassTrace()
    with PassContext(opt_level=3, print_after=["fold_constants"], trace=trace):
        out = optimize(f)
    assert [n for n, _ in trace.ran] == names
    assert op_counts(out) == {"add": 1}
    assert "// IR after fold_constants" in capsys.readouterr().err
    assert_same_outputs(f, out)


def test_pass_context_gives_the_target_and_nests(monkeypatch, capsys):
    assert PassContext.current().target is None  # the default: no target
    with PassContext(target="llvm:core-avx2", opt_level=2) as outer:
        assert PassContext.current() is outer and outer.cpu_lanes() == 8
        assert outer.target.isa_level == "x86-avx2"
        with PassContext(target="cuda") as inner:
            assert PassContext.current() is inner and inner.cpu_lanes() == 0
        assert PassContext.current() is outer
    assert PassContext.current().target is None
    # the pipeline the driver runs ends by partitioning into kernels
    assert [p.name for p in compile_pipeline()] == [
        *[p.name for p in optimization_pipeline()], "fuse_ops"]
    monkeypatch.setenv("TECC_PRINT_AFTER", "simplify, fuse_ops")
    x = var("x", (2, 3))
    f = Function([x], call("relu", call("negative", x)))
    trace = PassTrace()
    with PassContext(opt_level=1, trace=trace):
        fused = run_passes(f, compile_pipeline())
    err = capsys.readouterr().err
    assert "// IR after simplify" in err and "// IR after fuse_ops" in err
    assert "// IR after fold_batch_norm" not in err
    assert [n for n, _ in trace.ran] == ["simplify", "fold_batch_norm", "simplify",
                                         "eliminate_dead_code", "fuse_ops"]
    (inputs,) = random_inputs(f, 1)
    res = build(fused, resolve_target("llvm"), ["x"], ["out0"], {"kind": "tensor", "index": 0},
                {})
    assert len(res.plan["kernels"]) == 1  # negative + relu: one kernel
    np.testing.assert_allclose(Executor(res.executable, res.plan, res.params).run_flat(inputs)[0],
                               np.maximum(-inputs, 0))


# ---------------------------------------------------------------- real models


def _opaque_calls(func: Function) -> int:
    return sum(n for op, n in op_counts(func).items() if get_op(op).pattern == Pattern.OPAQUE)


def _check_model(model: torch.nn.Module, inputs: tuple, rtol: float = 1e-4):
    imported = from_torch(model, inputs)
    before = imported.func
    with PassContext(target="llvm:core-avx2", opt_level=3):  # AVX2: 8 lanes
        after = optimize(before)
    arrays = [t.numpy() for t in inputs]
    want, got = run_ir(before, arrays), run_ir(after, arrays)
    assert max_rel_error(got, want) < rtol
    with torch.no_grad():
        eager = [t.numpy() for t in flatten(model(*inputs))]
    assert max_rel_error(got, eager) < rtol
    return before, after


def test_resnet18():
    torch.manual_seed(0)
    before, after = _check_model(models.resnet18().eval(), (torch.randn(1, 3, 32, 32),))
    counts = op_counts(after)
    assert "nn.batch_norm" not in counts and "nn.matmul" not in counts
    # the layout pass (default 8 lanes) blocked every conv: NCHW8c with packed weights
    assert counts["nn.conv2d_NCHWc"] == 20 and "nn.conv2d" not in counts
    # the RGB input is read in place (NCHW1c: a reshape), no layout transform at all
    assert "layout_transform" not in counts
    # each batch norm became the bias of its conv (one call for one); the reshape at
    # the input is all the layout pass added
    assert n_calls(after) <= n_calls(before) + 1
    assert _opaque_calls(after) == 0 < _opaque_calls(before)


def test_mlp():
    torch.manual_seed(0)
    before, after = _check_model(models.MLP().eval(), (torch.randn(2, 64),))
    # pack_dense_weights: every dense on a constant weight is packed at compile time
    assert op_counts(after) == {"nn.dense_pack": 3, "nn.bias_add": 3, "relu": 1, "gelu": 1}


def test_bert_encoder():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    mask[:, 12:] = 0
    before, after = _check_model(models.bert_encoder().eval(), (ids, mask))
    counts = op_counts(after)
    assert n_calls(after) < n_calls(before)
    assert counts["transpose"] < op_counts(before)["transpose"]
    assert counts["reshape"] < op_counts(before)["reshape"]
    # every linear layer (weights packed), the attention products stay matmul (the
    # projections stay apart on the CPU: combine_parallel_dense is for GPUs)
    assert counts["nn.dense_pack"] == 13


def test_fold_constants_keeps_zero_dim_types():
    # a full reduction is 0-d; the folded value must keep that type exactly
    x = var("x", (3,))
    f = Function([x], Tuple([call("add", x, call("sum", const(rand((2, 3), 60)))),
                             call("max", const(rand((4,), 61)))]))
    out = fold_constants(f)
    assert out.ty == f.ty
    assert "sum" not in op_counts(out) and "max" not in op_counts(out)
    assert_same_outputs(f, out)


def test_simplify_linear_on_a_flattened_input_keeps_the_leading_dims():
    # torch's linear on 3-d input exports as reshape -> addmm -> reshape: the dense
    # takes the 3-d input itself, so the residual add after it is its epilogue
    x = var("x", (2, 3, 4, 5))
    r = var("r", (2, 4, 6))
    flat = call("reshape", call("transpose", x, axes=(0, 2, 1, 3)), newshape=(8, 15))
    dense = call("nn.bias_add", call("nn.dense", flat, const(rand((6, 15), 62))),
                 const(rand((6,), 63)), axis=-1)
    f = Function([x, r], call("add", call("reshape", dense, newshape=(2, 4, 6)), r))
    out = simplify(f)
    assert op_counts(out) == {"transpose": 1, "reshape": 1, "nn.dense": 1, "nn.bias_add": 1,
                              "add": 1}
    d = next(n for n in post_order(out.body) if isinstance(n, Call) and n.op == "nn.dense")
    assert d.args[0].shape == (2, 4, 15) and d.args[0].args[0].op == "transpose"
    assert_same_outputs(f, out)
    # leading dims that do not multiply to the rows, or another last dim: kept
    g = Function([x], call("reshape", dense, newshape=(4, 12)))
    assert op_counts(simplify(g))["reshape"] == 2


def _kernels(func: Function) -> int:
    """Kernels fuse_ops makes of `func`: its calls of primitive functions that are
    more than a reshape (a reshape alone is a view)."""
    with PassContext(target="llvm:core-avx2", opt_level=3):
        fused = fuse_ops(func)
    return sum(1 for n in post_order(fused.body) if isinstance(n, Call)
               and isinstance(n.op, Function) and not is_reshape_only(n.op))


def _channels_last_mlp(x: Expr, residual: Expr, seed: int) -> Expr:
    """ConvNeXt's pointwise block: dense, bias, GELU, dense, a per-channel scale, the
    residual, back to channels first."""
    c = x.shape[-1]
    y = call("nn.bias_add", call("nn.dense", x, const(rand((4 * c, c), seed))),
             const(rand((4 * c,), seed + 1)), axis=-1)
    y = call("nn.dense", call("gelu", y, approximate="none"), const(rand((c, 4 * c), seed + 2)))
    y = call("add", call("multiply", const(rand((c,), seed + 3)), y), residual)
    return call("transpose", y, axes=(0, 3, 1, 2))


def test_fold_dense_rows_computes_on_the_rows_with_the_epilogue_below_the_view():
    x, r = var("x", (2, 5, 7, 16)), var("r", (2, 5, 7, 16))
    f = Function([x, r], _channels_last_mlp(x, r, 80))
    with PassContext(target="llvm:core-avx2", opt_level=3):
        out = fold_dense_rows(f)
    calls = [n for n in post_order(out.body) if isinstance(n, Call)]
    # both denses on the 70 rows; bias, GELU, scale and residual on [70, N]; one view
    # of x, one of r, one back to [2, 5, 7, 16] before the transpose
    assert [n.args[0].shape for n in calls if n.op == "nn.dense"] == [(70, 16), (70, 64)]
    assert all(n.shape[0] == 70 and len(n.shape) == 2 for n in calls
               if n.op in ("nn.bias_add", "gelu", "multiply", "add"))
    assert op_counts(out)["reshape"] == 3
    assert _kernels(out) == _kernels(f) == 3  # the epilogues still fuse; views are free
    assert_same_outputs(f, out, rtol=1e-4, atol=1e-4)


def test_fold_dense_rows_leaves_what_it_must_and_keeps_the_results():
    with PassContext(target="llvm:core-avx2", opt_level=3):
        # one block of rows ([1, S, K]: the shipped records' workloads), or a GPU target
        x = var("x", (1, 9, 16))
        g = Function([x], call("relu", call("nn.dense", x, const(rand((8, 16), 90)))))
        assert fold_dense_rows(g) is g or structural_equal(fold_dense_rows(g), g)
        # an operand varying along another axis than the last, and a dense used twice:
        # the view stays above them
        x, s = var("x", (1, 4, 6, 16)), var("s", (1, 4, 1, 8))
        d = call("nn.dense", x, const(rand((8, 16), 91)))
        h = Function([x, s], Tuple([call("add", d, s), call("relu", d)]))
        out = fold_dense_rows(h)
        assert [n.args[0].shape for n in post_order(out.body)
                if isinstance(n, Call) and n.op == "nn.dense"] == [(24, 16)]
        assert [n.shape for n in post_order(out.body)
                if isinstance(n, Call) and n.op in ("add", "relu")] == [(1, 4, 6, 8)] * 2
        assert_same_outputs(h, out)
    x = var("x", (1, 4, 6, 16))
    k = Function([x], call("nn.dense", x, const(rand((8, 16), 92))))
    with PassContext(target="cuda", opt_level=3):
        assert fold_dense_rows(k) is k


def test_channels_last_mlp_of_a_torch_model_runs_on_rows():
    # torch's Linear on [N, H, W, C] (ConvNeXt), whole pipeline, against eager
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(24)
            self.fc1, self.fc2 = torch.nn.Linear(24, 96), torch.nn.Linear(96, 24)
            self.gamma = torch.nn.Parameter(torch.rand(24) + 0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.norm(x.permute(0, 2, 3, 1))
            y = self.gamma * self.fc2(torch.nn.functional.gelu(self.fc1(y)))
            return x + y.permute(0, 3, 1, 2)

    torch.manual_seed(0)
    _, after = _check_model(Block().eval(), (torch.randn(2, 24, 7, 7),))
    denses = [n for n in post_order(after.body) if isinstance(n, Call)
              and n.op == "nn.dense_pack"]
    assert [d.args[0].shape for d in denses] == [(98, 24), (98, 96)]


def _projections(x: Expr, widths: tuple[int, ...], biases: tuple[bool, ...], seed: int):
    outs = []
    for i, (n, has_bias) in enumerate(zip(widths, biases, strict=True)):
        y = call("nn.dense", x, const(rand((n, x.shape[-1]), seed + 2 * i)))
        if has_bias:
            y = call("nn.bias_add", y, const(rand((n,), seed + 2 * i + 1)), axis=-1)
        outs.append(y)
    return outs


def test_combine_parallel_dense_makes_one_dense_of_the_projections():
    x = var("x", (2, 5, 8))
    q, k, v = _projections(call("relu", x), (8, 8, 4), (True, False, True), 70)
    f = Function([x], Tuple([call("tanh", q),
                             call("multiply", k, call("sum", v, axis=(-1,), keepdims=True)),
                             v]))
    assert combine_parallel_dense(f) is f  # no target, or a CPU one: nothing to gain
    with PassContext(target="llvm"):
        assert combine_parallel_dense(f) is f
    with PassContext(target="cuda"):
        out = combine_parallel_dense(f)
    counts = op_counts(out)
    assert counts["nn.dense"] == 1 and counts["nn.bias_add"] == 1
    assert counts["strided_slice"] == 3
    d = next(n for n in post_order(out.body) if isinstance(n, Call) and n.op == "nn.dense")
    assert d.args[1].shape == (20, 8)
    assert_same_outputs(f, out)
    # other inputs, weights of another width or dtype, computed weights: apart
    y = var("y", (2, 5, 8))
    w = var("w", (8, 8))
    apart = Function([x, y, w], Tuple([*_projections(x, (8,), (True,), 80),
                                       *_projections(y, (8,), (True,), 82),
                                       call("nn.dense", x, w)]))
    with PassContext(target="cuda"):
        assert combine_parallel_dense(apart) is apart


def test_combine_parallel_dense_keeps_a_dense_with_other_users_whole():
    # the dense is read by its bias_add and by another op: the slice stands for the
    # dense itself, and the bias stays on its own
    x = var("x", (4, 6))
    a = call("nn.dense", x, const(rand((3, 6), 90)))
    a_bias = call("nn.bias_add", a, const(rand((3,), 91)), axis=-1)
    (b,) = _projections(x, (5,), (True,), 92)
    f = Function([x], Tuple([a_bias, call("negative", a), b]))
    with PassContext(target="cuda"):
        out = combine_parallel_dense(f)
    assert op_counts(out)["nn.dense"] == 1 and op_counts(out)["nn.bias_add"] == 2
    assert_same_outputs(f, out)


def test_simplify_reduce_keepdims_then_reshape():
    x = var("x", (2, 8, 3, 3))
    pooled = call("mean", x, axis=(-1, -2), keepdims=True)
    f = Function([x], call("reshape", pooled, newshape=(2, 8)))
    out = simplify(f)
    assert op_counts(out) == {"mean": 1} and out.body.attrs["keepdims"] is False
    assert_same_outputs(f, out)
    # the keepdims result has another user: reducing twice would cost more
    shared = Function([x], Tuple([call("reshape", pooled, newshape=(2, 8)), pooled]))
    assert op_counts(simplify(shared)) == {"mean": 1, "reshape": 1}
    # a reshape that does more than drop the kept dims stays
    other = Function([x], call("reshape", pooled, newshape=(16,)))
    assert op_counts(simplify(other)) == {"mean": 1, "reshape": 1}


# ---------------------------------------------------------------- winograd_gpu


def _conv_chain(x: Expr, seed: int) -> Expr:
    """Eligible 3x3 layers (64 channels, 12x10 and 11x10 planes: partial F(4x4) tiles)
    between a 1x1 conv, a stride-2 3x3 conv and a narrow one, which stay direct."""
    def conv(inp: Expr, cout: int, k: int, s: int, pad: tuple, seed: int) -> Call:
        w = const(rand((cout, inp.shape[1], k, k), seed) * 0.1)
        return call("nn.conv2d", inp, w, strides=(s, s), padding=pad)

    y = call("relu", call("nn.bias_add", conv(x, 64, 3, 1, (1, 1, 1, 1), seed),
                          const(rand((64,), seed + 1)), axis=1))
    y = call("add", conv(y, 64, 3, 1, (1, 0, 0, 1), seed + 2), const(rand((64, 1, 1), seed + 3)))
    y = conv(y, 64, 1, 1, (0, 0, 0, 0), seed + 4)
    y = conv(y, 64, 3, 2, (1, 1, 1, 1), seed + 5)
    return conv(y, 16, 3, 1, (1, 1, 1, 1), seed + 6)


def test_winograd_gpu_rewrites_the_eligible_3x3_convs_and_keeps_their_values():
    x = var("x", (2, 64, 12, 10))
    before = Function([x], _conv_chain(x, 40))
    with PassContext(target="cuda:sm_90"):
        after = run_passes(before, [get_pass("winograd_gpu")])
    counts = op_counts(after)
    assert counts["nn.winograd_input"] == counts["nn.winograd_output"] == 2, counts
    assert counts["nn.matmul"] == 2 and counts["nn.conv2d"] == 3, counts
    # F(4x4)'s transforms in float32: a little further from the direct sum than 1e-5
    assert_same_outputs(before, after, rtol=1e-4, atol=1e-4)
    (want,) = run_ir(before, random_inputs(before))
    (fast,) = evaluate_function(after, random_inputs(before))
    np.testing.assert_allclose(fast, want, rtol=1e-4, atol=1e-4)


def test_winograd_gpu_leaves_cpu_targets_and_the_direct_choice_alone():
    x = var("x", (1, 64, 16, 16))
    before = Function([x], _conv_chain(x, 50))
    with PassContext(target="llvm"):
        assert run_passes(before, [get_pass("winograd_gpu")]) is before
    direct = TuningCallbacks(gpu_winograd_tile=lambda conv, info: 0)
    with PassContext(target="cuda:sm_90", tuning=direct):
        assert op_counts(run_passes(before, [get_pass("winograd_gpu")]))["nn.conv2d"] == 5
