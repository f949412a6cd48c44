"""Import a PyTorch model into the tecc IR.

The model is captured with torch.export, decomposed to core ATen, and each ATen
call is mapped by a converter registered here. Calls whose inputs are all constants
(buffers, arange, full, ...) are evaluated with torch at import time. Every
converted call is checked against the shape and dtype torch.export recorded.
"""

from __future__ import annotations

import collections
import operator
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tecc.frontend.ir import Call, Constant, Expr, Function, TensorType, Tuple, TupleGetItem, Var
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

Converter = Callable[["ImportContext", torch.fx.Node, list, dict], Any]
_CONVERTERS: dict[str, Converter] = {}


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
                     "so that converters can be added (frontend/importer.py).")
        super().__init__("\n".join(lines))


class ImportError_(ValueError):
    """A supported op was used in a way the importer does not handle."""


def converter(*targets: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for t in targets:
            _CONVERTERS[t] = fn
        return fn

    return register


def supported_aten_ops() -> list[str]:
    return sorted(_CONVERTERS)


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
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    model = model.eval()
    with torch.no_grad():
        exported = torch.export.export(model, tuple(example_inputs))
    return from_exported_program(exported)


def load_pt2(path: str | os.PathLike) -> ImportedModel:
    """Import a program saved with torch.export.save."""
    return from_exported_program(torch.export.load(os.fspath(path)))


def from_exported_program(exported: ExportedProgram) -> ImportedModel:
    exported = exported.run_decompositions()
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


class ImportContext:
    def __init__(self, exported: ExportedProgram) -> None:
        self.exported = exported
        self.values: dict[str, Any] = {}
        self.node: torch.fx.Node | None = None

    # Helpers used by converters -------------------------------------------------

    @property
    def span(self) -> str | None:
        return source_location(self.node) if self.node is not None else None

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

    def run(self) -> ImportedModel:
        ep = self.exported
        sig = ep.graph_signature
        state = {**ep.state_dict, **ep.constants}
        inputs: list[TensorSpec] = []
        params: list[Var] = []
        param_names: dict[int, str] = {}
        specs = {s.arg.name: s for s in sig.input_specs}
        graph = ep.graph_module.graph

        unsupported: dict[str, list[str]] = collections.defaultdict(list)
        for node in graph.nodes:
            if node.op == "call_function" and self._target_name(node) not in _CONVERTERS:
                if not self._all_constant_args(node, specs):
                    unsupported[self._target_name(node)].append(source_location(node))
        if unsupported:
            raise UnsupportedOperatorError(dict(unsupported))

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
        for value in user_outputs:
            expr = self.values[value.name] if isinstance(value, torch.fx.Node) else value
            if not isinstance(expr, Expr):
                raise ImportError_(f"model output {value!r} is not a tensor")
            out_exprs.append(expr)
        body = out_exprs[0] if len(out_exprs) == 1 else Tuple(out_exprs)
        func = Function(params, body)
        names = [f"output{i}" for i in range(len(out_exprs))]
        structure = treespec_to_structure(ep.call_spec.out_spec, iter(range(len(out_exprs))))
        for i, key in _leaf_names(structure):
            names[i] = key
        outputs = [TensorSpec(n, e.shape, e.dtype) for n, e in zip(names, out_exprs, strict=True)]
        return ImportedModel(func, inputs, outputs, structure, param_names)

    @staticmethod
    def _target_name(node: torch.fx.Node) -> str:
        if node.target is operator.getitem:
            return "getitem"
        return str(node.target)

    def _all_constant_args(self, node: torch.fx.Node, specs: dict) -> bool:
        """True when no user input flows into `node` (it will be evaluated by torch)."""
        stack = [a for a in node.all_input_nodes]
        seen = set()
        while stack:
            n = stack.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            if n.op == "placeholder" and specs[n.name].kind == InputKind.USER_INPUT:
                return False
            stack.extend(n.all_input_nodes)
        return True

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
        result = _CONVERTERS[self._target_name(node)](self, node, args, kwargs)
        self._check(node, result)
        return result

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
    if spec.is_leaf():
        return {"kind": "tensor", "index": next(leaves)}
    items = [treespec_to_structure(child, leaves) for child in spec.children()]
    node_type = spec.type
    if node_type is type(None):
        return {"kind": "none"}
    if node_type is list:
        return {"kind": "list", "items": items}
    if node_type is dict or isinstance(spec.context, list | tuple) and all(
            isinstance(k, str) for k in spec.context or ()) and node_type is not tuple:
        return {"kind": "dict", "keys": [str(k) for k in spec.context], "items": items}
    return {"kind": "tuple", "items": items}


def _leaf_names(structure: dict, prefix: str = ""):
    if structure["kind"] == "tensor":
        if prefix:
            yield structure["index"], prefix
    elif structure["kind"] == "dict":
        for key, item in zip(structure["keys"], structure["items"], strict=True):
            yield from _leaf_names(item, f"{prefix}.{key}" if prefix else key)


# ---------------------------------------------------------------- converters
# Each takes (ctx, node, args, kwargs) with fx nodes replaced by IR expressions
# and returns an Expr, or a Python tuple for multi-output ATen ops.


@converter("getitem")
def _getitem(ctx: ImportContext, node, args, kwargs):
    value, index = args
    if isinstance(value, tuple):
        item = value[index]
        if item is None:
            raise ImportError_(f"output {index} of {node.args[0].target} is not supported "
                               f"(used at {source_location(node)})")
        return item
    return TupleGetItem(value, index)


def _unary(op: str) -> Converter:
    return lambda ctx, node, args, kwargs: ctx.call(op, ctx.cast(args[0], ctx.out_dtype()))


for _aten, _op in {
    "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "erf": "erf", "exp": "exp",
    "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "neg": "negative", "abs": "abs",
    "reciprocal": "reciprocal", "silu": "silu", "hardswish": "hardswish",
    "hardsigmoid": "hardsigmoid",
}.items():
    converter(f"aten.{_aten}.default")(_unary(_op))


@converter("aten.clone.default", "aten.alias.default", "aten.detach.default",
           "aten.lift_fresh_copy.default", "aten.contiguous.default")
def _identity(ctx, node, args, kwargs):
    return args[0]


@converter("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
           "aten.sym_constrain_range_for_size.default")
def _assertion(ctx, node, args, kwargs):
    return None


@converter("aten._to_copy.default", "aten.to.dtype")
def _to_copy(ctx, node, args, kwargs):
    return ctx.cast(args[0], ctx.out_dtype())


@converter("aten.gelu.default")
def _gelu(ctx, node, args, kwargs):
    return ctx.call("gelu", args[0], approximate=kwargs.get("approximate", "none"))


@converter("aten.hardtanh.default")
def _hardtanh(ctx, node, args, kwargs):
    lo = args[1] if len(args) > 1 else -1.0
    hi = args[2] if len(args) > 2 else 1.0
    return ctx.call("clip", args[0], a_min=float(lo), a_max=float(hi))


@converter("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default")
def _clamp(ctx, node, args, kwargs):
    x = ctx.cast(args[0], ctx.out_dtype())
    name = str(node.target)
    lo = args[1] if len(args) > 1 and "clamp_max" not in name else kwargs.get("min")
    hi = (args[2] if len(args) > 2 else kwargs.get("max")) if "clamp_max" not in name else args[1]
    if "clamp_min" in name:
        hi = None
    if lo is not None and hi is not None:
        return ctx.call("clip", x, a_min=float(lo), a_max=float(hi))
    if lo is not None:
        x = ctx.call("maximum", x, ctx.expr(lo, like=x))
    if hi is not None:
        x = ctx.call("minimum", x, ctx.expr(hi, like=x))
    return x


@converter("aten.leaky_relu.default")
def _leaky_relu(ctx, node, args, kwargs):
    return ctx.call("leaky_relu", args[0], alpha=float(args[1]) if len(args) > 1 else 0.01)


def _binary(op: str, result_is_bool: bool = False) -> Converter:
    def convert(ctx: ImportContext, node, args, kwargs):
        a, b = args[0], args[1]
        if result_is_bool:
            dtype = _promoted_dtype(a, b)
        else:
            dtype = ctx.out_dtype()
        a = ctx.cast(ctx.expr(a, dtype=dtype), dtype)
        b = ctx.cast(ctx.expr(b, dtype=dtype), dtype)
        alpha = kwargs.get("alpha", 1)
        if alpha != 1:
            b = ctx.call("multiply", b, ctx.const(alpha, dtype))
        return ctx.call(op, a, b)

    return convert


def _promoted_dtype(a: Any, b: Any) -> str:
    def proxy(v: Any) -> Any:
        if isinstance(v, Expr):
            return torch.empty((1,) * max(len(v.shape), 1), dtype=getattr(torch, v.dtype))
        return v

    return torch_dtype_name(torch.result_type(proxy(a), proxy(b)))


for _aten, _op in {"add": "add", "sub": "subtract", "mul": "multiply", "maximum": "maximum",
                   "minimum": "minimum", "pow": "power"}.items():
    for _overload in ("Tensor", "Scalar", "Tensor_Scalar", "Tensor_Tensor", "default"):
        converter(f"aten.{_aten}.{_overload}")(_binary(_op))
for _aten, _op in {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
                   "gt": "greater", "ge": "greater_equal"}.items():
    for _overload in ("Tensor", "Scalar"):
        converter(f"aten.{_aten}.{_overload}")(_binary(_op, result_is_bool=True))


@converter("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(ctx, node, args, kwargs):
    mode = kwargs.get("rounding_mode")
    if mode is None:
        return _binary("divide")(ctx, node, args, {})
    if mode == "floor":
        return _binary("floor_divide")(ctx, node, args, {})
    raise ImportError_(f"division with rounding_mode={mode!r} is not supported "
                       f"({source_location(node)})")


@converter("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(ctx, node, args, kwargs):
    return _binary("subtract")(ctx, node, [args[1], args[0]], kwargs)


def _logical(op: str) -> Converter:
    def convert(ctx: ImportContext, node, args, kwargs):
        if ctx.out_dtype() != "bool":
            raise ImportError_(f"{node.target} on {ctx.out_dtype()} tensors is not supported "
                               f"({source_location(node)})")
        a = ctx.cast(ctx.expr(args[0], dtype="bool"), "bool")
        b = ctx.cast(ctx.expr(args[1], dtype="bool"), "bool")
        return ctx.call(op, a, b)

    return convert


converter("aten.bitwise_and.Tensor", "aten.logical_and.default")(_logical("logical_and"))
converter("aten.bitwise_or.Tensor", "aten.logical_or.default")(_logical("logical_or"))


@converter("aten.logical_not.default", "aten.bitwise_not.default")
def _logical_not(ctx, node, args, kwargs):
    return ctx.call("logical_not", ctx.cast(args[0], "bool"))


@converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
           "aten.where.Scalar")
def _where(ctx, node, args, kwargs):
    dtype = ctx.out_dtype()
    cond = ctx.cast(args[0], "bool")
    x = ctx.cast(ctx.expr(args[1], dtype=dtype), dtype)
    y = ctx.cast(ctx.expr(args[2], dtype=dtype), dtype)
    return ctx.call("where", cond, x, y)


@converter("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default")
def _full_like(ctx, node, args, kwargs):
    # Only the shape of the input matters: the result is a constant.
    value = {"aten.zeros_like.default": 0, "aten.ones_like.default": 1}.get(
        str(node.target), args[1] if len(args) > 1 else None)
    return Constant(np.full(ctx.out_shape(), value, dtype=ctx.out_dtype()))


# -- linear algebra


@converter("aten.addmm.default")
def _addmm(ctx, node, args, kwargs):
    bias, a, b = args[:3]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    product = ctx.call("nn.matmul", a, b)
    if alpha != 1:
        product = ctx.call("multiply", product, ctx.const(alpha, product.dtype))
    bias = ctx.expr(bias, like=product)
    if beta != 1:
        bias = ctx.call("multiply", bias, ctx.const(beta, product.dtype))
    return ctx.call("add", product, bias)


@converter("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(ctx, node, args, kwargs):
    return ctx.call("nn.matmul", args[0], args[1])


@converter("aten.linear.default")
def _linear(ctx, node, args, kwargs):
    out = ctx.call("nn.dense", args[0], args[1])
    if len(args) > 2 and args[2] is not None:
        out = ctx.call("add", out, ctx.expr(args[2], like=out))
    return out


@converter("aten.convolution.default")
def _convolution(ctx, node, args, kwargs):
    x, w, b, stride, padding, dilation, transposed, _output_padding, groups = args
    if transposed or len(stride) != 2:
        kind = "transposed" if transposed else f"{len(stride)}-d"
        raise UnsupportedOperatorError({f"aten.convolution ({kind})": [source_location(node)]})
    pads = (padding[0], padding[1], padding[0], padding[1])
    out = ctx.call("nn.conv2d", x, w, strides=tuple(stride), padding=pads,
                   dilation=tuple(dilation), groups=groups)
    if b is not None:
        out = ctx.call("nn.bias_add", out, ctx.expr(b), axis=1)
    return out


@converter("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(ctx, node, args, kwargs):
    x, w, b, mean, var, _momentum, eps = args
    c = x.shape[1]
    w = ctx.expr(w) if w is not None else ctx.const(np.ones(c), x.dtype)
    b = ctx.expr(b) if b is not None else ctx.const(np.zeros(c), x.dtype)
    out = ctx.call("nn.batch_norm", x, w, b, ctx.expr(mean), ctx.expr(var), epsilon=float(eps))
    return (out, None, None)


@converter("aten.native_layer_norm.default")
def _layer_norm(ctx, node, args, kwargs):
    x, normalized_shape, w, b, eps = args
    if len(normalized_shape) != 1:
        raise ImportError_(f"layer_norm over {len(normalized_shape)} axes is not supported "
                           f"({source_location(node)})")
    c = x.shape[-1]
    w = ctx.expr(w) if w is not None else ctx.const(np.ones(c), x.dtype)
    b = ctx.expr(b) if b is not None else ctx.const(np.zeros(c), x.dtype)
    return (ctx.call("nn.layer_norm", x, w, b, epsilon=float(eps)), None, None)


@converter("aten._softmax.default", "aten._log_softmax.default")
def _softmax(ctx, node, args, kwargs):
    op = "nn.log_softmax" if "log" in str(node.target) else "nn.softmax"
    return ctx.call(op, args[0], axis=args[1])


# -- pooling and reductions


def _pair(v: Sequence[int] | int, n: int = 2) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    return tuple(v * n if len(v) == 1 else v)


@converter("aten.max_pool2d_with_indices.default")
def _max_pool(ctx, node, args, kwargs):
    x, kernel = args[0], _pair(args[1])
    stride = _pair(args[2]) if len(args) > 2 and args[2] else kernel
    pad = _pair(args[3]) if len(args) > 3 else (0, 0)
    dilation = _pair(args[4]) if len(args) > 4 else (1, 1)
    ceil = bool(args[5]) if len(args) > 5 else False
    out = ctx.call("nn.max_pool2d", x, pool_size=kernel, strides=stride,
                   padding=(pad[0], pad[1], pad[0], pad[1]), dilation=dilation, ceil_mode=ceil)
    return (out, None)


@converter("aten.avg_pool2d.default")
def _avg_pool(ctx, node, args, kwargs):
    x, kernel = args[0], _pair(args[1])
    stride = _pair(args[2]) if len(args) > 2 and args[2] else kernel
    pad = _pair(args[3]) if len(args) > 3 else (0, 0)
    ceil = bool(args[4]) if len(args) > 4 else False
    include = bool(args[5]) if len(args) > 5 else True
    if len(args) > 6 and args[6] is not None:
        raise ImportError_(f"avg_pool2d with divisor_override is not supported "
                           f"({source_location(node)})")
    return ctx.call("nn.avg_pool2d", x, pool_size=kernel, strides=stride,
                    padding=(pad[0], pad[1], pad[0], pad[1]), ceil_mode=ceil,
                    count_include_pad=include)


@converter("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool(ctx, node, args, kwargs):
    return ctx.call("nn.adaptive_avg_pool2d", args[0], output_size=ctx.out_shape()[-2:])


def _reduction(op: str) -> Converter:
    def convert(ctx: ImportContext, node, args, kwargs):
        x = args[0]
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if isinstance(dims, int):
            dims = [dims]
        axis = None if dims is None or len(dims) == 0 else tuple(dims)
        return ctx.call(op, ctx.cast(x, ctx.out_dtype()), axis=axis, keepdims=bool(keepdim))

    return convert


converter("aten.mean.dim", "aten.mean.default")(_reduction("mean"))
converter("aten.sum.dim_IntList", "aten.sum.default")(_reduction("sum"))
converter("aten.amax.default", "aten.max.default")(_reduction("max"))
converter("aten.amin.default", "aten.min.default")(_reduction("min"))
converter("aten.prod.dim_int", "aten.prod.default")(_reduction("prod"))


@converter("aten.any.dim", "aten.any.dims", "aten.any.default")
def _any(ctx, node, args, kwargs):
    as_int = ctx.cast(args[0], "int32")
    dims = args[1] if len(args) > 1 else None
    if isinstance(dims, int):
        dims = [dims]
    keepdim = bool(args[2]) if len(args) > 2 else False
    axis = None if not dims else tuple(dims)
    reduced = ctx.call("max", as_int, axis=axis, keepdims=keepdim)
    return ctx.call("not_equal", reduced, ctx.const(0, "int32"))


@converter("aten.var.correction", "aten.var.dim")
def _var(ctx, node, args, kwargs):
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    correction = kwargs.get("correction", 1)
    if correction is None:
        correction = 1
    keepdim = kwargs.get("keepdim", False)
    axis = None if not dims else tuple(dims)
    return ctx.call("variance", args[0], axis=axis, keepdims=keepdim, correction=int(correction))


# -- data movement


@converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
           "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
           "aten.squeeze.default", "aten.flatten.using_ints")
def _reshape(ctx, node, args, kwargs):
    x, shape = args[0], ctx.out_shape()
    return x if x.shape == shape else ctx.call("reshape", x, newshape=shape)


@converter("aten.permute.default")
def _permute(ctx, node, args, kwargs):
    axes = tuple(a % len(args[0].shape) for a in args[1])
    if axes == tuple(range(len(axes))):
        return args[0]
    return ctx.call("transpose", args[0], axes=axes)


@converter("aten.t.default", "aten.transpose.int")
def _transpose(ctx, node, args, kwargs):
    x = args[0]
    axes = list(range(x.tensor_type.ndim))
    d0, d1 = (args[1], args[2]) if len(args) > 2 else (0, 1)
    if axes:
        axes[d0], axes[d1] = axes[d1], axes[d0]
    return ctx.call("transpose", x, axes=tuple(axes))


@converter("aten.expand.default")
def _expand(ctx, node, args, kwargs):
    x, shape = args[0], ctx.out_shape()
    return x if x.shape == shape else ctx.call("broadcast_to", x, shape=shape)


@converter("aten.slice.Tensor")
def _slice(ctx, node, args, kwargs):
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


@converter("aten.select.int")
def _select(ctx, node, args, kwargs):
    x, dim, index = args
    index = index % x.shape[dim]
    sliced = ctx.call("strided_slice", x, begin=(index,), end=(index + 1,), strides=(1,),
                      axes=(dim,))
    return ctx.call("reshape", sliced, newshape=ctx.out_shape())


@converter("aten.cat.default", "aten.concat.default")
def _cat(ctx, node, args, kwargs):
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    dtype = ctx.out_dtype()
    parts = [ctx.cast(ctx.expr(t), dtype) for t in args[0] if t.tensor_type.size > 0]
    return ctx.call("concatenate", *parts, axis=dim)


@converter("aten.split_with_sizes.default", "aten.split.Tensor")
def _split(ctx, node, args, kwargs):
    x, sizes = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    if isinstance(sizes, int):
        full = x.shape[dim]
        sizes = [min(sizes, full - i) for i in range(0, full, sizes)]
    parts = ctx.call("split", x, sizes=tuple(sizes), axis=dim)
    return tuple(TupleGetItem(parts, i) for i in range(len(sizes)))


@converter("aten.embedding.default")
def _embedding(ctx, node, args, kwargs):
    return ctx.call("take", args[0], args[1], axis=0)


@converter("aten.index_select.default")
def _index_select(ctx, node, args, kwargs):
    return ctx.call("take", args[0], args[2], axis=args[1])


@converter("aten.index.Tensor")
def _index(ctx, node, args, kwargs):
    """Advanced indexing by constant index tensors on leading axes: one `take`
    over the flattened indexed axes with the flat indices folded now."""
    x, indices = args
    k = len(indices)
    if any(not isinstance(i, Constant) for i in indices) or k > len(x.shape):
        raise ImportError_("indexing with computed index tensors is not supported "
                           f"({source_location(node)})")
    lead = x.shape[:k]
    grids = np.broadcast_arrays(*[np.asarray(i.data) % d for i, d in zip(indices, lead,
                                                                           strict=True)])
    flat = np.ravel_multi_index(tuple(grids), lead).astype("int64")
    merged = ctx.call("reshape", x, newshape=(int(np.prod(lead)),) + x.shape[k:])
    return ctx.call("take", merged, Constant(flat), axis=0)
