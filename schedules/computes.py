"""The TE computes of the ops, as the schedules look them up.

Each op's compute is defined with the op itself (frontend/op_defs/, registered in
tecc.frontend.ops.OPS): `fn(args: list[te.Tensor], attrs: Attrs, out_type: Type) ->
te.Tensor | list[te.Tensor]`, where `out_type` is the type the op's type relation
inferred. Anchor ops (conv2d, dense, matmul, the reductions) write their main block
with the ANCHOR_ATTR annotation, whose value (the anchor kind) the default schedule
and the templates dispatch on.
"""

from __future__ import annotations

from tecc.frontend.op_defs.common import ANCHOR_ATTR, KEEP_ATTR, scalar_constant
from tecc.frontend.ops import OPS, Compute

__all__ = ["ANCHOR_ATTR", "KEEP_ATTR", "Compute", "get_compute", "registered_computes",
           "scalar_constant"]


def get_compute(op_name: str) -> Compute:
    return OPS.get(op_name).compute


def registered_computes() -> list[str]:
    return [name for name in OPS.names() if OPS.get(name).compute is not None]
