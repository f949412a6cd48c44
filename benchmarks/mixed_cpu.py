"""torch and tecc in turn on the CPU: the torch.compile backend on a model that graph
breaks split, where torch runs between tecc's graphs, under libgomp's default spin and
under the short one tecc sets (tecc.OPENMP_SPIN_COUNT, when tecc is imported before
torch). Each setting runs in its own process (libgomp reads it once, when it loads) and
times torch eager, tecc on the whole model and the backend on the split one, in
interleaved rounds.

    python benchmarks/mixed_cpu.py [--rounds 8]

Writes results/mixed_cpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

# libgomp's default for OMP_WAIT_POLICY unset (its documentation), named so both runs
# state their spin explicitly
LIBGOMP_DEFAULT_SPIN = "300000"


def child(rounds: int) -> dict[str, float]:
    """Median ms of each competitor, over `rounds` interleaved rounds."""
    import torch

    import tecc
    from benchmarks.common import interleaved_ms
    from tests.models import resnet18

    class StagesBroken(torch.nn.Module):
        """ResNet-18 with a graph break and a torch op after each stage."""

        def __init__(self) -> None:
            super().__init__()
            self.m = resnet18().eval()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            m = self.m
            x = m.maxpool(m.relu(m.bn1(m.conv1(x))))
            for layer in (m.layer1, m.layer2, m.layer3, m.layer4):
                x = layer(x)
                torch._dynamo.graph_break()
                x = x * 1.0001  # torch runs an op on the whole activation
            return m.fc(torch.flatten(m.avgpool(x), 1))

    torch.manual_seed(0)
    model = StagesBroken().eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = model(x)
        backend = torch.compile(model, backend="tecc")
        torch.testing.assert_close(backend(x), expected, rtol=1e-3, atol=1e-4)
        whole = tecc.compile(model.m, (x,))
        fns = {"eager": lambda: model(x), "tecc whole model": lambda: whole(x),
               "backend, 4 graph breaks": lambda: backend(x)}
        return interleaved_ms(fns, rounds=rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.rounds)))
        return
    import tecc
    from benchmarks.common import host_line, write_table

    settings = {f"libgomp's default ({LIBGOMP_DEFAULT_SPIN})": LIBGOMP_DEFAULT_SPIN,
                f"tecc's ({tecc.OPENMP_SPIN_COUNT})": tecc.OPENMP_SPIN_COUNT}
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    results = {}
    for label, spin in settings.items():
        out = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds)],
                             env={**env, "GOMP_SPINCOUNT": spin}, check=True,
                             capture_output=True, text=True).stdout
        results[label] = json.loads(out.strip().splitlines()[-1])
        print(label, results[label], flush=True)
    base = results[next(iter(settings))]
    rows = [[label, *(f"{ms[k]:.2f}" for k in ms),
             f"{ms['backend, 4 graph breaks'] / ms['tecc whole model']:.2f}x",
             f"{base['backend, 4 graph breaks'] / ms['backend, 4 graph breaks']:.2f}x"]
            for label, ms in results.items()]
    write_table(
        "mixed_cpu", "torch and tecc in turn on the CPU: the backend on a model split by "
        "graph breaks (median ms)",
        ["GOMP_SPINCOUNT (torch's OpenMP)", *base, "split / whole tecc",
         "split: default spin / this"], rows,
        [f"Host: {host_line()}. ResNet-18, batch 1, fp32; the split model has a graph break "
         "and a torch multiply after each of its 4 stages (the stem, pooling and the "
         "classifier run in torch too: Dynamo runs the broken frame eagerly).",
         f"Each spin setting in its own process; medians over {args.rounds} interleaved rounds "
         "(benchmarks.common.interleaved_ms).",
         "Command: `python benchmarks/mixed_cpu.py`."])


if __name__ == "__main__":
    main()
