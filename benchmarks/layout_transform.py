"""What a layout_transform kernel costs on this CPU, by kind of transform.

Times the transform kernels tecc builds (the injective schedule's fallback, TVM's
time_evaluator, warm caches as the tuner times kernels) for activation shapes of
ResNet-18 and MobileNetV2 and the block pairs that tuned conv configs ask for, and
fits seconds = launch + bytes moved (read + write) / bandwidth per kind. Against a
conv's time, it says what choosing a config with another channel block costs alone.
In a model it costs more: weighing these costs against the tuned convs' times (a
graph-level choice of blocks) made MobileNetV2 no faster than tecc's choice of the
config that reads its producer's block (tecc/tuning.py): results/layout_transform.md.

    python benchmarks/layout_transform.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tvm  # noqa: E402
from tecc.frontend.ir import Call, Function, TensorType, Var  # noqa: E402
from tecc.graph_opt.layout import layout_name  # noqa: E402
from tecc.schedules.lower import lower_primitive  # noqa: E402

from benchmarks.common import host_line, write_table  # noqa: E402
from tecc.target import resolve_target  # noqa: E402

# (channels, height/width): activations of ResNet-18 and MobileNetV2 at batch 1
SHAPES = [(3, 224), (32, 112), (96, 112), (144, 56), (64, 56), (192, 28), (128, 28),
          (384, 14), (256, 14), (576, 14), (960, 7), (512, 7)]
BLOCK_PAIRS = [(16, 8), (8, 16), (16, 32), (32, 16), (None, 16), (16, None), (None, 3)]


def blocked_shape(c: int, hw: int, block: int | None) -> tuple[int, ...]:
    return (1, c, hw, hw) if block is None else (1, c // block, hw, hw, block)


def transform_seconds(c: int, hw: int, src: int | None, dst: int | None,
                      target: tvm.target.Target) -> float:
    x = Var("x", TensorType(blocked_shape(c, hw, src), "float32"))
    func = Function([x], Call("layout_transform", [x], {
        "src_layout": layout_name(src), "dst_layout": layout_name(dst)}))
    prim = lower_primitive(func, "k", target)
    ex = tvm.compile(tvm.IRModule({"k": prim}), target=target)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    data = tvm.runtime.tensor(rng.uniform(-1, 1, blocked_shape(c, hw, src)).astype("float32"),
                              dev)
    out = tvm.runtime.tensor(np.zeros(blocked_shape(c, hw, dst), "float32"), dev)
    timer = ex.mod.time_evaluator("k", dev, number=20, repeat=7, min_repeat_ms=40)
    return float(np.median(timer(data, out).results))


def transform_class(src: int | None, dst: int | None) -> str:
    """The kinds of transform whose speeds differ (the injective schedule vectorizes
    the output's innermost axis: splitting a block is slower than merging blocks)."""
    if src is None:
        return "from NCHW"
    if dst is None:
        return "to NCHW"
    return "to a smaller block" if dst < src else "to a larger block"


def main() -> None:
    target = resolve_target("llvm")
    rows: list[list[str]] = []
    samples: dict[str, list[tuple[int, float]]] = {}
    for c, hw in SHAPES:
        for src, dst in BLOCK_PAIRS:
            if any(b is not None and c % b for b in (src, dst)) or (dst == 3) != (c == 3):
                continue
            t = transform_seconds(c, hw, src, dst, target)
            moved = 2 * 4 * c * hw * hw
            samples.setdefault(transform_class(src, dst), []).append((moved, t))
            rows.append([f"{c}x{hw}x{hw}", f"{layout_name(src)} -> {layout_name(dst)}",
                         f"{moved / 1e3:.0f}", f"{t * 1e6:.1f}", f"{moved / t / 1e9:.1f}"])
            print(rows[-1], flush=True)
    fits = []
    for kind, points in samples.items():
        moved, seconds = np.array(points, float).T
        a = np.stack([np.ones(len(moved)), moved], axis=1)
        (launch, per_byte), *_ = np.linalg.lstsq(a, seconds, rcond=None)
        fits.append(f"- {kind}: seconds = {launch * 1e6:.2f} us + bytes / "
                    f"{1 / per_byte / 1e9:.1f} GB/s")
    print("\n".join(fits))
    write_table("layout_transform", "layout_transform kernels on this CPU",
                ["tensor (C x H x W)", "transform", "KB moved", "us", "GB/s"], rows,
                [host_line(), "",
                 "Each kernel as tecc builds it, timed alone with warm caches (TVM "
                 "time_evaluator, median of 7 repeats). Least-squares fits per kind of "
                 "transform (bytes: read + write):", "", *fits])


if __name__ == "__main__":
    main()
