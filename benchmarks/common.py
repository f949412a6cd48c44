"""Timing and reporting shared by the benchmark scripts."""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tecc import runtime  # noqa: F401 - sets TVM_NUM_THREADS (a thread per core) here and in workers

RESULTS = Path(__file__).resolve().parent / "results"


def median_ms(fn: Callable[[], object], min_runs: int = 10, min_seconds: float = 1.0,
              warmup: int = 3) -> float:
    """Median wall time of `fn` in milliseconds, after warm-up calls."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(times) < min_runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if len(times) >= 1000:
            break
    return statistics.median(times) * 1e3


def interleaved_ms(fns: dict[str, Callable[[], object]], rounds: int = 7,
                   seconds_per_round: float = 0.3, warmup: int = 3) -> dict[str, float]:
    """Median wall time (ms) of each function, measured in interleaved rounds so that
    a slow phase of a shared machine hits every competitor alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            deadline = time.perf_counter() + seconds_per_round
            runs = 0
            while runs < 2 or time.perf_counter() < deadline:
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
                runs += 1
    return {name: statistics.median(times) * 1e3 for name, times in samples.items()}


def with_and_without(model: Any, inputs: tuple,
                     without: Callable[[], contextlib.AbstractContextManager]
                     ) -> tuple[Any, Any]:
    """tecc's builds of `model` under the context `without()` (a change left out) and
    as the code stands."""
    import tecc

    with without():
        before = tecc.compile(model, inputs)
    return before, tecc.compile(model, inputs)


def against_eager(model: Any, inputs: tuple, builds: dict[str, Any], rounds: int = 7
                  ) -> tuple[dict[str, float], float]:
    """Median ms of torch eager ("eager") and of each tecc build of `model` (called
    with numpy arrays), in one set of interleaved rounds, and the largest relative
    error of the builds' outputs against eager's."""
    import torch

    from tests.util import max_rel_error

    with torch.no_grad():
        expected = model(*inputs)
    err = max(max_rel_error(b(*inputs), expected) for b in builds.values())
    arrays = [x.numpy() for x in inputs]
    fns: dict[str, Callable[[], object]] = {"eager": lambda: model(*inputs)}
    fns.update({name: (lambda b=b: b(*arrays)) for name, b in builds.items()})
    with torch.no_grad():
        return interleaved_ms(fns, rounds=rounds), err


def sources(cm: Any) -> str:
    """How a compiled model's workloads got their configs, e.g. "12 retargeted, 4
    fallback" (CompiledModel.tasks' sources)."""
    counts: dict[str, int] = {}
    for t in cm.tasks():
        counts[t["source"]] = counts.get(t["source"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


EXAMPLE_MODELS = "mlp,resnet18,mobilenet_v2,transformer_layer,bert"


def add_model_args(parser: argparse.ArgumentParser, output: str,
                   models: str = EXAMPLE_MODELS) -> None:
    """--models (the example models, comma-separated), --threads and --output."""
    parser.add_argument("--models", default=models)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=output)


def example_model_runs(args: argparse.Namespace) -> Iterator[tuple[str, Any, tuple]]:
    """(name, model, inputs) of each example model of args.models at batch 1, torch
    on args.threads threads, each announced as it starts."""
    import torch

    from tests.models import example_models

    torch.set_num_threads(args.threads)
    models = example_models(batch=1)
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        yield (name, *models[name])


def host_line() -> str:
    from tecc.runtime.cpu import host_cpu_model

    from tecc.target import target_info

    host = target_info("llvm")
    return (f"{host_cpu_model()} ({host.cpu}, {host.isa_level}), {host.cores} "
            f"cores, Python {platform.python_version()}")


def write_table(name: str, title: str, header: list[str], rows: list[list[str]],
                notes: list[str]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", "", *notes, "",
             "| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    path = RESULTS / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[len(notes) + 3:]))
    print(f"written to {path}")
    return path


class CurveStore:
    """Each finished (workload, tuner, seed) curve (best seconds after each trial), kept
    in a JSON file written after every curve: the full matrix takes hours on this host,
    so runs add to the file and skip the curves it already holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}

    def curve(self, workload: str, tuner: str, seed: int, trials: int) -> list[float] | None:
        entry = self.data.get(workload, {}).get(tuner, {}).get(str(seed))
        if entry is None or entry["trials"] < trials:
            return None
        return entry["best_s"][:trials]

    def add(self, workload: str, tuner: str, seed: int, trials: int, curve: list[float],
            wall_s: float | None = None) -> None:
        runs = self.data.setdefault(workload, {}).setdefault(tuner, {})
        runs[str(seed)] = {"trials": trials, "best_s": [float(f"{c:.6g}") for c in curve]}
        if wall_s is not None:
            runs[str(seed)]["wall_s"] = round(wall_s, 1)
        self.save()

    def seeds(self, workload: str, tuner: str) -> list[int]:
        """The seeds of the workload's stored curves by `tuner`."""
        return sorted(int(seed) for seed in self.data.get(workload, {}).get(tuner, {}))

    def wall_s(self, workload: str, tuner: str, seed: int) -> float | None:
        """Seconds the run of a curve took, where it was stored."""
        return self.data.get(workload, {}).get(tuner, {}).get(str(seed), {}).get("wall_s")

    def set_torch(self, workload: str, gflops: float) -> None:
        self.data.setdefault(workload, {})["torch_gflops"] = round(gflops, 2)
        self.save()

    def torch(self, workload: str) -> float | None:
        return self.data.get(workload, {}).get("torch_gflops")

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=None, separators=(",", ":")) + "\n")
        tmp.replace(self.path)
