"""A structured summary of a compiled model: its kernels and its memory plan."""

from __future__ import annotations

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

    def __str__(self) -> str:
        mem = self.memory
        lines = [
            f"target {self.target}: {len(self.kernels)} kernels, {self.kernel_calls} calls",
            f"memory: {mem['planned_bytes'] / 2**20:.2f} MiB planned for intermediates "
            f"({mem['storages']} storages), {mem['naive_bytes'] / 2**20:.2f} MiB with one "
            "buffer per tensor",
            f"passes: {', '.join(self.passes)}",
            "",
            f"{'kernel':34s} {'calls':>5s}  {'output':22s} ops",
        ]
        for k in self.kernels:
            out = ",".join(str(list(s)) for s in k.output_shapes)
            lines.append(f"{k.name[:34]:34s} {k.calls:5d}  {out[:22]:22s} {' + '.join(k.ops)}")
        return "\n".join(lines)


def summarize(compiled: Any) -> CompileSummary:
    result = compiled.build_result
    kernels = [KernelSummary(k.name, k.anchor, k.ops, k.input_shapes, k.output_shapes, k.calls)
               for k in result.kernels.values()]
    info = compiled.target_info
    return CompileSummary(kernels, len(compiled.plan["kernels"]), result.memory.summary(),
                          list(getattr(compiled, "passes", [])),
                          info.cpu if info.is_cpu else f"{info.kind} {info.arch}")
