"""The untuned dense fallback with some of its values overridden (--set), against the
fallback as it stands, per zoo model with dense layers: both builds in one process,
interleaved rounds, torch eager as the reference. The overrides apply to the large
GEMMs' branch (order k_mn: M >= 128, N and K >= 256) of
schedules/templates_dense.dense_fallback_values, or to every dense with --all.

    python benchmarks/dense_fallback_ab.py --set order=mn_k [--set tile_no=1]
        [--models vit,whisper_encoder] [--all] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.schedules import templates_dense  # noqa: E402

from benchmarks import zoo  # noqa: E402
from benchmarks.common import host_line, write_table  # noqa: E402
from tecc.target import target_info  # noqa: E402

MODELS = "bert,gpt2,vit,convnext,segformer,mobilevit,whisper_encoder"


@contextlib.contextmanager
def fallback_values(function: Callable[..., dict[str, Any]]) -> Iterator[None]:
    """templates_dense.dense_fallback_values replaced by `function` while the block
    runs."""
    saved = templates_dense.dense_fallback_values
    templates_dense.dense_fallback_values = function
    try:
        yield
    finally:
        templates_dense.dense_fallback_values = saved


def overriding(values: dict[str, Any], every_dense: bool) -> Callable[..., dict[str, Any]]:
    """dense_fallback_values with `values` set in the large GEMMs' branch, or in every
    dense's."""
    original = templates_dense.dense_fallback_values

    def fallback(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = original(*args, **kwargs)
        return dict(out, **values) if every_dense or out["order"] == "k_mn" else out

    return fallback


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", required=True, metavar="KNOB=VALUE")
    parser.add_argument("--all", action="store_true", help="override every dense's fallback")
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None,
                        help="results name (default dense_fallback_ab_<this CPU>)")
    args = parser.parse_args()
    values = {k: _value(v) for k, v in (item.split("=", 1) for item in args.set)}
    label = ", ".join(f"{k}={v}" for k, v in values.items())
    cpu = target_info("llvm").cpu
    torch.set_num_threads(args.threads)
    original = templates_dense.dense_fallback_values
    with fallback_values(overriding(values, args.all)):
        rows = zoo.ab_rows(args.models, lambda: fallback_values(original))
    write_table(
        args.output or f"dense_fallback_ab_{cpu}",
        f"Untuned dense fallback with {label} against it as it stands, on {cpu} (CPU)",
        ["model", "torch eager ms", "tecc fallback ms", f"tecc {label} ms",
         "changed vs fallback", "max rel err"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads. Untuned, batch 1, the zoo's models "
         "(benchmarks/zoo.py); overrides in " + ("every dense" if args.all else
                                                   "the large GEMMs' branch (order k_mn)")
         + ". Medians over 7 interleaved rounds, one process.",
         "Command: `python benchmarks/dense_fallback_ab.py "
         + " ".join(f"--set {item}" for item in args.set) + (" --all" if args.all else "")
         + "`."],
    )


if __name__ == "__main__":
    main()
