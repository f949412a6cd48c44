"""Passes and the pass manager.

A pass is a pure function Function -> Function with a name and an opt level. The
manager runs the passes whose level is within the requested opt_level, checks the
types after each one, and prints the IR after the passes named in
`print_after` or in the TECC_PRINT_AFTER environment variable (comma separated;
"all" prints after every pass).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tecc.frontend.ir import Call, Function, IRTypeError, post_order
from tecc.frontend.ops import get_op
from tecc.frontend.printer import astext

PassFn = Callable[[Function], Function]


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


@dataclass
class PassTrace:
    """What the manager did: the passes run and the time each took."""

    ran: list[tuple[str, float]] = field(default_factory=list)


def run_passes(
    func: Function,
    passes: Sequence[Pass],
    opt_level: int = 3,
    print_after: Sequence[str] | None = None,
    trace: PassTrace | None = None,
) -> Function:
    wanted = set(print_after or ())
    wanted |= {n.strip() for n in os.environ.get("TECC_PRINT_AFTER", "").split(",") if n.strip()}
    for p in passes:
        if p.opt_level > opt_level:
            continue
        start = time.perf_counter()
        func = p(func)
        check_types(func)
        if trace is not None:
            trace.ran.append((p.name, time.perf_counter() - start))
        if p.name in wanted or "all" in wanted:
            print(f"// IR after {p.name}\n{astext(func)}", file=sys.stderr)
    return func
