"""Partitioning: compile(..., fallback="torch") for a model with ops tecc cannot import.

The model's torch.export graph (core ATen, as the importer sees it) is split by torch's
CapabilityBasedPartitioner into maximal connected regions of nodes that have a
converter. Each region large enough to be worth a call (MIN_COMPUTE_OPS) is compiled by
tecc as its own model, the region's constant inputs (weights, and what is computed from
them alone, folded once here as the importer would) frozen in; the rest of the graph
runs in torch. The glue is the FX graph itself: its regions are call_module nodes whose
modules call the compiled models with torch tensors (the CPU executor reads and returns
numpy views of them, the CUDA executor reads torch's GPU tensors in place through DLPack).
"""

from __future__ import annotations

import collections
import operator
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.node import _get_qualified_name
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from tecc.frontend.importer import (
    ImportError_,
    TensorSpec,
    UnsupportedOperatorError,
    check_static_and_typed,
    convertible,
    data_dependent_shape,
    decomposition_table,
    export_program,
    source_location,
    torch_dtype_name,
    unsupported_calls,
)
from tecc.frontend.types import IRTypeError

if TYPE_CHECKING:
    from tecc.api import CompiledModel

# A region compiles when it holds at least two compute ops (NON_COMPUTE_OPS: views,
# reshapes, getitem do not count) or one of HEAVY_OPS (the partitioner's rule without
# single-node partitions): a lone elementwise op or view between two torch ops stays in
# torch, where the call into the executor and back would cost more than the op itself.
HEAVY_OPS = ("aten.convolution.default", "aten.mm.default", "aten.addmm.default",
             "aten.bmm.default", "aten.native_layer_norm.default", "aten._softmax.default")
NON_COMPUTE_OPS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
                   "aten.permute.default", "aten.t.default", "aten.transpose.int",
                   "aten.expand.default", "aten.squeeze.default", "aten.squeeze.dim",
                   "aten.squeeze.dims", "aten.unsqueeze.default", "aten.slice.Tensor",
                   "aten.select.int", "aten.alias.default", "aten.clone.default",
                   "aten.contiguous.default", "aten.detach.default",
                   "aten.flatten.using_ints", "aten.lift_fresh_copy.default",
                   "aten._assert_tensor_metadata.default", "aten._assert_scalar.default")
# what tecc.compile raises for a graph it cannot compile (the region then runs in torch)
NOT_COMPILABLE = (UnsupportedOperatorError, ImportError_, IRTypeError, NotImplementedError)


def _qualified(names: Sequence[str]) -> list[str]:
    """The partitioner's spelling of ATen op names: torch.ops.aten.x.overload."""
    return [f"torch.ops.{n}" for n in names]


class TorchFallbackError(RuntimeError):
    """What a model with ops running in torch cannot do (a deployment package)."""


class ConverterSupport(OperatorSupportBase):
    """The nodes tecc compiles: calls with a converter in the op registry whose inputs
    are tensors (a Python scalar torch computes, e.g. by .item(), is none), and getitem
    when the call it reads from is compiled too."""

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or not convertible(node):
            return False
        if data_dependent_shape(node) or any(data_dependent_shape(n)
                                             for n in node.all_input_nodes):
            return False  # a shape known only at run time: torch computes it
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, torch.fx.Node) and self.is_node_supported(submodules,
                                                                                source)
        return all(isinstance(n.meta.get("val"), torch.Tensor) for n in node.all_input_nodes)


class FrozenInputs(torch.nn.Module):
    """A graph module with some inputs fixed (tensors as buffers, sizes as ints):
    torch.export then sees constants, and the other inputs stay the module's, in order."""

    def __init__(self, gm: torch.fx.GraphModule, fixed: dict[int, Any], count: int) -> None:
        super().__init__()
        self.gm = gm
        self.count = count
        self.sizes = {i: v for i, v in fixed.items() if not isinstance(v, torch.Tensor)}
        self.tensor_slots = sorted(i for i, v in fixed.items() if isinstance(v, torch.Tensor))
        for i in self.tensor_slots:
            self.register_buffer(f"static_{i}", fixed[i].detach(), persistent=False)

    def forward(self, *given: torch.Tensor) -> Any:
        rest = iter(given)
        args = [self.sizes[i] if i in self.sizes else
                getattr(self, f"static_{i}") if i in self.tensor_slots else next(rest)
                for i in range(self.count)]
        return self.gm(*args)


def real_tensor(x: torch.Tensor) -> torch.Tensor:
    """A real tensor like `x` (a fake one from torch.export or Dynamo): compiling needs
    shapes and dtypes only, and random values that are never all zeros."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(x, FakeTensor):
        return x
    if x.dtype.is_floating_point:
        return torch.randn(tuple(x.shape), dtype=x.dtype)
    return torch.ones(tuple(x.shape), dtype=x.dtype)


@dataclass
class Region:
    """A connected set of nodes tecc compiles as one model."""

    name: str  # its call_module target in the glue graph
    module: FrozenInputs  # the region's graph, its constant inputs frozen in
    example_inputs: tuple[torch.Tensor, ...]
    ops: dict[str, int]  # ATen op -> uses


@dataclass
class Partitioning:
    """A model's graph split into regions for tecc and the ops torch runs."""

    glue: torch.fx.GraphModule  # the model: placeholders are its inputs, in order
    regions: list[Region]
    unsupported: dict[str, list[str]]  # op without a converter -> its source lines
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    out_spec: Any  # the pytree spec of the model's outputs
    timings: dict[str, float] = field(default_factory=dict)

    def torch_ops(self) -> dict[str, int]:
        """The ops the glue runs in torch, and how often per call: its own calls and
        those of the regions not (or not yet) compiled."""
        counts = collections.Counter(_op_counts(self.glue.graph.nodes))
        for region in self.regions:
            if isinstance(getattr(self.glue, region.name), FrozenInputs):
                counts.update(region.ops)
        return dict(sorted(counts.items()))


def _op_counts(nodes: Any) -> dict[str, int]:
    counts = collections.Counter(str(n.target) for n in nodes if n.op == "call_function"
                                 and _get_qualified_name(n.target) != "_operator.getitem")
    return dict(sorted(counts.items()))


def exported_program(model: torch.nn.Module | str | os.PathLike | ExportedProgram,
                     example_inputs: Sequence[Any] | None) -> ExportedProgram:
    """The core-ATen program the importer would import (checked for what no region
    could change: dynamic input shapes, bfloat16; data-dependent shapes stay in torch)."""
    if isinstance(model, str | os.PathLike):
        exported = torch.export.load(os.fspath(model))
    elif isinstance(model, ExportedProgram):
        exported = model
    elif example_inputs is None:
        raise ValueError("example_inputs are needed to compile a torch.nn.Module")
    else:
        exported = export_program(model, example_inputs)
    exported = exported.run_decompositions(decomposition_table())
    check_static_and_typed(exported, data_dependent=True)
    return exported


def _glue_graph(exported: ExportedProgram) -> torch.fx.GraphModule:
    """The program's graph with its parameters, buffers and constants as attributes
    (get_attr nodes), the user inputs as its placeholders and the user outputs as its
    output (a flat tuple)."""
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    sig = exported.graph_signature
    kinds = {s.arg.name: s for s in sig.input_specs}
    state = {**exported.state_dict, **exported.constants}
    for node in exported.graph.nodes:
        if node.op == "placeholder" and kinds[node.name].kind != InputKind.USER_INPUT:
            name = node.name
            root.register_buffer(name, state[kinds[node.name].target].detach(),
                                 persistent=False)
            env[node] = graph.get_attr(name)
            env[node].meta = dict(node.meta)
        elif node.op == "output":
            user = [out for out, s in zip(node.args[0], sig.output_specs, strict=True)
                    if s.kind == OutputKind.USER_OUTPUT]
            graph.output(tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in user))
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    return torch.fx.GraphModule(root, graph)


def _fold_constants(gm: torch.fx.GraphModule) -> None:
    """Evaluate, once and with torch, the calls that read constants alone (weight
    transposes, arange, ...): as the importer folds them, and so that every region
    takes at least one input of the model."""
    values: dict[torch.fx.Node, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            values[node] = getattr(gm, node.target)
        elif node.op == "call_function" and all(n in values for n in node.all_input_nodes):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
            with torch.no_grad():
                values[node] = node.target(*args, **kwargs)
    for node in list(values):
        if node.op != "call_function" or not isinstance(values[node], torch.Tensor):
            continue
        if all(user in values for user in node.users):
            continue  # read by folded calls alone
        name = f"folded_{node.name}"
        gm.register_buffer(name, values[node].detach().contiguous(), persistent=False)
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
    gm.graph.eliminate_dead_code()
    _drop_unused_attributes(gm)


def _drop_unused_attributes(gm: torch.fx.GraphModule) -> None:
    used = {n.target for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    for name in [n for n, _ in gm.named_buffers(recurse=False)] + [
            n for n, _ in gm.named_children()]:
        if name not in used:
            delattr(gm, name)


def partition(exported: ExportedProgram) -> Partitioning:
    """Split an exported program (exported_program's) into regions and torch ops."""
    start = time.perf_counter()
    glue = _glue_graph(exported)
    _fold_constants(glue)
    placeholders = [n for n in glue.graph.nodes if n.op == "placeholder"]
    for n in placeholders:
        if not isinstance(n.meta.get("val"), torch.Tensor):
            raise ImportError_(f"input {n.name!r} is not a tensor ({n.meta.get('val')!r}); "
                               "only tensor inputs are supported")
    inputs = [TensorSpec(n.name, tuple(int(d) for d in n.meta["val"].shape),
                         torch_dtype_name(n.meta["val"].dtype)) for n in placeholders]
    outputs = [TensorSpec(f"output{i}", tuple(int(d) for d in v.shape), torch_dtype_name(v.dtype))
               for i, v in enumerate(_output_vals(glue))]
    support = ConverterSupport()
    unsupported: dict[str, list[str]] = collections.defaultdict(list)
    for node in glue.graph.nodes:
        if node.op == "call_function" and not convertible(node):
            unsupported[str(node.target)].append(source_location(node))
    partitioner = CapabilityBasedPartitioner(
        glue, support, allows_single_node_partition=False,
        non_compute_ops=_qualified(NON_COMPUTE_OPS),
        allowed_single_node_partition_ops=_qualified(HEAVY_OPS))
    position = {n: i for i, n in enumerate(glue.graph.nodes)}
    proposed = sorted(partitioner.propose_partitions(),  # numbered in the model's order
                      key=lambda p: min(position[n] for n in p.nodes))
    fused = partitioner.fuse_partitions(proposed, prefix="region_") if proposed else glue
    calls = {n.target: n for n in fused.graph.nodes if n.op == "call_module"}
    regions = []
    for index, proposal in enumerate(proposed):  # the fuser names them region_<index>
        node = calls[f"region_{index}"]
        sub = getattr(fused, node.target)
        fixed = {i: getattr(fused, a.target) for i, a in enumerate(node.args)
                 if isinstance(a, torch.fx.Node) and a.op == "get_attr"}
        given = [a for i, a in enumerate(node.args) if i not in fixed]
        # the fuser gives its getitem nodes the meta of the outputs they stand for
        examples = tuple(real_tensor(a.meta["val"]) for a in given)
        frozen = FrozenInputs(sub, fixed, len(node.args)).eval()
        regions.append(Region(node.target, frozen, examples, _op_counts(proposal.nodes)))
        # the constants are the region's own now; until it is compiled, torch runs it
        fused.add_submodule(node.target, frozen)
        node.args = tuple(given)
    fused.graph.eliminate_dead_code()
    _drop_unused_attributes(fused)
    fused.recompile()
    timings = {"partition_s": time.perf_counter() - start}
    return Partitioning(fused, regions, dict(unsupported), inputs, outputs,
                        exported.call_spec.out_spec, timings)


def _output_vals(gm: torch.fx.GraphModule) -> list[Any]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [o.meta["val"] if isinstance(o, torch.fx.Node) else torch.as_tensor(o)
            for o in out.args[0]]


class CompiledRegion(torch.nn.Module):
    """A region in the glue graph: its compiled model, called with torch tensors."""

    def __init__(self, compiled: Any) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.compiled(*inputs)


def openmp_spin_hint() -> str:
    """Advice for a CPU process where torch's OpenMP workers started before tecc with
    their default spin (tecc.OPENMP_SPINS_LONG), else ""."""
    import tecc

    if not tecc.OPENMP_SPINS_LONG:
        return ""
    return ("torch was imported before tecc, so its OpenMP threads spin for milliseconds "
            "after each of its ops on the cores tecc's kernels run on next, which slows both "
            "where they run in turn: set GOMP_SPINCOUNT="
            f"{tecc.OPENMP_SPIN_COUNT} in the environment before Python starts, or import "
            "tecc before torch (ResNet-18 with a graph break after each stage, 2 cores: "
            "50 -> 25 ms)")


class PartitionedModel:
    """A model compiled by tecc in regions, the ops tecc cannot compile run in torch
    between them (compile(..., fallback="torch")). Called as a CompiledModel: torch
    tensors (or numpy arrays) in the order of the model's inputs; outputs come back as
    the model returns them. `torch_ops` names the ops torch runs; a warning names them
    at the first call. It cannot be exported as a deployment package (the TVM runtime
    alone cannot run torch's ops)."""

    def __init__(self, parts: Partitioning, regions: list[Any], failed: dict[str, str],
                 target: Any, timings: dict[str, float]) -> None:
        self.glue = parts.glue
        self.partitioning = parts
        self.regions = regions  # CompiledModel per compiled region
        self.failed = failed  # region -> why tecc did not compile it (it runs in torch)
        self.target_info = target
        self.target = target.tvm_target
        self.timings = timings
        self.records_digest = next((r.records_digest for r in regions), None)
        self._warned = False
        self._on_device = not target.is_gpu

    @property
    def torch_ops(self) -> dict[str, int]:
        """The ATen ops that run in torch, and how often per call."""
        return self.partitioning.torch_ops()

    @property
    def unsupported_ops(self) -> dict[str, int]:
        """Those of torch_ops without a converter in tecc (the others sit in regions too
        small to compile, or in a region tecc failed to compile: see `failed`)."""
        return {op: len(places) for op, places in sorted(self.partitioning.unsupported.items())}

    @property
    def input_specs(self) -> list[dict]:
        return [s.to_json() for s in self.partitioning.inputs]

    @property
    def output_specs(self) -> list[dict]:
        return [s.to_json() for s in self.partitioning.outputs]

    @property
    def device(self) -> torch.device:
        """Where the glue's tensors live: the CPU, or the GPU of a cuda target."""
        return torch.device("cuda" if self.target_info.is_gpu else "cpu")

    def fallback_message(self) -> str:
        ops = ", ".join(f"{op} x{n}" for op, n in self.torch_ops.items())
        why = [f"{len(self.unsupported_ops)} without a converter "
               f"({', '.join(self.unsupported_ops)})"] if self.unsupported_ops else []
        why += [f"{name} not compiled: {reason}" for name, reason in self.failed.items()]
        spin = "" if self.target_info.is_gpu else openmp_spin_hint()
        return (f"tecc: {sum(self.torch_ops.values())} op call(s) of this model run in torch "
                f"(fallback=\"torch\"): {ops}; {'; '.join(why) or 'regions too small'}; "
                f"{len(self.regions)} region(s) are compiled by tecc" + (f"; {spin}" if spin else ""))

    def __call__(self, *inputs: Any) -> Any:
        if not self._warned:
            self._warned = True
            warnings.warn(self.fallback_message(), stacklevel=2)
        specs = self.partitioning.inputs
        if len(inputs) != len(specs):
            expected = ", ".join(f"{s.name}: {s.shape} {s.dtype}" for s in specs)
            raise ValueError(f"expected {len(specs)} input(s) ({expected}), got {len(inputs)}")
        if not self._on_device:
            self._move_glue()
        as_numpy = not any(isinstance(x, torch.Tensor) for x in inputs)
        tensors = [self._checked(i, x) for i, x in enumerate(inputs)]
        with torch.no_grad():
            flat = self.glue(*tensors)
        if as_numpy:
            flat = [f.cpu().numpy() if isinstance(f, torch.Tensor) else f for f in flat]
        return pytree.tree_unflatten(list(flat), self.partitioning.out_spec)

    def _move_glue(self) -> None:
        """The glue's constants onto the GPU of a cuda target, at the first call (the
        model builds without one)."""
        if not torch.cuda.is_available():
            from tecc.runtime.cuda import CudaError

            raise CudaError(
                f"this model was compiled for {self.target_info.kind}:{self.target_info.arch} "
                "and its torch ops run on the GPU, where torch sees none "
                "(torch.cuda.is_available() is False: no GPU, or a torch without CUDA). "
                "Call it on the machine with the GPU, or compile for llvm")
        self.glue.to(self.device)
        self._on_device = True

    def _checked(self, i: int, x: Any) -> torch.Tensor:
        spec = self.partitioning.inputs[i]
        tensor = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"inputs must be torch tensors or numpy arrays, got "
                            f"{type(x).__name__}")
        if tuple(tensor.shape) != spec.shape or torch_dtype_name(tensor.dtype) != spec.dtype:
            raise ValueError(f"input {spec.name!r} (#{i}): expected shape {spec.shape} "
                             f"{spec.dtype}, got {tuple(tensor.shape)} "
                             f"{torch_dtype_name(tensor.dtype)}")
        return tensor.to(self.device)

    def _refuse(self, what: str) -> TorchFallbackError:
        return TorchFallbackError(
            f"{what} runs with the TVM runtime alone, and this model runs "
            f"{', '.join(self.torch_ops)} in torch (compiled with fallback=\"torch\"). "
            "Replace those ops in the model with supported ones (or add converters, "
            "frontend/op_defs/) and compile with fallback=\"strict\" to export it; "
            "serving it as it is needs torch in the process that calls it")

    def export(self, path: str | os.PathLike) -> None:
        """Refused: see the class."""
        raise self._refuse("a deployment package")

    def export_python_package(self, out_dir: str | os.PathLike, name: str,
                              version: str = "1.0") -> None:
        """Refused: see the class."""
        raise self._refuse("a deployment wheel")

    def kernels(self) -> dict[str, Any]:
        """The built kernels of all regions, named region.kernel."""
        return {f"{r.region_name}.{name}": k for r in self.regions
                for name, k in r.build_result.kernels.items()}

    def tasks(self) -> list[dict]:
        """The tuning tasks of the compiled regions (CompiledModel.tasks)."""
        from tecc.tuning import task_table

        return task_table(self.kernels())

    def tuning_report(self) -> str:
        from tecc.api import CompiledModel

        return CompiledModel.tuning_report(self)  # type: ignore[arg-type]

    def summary(self) -> Any:
        """The regions' kernels and memory, and the ops that run in torch."""
        from tecc.summary import summarize_partitioned

        return summarize_partitioned(self)

    def astext(self) -> str:
        """Each region's optimized IR, and the glue graph."""
        parts = [f"# {r.region_name}\n{r.astext()}" for r in self.regions]
        return "\n\n".join([*parts, f"# torch glue\n{self.glue.code.strip()}"])

    def __repr__(self) -> str:
        return (f"PartitionedModel({len(self.regions)} compiled region(s), "
                f"{sum(self.torch_ops.values())} op call(s) in torch, target={self.target})")


def compile_with_fallback(model: torch.nn.Module | str | os.PathLike | ExportedProgram,
                          example_inputs: Sequence[Any] | None, target: str = "llvm",
                          opt_level: int = 3, print_after: Sequence[str] | None = None,
                          records: Any = None, winograd: bool = True,
                          cuda_graph: bool = True) -> CompiledModel | PartitionedModel:
    """tecc.compile(..., fallback="torch"): a CompiledModel when tecc imports every op,
    else a PartitionedModel."""
    from tecc.api import compile_strict
    from tecc.target import target_info
    from tecc.tuning import warn_untuned

    start = time.perf_counter()
    exported = exported_program(model, example_inputs)
    export_s = time.perf_counter() - start
    options = dict(target=target, opt_level=opt_level, print_after=print_after,
                   records=records, winograd=winograd, cuda_graph=cuda_graph)
    if _all_convertible(exported):
        return compile_strict(exported, None, **options)
    parts = partition(exported)
    compiled, failed = [], {}
    for region in parts.regions:
        try:
            built = compile_strict(region.module, region.example_inputs, **options,
                                   warn_records=False)
        except NOT_COMPILABLE as err:
            # the region's FrozenInputs stays in the glue: torch runs it
            failed[region.name] = str(err).strip().splitlines()[0] or type(err).__name__
            continue
        built.region_name = region.name
        parts.glue.add_submodule(region.name, CompiledRegion(built))
        compiled.append(built)
    parts.glue.recompile()
    timings = {"export_s": export_s, **parts.timings}
    for built in compiled:
        for key, value in built.timings.items():
            timings[key] = timings.get(key, 0.0) + value
    result = PartitionedModel(parts, compiled, failed, target_info(target), timings)
    if records and compiled:
        unapplied: collections.Counter[str] = collections.Counter()
        for c in compiled:
            unapplied.update(c.unapplied_records)
        warn_untuned(result.tasks(), unapplied)
    return result


def _all_convertible(exported: ExportedProgram) -> bool:
    """Whether the strict import takes the whole program (its op check passes, no
    shape depends on the data)."""
    return not unsupported_calls(exported) and not any(
        data_dependent_shape(n) for n in exported.graph.nodes)


def region_graphs(model: torch.nn.Module | str | os.PathLike | ExportedProgram,
                  example_inputs: Sequence[Any] | None) -> list[tuple[Any, Sequence[Any] | None]]:
    """What compile(..., fallback="torch") compiles, as (model, example inputs) pairs:
    the model itself when tecc imports every op, else its regions (tune tunes them)."""
    exported = exported_program(model, example_inputs)
    if _all_convertible(exported):
        return [(exported, None)]
    return [(r.module, r.example_inputs) for r in partition(exported).regions]
