"""Intermediates stored in the kernel's output buffer (a pass on scheduled PrimFuncs).

A template marks a block whose result has the shape and dtype of an output the
kernel writes later from it, elementwise, at the same indices (softmax's exp, read
by the exp-sum and rescaled by the normalize): `sch.annotate(block, IN_OUTPUT_ATTR,
output buffer name)`. `store_in_outputs` then gives that block's buffer the output's
storage: the exp is written into the output, the sum reads it there and the
normalize rescales it in place. No intermediate is allocated, where a kept row
buffer over 1 KB would be a workspace allocation per row on the CPU (TVM's limit for
a stack buffer), and an inlined exp would be computed twice per element.

A mark the function does not bear out (no such output, another shape or dtype)
leaves the function unchanged, only the mark removed.
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi

IN_OUTPUT_ATTR = "tecc.in_output"


def _marked_blocks(func: tvm.tirx.PrimFunc) -> list[Any]:
    found: list[Any] = []

    def visit(block: Any) -> None:
        if IN_OUTPUT_ATTR in block.annotations:
            found.append(block)

    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, visit)])
    return found


def same_storage(a: Any, b: Any) -> bool:
    """Whether buffers `a` and `b` (buffer Vars) hold the same shape and dtype."""
    ta, tb = a.ty, b.ty
    return (str(ta.dtype) == str(tb.dtype) and len(ta.shape) == len(tb.shape)
            and all(int(x) == int(y) for x, y in zip(ta.shape, tb.shape, strict=True)))


def store_in_outputs(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with each marked block's buffer replaced by the output it names (see
    the module docstring) and dropped from the allocations; the marks removed."""
    marked = _marked_blocks(func)
    if not marked:
        return func
    outputs = {p.name: p for p in func.params}
    remap: dict[Any, Any] = {}
    for block in marked:
        buffer = block.writes[0].source
        output = outputs.get(str(block.annotations[IN_OUTPUT_ATTR]))
        if output is not None and same_storage(buffer, output):
            remap[buffer] = output
    # after the remap the marked buffers' allocations name the outputs
    outputs_used = list(remap.values())

    def rebuild(block: Any, mutator: Any) -> Any:
        block = mutator.default_mutate(block)
        annotations = {k: v for k, v in block.annotations.items() if k != IN_OUTPUT_ATTR}
        allocs = [b for b in block.alloc_buffers
                  if not any(b.same_as(o) for o in outputs_used)]
        if len(annotations) == len(block.annotations) and len(allocs) == len(
                block.alloc_buffers):
            return block
        return tvm.s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint,
                                block.body, block.init, allocs, block.match_buffers,
                                annotations, block.span)

    def on_func(f: Any, mutator: Any) -> Any:
        for buffer, output in remap.items():
            mutator.var_remap_set(buffer, output)
        return mutator.default_mutate(f)

    return tvm_ffi.structural_mutate(func, [(tvm.tirx.PrimFunc, on_func),
                                            (tvm.s_tir.SBlock, rebuild)])
