"""The op registry: the one place every op of the IR is looked up by name.

An op is defined once, in the module of its family under frontend/op_defs/, by one
`OPS.register(...)` call that gives everything the compiler knows about it: its
attribute schema, its type relation (shape and dtype inference), its fusion pattern
kind, its TE compute (what the kernel computes, read by schedules/), its numpy
evaluator (constant folding and the tuner's reference outputs, read by graph_opt/)
and whether it runs on channel-blocked data (the NCHWc layout pass). The ATen
converters that produce it are registered next to it with `@OPS.converter(...)`.
A name registered twice raises, so a definition cannot be shadowed silently.

Passes and schedules ask `get_op(name)`; importing any tecc.frontend module loads
every family (frontend/__init__.py), so the table is complete whenever a Call can be
built. This module imports neither torch nor tvm.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tecc.frontend.types import Attrs, IRTypeError, Type

if TYPE_CHECKING:
    import numpy as np
    import torch
    from tecc.frontend.importer import ImportContext
    from tvm import te


class Pattern(enum.IntEnum):
    """Fusion pattern kinds, ordered as TVM orders them (lower fuses more freely)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


# argument types, checked attributes -> result type (raises IRTypeError)
TypeRel = Callable[[list[Type], Attrs], Type]
# TE inputs, attributes, the inferred result type -> the result tensor(s); semantics
# follow torch eager (the reference the tests compare with)
Compute = Callable[[list["te.Tensor"], Attrs, Type], "te.Tensor | list[te.Tensor]"]
# numpy inputs, attributes, result type -> the result (a list for tuple results); may
# raise NotFoldable to decline
Evaluator = Callable[[list["np.ndarray"], Attrs, Type], "np.ndarray | list[np.ndarray]"]
# (import context, fx node, args with fx nodes replaced by IR values, kwargs) -> an
# IR expression, or a Python tuple for an ATen op with several outputs
Converter = Callable[["ImportContext", "torch.fx.Node", list, dict], Any]

REQUIRED = object()  # the default of an attribute that must be given


class NotFoldable(Exception):
    """An evaluator declines (e.g. integer division by zero): the call is left as is."""


@dataclass(frozen=True)
class OpDef:
    """Everything known about one op (see the module docstring)."""

    name: str
    num_inputs: int | None  # None: variadic
    type_rel: TypeRel
    pattern: Pattern
    compute: Compute
    attrs: Mapping[str, Any] = field(default_factory=dict)  # name -> default or REQUIRED
    evaluate: Evaluator | None = None  # None: never folded
    # Runs on NCHW{c}c data as well as NCHW and keeps the block, beyond what its pattern
    # says (elementwise ops do anyway): a pool through its `layout` attribute, a
    # reduction over (H, W) because it reduces each channel apart.
    blocked_layout: bool = False
    doc: str = ""

    def check_attrs(self, given: Attrs) -> Attrs:
        unknown = set(given) - set(self.attrs)
        if unknown:
            raise IRTypeError(f"{self.name}: unknown attributes {sorted(unknown)}")
        values = {}
        for key, default in self.attrs.items():
            if key in given:
                values[key] = given[key]
            elif default is REQUIRED:
                raise IRTypeError(f"{self.name}: missing attribute {key!r}")
            else:
                values[key] = default
        return Attrs(values)


class OpRegistry:
    """Ops by name and ATen converters by target; each name is registered once."""

    def __init__(self) -> None:
        self._ops: dict[str, OpDef] = {}
        self._converters: dict[str, Converter] = {}

    def register(self, name: str, type_rel: TypeRel, pattern: Pattern,
                 num_inputs: int | None, *, compute: Compute,
                 attrs: Mapping[str, Any] | None = None, evaluate: Evaluator | None = None,
                 blocked_layout: bool = False, doc: str = "") -> OpDef:
        if name in self._ops:
            raise ValueError(f"op {name!r} is registered twice")
        opdef = OpDef(name, num_inputs, type_rel, pattern, compute, dict(attrs or {}),
                      evaluate, blocked_layout, doc)
        self._ops[name] = opdef
        return opdef

    def get(self, name: str) -> OpDef:
        try:
            return self._ops[name]
        except KeyError:
            raise KeyError(f"no op named {name!r} is registered (frontend/op_defs/ defines "
                           "the ops)") from None

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)

    def converter(self, *aten_targets: str) -> Callable[[Converter], Converter]:
        """Register a converter for ATen targets ("aten.roll.default"). A target with
        a converter is imported natively: the importer does not decompose it."""
        def register(fn: Converter) -> Converter:
            for target in aten_targets:
                if target in self._converters:
                    raise ValueError(f"a converter for {target!r} is registered twice")
                self._converters[target] = fn
            return fn

        return register

    def converter_for(self, aten_target: str) -> Converter | None:
        return self._converters.get(aten_target)

    def aten_targets(self) -> list[str]:
        return sorted(self._converters)


OPS = OpRegistry()


def get_op(name: str) -> OpDef:
    return OPS.get(name)


def registered_ops() -> list[str]:
    return OPS.names()


# ---------------------------------------------------------------- attribute helpers
# The meaning of the `axis` attributes, shared by op definitions and passes.


def normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise IRTypeError(f"axis {axis} out of range for rank {ndim}")
    return axis % max(ndim, 1)


def reduce_axes(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    """The sorted, non-negative reduction axes (all axes when `axis` is None)."""
    if attrs["axis"] is None:
        return tuple(range(ndim))
    return tuple(sorted({normalize_axis(a, ndim) for a in attrs["axis"]}))
