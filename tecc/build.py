"""Build a partitioned IR Function into one TVM library and an execution plan.

The input is a Function whose body is calls of primitive Functions (one per kernel),
tuples and tuple items. Each distinct primitive Function is lowered once (identical
layers share a kernel), all kernels go into one IRModule and one library, and the
plan lists the kernel calls in order over numbered tensors (runtime/plan.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tvm

from frontend.ir import (
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
from graph_opt.fuse_ops import is_primitive_call
from schedules.lower import lower_primitive


@dataclass
class KernelInfo:
    name: str
    ops: list[str]
    input_shapes: list[tuple[int, ...]]
    output_shapes: list[tuple[int, ...]]
    calls: int = 0


@dataclass
class BuildResult:
    executable: object  # tvm.runtime.Executable
    plan: dict
    params: dict[str, np.ndarray]
    kernels: dict[str, KernelInfo] = field(default_factory=dict)
    build_seconds: float = 0.0


def _ops_of(func: Function) -> list[str]:
    return [n.op for n in post_order(func.body) if isinstance(n, Call) and isinstance(n.op, str)]


def _kernel_name(index: int, ops: list[str]) -> str:
    main = [o for o in ops if o.startswith("nn.")] or ops
    tail = [o for o in ops if o not in main]
    words = [main[0]] + tail[:3]
    return f"k{index}_" + "_".join(w.replace(".", "_") for w in words)


class _PlanBuilder:
    def __init__(self) -> None:
        self.tensors: list[dict] = []
        self.storages: list[dict] = []

    def new_tensor(self, shape: tuple[int, ...], dtype: str, kind: str) -> int:
        tid = len(self.tensors)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.storages.append({"id": tid, "nbytes": max(nbytes, 1)})
        self.tensors.append({"id": tid, "storage": tid, "offset": 0, "shape": list(shape),
                             "dtype": dtype, "kind": kind})
        return tid


def build(
    func: Function,
    target: tvm.target.Target,
    input_names: list[str],
    output_names: list[str],
    output_structure: dict,
    param_names: dict[int, str] | None = None,
) -> BuildResult:
    start = time.perf_counter()
    param_names = param_names or {}
    plan = _PlanBuilder()
    tensor_of: dict[int, int | list[int]] = {}
    inputs, params_json, kernels_json = [], [], []
    params: dict[str, np.ndarray] = {}

    for var, name in zip(func.params, input_names, strict=True):
        tid = plan.new_tensor(var.shape, var.dtype, "input")
        tensor_of[id(var)] = tid
        inputs.append({"name": name, "tensor": tid})

    prim_funcs: dict[str, tvm.tirx.PrimFunc] = {}
    kernel_by_digest: dict[str, str] = {}
    kernels: dict[str, KernelInfo] = {}

    def constant_tensor(node: Constant) -> int:
        name = param_names.get(id(node), f"const{len(params)}")
        while name in params:
            name += "_"
        tid = plan.new_tensor(node.shape, node.dtype, "param")
        params[name] = np.asarray(node.data)
        params_json.append({"name": name, "tensor": tid})
        return tid

    for node in post_order(func.body):
        if isinstance(node, Var):
            if id(node) not in tensor_of:
                raise ValueError(f"free variable %{node.name} is not an input of the model")
        elif isinstance(node, Constant):
            tensor_of[id(node)] = constant_tensor(node)
        elif isinstance(node, Tuple):
            tensor_of[id(node)] = [tensor_of[id(f)] for f in node.fields]
        elif isinstance(node, TupleGetItem):
            tensor_of[id(node)] = tensor_of[id(node.tuple_value)][node.index]
        elif is_primitive_call(node):
            prim = node.op
            digest = structural_digest(prim)
            if digest not in kernel_by_digest:
                name = _kernel_name(len(kernel_by_digest), _ops_of(prim))
                kernel_by_digest[digest] = name
                prim_funcs[name] = lower_primitive(prim, name, target)
                out_types = prim.ret_type.fields if isinstance(prim.ret_type, TupleType) \
                    else (prim.ret_type,)
                kernels[name] = KernelInfo(name, _ops_of(prim), [p.shape for p in prim.params],
                                           [t.shape for t in out_types])
            name = kernel_by_digest[digest]
            kernels[name].calls += 1
            out_types = node.ty.fields if isinstance(node.ty, TupleType) else (node.ty,)
            outs = [plan.new_tensor(t.shape, t.dtype, "intermediate") for t in out_types]
            args = [tensor_of[id(a)] for a in node.args]
            kernels_json.append({"name": name, "args": args + outs})
            tensor_of[id(node)] = outs if isinstance(node.ty, TupleType) else outs[0]
        else:
            raise ValueError(f"cannot build {node!r}: partition the function into kernels first")

    body = func.body
    out_ids = tensor_of[id(body)] if isinstance(body, Tuple) else [tensor_of[id(body)]]
    outputs = [{"name": n, "tensor": t} for n, t in zip(output_names, out_ids, strict=True)]
    for t in out_ids:
        if plan.tensors[t]["kind"] == "intermediate":
            plan.tensors[t]["kind"] = "output"

    with target:
        executable = tvm.compile(tvm.IRModule(prim_funcs), target=target)
    plan_json = {
        "version": 1,
        "storages": plan.storages,
        "tensors": plan.tensors,
        "inputs": inputs,
        "params": params_json,
        "outputs": outputs,
        "kernels": kernels_json,
        "output_structure": output_structure,
    }
    return BuildResult(executable, plan_json, params, kernels, time.perf_counter() - start)
