"""Import a PyTorch model into the tecc IR.

The model is captured with torch.export, decomposed to core ATen (except the ATen
ops that have a converter: see `decomposition_table`), and each ATen call is mapped
by the converter registered with its IR op in frontend/op_defs/. Calls whose inputs
are all constants (buffers, arange, full, ...) are evaluated with torch at import
time. Every converted call is checked against the shape and dtype torch.export
recorded.
"""

from __future__ import annotations

import collections
import operator
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tecc.frontend.fast_paths import DECOMPOSITIONS as FAST_PATH_DECOMPOSITIONS
from tecc.frontend.ir import Call, Constant, Expr, Function, TensorType, Tuple, TupleGetItem, Var
from tecc.frontend.ops import OPS
from torch._decomp import decomposition_table as torch_decompositions
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind


class UnsupportedOperatorError(NotImplementedError):
    """The model uses ops the importer cannot convert. Lists every one of them."""

    def __init__(self, unsupported: dict[str, list[str]]) -> None:
        self.unsupported = unsupported
        lines = [f"the model uses {len(unsupported)} operator(s) that tecc cannot import:"]
        for op, places in sorted(unsupported.items()):
            lines.append(f"  {op}: {len(places)} use(s)")
            for place in sorted(set(places))[:5]:
                lines.append(f"    at {place}")
        lines.append("Rewrite those parts of the model with supported ops, or report the ops "
                     "so that converters can be added (frontend/op_defs/).")
        super().__init__("\n".join(lines))


class ImportError_(ValueError):
    """A supported op was used in a way the importer does not handle."""


def supported_aten_ops() -> list[str]:
    return OPS.aten_targets()


# Core ATen ops, which torch.export keeps whole, that tecc imports through torch's own
# decompositions into ops it converts (vector_norm: abs, pow, sum for any order).
CORE_OPS_DECOMPOSED = ("aten.linalg_vector_norm.default",)


def decomposition_table() -> dict:
    """torch.export's default decompositions and those of CORE_OPS_DECOMPOSED, less
    every ATen op that has a converter
    (an op with a native IR op, hardswish, silu ..., reaches it instead of being
    rewritten into primitives first), and with those of the fused ops of torch's
    transformer fast paths, which torch has none of (frontend/fast_paths.py)."""
    table = torch.export.default_decompositions()
    table.update({op: fn for op, fn in torch_decompositions.items()
                  if str(op) in CORE_OPS_DECOMPOSED})
    for aten_op in list(table.keys()):
        if OPS.converter_for(str(aten_op)) is not None:
            del table[aten_op]
    table.update(FAST_PATH_DECOMPOSITIONS)
    return table


# ---------------------------------------------------------------- results of an import


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass
class ImportedModel:
    """An imported model: the IR function, its named inputs and outputs, and how the
    flat outputs are rebuilt into the model's output structure (plan.md's format)."""

    func: Function
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    output_structure: dict
    param_names: dict[int, str] = field(default_factory=dict)  # id(Constant) -> state name


# ---------------------------------------------------------------- entry points


def from_torch(model: torch.nn.Module, example_inputs: Sequence[Any]) -> ImportedModel:
    """Export `model` with `example_inputs` (static shapes) and import it."""
    return from_exported_program(export_program(model, example_inputs))


def export_program(model: torch.nn.Module, example_inputs: Sequence[Any]) -> ExportedProgram:
    """torch.export's program of `model` in eval mode (static shapes), not yet decomposed."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    model = model.eval()
    with torch.no_grad():
        try:
            return torch.export.export(model, tuple(example_inputs))
        except Exception as err:
            if not _register_cache_outputs(err):
                raise
            return torch.export.export(model, tuple(example_inputs))


def _register_cache_outputs(err: Exception) -> bool:
    """After torch.export refused a transformers cache (DynamicCache ...) among the
    outputs as an unknown type: register transformers' cache classes as pytree nodes
    (its own exporter's flattener, which keeps every tensor a leaf) so that a retry
    flattens them. False when the error is another one, or transformers cannot."""
    message = str(err)
    match = re.search(r"Found <class '([\w.]+)'> in output, which is not a known type", message)
    if match is None or not match.group(1).startswith("transformers."):
        return False
    try:
        from transformers.cache_utils import Cache
        from transformers.exporters.exporter_dynamo import register_pytree_node
    except ImportError as missing:
        raise ImportError_(
            f"the model returns a {match.group(1)} (a key/value cache), which tecc can only "
            f"flatten with transformers' exporter ({missing}): call the model with "
            "use_cache=False, or upgrade transformers") from err
    stack = [Cache]
    while stack:  # every Cache subclass, as transformers' exporter registers them
        cls = stack.pop()
        register_pytree_node(cls)
        stack.extend(cls.__subclasses__())
    return True


def load_pt2(path: str | os.PathLike) -> ImportedModel:
    """Import a program saved with torch.export.save."""
    return from_exported_program(torch.export.load(os.fspath(path)))


def from_exported_program(exported: ExportedProgram) -> ImportedModel:
    exported = exported.run_decompositions(decomposition_table())
    return ImportContext(exported).run()


# ---------------------------------------------------------------- the importer


def torch_dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def source_location(node: torch.fx.Node) -> str:
    """The model source line of a node, from the stack trace torch.export kept."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    # The last frame outside torch itself is the model's own line.
    for path, line, func, code in reversed(frames):
        if f"{os.sep}torch{os.sep}" not in path:
            return f"{path}:{line} in {func}: {code.strip()}"
    if frames:
        path, line, func, code = frames[-1]
        return f"{path}:{line} in {func}: {code.strip()}"
    return f"graph node {node.name}"


def convertible(node: torch.fx.Node) -> bool:
    """Whether a call node has a converter (operator.getitem, taking an output of a
    multi-output call, counts): the op check of an import, and what partitioning
    (tecc.partition) compiles."""
    return node.target is operator.getitem or OPS.converter_for(str(node.target)) is not None


def _reads_user_input(node: torch.fx.Node, specs: dict) -> bool:
    """Whether a user input flows into `node` (else torch evaluates it at import)."""
    stack = list(node.all_input_nodes)
    seen = set()
    while stack:
        n = stack.pop()
        if n.name in seen:
            continue
        seen.add(n.name)
        if n.op == "placeholder" and specs[n.name].kind == InputKind.USER_INPUT:
            return True
        stack.extend(n.all_input_nodes)
    return False


def unsupported_calls(exported: ExportedProgram) -> dict[str, list[str]]:
    """The import's op check: each op without a converter that a user input flows into
    (calls on constants alone are evaluated at import), with its source lines."""
    specs = {s.arg.name: s for s in exported.graph_signature.input_specs}
    unsupported: dict[str, list[str]] = collections.defaultdict(list)
    for node in exported.graph.nodes:
        if node.op == "call_function" and not convertible(node) \
                and _reads_user_input(node, specs):
            unsupported[str(node.target)].append(source_location(node))
    return dict(unsupported)


def check_static_and_typed(exported: ExportedProgram, data_dependent: bool = False) -> None:
    """The errors an import raises before its op check: dynamic input dimensions,
    data-dependent shapes (unless `data_dependent`: the partitioner leaves them to
    torch), bfloat16 (ImportContext._check_static_and_typed)."""
    specs = {s.arg.name: s for s in exported.graph_signature.input_specs}
    ImportContext._check_static_and_typed(exported.graph, specs,
                                          {**exported.state_dict, **exported.constants},
                                          data_dependent)


def data_dependent_shape(node: torch.fx.Node) -> bool:
    """Whether a node's tensor value has a dimension that depends on the data (a
    boolean mask's selection, nonzero): an unbacked symbol, not an int."""
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape)


class ImportContext:
    def __init__(self, exported: ExportedProgram) -> None:
        self.exported = exported
        self.values: dict[str, Any] = {}
        self.node: torch.fx.Node | None = None

    # Helpers used by converters -------------------------------------------------

    @property
    def span(self) -> str | None:
        return source_location(self.node) if self.node is not None else None

    def error(self, message: str) -> ImportError_:
        """The error for a supported op used in a way that is not handled, with the
        model source line of the node being converted."""
        return ImportError_(f"{message} ({self.span})")

    def unsupported(self, what: str) -> UnsupportedOperatorError:
        """The error for an operator variant the importer cannot convert at all."""
        return UnsupportedOperatorError({what: [self.span or "unknown"]})

    def promoted_dtype(self, a: Any, b: Any) -> str:
        """The dtype torch's type promotion gives `a op b` (tensors or Python scalars)."""
        def proxy(v: Any) -> Any:
            if isinstance(v, Expr):
                return torch.empty((1,) * max(len(v.shape), 1), dtype=getattr(torch, v.dtype))
            return v

        return torch_dtype_name(torch.result_type(proxy(a), proxy(b)))

    def call(self, op: str, *args: Expr, **attrs: Any) -> Call:
        return Call(op, args, attrs, span=self.span)

    def const(self, value: Any, dtype: str) -> Constant:
        return Constant(np.asarray(value, dtype=dtype))

    def expr(self, value: Any, like: Expr | None = None, dtype: str | None = None) -> Expr:
        """An IR expression for a converter argument: Exprs pass, Python scalars
        become constants of `dtype` (default: the dtype of `like`)."""
        if isinstance(value, Expr):
            return value
        if isinstance(value, torch.Tensor):
            return Constant(value.detach().cpu().numpy())
        dtype = dtype or (like.dtype if like is not None else None)
        if dtype is None:
            dtype = "float32" if isinstance(value, float) else "int64"
        return self.const(value, dtype)

    def out_meta(self, index: int | None = None) -> torch.Tensor:
        val = self.node.meta["val"]
        return val[index] if index is not None else val

    def out_dtype(self) -> str:
        return torch_dtype_name(self.out_meta().dtype)

    def out_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.out_meta().shape)

    def cast(self, x: Expr, dtype: str) -> Expr:
        if x.dtype == dtype:
            return x
        if isinstance(x, Constant):
            return Constant(x.data.astype(dtype))
        return self.call("cast", x, dtype=dtype)

    # The walk ------------------------------------------------------------------

    @staticmethod
    def _check_static_and_typed(graph: torch.fx.Graph, specs: dict, state: dict,
                                data_dependent: bool = False) -> None:
        """tecc's own errors, before the op check would list their symptoms as
        unsupported ops: dynamic input dimensions, data-dependent shapes (a boolean
        mask, nonzero), and bfloat16 tensors (numpy, the runtime's arrays, has none)."""
        for node in graph.nodes:
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue
            symbolic = [i for i, d in enumerate(val.shape) if not isinstance(d, int)]
            if node.op == "placeholder" and specs[node.name].kind == InputKind.USER_INPUT:
                if symbolic:
                    raise ImportError_(
                        f"input {node.name!r} has dynamic dimension(s) {symbolic} "
                        f"({tuple(val.shape)}): tecc compiles static shapes. Export without "
                        "dynamic_shapes (or with Dim constraints removed), and compile once "
                        "per shape you serve")
                if val.dtype == torch.bfloat16:
                    raise ImportError_(
                        f"input {node.name!r} is bfloat16, which tecc does not compute "
                        "(numpy, the runtime's array type, has no bfloat16): cast the model "
                        "and inputs to float32 or float16, e.g. model.float(), x.float()")
            elif symbolic and not data_dependent:
                raise ImportError_(
                    f"{source_location(node)}: {node.target} has a shape that depends on "
                    f"the data ({tuple(val.shape)}), e.g. a boolean mask x[x > 0] or nonzero: "
                    "tecc compiles static shapes. Keep the shape fixed, e.g. "
                    "torch.where(mask, x, 0), or compile with fallback=\"torch\" to run "
                    "it in torch")
        for name, tensor in state.items():
            if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.bfloat16:
                raise ImportError_(
                    f"parameter {name!r} is bfloat16, which tecc does not compute: cast the "
                    "model to float32 or float16 (model.float())")

    def run(self) -> ImportedModel:
        ep = self.exported
        sig = ep.graph_signature
        state = {**ep.state_dict, **ep.constants}
        inputs: list[TensorSpec] = []
        params: list[Var] = []
        param_names: dict[int, str] = {}
        specs = {s.arg.name: s for s in sig.input_specs}
        graph = ep.graph_module.graph

        self._check_static_and_typed(graph, specs, state)
        unsupported = unsupported_calls(ep)
        if unsupported:
            raise UnsupportedOperatorError(unsupported)

        for node in graph.nodes:
            self.node = node
            if node.op == "placeholder":
                spec = specs[node.name]
                if spec.kind == InputKind.USER_INPUT:
                    val = node.meta["val"]
                    if not isinstance(val, torch.Tensor):
                        raise ImportError_(f"input {node.name!r} is not a tensor ({val!r}); "
                                           "only tensor inputs are supported")
                    ty = TensorType(tuple(int(d) for d in val.shape), torch_dtype_name(val.dtype))
                    var = Var(node.name, ty)
                    params.append(var)
                    inputs.append(TensorSpec(node.name, ty.shape, ty.dtype))
                    self.values[node.name] = var
                else:
                    tensor = state[spec.target]
                    const = Constant(tensor.detach().cpu().contiguous().numpy())
                    param_names[id(const)] = spec.target
                    self.values[node.name] = const
            elif node.op == "call_function":
                self.values[node.name] = self._convert(node)
            elif node.op == "output":
                outputs_raw = node.args[0]
        self.node = None

        user_outputs = [
            out for out, s in zip(outputs_raw, sig.output_specs, strict=True)
            if s.kind == OutputKind.USER_OUTPUT
        ]
        out_exprs = []
        leaf_indices: list[int | None] = []  # per output leaf: its tensor, or None
        for value in user_outputs:
            expr = self.values[value.name] if isinstance(value, torch.fx.Node) else value
            if expr is None:  # (hidden_states, None): torch.export keeps the None a leaf
                leaf_indices.append(None)
                continue
            if not isinstance(expr, Expr):
                raise ImportError_(f"model output {value!r} is not a tensor")
            leaf_indices.append(len(out_exprs))
            out_exprs.append(expr)
        if not out_exprs:
            raise ImportError_("the model returns no tensor")
        body = out_exprs[0] if len(out_exprs) == 1 else Tuple(out_exprs)
        func = Function(params, body)
        names = [f"output{i}" for i in range(len(out_exprs))]
        structure = treespec_to_structure(ep.call_spec.out_spec, iter(leaf_indices))
        for i, key in _leaf_names(structure):
            names[i] = key
        outputs = [TensorSpec(n, e.shape, e.dtype) for n, e in zip(names, out_exprs, strict=True)]
        return ImportedModel(func, inputs, outputs, structure, param_names)

    def _lookup(self, arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node):
            return self.values[arg.name]
        if isinstance(arg, list | tuple):
            return type(arg)(self._lookup(a) for a in arg)
        return arg

    def _convert(self, node: torch.fx.Node) -> Any:
        args = [self._lookup(a) for a in node.args]
        kwargs = {k: self._lookup(v) for k, v in node.kwargs.items()}
        if node.target is not operator.getitem and not _has_expr(args, kwargs):
            return self._evaluate(node, args, kwargs)
        if all(not isinstance(v, Expr) or isinstance(v, Constant) for v in _flat(args, kwargs)) \
                and node.target is not operator.getitem:
            return self._evaluate(node, args, kwargs)
        if node.target is operator.getitem:
            result = self._getitem(node, *args)
        else:
            convert = OPS.converter_for(str(node.target))
            assert convert is not None  # run() listed every unconvertible node
            result = convert(self, node, args, kwargs)
        self._check(node, result)
        return result

    def _getitem(self, node: torch.fx.Node, value: Any, index: int) -> Any:
        """An output of a multi-output op: a converter's Python tuple, or a tuple Expr."""
        if isinstance(value, tuple):
            item = value[index]
            if item is None:
                raise ImportError_(f"output {index} of {node.args[0].target} is not supported "
                                   f"(used at {source_location(node)})")
            return item
        return TupleGetItem(value, index)

    def _evaluate(self, node: torch.fx.Node, args: list, kwargs: dict) -> Any:
        """Constant-fold a call whose inputs are all known, with torch itself."""

        def to_torch(v: Any) -> Any:
            if isinstance(v, Constant):
                return torch.from_numpy(np.array(v.data))
            if isinstance(v, list | tuple):
                return type(v)(to_torch(a) for a in v)
            return v

        with torch.no_grad():
            out = node.target(*to_torch(args), **{k: to_torch(v) for k, v in kwargs.items()})
        if isinstance(out, torch.Tensor):
            return Constant(out.detach().contiguous().numpy())
        if isinstance(out, list | tuple):
            return tuple(Constant(o.detach().contiguous().numpy())
                         if isinstance(o, torch.Tensor) else o for o in out)
        return out

    def _check(self, node: torch.fx.Node, result: Any) -> None:
        """The converted expression must have the type torch.export recorded."""
        val = node.meta.get("val")
        pairs = []
        if isinstance(result, Expr) and isinstance(val, torch.Tensor):
            pairs.append((result, val))
        elif isinstance(result, tuple) and isinstance(val, list | tuple):
            pairs += [(r, v) for r, v in zip(result, val, strict=False)
                      if isinstance(r, Expr) and isinstance(v, torch.Tensor)]
        for expr, meta in pairs:
            want = (tuple(int(d) for d in meta.shape), torch_dtype_name(meta.dtype))
            got = (expr.shape, expr.dtype)
            if want != got:
                raise ImportError_(f"internal error converting {node.target} at "
                                   f"{source_location(node)}: produced {got}, torch has {want}")


def _flat(args: list, kwargs: dict) -> list:
    out: list = []
    stack = list(args) + list(kwargs.values())
    while stack:
        v = stack.pop()
        if isinstance(v, list | tuple):
            stack.extend(v)
        else:
            out.append(v)
    return out


def _has_expr(args: list, kwargs: dict) -> bool:
    return any(isinstance(v, Expr) for v in _flat(args, kwargs))


def treespec_to_structure(spec: Any, leaves) -> dict:
    """Turn a torch pytree TreeSpec into plan.md's output_structure (plain JSON)."""
    if spec.is_leaf():  # a tensor's index among the outputs, or None for a None leaf
        index = next(leaves)
        return {"kind": "none"} if index is None else {"kind": "tensor", "index": index}
    items = [treespec_to_structure(child, leaves) for child in spec.children()]
    node_type = spec.type
    if isinstance(spec.context, dict) and spec.context.get("_t") == "obj":
        # an object flattened by transformers' exporter (a DynamicCache): a dict of its
        # tensors named by their attribute paths ("layers.0.keys"), in leaf order
        paths = dict(_object_tensor_paths(spec.context))
        return {"kind": "dict", "keys": [paths[i] for i in range(len(items))], "items": items}
    if node_type is type(None):
        return {"kind": "none"}
    if node_type is list:
        return {"kind": "list", "items": items}
    if node_type is dict or isinstance(spec.context, list | tuple) and all(
            isinstance(k, str) for k in spec.context or ()) and node_type is not tuple:
        return {"kind": "dict", "keys": [str(k) for k in spec.context], "items": items}
    return {"kind": "tuple", "items": items}


def _object_tensor_paths(context: Any, prefix: str = ""):
    """(leaf index, attribute path) of every tensor in a context of transformers'
    pytree flattener ({"_t": "obj", "s": {attribute: ...}}, lists, {"_t": "tensor"})."""
    if isinstance(context, list):
        for i, item in enumerate(context):
            yield from _object_tensor_paths(item, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(context, dict):
        kind = context.get("_t")
        if kind == "tensor":
            yield context["i"], prefix
        elif kind == "obj":
            yield from _object_tensor_paths(context["s"], prefix)
        elif kind in ("seq", "map"):
            yield from _object_tensor_paths(context["v"], prefix)
        elif kind is None:
            for key, item in context.items():
                yield from _object_tensor_paths(item, f"{prefix}.{key}" if prefix else key)


def _leaf_names(structure: dict, prefix: str = ""):
    if structure["kind"] == "tensor":
        if prefix:
            yield structure["index"], prefix
    elif structure["kind"] == "dict":
        for key, item in zip(structure["keys"], structure["items"], strict=True):
            yield from _leaf_names(item, f"{prefix}.{key}" if prefix else key)
