"""The graph pipeline: which passes run, in which order.

Every pass runs under the current PassContext (graph_opt.pass_manager), which gives
the target's facts, the opt level and the tuning callbacks.
"""

from __future__ import annotations

from tecc.frontend.ir import Function

# Importing the pass modules registers the passes.
from tecc.graph_opt import (  # noqa: F401
    attention,
    combine_dense,
    cse,
    dense_pack,
    fold_batch_norm,
    fold_constant,
    fold_dense_rows,
    fuse_ops,
    layout,
    simplify,
    winograd,
)
from tecc.graph_opt.pass_manager import Pass, get_pass, run_passes

OPTIMIZATION_PASSES = ("simplify", "fold_batch_norm", "fold_constants", "simplify",
                       "eliminate_common_subexpr", "combine_parallel_dense",
                       "eliminate_dead_code", "fuse_attention",
                       "convert_layout_nchwc", "winograd_gpu", "fold_dense_rows",
                       "pack_dense_weights")


def optimization_pipeline() -> list[Pass]:
    """The graph optimizations in order. simplify first canonicalizes (matmul ->
    dense, drops no-ops) so the patterns after it see one form; batch norms fold into
    convs before constant folding so that the new weights are final; constant folding
    exposes new identities (a folded reshape/transpose chain), hence a second
    simplify; CSE then sees the simplest graph (two denses of the same weight are one
    before parallel denses are combined), and DCE drops what merging left
    unreachable. Attention chains become one op (CPU) on that final graph; the CPU
    layout pass, the GPU Winograd rewrite, the CPU denses on 2-D rows (after the
    attention patterns, which match denses on [B, S, K]) and the dense weight packing
    come last, on the final weights, right before fusion."""
    return [get_pass(n) for n in OPTIMIZATION_PASSES]


def compile_pipeline() -> list[Pass]:
    """What the driver runs: the graph optimizations, then fuse_ops (opt_level >= 1)
    partitioning the graph into kernels."""
    return [*optimization_pipeline(), get_pass("fuse_ops")]


def optimize(func: Function) -> Function:
    """Run the graph optimizations on `func` under the current PassContext
    (opt_level 0: only DCE)."""
    return run_passes(func, optimization_pipeline())
