"""tecc as a torch.compile backend, for inference:

    model = torch.compile(model, backend="tecc", options={"target": "llvm",
                                                           "records": "tuning_logs/"})

(registered through the `torch_dynamo_backends` entry point). Each graph Dynamo hands
over is compiled by tecc.compile with its parameters frozen in as constants (Dynamo
passes them as graph inputs; tecc packs and folds weights, so it takes them as they are
at the first call: a model whose weights change afterwards must be compiled again, as
with TorchInductor's freezing). Dynamo hands over one graph for every instance of a
module whose code and shapes are the same (a block repeated N times, broken by a graph
break), with each instance's weights as inputs and no guard on which weights they are:
the graph therefore keeps one tecc build per set of weights met (told apart by their
storage), made at their first call. Compiled graphs are cached by Dynamo, which
recompiles for new shapes and dtypes (its guards). A graph with ops tecc cannot import is compiled
with fallback="torch": tecc compiles its regions of supported ops and those ops run in
torch between them (tecc.partition; a warning at the first call names them). A graph
tecc cannot compile otherwise (no region worth compiling, a dynamic or data-dependent
shape, an input that is no tensor) runs in torch, with a warning naming why; graph
breaks are Dynamo's.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tecc.frontend.importer import UnsupportedOperatorError
from tecc.partition import NOT_COMPILABLE, FrozenInputs, openmp_spin_hint, real_tensor

OPTIONS = ("target", "records", "winograd", "opt_level")


def _is_static(x: Any) -> bool:
    return isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type",
                                                        None) is not None


_cpu_graphs = 0


def _note_cpu_graph() -> None:
    """Warn once, at a process's second CPU graph (Dynamo split the model: torch runs
    between tecc's graphs), where torch's OpenMP threads spin long (openmp_spin_hint)."""
    global _cpu_graphs
    _cpu_graphs += 1
    if _cpu_graphs == 2 and (hint := openmp_spin_hint()):
        warnings.warn(f"tecc backend: several graphs run on the CPU with torch between them; "
                      f"{hint}", stacklevel=4)


def _compile(gm: torch.fx.GraphModule, inputs: Sequence[Any], fixed: dict[int, Any],
             options: dict[str, Any]) -> Callable[..., Any] | None:
    """tecc's build of `gm` with the inputs `fixed` frozen in, called with all of the
    graph's inputs; None (and a warning why) when tecc cannot compile it."""
    import tecc

    given = [i for i in range(len(inputs)) if i not in fixed]
    module = FrozenInputs(gm, fixed, len(inputs)).eval()
    try:
        compiled = tecc.compile(module, tuple(real_tensor(inputs[i]) for i in given),
                                fallback="torch", **options)
        if not getattr(compiled, "regions", True):  # partitioned, and nothing compiled
            raise UnsupportedOperatorError(compiled.partitioning.unsupported)
    except NOT_COMPILABLE as err:
        if isinstance(err, UnsupportedOperatorError):
            first = f"tecc cannot import {', '.join(sorted(err.unsupported))}"
        else:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        warnings.warn(f"tecc backend: a graph of {len(gm.graph.nodes)} nodes runs in torch: "
                      f"{first}", stacklevel=3)
        return None

    if not compiled.target_info.is_gpu:
        _note_cpu_graph()

    def run(*args: Any) -> Any:
        return compiled(*[args[i] for i in given])

    # True, or "partitioned": a graph with ops tecc cannot import, compiled in regions
    run.compiled = "partitioned" if compiled.torch_ops else True  # type: ignore[attr-defined]
    return run


def tecc_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The torch.compile backend: `options` takes tecc.compile's target, records,
    winograd and opt_level."""

    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"tecc backend: unknown option(s) {unknown}; it takes {OPTIONS}")
    static = sorted(i for i, x in enumerate(example_inputs) if _is_static(x))
    # Dynamic: a graph Dynamo made dynamic (sizes as SymInt inputs), built per set of sizes
    dynamic = not all(isinstance(x, torch.Tensor) for x in example_inputs)
    # one build per set of weights (see the module docstring) and sizes, made at its
    # first call; None: tecc cannot compile the graph (a warning said why)
    builds: dict[tuple, Callable[..., Any] | None] = {}

    def build_for(args: Sequence[Any]) -> Callable[..., Any] | None:
        key = tuple(args[i].data_ptr() for i in static)
        if dynamic:
            key += tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                         for i, a in enumerate(args) if i not in static)
        if key not in builds:
            fixed = {i: args[i] for i in static}
            fixed.update({i: int(a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)})
            builds[key] = _compile(gm, args, fixed, options)
        return builds[key]

    first = None if dynamic else build_for(example_inputs)
    if not dynamic and first is None:
        return gm.forward
    # the common call: the same weight objects as the last one (an identity check of
    # each, about 5 us for 200 weights against 18 for the storage key)
    pick = operator.itemgetter(*static) if len(static) > 1 else None  # a tuple from 2 on

    def weights_of(args: Sequence[Any]) -> tuple:
        return pick(args) if pick is not None else tuple(args[i] for i in static)

    last: list[Any] = [() if dynamic else weights_of(example_inputs), first]

    def run(*args: Any) -> Any:
        weights = weights_of(args)
        if dynamic or not all(map(operator.is_, weights, last[0])):
            last[:] = [weights, build_for(args)]
        build = last[1]
        return gm.forward(*args) if build is None else build(*args)

    # True, or "partitioned" (see _compile), or "per shape"
    run.compiled = "per shape" if dynamic else first.compiled  # type: ignore[attr-defined]
    return run
