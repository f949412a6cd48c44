"""Build a fused IR Function into one TVM library and an execution plan.

The input is a Function whose body is calls of primitive Functions (one per kernel),
tuples and tuple items. Each distinct primitive Function is lowered once (identical
layers share a kernel), all kernels go into one IRModule and one library, and the
plan lists the kernel calls in order over numbered tensors (runtime/plan.md), the
intermediates placed in storage slots by the memory planner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tvm

from tecc.frontend.ir import (
    Call,
    Constant,
    Function,
    Tuple,
    TupleGetItem,
    TupleType,
    Var,
    post_order,
    structural_digest,
)
from tecc.frontend.ops import Pattern, get_op
from tecc.graph_opt.fuse_ops import is_primitive_call
from tecc.graph_opt.memory_plan import MemoryPlan, Step, plan_memory
from tecc.graph_opt.patterns import is_reshape_only
from tecc.schedules.lower import lower_primitive
from tecc.target import TargetInfo, resolve_target


@dataclass
class KernelInfo:
    """One compiled kernel (shared by every call of an identical fused group)."""

    name: str
    ops: list[str]
    anchor: str
    input_shapes: list[tuple[int, ...]]
    output_shapes: list[tuple[int, ...]]
    calls: int = 0
    # what each anchor's template did (schedules.default.AppliedTemplate): workload,
    # template, space size, config used and its source ("fallback", "exact", ...)
    templates: list = field(default_factory=list)


@dataclass
class BuildResult:
    executable: object  # tvm.runtime.Executable
    plan: dict
    params: dict[str, np.ndarray]
    kernels: dict[str, KernelInfo] = field(default_factory=dict)
    memory: MemoryPlan | None = None
    build_seconds: float = 0.0


def ops_of(func: Function) -> list[str]:
    return [n.op for n in post_order(func.body) if isinstance(n, Call) and isinstance(n.op, str)]


def anchor_of(func: Function) -> str:
    if "anchor" in func.attrs:
        return func.attrs["anchor"]
    calls = [n for n in post_order(func.body) if isinstance(n, Call) and isinstance(n.op, str)]
    return max(calls, key=lambda c: get_op(c.op).pattern).op if calls else "copy"


def _kernel_name(index: int, ops: list[str], anchor: str) -> str:
    rest = [o for o in dict.fromkeys(ops) if o != anchor][:3]
    return f"k{index}_" + "_".join(w.replace("nn.", "") for w in [anchor, *rest])


def _inplace_params(prim: Function) -> list[int]:
    """Params the kernel may overwrite with its output: every op is elementwise or
    broadcast and reads that param only at the output's own index."""
    if isinstance(prim.ret_type, TupleType):
        return []
    calls = [n for n in post_order(prim.body) if isinstance(n, Call)]
    if not calls or any(not isinstance(c.op, str) or get_op(c.op).pattern > Pattern.BROADCAST
                        for c in calls):
        return []
    result = []
    for k, p in enumerate(prim.params):
        if p.ty != prim.ret_type:
            continue
        readers = [c for c in calls if any(a is p for a in c.args)]
        if readers and all(c.ty == p.ty for c in readers):
            result.append(k)
    return result


def build(
    func: Function,
    target: TargetInfo | tvm.target.Target | str,
    input_names: list[str],
    output_names: list[str],
    output_structure: dict,
    param_names: dict[int, str] | None = None,
    plan_memory_reuse: bool = True,
    config_fn=None,
) -> BuildResult:
    """`config_fn(workload, config space) -> config JSON | (config JSON, source) | None`,
    or a list of (config JSON, source) of which the first that fits the kernel's layout
    is used, picks each anchor's schedule config (None: the template's fallback). `target`: the
    target's facts, a TVM Target or a short string (tecc.target.resolve_target)."""
    start = time.perf_counter()
    target = resolve_target(target)
    param_names = param_names or {}
    tensors: list[dict] = []
    tensor_of: dict[int, int | list[int]] = {}
    inputs, params_json = [], []
    params: dict[str, np.ndarray] = {}
    steps: list[Step] = []
    kernel_calls: list[tuple[str, list[int]] | None] = []
    view_of: dict[int, int] = {}  # a reshape of an input or a param -> that tensor

    def new_tensor(shape: tuple[int, ...], dtype: str, kind: str) -> int:
        tensors.append({"id": len(tensors), "shape": list(shape), "dtype": dtype, "kind": kind})
        return len(tensors) - 1

    for var, name in zip(func.params, input_names, strict=True):
        tensor_of[id(var)] = new_tensor(var.shape, var.dtype, "input")
        inputs.append({"name": name, "tensor": tensor_of[id(var)]})

    prim_funcs: dict[str, tvm.tirx.PrimFunc] = {}
    kernel_by_digest: dict[str, str] = {}
    kernels: dict[str, KernelInfo] = {}

    for node in post_order(func.body):
        if isinstance(node, Var):
            if id(node) not in tensor_of:
                raise ValueError(f"free variable %{node.name} is not an input of the model")
        elif isinstance(node, Constant):
            name = param_names.get(id(node), f"const{len(params)}")
            while name in params:
                name += "_"
            tensor_of[id(node)] = new_tensor(node.shape, node.dtype, "param")
            params[name] = np.asarray(node.data)
            params_json.append({"name": name, "tensor": tensor_of[id(node)]})
        elif isinstance(node, Tuple):
            tensor_of[id(node)] = [tensor_of[id(f)] for f in node.fields]
        elif isinstance(node, TupleGetItem):
            tensor_of[id(node)] = tensor_of[id(node.tuple_value)][node.index]
        elif is_primitive_call(node):
            prim = node.op
            out_types = node.ty.fields if isinstance(node.ty, TupleType) else (node.ty,)
            outs = [new_tensor(t.shape, t.dtype, "intermediate") for t in out_types]
            args = [tensor_of[id(a)] for a in node.args]
            tensor_of[id(node)] = outs if isinstance(node.ty, TupleType) else outs[0]
            if is_reshape_only(prim):
                # A view of its input's bytes: no kernel at all.
                if tensors[args[0]]["kind"] == "intermediate":
                    steps.append(Step(args, outs, alias={outs[0]: args[0]}))
                    kernel_calls.append(None)
                    continue
                # of a model input or a param (e.g. NCHW -> NCHW1c): that buffer's view
                view_of[outs[0]] = view_of.get(args[0], args[0])
                tensors[outs[0]]["kind"] = "view"
                continue
            digest = structural_digest(prim)
            if digest not in kernel_by_digest:
                name = _kernel_name(len(kernel_by_digest), ops_of(prim), anchor_of(prim))
                kernel_by_digest[digest] = name
                prim_funcs[name], applied = lower_primitive(prim, name, target, config_fn,
                                                            return_info=True)
                kernels[name] = KernelInfo(name, ops_of(prim), anchor_of(prim),
                                           [p.shape for p in prim.params],
                                           [t.shape for t in out_types], templates=applied)
            name = kernel_by_digest[digest]
            kernels[name].calls += 1
            candidates = _inplace_params(prim)
            inplace = {outs[0]: args[candidates[0]]} if candidates else {}
            steps.append(Step(args, outs, inplace=inplace))
            kernel_calls.append((name, args + outs))
        else:
            raise ValueError(f"cannot build {node!r}: partition the function into kernels first")

    body = func.body
    out_ids = tensor_of[id(body)] if isinstance(body, Tuple) else [tensor_of[id(body)]]
    outputs = [{"name": n, "tensor": t} for n, t in zip(output_names, out_ids, strict=True)]
    for t in out_ids:
        if tensors[t]["kind"] == "intermediate":
            tensors[t]["kind"] = "output"

    planned = {t["id"]: _nbytes(t) for t in tensors if t["kind"] in ("intermediate", "output")}
    memory = plan_memory(steps, planned, set(out_ids), reuse=plan_memory_reuse)
    storages = [{"id": s, "nbytes": n} for s, n in enumerate(memory.storage_bytes)]
    for t in tensors:
        if t["id"] in memory.storage_of:
            t["storage"] = memory.storage_of[t["id"]]
        elif t["id"] not in view_of:  # inputs and params keep their own buffers
            t["storage"] = len(storages)
            storages.append({"id": len(storages), "nbytes": max(_nbytes(t), 1)})
        t["offset"] = 0
    for view, source in view_of.items():
        tensors[view]["storage"] = tensors[source]["storage"]

    if target.kind.name == "cuda":
        from tecc.cuda_toolchain import compile_cuda

        executable = compile_cuda(tvm.IRModule(prim_funcs), target)
    else:
        with target:
            executable = tvm.compile(tvm.IRModule(prim_funcs), target=target)
    plan_json = {
        "version": 1,
        "storages": storages,
        "tensors": tensors,
        "inputs": inputs,
        "params": params_json,
        "outputs": outputs,
        "kernels": [{"name": c[0], "args": c[1]} for c in kernel_calls if c is not None],
        "output_structure": output_structure,
    }
    return BuildResult(executable, plan_json, params, kernels, memory,
                       time.perf_counter() - start)


def index_checks(func: Function, input_names: list[str]) -> list[dict]:
    """The model inputs that index a table directly (embedding, index_select: `take`
    of an input), with the table's extent: the runtime checks their values before a
    run, since torch raises IndexError where the kernel would clamp."""
    names = {id(p): n for p, n in zip(func.params, input_names, strict=True)}
    checks: dict[str, int] = {}
    for node in post_order(func.body):
        if isinstance(node, Call) and node.op == "take" and id(node.args[1]) in names:
            data = node.args[0]
            axis = int(node.attrs.get("axis", 0)) % len(data.shape)
            name = names[id(node.args[1])]
            checks[name] = min(checks.get(name, int(data.shape[axis])), int(data.shape[axis]))
    return [{"input": n, "size": size} for n, size in checks.items()]


def _nbytes(tensor: dict) -> int:
    return int(np.prod(tensor["shape"], dtype=np.int64)) * np.dtype(tensor["dtype"]).itemsize
