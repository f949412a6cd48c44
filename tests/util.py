"""Comparison helpers shared by the tests."""

import numpy as np
import torch


def flatten(value) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in flatten(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in flatten(v)]
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        return flatten(value.to_tuple())
    return [value]


def to_cpu(value):
    """`value` (a tensor, or dicts, lists and tuples of them) with its tensors on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(v) for v in value)
    return value


def max_rel_error(got, expected) -> float:
    """max |got - expected| / max |expected| over all outputs."""
    worst = 0.0
    for g, e in zip(flatten(got), flatten(expected), strict=True):
        if e is None:  # an optional output the model leaves out, None in both
            assert g is None, f"{type(g).__name__} where the model gives None"
            continue
        g = g.detach().numpy() if isinstance(g, torch.Tensor) else np.asarray(g)
        e = e.detach().numpy() if isinstance(e, torch.Tensor) else np.asarray(e)
        scale = max(float(np.abs(e).max()), 1e-6) if e.size else 1.0
        worst = max(worst, float(np.abs(g.astype("float64") - e).max()) / scale if e.size else 0)
    return worst


def assert_close(got, expected, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    got_flat, exp_flat = flatten(got), flatten(expected)
    assert len(got_flat) == len(exp_flat), f"{len(got_flat)} outputs, expected {len(exp_flat)}"
    for i, (g, e) in enumerate(zip(got_flat, exp_flat, strict=True)):
        assert isinstance(g, type(e)) or isinstance(e, torch.Tensor) and isinstance(
            g, torch.Tensor), f"output {i}: {type(g).__name__}, expected {type(e).__name__}"
        g = g.detach().numpy() if isinstance(g, torch.Tensor) else g
        e = e.detach().numpy() if isinstance(e, torch.Tensor) else e
        assert g.shape == e.shape and g.dtype == e.dtype, (
            f"output {i}: {g.shape} {g.dtype}, expected {e.shape} {e.dtype}")
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"output {i}")


# One 8-lane and one 16-lane float32 target: every template is scheduled and built for
# both; their kernels run where the host has the instructions (runs_on_host).
VECTOR_TARGETS = ("llvm:core-avx2", "llvm:skylake-avx512")


def runs_on_host(target) -> bool:
    """Whether code for `target` runs here: the host has every ISA feature it uses."""
    from tecc.runtime.cpu import host_cpuinfo_flags, missing_on_host

    from tecc.target import target_info

    flags = host_cpuinfo_flags()
    return flags is not None and not missing_on_host(target_info(target).features, flags)


def lowered_matmul(a, b, target: str, config):
    """The scheduled PrimFunc ("mm") of a @ b for `target` with the matmul template's
    `config` (None: its fallback): (PrimFunc, applied templates, target facts)."""
    from tests.models import MatMul

    return lowered_group(MatMul(), (a, b), target, config, "mm")


def lowered_group(module, inputs, target: str, config, name: str = "main",
                  winograd: bool = True):
    """The scheduled PrimFunc `name` of `module`'s first fused group (its anchor with
    the epilogue) for `target` with its template's `config` (None: the fallback):
    (PrimFunc, applied templates, target facts)."""
    from tecc.frontend.ir import Call, Function, post_order
    from tecc.schedules.lower import lower_primitive

    from tecc.api import fused_graph

    _, part, _, _, info = fused_graph(module, inputs, target, 3, None, None, {}, winograd)
    group = next(c.op for c in post_order(part.body)
                 if isinstance(c, Call) and isinstance(c.op, Function))
    prim, applied = lower_primitive(group, name, info.tvm_target, config, return_info=True)
    return prim, applied, info
