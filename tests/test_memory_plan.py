"""The memory planner: no two simultaneously live tensors share bytes, and a
planned graph computes what the unplanned one does."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tecc.frontend.ir import Call, Function, TensorType, Tuple, Var
from tecc.graph_opt.fuse_ops import fuse_ops
from tecc.graph_opt.memory_plan import Step, plan_memory
from tecc.runtime import Executor

from tecc.build import build
from tecc.target import resolve_target


@st.composite
def step_sequences(draw):
    """Random kernel sequences over tensors 0..n-1 (0 and 1 are model inputs)."""
    sizes = {0: draw(st.integers(1, 4096)), 1: draw(st.integers(1, 4096))}
    steps = []
    for _ in range(draw(st.integers(1, 25))):
        out = len(sizes)
        ins = draw(st.lists(st.sampled_from(sorted(sizes)), min_size=1, max_size=3, unique=True))
        kind = draw(st.sampled_from(["plain", "inplace", "alias"]))
        planned_ins = [i for i in ins if i >= 2]
        if kind != "plain" and planned_ins:
            src = planned_ins[0]
            sizes[out] = sizes[src]
            steps.append(Step(ins, [out], **({"inplace": {out: src}} if kind == "inplace"
                                             else {"alias": {out: src}})))
        else:
            sizes[out] = draw(st.integers(1, 4096))
            steps.append(Step(ins, [out]))
    outputs = set(draw(st.lists(st.sampled_from(sorted(sizes)[2:] or [2]), max_size=3)))
    return steps, {t: s for t, s in sizes.items() if t >= 2}, outputs & set(sizes)


@settings(max_examples=300, deadline=None)
@given(step_sequences())
def test_live_tensors_never_share_bytes(case):
    steps, nbytes, outputs = case
    plan = plan_memory(steps, nbytes, outputs)
    owner = {o: s for step in steps for o, s in step.alias.items() if o in nbytes and s in nbytes}

    def root(t):
        while t in owner:
            t = owner[t]
        return t

    born, last = {}, {}
    for i, step in enumerate(steps):
        for t in step.outputs:
            born.setdefault(root(t), i)
        for t in step.inputs + step.outputs:
            if t in nbytes:
                last[root(t)] = max(last.get(root(t), -1), i)
    for t in outputs:
        last[root(t)] = len(steps)
    inplace_pairs = {(root(s), root(o)) for step in steps for o, s in step.inplace.items()}
    roots = sorted({root(t) for t in nbytes})
    for t in nbytes:  # every tensor fits its slot, views included
        assert plan.storage_bytes[plan.storage_of[t]] >= nbytes[t]
        assert plan.storage_of[t] == plan.storage_of[root(t)]
    for a in roots:
        for b in roots:
            if a >= b or plan.storage_of[a] != plan.storage_of[b]:
                continue
            first, second = (a, b) if born[a] <= born[b] else (b, a)
            overlap = last[first] >= born[second]
            handed_over = last[first] == born[second] and (first, second) in inplace_pairs
            assert not overlap or handed_over, (
                f"tensors {a} and {b} share slot {plan.storage_of[a]} while both live")
    assert plan.planned_bytes <= plan.naive_bytes + 64 * len(nbytes)


UNARY = ["relu", "sigmoid", "negative", "tanh"]
BINARY = ["add", "multiply", "subtract", "maximum"]


@st.composite
def elementwise_graphs(draw):
    shape = (draw(st.integers(1, 3)), draw(st.integers(2, 9)))
    x = Var("x", TensorType(shape, "float32"))
    y = Var("y", TensorType(shape, "float32"))
    values = [x, y]
    for _ in range(draw(st.integers(2, 10))):
        if draw(st.booleans()):
            op = draw(st.sampled_from(UNARY))
            values.append(Call(op, [draw(st.sampled_from(values))]))
        elif draw(st.integers(0, 4)) == 0:
            src = draw(st.sampled_from(values))
            flat = Call("reshape", [src], {"newshape": (src.tensor_type.size,)})
            values.append(Call("reshape", [Call("sigmoid", [flat])], {"newshape": shape}))
        else:
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            values.append(Call(draw(st.sampled_from(BINARY)), [a, b]))
    outs = draw(st.lists(st.sampled_from(values[2:]), min_size=1, max_size=2, unique=True))
    return Function([x, y], outs[0] if len(outs) == 1 else Tuple(outs))


def _run(func, inputs, reuse: bool, max_depth: int):
    fused = fuse_ops(func, max_depth=max_depth)
    n_out = len(func.body.fields) if isinstance(func.body, Tuple) else 1
    structure = ({"kind": "tuple", "items": [{"kind": "tensor", "index": i}
                                             for i in range(n_out)]})
    names = [p.name for p in func.params]
    result = build(fused, resolve_target("llvm"), names, [f"o{i}" for i in range(n_out)],
                   structure, {}, plan_memory_reuse=reuse)
    return Executor(result.executable, result.plan, result.params).run_flat(*inputs), result


@settings(max_examples=12, deadline=None)
@given(elementwise_graphs(), st.sampled_from([1, 3]))
def test_planned_execution_equals_unplanned(func, max_depth):
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(p.shape).astype("float32") for p in func.params]
    planned, result = _run(func, inputs, reuse=True, max_depth=max_depth)
    unplanned, _ = _run(func, inputs, reuse=False, max_depth=max_depth)
    for a, b in zip(planned, unplanned, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert result.memory.planned_bytes <= result.memory.naive_bytes


def test_chain_reuses_two_slots():
    x = Var("x", TensorType((64, 64), "float32"))
    value = x
    for op in ["relu", "sigmoid", "tanh", "negative", "relu", "sigmoid"]:
        value = Call("exp", [Call(op, [value])])
    func = Function([x], value)
    inputs = [np.random.default_rng(1).standard_normal((64, 64)).astype("float32")]
    (out,), result = _run(func, inputs, reuse=True, max_depth=1)
    # twelve kernels, each output dying at the next kernel: in-place leaves one slot
    assert len(result.plan["kernels"]) == 12
    assert len(result.memory.storage_bytes) <= 2
    assert result.memory.naive_bytes == 12 * 64 * 64 * 4
    ref = inputs[0]
    for f in [lambda v: np.maximum(v, 0), lambda v: 1 / (1 + np.exp(-v)), np.tanh, np.negative,
              lambda v: np.maximum(v, 0), lambda v: 1 / (1 + np.exp(-v))]:
        ref = np.exp(f(ref))
    np.testing.assert_allclose(out, ref, rtol=1e-5)
