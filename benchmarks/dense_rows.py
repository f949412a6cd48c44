"""Denses on 2-D rows (graph_opt/fold_dense_rows.py) against denses on their N-d input,
untuned CPU, both builds of each model timed in one process in interleaved rounds with
torch eager as the reference: ConvNeXt's pointwise MLP at each stage's size, an MLP on
[8, 128, 256] (a batch of sequences), and the zoo's models with such denses.

    python benchmarks/dense_rows.py [--models convnext,swin] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.graph_opt import pipeline  # noqa: E402

from benchmarks.common import against_eager, host_line, with_and_without, write_table  # noqa: E402


class Mlp(torch.nn.Module):
    """ConvNeXt's pointwise block on channels-last input: dense, GELU, dense, scale."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
        self.scale = torch.nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def mlp_case(shape: tuple[int, ...]) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Mlp(shape[-1]).eval(), (torch.randn(*shape),)


CASES = {
    "mlp_7x7x768": lambda: mlp_case((1, 7, 7, 768)),
    "mlp_14x14x384": lambda: mlp_case((1, 14, 14, 384)),
    "mlp_28x28x192": lambda: mlp_case((1, 28, 28, 192)),
    "mlp_56x56x96": lambda: mlp_case((1, 56, 56, 96)),
    "mlp_8x128x256": lambda: mlp_case((8, 128, 256)),
}


def zoo_case(name: str):
    from benchmarks import zoo

    return next(z for z in zoo.ZOO if z.name == name).build()


@contextlib.contextmanager
def without_fold() -> Iterator[None]:
    saved = pipeline.OPTIMIZATION_PASSES
    pipeline.OPTIMIZATION_PASSES = tuple(p for p in saved if p != "fold_dense_rows")
    try:
        yield
    finally:
        pipeline.OPTIMIZATION_PASSES = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join([*CASES, "convnext", "swin"]))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default="dense_rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        model, inputs = CASES[name]() if name in CASES else zoo_case(name)
        model = model.eval()
        print(f"== {name}", flush=True)
        nd, rows_2d = with_and_without(model, inputs, without_fold)
        ms, err = against_eager(model, inputs, {"nd": nd, "rows": rows_2d})
        rows.append([name, str(nd.summary().kernel_calls), str(rows_2d.summary().kernel_calls),
                     f"{ms['eager']:.3f}", f"{ms['nd']:.3f}", f"{ms['rows']:.3f}",
                     f"{ms['nd'] / ms['rows']:.2f}x", f"{err:.1e}"])
        print(rows[-1], flush=True)
    write_table(
        args.output, "Denses on 2-D rows against denses on N-d input (CPU, untuned)",
        ["model", "kernel calls N-d", "kernel calls rows", "torch eager ms", "tecc N-d ms",
         "tecc rows ms", "rows vs N-d", "max rel err"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads.",
         "N-d: the dense template takes the leading axes as a batch sharing the weight "
         "(fold_dense_rows left out); rows: every dense on [P, K], P the product of the "
         "leading axes and the rows. Medians over 7 interleaved rounds, one process.",
         "Command: `python benchmarks/dense_rows.py`."],
    )


if __name__ == "__main__":
    main()
