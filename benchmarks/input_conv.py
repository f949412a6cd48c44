"""The conv on the RGB input: which input block its untuned layout takes.

The layout pass gives a conv's input a channel block (graph_opt/layout.in_block).
Three channels have no vector block; this compares the two choices, each built with
the fallback configs in the same process and timed interleaved:
- "NCHW in place" (tecc's rule): blocks of 1 channel, the model's NCHW input read as
  it is (a reshape, no layout_transform);
- "all 3 channels" (the previous rule): [N, 1, H, W, 3], after a layout_transform.
With `--compare tiles`, the fallback's column tile of such a conv (one input channel
per step, overlapping kw taps: templates_conv.TAP_SHARING_SHARE) instead: the full
accumulator budget against half of it (tecc's rule).
Targets: the host's (llvm) and AVX2 (llvm:core-avx2), which runs on any x86-64 host
with AVX2, so both are measured on one machine.

    python benchmarks/input_conv.py [--targets llvm,llvm:core-avx2] [--compare tiles]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc.graph_opt.layout as layout  # noqa: E402
import tecc.schedules.templates_conv as templates_conv  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import host_line, interleaved_ms, write_table  # noqa: E402
from tests.models import MobileNetV2, randomize_batchnorm, resnet18  # noqa: E402

IN_PLACE = layout.in_block


def all_channels_block(channels: int, lanes: int) -> int:
    """The previous rule: few channels without a vector block are one block."""
    block = IN_PLACE(channels, lanes)
    return channels if block == 1 and channels > 1 else block


def use_rule(rule) -> None:
    layout.in_block = rule
    templates_conv.in_block = rule


def tap_share(share: float) -> None:
    templates_conv.TAP_SHARING_SHARE = share


HALF_TILE = templates_conv.TAP_SHARING_SHARE
# per comparison: the two variants (label, how to set it up), the table's name and title
COMPARISONS = {
    "blocks": ((("all 3 channels", lambda: use_rule(all_channels_block)),
                ("NCHW in place (tecc)", lambda: use_rule(IN_PLACE))),
               "input_conv", "The conv on the RGB input: its untuned input block (median ms)",
               "reading NCHW in place is faster"),
    "tiles": ((("full column tile", lambda: tap_share(1.0)),
               ("half column tile (tecc)", lambda: tap_share(HALF_TILE))),
              "input_conv_tiles",
              "The conv on the RGB input: its fallback column tile (median ms)",
              "the half tile is faster"),
}


def restore() -> None:
    use_rule(IN_PLACE)
    tap_share(HALF_TILE)


def models() -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    out = {
        "stem 7x7/2, 3 -> 64 (ResNet)": torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 7, 2, 3), torch.nn.ReLU()),
        "stem 3x3/2, 3 -> 32 (MobileNetV2)": torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, 2, 1), torch.nn.ReLU6()),
        "ResNet-18": resnet18(),
        "MobileNetV2": MobileNetV2(),
    }
    for m in out.values():
        m.eval()
        randomize_batchnorm(m)
    return {name: (m, (x,)) for name, m in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--targets", default="llvm,llvm:core-avx2")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="blocks")
    args = parser.parse_args()
    variants, table, title, better = COMPARISONS[args.compare]
    (first, _), (second, _) = variants
    rows = []
    for target in args.targets.split(","):
        for name, (model, inputs) in models().items():
            x = inputs[0].numpy()
            with torch.no_grad():
                want = model(*inputs).numpy()
            built = {}
            for label, set_up in variants:
                set_up()
                built[label] = tecc.compile(model, inputs, target=target)
            restore()
            for label, cm in built.items():
                err = np.abs(np.asarray(cm(x)) - want).max() / np.abs(want).max()
                if err > 1e-4:
                    raise AssertionError(f"{name} {label}: relative error {err:.1e}")
            ms = interleaved_ms({k: (lambda cm=cm, x=x: cm(x)) for k, cm in built.items()},
                                rounds=9)
            ratio = ms[first] / ms[second]
            rows.append([target, name, f"{ms[first]:.3f}", f"{ms[second]:.3f}", f"{ratio:.2f}x"])
            print(rows[-1], flush=True)
    command = "python benchmarks/input_conv.py" + (
        f" --compare {args.compare}" if args.compare != "blocks" else "")
    write_table(table, title, ["target", "model", first, second, "speedup"], rows,
                [host_line(), "Fallback configs, batch 1, 224x224, both variants built in one "
                 f"process and timed in interleaved rounds; ratios above 1 mean {better}.",
                 f"Command: `{command}`."])


if __name__ == "__main__":
    main()
