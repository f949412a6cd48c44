"""A structured summary of a compiled model: its kernels and its memory plan."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KernelSummary:
    name: str
    anchor: str
    ops: list[str]
    input_shapes: list[tuple[int, ...]]
    output_shapes: list[tuple[int, ...]]
    calls: int


@dataclass
class CompileSummary:
    kernels: list[KernelSummary]
    kernel_calls: int
    memory: dict[str, int]
    passes: list[str] = field(default_factory=list)
    target: str = ""
    torch_ops: dict[str, int] = field(default_factory=dict)  # ATen op -> calls run in torch
    regions: int = 1  # the compiled regions (compile(..., fallback="torch"))

    def __str__(self) -> str:
        mem = self.memory
        lines = [
            f"target {self.target}: {len(self.kernels)} kernels, {self.kernel_calls} calls",
            f"memory: {mem['planned_bytes'] / 2**20:.2f} MiB planned for intermediates "
            f"({mem['storages']} storages), {mem['naive_bytes'] / 2**20:.2f} MiB with one "
            "buffer per tensor",
            f"passes: {', '.join(self.passes)}",
        ]
        if self.torch_ops:
            lines.append(f"runs in torch between {self.regions} compiled region(s): "
                         + ", ".join(f"{op} x{n}" for op, n in self.torch_ops.items()))
        lines += [
            "",
            f"{'kernel':34s} {'calls':>5s}  {'output':22s} ops",
        ]
        for k in self.kernels:
            out = ",".join(str(list(s)) for s in k.output_shapes)
            lines.append(f"{k.name[:34]:34s} {k.calls:5d}  {out[:22]:22s} {' + '.join(k.ops)}")
        return "\n".join(lines)


def _target_name(info: Any) -> str:
    return info.cpu if info.is_cpu else f"{info.kind} {info.arch}"


def _kernel_summaries(kernels: dict[str, Any]) -> list[KernelSummary]:
    return [KernelSummary(name, k.anchor, k.ops, k.input_shapes, k.output_shapes, k.calls)
            for name, k in kernels.items()]


def summarize(compiled: Any) -> CompileSummary:
    result = compiled.build_result
    return CompileSummary(_kernel_summaries(result.kernels), len(compiled.plan["kernels"]),
                          result.memory.summary(), list(getattr(compiled, "passes", [])),
                          _target_name(compiled.target_info))


def summarize_partitioned(model: Any) -> CompileSummary:
    """A PartitionedModel's regions together (kernels named region.kernel, memory
    summed) and the ops that run in torch."""
    memory: Counter[str] = Counter()
    for region in model.regions:
        memory.update(region.build_result.memory.summary())
    passes = list(getattr(model.regions[0], "passes", [])) if model.regions else []
    return CompileSummary(_kernel_summaries(model.kernels()),
                          sum(len(r.plan["kernels"]) for r in model.regions),
                          {"planned_bytes": 0, "naive_bytes": 0, "storages": 0, **memory},
                          passes, _target_name(model.target_info), model.torch_ops,
                          len(model.regions))
