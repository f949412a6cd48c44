"""Random search over the template spaces vs torch, in one process (2 threads).

    .venv/bin/python -m benchmarks.templates_search [n_configs] [which...]

which: mm1024 (dense 1024^3, weight packed at compile time), matmul1024 (nn.matmul,
B non-constant), conv128 (ResNet-18 128ch 28x28 3x3), conv256 (256ch 14x14 3x3),
conv64 (64ch 56x56 3x3). Prints GFLOP/s of torch, the fallback config and the best
of n random configs.
"""

from __future__ import annotations

import random
import sys
import time

import numpy as np
import torch
import tvm
from tecc.schedules.tasks import task_from_workload

torch.set_num_threads(2)
TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2})
DEV = tvm.cpu()


def conv_wl(c, hw, o, k=3, s=1, p=1):
    return {"template": "conv2d_NCHWc", "data": [1, c, hw, hw], "kernel": [o, c, k, k],
            "dtype": "float32", "strides": [s, s], "padding": [p] * 4, "dilation": [1, 1],
            "groups": 1}


CASES = {
    "mm1024": {"template": "dense", "inputs": [[[1024, 1024], "float32"],
                                               [[1024, 1024], "float32"]], "attrs": {}},
    "matmul1024": {"template": "matmul", "inputs": [[[1024, 1024], "float32"],
                                                    [[1024, 1024], "float32"]],
                   "attrs": {"transpose_a": False, "transpose_b": False}},
    "conv64": conv_wl(64, 56, 64),
    "conv128": conv_wl(128, 28, 128),
    "conv256": conv_wl(256, 14, 256),
}


def flops(task) -> float:
    wl = task.workload
    if "data" in wl:
        n, c, h, w = wl["data"]
        o, ipg, kh, kw = wl["kernel"]
        s = wl["strides"][0]
        oh = (h + 2 * wl["padding"][0] - kh) // s + 1
        return 2.0 * n * o * oh * oh * ipg * kh * kw
    (a, _), (b, _) = wl["inputs"]
    return 2.0 * a[0] * a[1] * (b[0] if wl["template"] == "dense" else b[1])


def torch_time(task, inputs) -> float:
    x, w = (torch.from_numpy(a) for a in inputs)
    wl = task.workload
    if "data" in wl:
        def fn():
            return torch.nn.functional.conv2d(x, w, stride=wl["strides"], padding=wl["padding"][0])
    elif wl["template"] == "dense":
        def fn():
            return torch.nn.functional.linear(x, w)
    else:
        def fn():
            return torch.matmul(x, w)
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        best = min(best, (time.perf_counter() - t0) / 5)
    return best


def tvm_time(task, config, inputs, expected) -> tuple[float, float]:
    prim = task.build_primfunc(config).with_attr("global_symbol", "k")
    ex = tvm.compile(tvm.IRModule({"k": prim}), target=TARGET)
    ki, ko = task.adapt_io(config, inputs, expected)
    args = [tvm.runtime.tensor(a, DEV) for a in ki]
    outs = [tvm.runtime.tensor(np.zeros(o.shape, o.dtype), DEV) for o in ko]
    ex["k"](*args, *outs)
    err = max(float(np.abs(o.numpy() - e).max()) for o, e in zip(outs, ko, strict=True))
    t = ex.mod.time_evaluator("k", DEV, number=3, repeat=3, min_repeat_ms=50)(*args, *outs).min
    return t, err


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    which = sys.argv[2:] or list(CASES)
    for name in which:
        task = task_from_workload(CASES[name], TARGET, name)
        inputs = task.reference_inputs(0)
        expected = task.reference_outputs(inputs)
        gf = flops(task) / 1e9
        t_torch = torch_time(task, inputs)
        fb = task.fallback_config()
        t_fb, err = tvm_time(task, fb, inputs, expected)
        print(f"{name}: space {len(task.space)}; torch {gf / t_torch:.1f} GFLOP/s; "
              f"fallback {gf / t_fb:.1f} GFLOP/s (err {err:.1e}) {fb.to_json()}", flush=True)
        best = (float("inf"), None)
        start = time.perf_counter()
        for cfg in task.space.sample(random.Random(0), n):
            try:
                t, err = tvm_time(task, cfg, inputs, expected)
            except Exception as exc:  # noqa: BLE001
                print("  failed", cfg.to_json(), exc)
                continue
            if err > 1e-2:
                print("  WRONG", cfg.to_json(), err)
            if t < best[0]:
                best = (t, cfg.to_json())
        t_torch = torch_time(task, inputs)
        print(f"{name}: best of {n} {gf / best[0]:.1f} GFLOP/s {best[1]}; torch again "
              f"{gf / t_torch:.1f} GFLOP/s; search {time.perf_counter() - start:.0f}s",
              flush=True)


if __name__ == "__main__":
    main()
