"""Where the time of a call through torch.compile(backend="tecc") goes, against calling
tecc.compile's build directly: per example model, torch eager, tecc.compile's build
(called with torch tensors, as the backend calls it), the backend, the backend with
Dynamo's guards skipped (torch.compiler.set_stance(skip_guard_eval_unsafe=True)), and
Dynamo's own entry (its guards and the gathering of each weight as a graph input),
timed through a backend that returns outputs computed ahead: back to back, right
after a run of the model's tecc build, as the entry runs in a loop of calls, and right
after a sweep over 64 MB of memory, which evicts the caches as the model's kernels do
but leaves no thread running (the same time as after the build: the cost is cache
misses, not threads of the build competing for the cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    add_model_args,
    example_model_runs,
    host_line,
    interleaved_ms,
    write_table,
)

ENTRY_CALLS = 300
SWEEP_BYTES = 64 << 20


def entry_only(model: torch.nn.Module) -> tuple[Callable[..., Any], list[int]]:
    """`model` through Dynamo with a backend that returns its graph's outputs computed
    at compile time: a call costs Dynamo's entry alone. Also the graph input counts."""
    counts: list[int] = []

    def ahead(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        counts.append(len(example_inputs))
        outputs = gm(*example_inputs)
        return lambda *args: outputs

    return torch.compile(model, backend=ahead), counts


def entry_ms(entry: Callable[..., Any], inputs: tuple, before: Callable[[], object] | None
             ) -> float:
    """Median ms of a call of `entry`, each after a call of `before` (not timed)."""
    times = []
    for _ in range(ENTRY_CALLS):
        if before is not None:
            before()
        start = time.perf_counter()
        entry(*inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(model: torch.nn.Module, inputs: tuple) -> tuple[dict[str, float], list[int]]:
    """Median ms of each way of calling `model` (the module docstring), and the input
    counts of the graphs Dynamo made of it."""
    import tecc

    model.eval()
    strict = tecc.compile(model, inputs)
    torch._dynamo.reset()
    via = torch.compile(model, backend="tecc")
    with torch.no_grad():
        via(*inputs)

    def skipping_guards() -> object:
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return via(*inputs)

    with torch.no_grad():
        ms = interleaved_ms({"eager": lambda: model(*inputs),
                             "tecc": lambda: strict(*inputs),
                             "backend": lambda: via(*inputs),
                             "skipped": skipping_guards}, rounds=9)
        torch._dynamo.reset()  # the entry's graph alone in Dynamo's cache
        entry, graph_inputs = entry_only(model)
        entry(*inputs)
        ms["entry"] = entry_ms(entry, inputs, None)
        ms["entry after"] = entry_ms(entry, inputs, lambda: strict(*inputs))
        sweep = np.ones(SWEEP_BYTES // 8)
        ms["entry after sweep"] = entry_ms(entry, inputs, sweep.sum)
    torch._dynamo.reset()
    return ms, graph_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_model_args(parser, "backend_overhead")
    args = parser.parse_args()

    rows = []
    for name, model, inputs in example_model_runs(args):
        ms, graph_inputs = measure(model, inputs)
        print(name, {k: round(v, 3) for k, v in ms.items()}, flush=True)
        rows.append([name, "+".join(map(str, graph_inputs))]
                    + [f"{ms[k]:.3f}" for k in ("eager", "tecc", "backend", "skipped")]
                    + [f"{ms['backend'] - ms['tecc']:+.3f}", f"{ms['entry']:.3f}",
                       f"{ms['entry after']:.3f}", f"{ms['entry after sweep']:.3f}"])
    notes = [f"Host: {host_line()}; torch {torch.__version__}, torch and tecc on "
             f"{args.threads} threads, batch 1, untuned (fallback configs).",
             "eager, tecc (tecc.compile's build called with torch tensors), backend "
             "(torch.compile(model, backend=\"tecc\")) and guards skipped (the backend under "
             "torch.compiler.set_stance(\"default\", skip_guard_eval_unsafe=True)): median ms "
             "of 9 interleaved rounds. Dynamo's entry: a call through a backend that returns "
             f"outputs computed ahead, median of {ENTRY_CALLS} calls, back to back and each "
             "right after a call of the tecc build (as in a loop of calls through the "
             f"backend), and each right after a sum over {SWEEP_BYTES >> 20} MB of memory (no "
             "thread left running, caches evicted). graph inputs: the input and every weight and buffer, each one "
             "Dynamo gathers and guards at every call.",
             f"Command: `python benchmarks/backend_overhead.py --models {args.models}`."]
    write_table(args.output, "A call through torch.compile(backend=\"tecc\"): where its time goes",
                ["model", "graph inputs", "torch eager", "tecc", "backend",
                 "backend, guards skipped", "backend - tecc", "Dynamo's entry, back to back",
                 "Dynamo's entry, after a tecc run", "Dynamo's entry, after a memory sweep"],
                rows, notes)


if __name__ == "__main__":
    main()
