"""The untuned dense register tile with this CPU's accumulator limit
(schedules/templates_dense.TILE_ACCUMULATORS) against the tile the vector registers
allow, per zoo model with dense layers: both builds in one process, interleaved
rounds, torch eager as the reference. On a CPU without an entry both builds are the
same: the script then says so and measures nothing, unless --accumulators gives a
limit to try there (the question an entry answers).

    python benchmarks/dense_tile_rows.py [--models bert,gpt2] [--threads 2]
        [--accumulators 16]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.schedules import templates_dense  # noqa: E402

from benchmarks import zoo  # noqa: E402
from benchmarks.common import host_line, write_table  # noqa: E402
from tecc.target import target_info  # noqa: E402

MODELS = "bert,gpt2,vit,convnext,segformer,mobilevit,whisper_encoder"


@contextlib.contextmanager
def accumulator_limits(limits: dict[str, int]) -> Iterator[None]:
    """TILE_ACCUMULATORS replaced by `limits` while the block runs."""
    saved = dict(templates_dense.TILE_ACCUMULATORS)
    templates_dense.TILE_ACCUMULATORS.clear()
    templates_dense.TILE_ACCUMULATORS.update(limits)
    try:
        yield
    finally:
        templates_dense.TILE_ACCUMULATORS.clear()
        templates_dense.TILE_ACCUMULATORS.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None,
                        help="results name (default dense_tile_rows_<this CPU>)")
    parser.add_argument("--accumulators", type=int, default=None,
                        help="the limit to measure on this CPU (default: its entry in "
                             "TILE_ACCUMULATORS)")
    args = parser.parse_args()
    cpu = target_info("llvm").cpu
    limit = args.accumulators or templates_dense.tile_accumulators(cpu)
    if limit is None:
        raise SystemExit(f"this CPU ({cpu}) has no accumulator limit in "
                         "templates_dense.TILE_ACCUMULATORS: both builds would be the same "
                         "(--accumulators N tries one)")
    torch.set_num_threads(args.threads)
    with accumulator_limits({cpu: limit}):
        rows = zoo.ab_rows(args.models, lambda: accumulator_limits({}))
    write_table(
        args.output or f"dense_tile_rows_{cpu}",
        f"Untuned dense register tiles: at most {limit} accumulators on {cpu} against the "
        "registers' limit (CPU)",
        ["model", "torch eager ms", "tecc registers' limit ms", f"tecc {limit} accumulators ms",
         "limited vs registers' limit", "max rel err"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads. Untuned (fallback configs), batch 1, "
         "the zoo's models (benchmarks/zoo.py). Medians over 7 interleaved rounds, one "
         "process.",
         "Command: `python benchmarks/dense_tile_rows.py"
         + (f" --accumulators {args.accumulators}" if args.accumulators else "") + "`."],
    )


if __name__ == "__main__":
    main()
