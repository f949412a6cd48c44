"""`make demo`: compile the ResNet-18 definition with the shipped tuning records
(tuning_logs/: used where they match this CPU, else the fallback configs), check it
against eager, time both."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc  # noqa: E402
from benchmarks.common import median_ms  # noqa: E402
from tests.models import resnet18  # noqa: E402
from tests.util import max_rel_error  # noqa: E402


def main() -> None:
    torch.manual_seed(0)
    model = resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    start = time.perf_counter()
    records = Path(__file__).resolve().parents[1] / "tuning_logs"
    compiled = tecc.compile(model, (x,), target="llvm", records=records)
    info = compiled.target_info
    print(f"compiled ResNet-18 for {info.cpu} ({info.isa_level}) "
          f"in {time.perf_counter() - start:.1f} s: {compiled}")
    sources = [t["source"] for t in compiled.tasks()]
    print(f"tuning records: {len(sources) - sources.count('fallback')} of {len(sources)} "
          f"workloads tuned (from {records.name}/)")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = model(x)
        eager_ms = median_ms(lambda: model(x))
    error = max_rel_error(compiled(x), expected)
    tecc_ms = median_ms(lambda: compiled(x))
    print(f"max relative error vs torch eager: {error:.2e}")
    print(f"latency: torch eager {eager_ms:.2f} ms, tecc {tecc_ms:.2f} ms "
          f"({eager_ms / tecc_ms:.2f}x)")
    if error > 1e-3:
        raise SystemExit("tecc output does not match torch eager")


if __name__ == "__main__":
    main()
