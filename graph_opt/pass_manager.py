"""Passes, the pass manager and the pass context.

A pass is a pure function Function -> Function with a name and an opt level,
registered once by `register_pass` (its one entry point). What a pass may know
beyond the IR comes from the current `PassContext` (as TVM's PassContext): the
target's facts (tecc.target.TargetInfo), the opt level, and the per-layer choices
a driver makes from tuning records (`TuningCallbacks`). The manager runs the passes
whose level is within the context's opt_level, checks the types after each one,
records them in the context's trace and prints the IR after the passes named in
the context's `print_after` or in the TECC_PRINT_AFTER environment variable (comma
separated; "all" prints after every pass).

graph_opt imports no TVM: a target given by name is resolved (tecc.target) only
when a context is made with one.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tecc.frontend.ir import Call, Function, IRTypeError, post_order
from tecc.frontend.ops import get_op
from tecc.frontend.printer import astext

if TYPE_CHECKING:
    from tecc.target import TargetInfo

PassFn = Callable[[Function], Function]

# (conv call, lanes) -> Winograd output tile for the conv, 0 for the direct algorithm
WinogradFn = Callable[[Call, int], int]
# (conv call, block of its input as produced or None, Winograd tile or 0) -> (ic_bn,
# oc_bn) the conv's schedule config wants (a tuning record), or None for the layout
# pass's own choice
ConvBlocksFn = Callable[[Call, "int | None", int], "tuple[int, int] | None"]
# (conv call, the GPU target's facts) -> Winograd output tile for a conv on a GPU
# (graph_opt/winograd.py), 0 for the direct conv
GpuWinogradFn = Callable[[Call, "TargetInfo"], int]
# (dense call, lanes) -> the packing block nb (N padded to whole blocks), or None to
# leave the dense unpacked
DenseBlockFn = Callable[[Call, int], "int | None"]


# The untuned choices. graph_opt.layout and graph_opt.dense_pack register their
# passes with this module, so their heuristics are imported when first asked for.
def untuned_winograd_tile(conv: Call, lanes: int) -> int:
    from tecc.graph_opt.layout import default_winograd_tile

    return default_winograd_tile(conv, lanes)


def untuned_gpu_winograd_tile(conv: Call, info: TargetInfo) -> int:
    from tecc.graph_opt.winograd import default_gpu_winograd_tile

    return default_gpu_winograd_tile(conv, info)


def untuned_conv_blocks(conv: Call, producer_block: int | None, tile: int
                        ) -> tuple[int, int] | None:
    return None


def untuned_dense_block(dense: Call, lanes: int) -> int | None:
    from tecc.graph_opt.dense_pack import default_dense_block

    return default_dense_block(dense.args[1].shape[0], lanes)


@dataclass(frozen=True)
class TuningCallbacks:
    """The per-layer choices the layout pass (`winograd_tile`, `conv_blocks`), the GPU
    Winograd pass (`gpu_winograd_tile`) and the dense weight packing (`dense_block`)
    ask the driver for. The defaults are the
    untuned choices; tecc.tuning.TuningContext answers from tuning records."""

    winograd_tile: WinogradFn = untuned_winograd_tile
    conv_blocks: ConvBlocksFn = untuned_conv_blocks
    dense_block: DenseBlockFn = untuned_dense_block
    gpu_winograd_tile: GpuWinogradFn = untuned_gpu_winograd_tile


@dataclass
class PassTrace:
    """What the manager did: the passes run and the time each took."""

    ran: list[tuple[str, float]] = field(default_factory=list)


_CURRENT: ContextVar[PassContext | None] = ContextVar("tecc_pass_context", default=None)


@dataclass
class PassContext:
    """What the passes run under: `with PassContext(target="llvm", opt_level=3):`.

    `target`: the facts of the target compiled for (a TargetInfo, or anything
    tecc.target.target_info takes); None (the default context) means no target, and
    the passes that need one (the CPU layout, dense packing) leave the IR as it is.
    `trace`, when given, records each pass run and its time."""

    target: TargetInfo | None = None
    opt_level: int = 3
    print_after: Sequence[str] = ()
    trace: PassTrace | None = None
    tuning: TuningCallbacks = field(default_factory=TuningCallbacks)
    _tokens: list[Token[Any]] = field(default_factory=list, init=False, repr=False,
                                      compare=False)

    def __post_init__(self) -> None:
        if self.target is not None:
            from tecc.target import target_info

            self.target = target_info(self.target)

    def __enter__(self) -> PassContext:
        self._tokens.append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._tokens.pop())

    @classmethod
    def current(cls) -> PassContext:
        """The innermost entered context, else a default one (no target, opt_level 3)."""
        ctx = _CURRENT.get()
        return ctx if ctx is not None else cls()

    def cpu_lanes(self, dtype: str = "float32") -> int:
        """SIMD lanes of `dtype` of the CPU target; 0 without a CPU target (the CPU
        layout passes are then off)."""
        if self.target is None or not self.target.is_cpu:
            return 0
        return self.target.vector_lanes(dtype)

    def prints_after(self, pass_name: str) -> bool:
        wanted = set(self.print_after)
        wanted |= {n.strip() for n in os.environ.get("TECC_PRINT_AFTER", "").split(",")
                   if n.strip()}
        return pass_name in wanted or "all" in wanted


@dataclass(frozen=True)
class Pass:
    name: str
    opt_level: int
    fn: PassFn

    def __call__(self, func: Function) -> Function:
        return self.fn(func)


_PASSES: dict[str, Pass] = {}


def register_pass(name: str, opt_level: int) -> Callable[[PassFn], PassFn]:
    """Register `fn` as the pass `name`, run at opt_level >= `opt_level`."""

    def wrap(fn: PassFn) -> PassFn:
        _PASSES[name] = Pass(name, opt_level, fn)
        return fn

    return wrap


def get_pass(name: str) -> Pass:
    return _PASSES[name]


def check_types(func: Function) -> None:
    """Re-derive the type of every op call and compare it with the one recorded."""
    for node in post_order(func.body):
        if isinstance(node, Call) and isinstance(node.op, str):
            opdef = get_op(node.op)
            again = opdef.type_rel([a.ty for a in node.args], node.attrs)
            if again != node.ty:
                raise IRTypeError(f"{node.op}: recorded type {node.ty}, derived {again}")
        elif isinstance(node, Call) and isinstance(node.op, Function):
            check_types(node.op)


def run_passes(func: Function, passes: Sequence[Pass]) -> Function:
    """Run `passes` in order under the current PassContext."""
    ctx = PassContext.current()
    for p in passes:
        if p.opt_level > ctx.opt_level:
            continue
        start = time.perf_counter()
        func = p(func)
        check_types(func)
        if ctx.trace is not None:
            ctx.trace.ran.append((p.name, time.perf_counter() - start))
        if ctx.prints_after(p.name):
            print(f"// IR after {p.name}\n{astext(func)}", file=sys.stderr)
    return func
