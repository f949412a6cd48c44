"""tecc as a torch.compile backend, for inference:

    model = torch.compile(model, backend="tecc", options={"target": "llvm",
                                                           "records": "tuning_logs/"})

(registered through the `torch_dynamo_backends` entry point). Each graph Dynamo hands
over is compiled by tecc.compile with its parameters frozen in as constants (Dynamo
passes them as graph inputs; tecc packs and folds weights, so it takes them as they are
at the first call: a model whose weights change afterwards must be compiled again, as
with TorchInductor's freezing). Compiled graphs are cached by Dynamo, which recompiles
for new shapes and dtypes (its guards). A graph tecc cannot
compile (an unsupported op, a dynamic or data-dependent shape, an input that is no
tensor) runs in torch, with a warning naming why; graph breaks are Dynamo's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tecc.frontend.importer import ImportError_, UnsupportedOperatorError
from tecc.frontend.types import IRTypeError

# tecc.compile's errors that mean "this graph is not for tecc": it then runs in torch
NOT_COMPILABLE = (UnsupportedOperatorError, ImportError_, IRTypeError, NotImplementedError)
OPTIONS = ("target", "records", "winograd", "opt_level")

class _Frozen(torch.nn.Module):
    """A Dynamo graph with its static inputs (parameters, and the sizes of a dynamic
    graph) fixed: torch.export then sees constants, and the other inputs are the
    model's."""

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


def _is_static(x: Any) -> bool:
    return isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type",
                                                        None) is not None


def _real(x: torch.Tensor) -> torch.Tensor:
    """A real tensor like `x` (Dynamo may hand over fake ones): tecc needs shapes and
    dtypes only, and random values that are never all zeros."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(x, FakeTensor):
        return x
    if x.dtype.is_floating_point:
        return torch.randn(tuple(x.shape), dtype=x.dtype)
    return torch.ones(tuple(x.shape), dtype=x.dtype)


def _compile(gm: torch.fx.GraphModule, inputs: Sequence[Any], fixed: dict[int, Any],
             options: dict[str, Any]) -> Callable[..., Any] | None:
    """tecc's build of `gm` with the inputs `fixed` frozen in, called with all of the
    graph's inputs; None (and a warning why) when tecc cannot compile it."""
    import tecc

    given = [i for i in range(len(inputs)) if i not in fixed]
    module = _Frozen(gm, fixed, len(inputs)).eval()
    try:
        compiled = tecc.compile(module, tuple(_real(inputs[i]) for i in given), **options)
    except NOT_COMPILABLE as err:
        if isinstance(err, UnsupportedOperatorError):
            first = f"tecc cannot import {', '.join(sorted(err.unsupported))}"
        else:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        warnings.warn(f"tecc backend: a graph of {len(gm.graph.nodes)} nodes runs in torch: "
                      f"{first}", stacklevel=3)
        return None

    def run(*args: Any) -> Any:
        return compiled(*[args[i] for i in given])

    run.compiled = True  # type: ignore[attr-defined]
    return run


def tecc_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The torch.compile backend: `options` takes tecc.compile's target, records,
    winograd and opt_level."""

    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"tecc backend: unknown option(s) {unknown}; it takes {OPTIONS}")
    static = {i: x for i, x in enumerate(example_inputs) if _is_static(x)}
    if all(isinstance(x, torch.Tensor) for x in example_inputs):
        compiled = _compile(gm, example_inputs, static, options)
        return gm.forward if compiled is None else compiled
    else:
        # A graph Dynamo made dynamic (sizes as SymInt inputs): one tecc build per set
        # of sizes met, made at its first call.
        builds: dict[tuple, Callable[..., Any] | None] = {}

        def run(*args: Any) -> Any:
            key = tuple(a if not isinstance(a, torch.Tensor) else (tuple(a.shape), a.dtype)
                        for i, a in enumerate(args) if i not in static)
            if key not in builds:
                sizes = {i: int(a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
                builds[key] = _compile(gm, args, {**static, **sizes}, options)
            build = builds[key]
            return gm.forward(*args) if build is None else build(*args)

    run.compiled = "per shape"  # type: ignore[attr-defined]
    return run
