"""The graph optimization pipeline: which passes run, in which order."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tecc.frontend.ir import Function

# Importing the pass modules registers the passes.
from tecc.graph_opt import (  # noqa: F401
    cse,
    dense_pack,
    fold_batch_norm,
    fold_constant,
    layout,
    simplify,
)
from tecc.graph_opt.pass_manager import Pass, PassTrace, get_pass, run_passes


def optimization_pipeline(overrides: Mapping[str, Callable[[Function], Function]] | None = None
                          ) -> list[Pass]:
    """The passes in order. simplify first canonicalizes (matmul -> dense, drops
    no-ops) so the patterns after it see one form; batch norms fold into convs before
    constant folding so that the new weights are final; constant folding exposes new
    identities (a folded reshape/transpose chain), hence a second simplify; CSE then
    sees the simplest graph, and DCE drops what merging left unreachable. The CPU
    layout pass and the dense weight packing come last, on the final weights, right
    before fusion."""
    names = ["simplify", "fold_batch_norm", "fold_constants", "simplify",
             "eliminate_common_subexpr", "eliminate_dead_code", "convert_layout_nchwc",
             "pack_dense_weights"]
    passes = [get_pass(n) for n in names]
    # `overrides`: a pass by name replaced by another function (same name and level),
    # e.g. the layout pass with the driver's per-layer block choice from tuning records
    overrides = overrides or {}
    return [Pass(p.name, p.opt_level, overrides[p.name]) if p.name in overrides else p
            for p in passes]


def optimize(func: Function, opt_level: int = 3, print_after: Sequence[str] | None = None,
             trace: PassTrace | None = None,
             overrides: Mapping[str, Callable[[Function], Function]] | None = None
             ) -> Function:
    """Run the optimization pipeline on `func` (opt_level 0: only DCE)."""
    return run_passes(func, optimization_pipeline(overrides), opt_level, print_after, trace)
