"""BERT-base's row kernels on a CUDA GPU (fp32): the GPU row templates
(schedules/gpu_reduce.py) against dlight's schedule of the same group and against
torch, CUDA-event medians in interleaved rounds; each kernel's result is checked
against torch first. Writes results/gpu_reduce.md.

    python benchmarks/gpu_reduce.py [--batches 1,16] [--dry-run]

Groups (sequence 128, hidden 768, 12 heads): the attention's masked softmax
(nn.safe_softmax, what aten._safe_softmax imports as), the group its decomposition
left before (`max_equal_logical_not_cast`, the any-reduction over the row; dlight
only: it no longer exists), and layer_norm. --dry-run builds every kernel it would
time (no GPU needed) and stops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_table  # noqa: E402

SEQ, HIDDEN, HEADS = 128, 768, 12


def groups(batch: int) -> list[tuple[str, Callable, list[torch.Tensor], Callable | None]]:
    """(name, IR function maker, inputs, torch reference or None)."""
    from tecc.frontend.ir import Call, Constant, Function, TensorType, Var

    gen = torch.Generator().manual_seed(batch)
    scores = torch.randn(batch, HEADS, SEQ, SEQ, generator=gen) * 3
    scores[..., 120:] = float("-inf")  # padded keys, as BERT's mask writes them
    x = torch.randn(batch, SEQ, HIDDEN, generator=gen)
    w, b = torch.randn(HIDDEN, generator=gen), torch.randn(HIDDEN, generator=gen)

    def var(name: str, t: torch.Tensor) -> Var:
        return Var(name, TensorType(tuple(t.shape), "float32"))

    def safe_softmax() -> Function:
        s = var("s", scores)
        return Function([s], Call("nn.safe_softmax", [s], {"axis": -1}))

    def any_kept() -> Function:
        s = var("s", scores)
        import numpy as np

        masked = Call("equal", [s, Constant(np.float32(-np.inf))])
        kept = Call("cast", [Call("logical_not", [masked])], {"dtype": "int32"})
        return Function([s], Call("max", [kept], {"axis": (-1,), "keepdims": True}))

    def layer_norm() -> Function:
        xv, wv, bv = var("x", x), var("w", w), var("b", b)
        return Function([xv, wv, bv], Call("nn.layer_norm", [xv, wv, bv], {"epsilon": 1e-12}))

    return [
        ("safe_softmax", safe_softmax, [scores],
         lambda s: torch.ops.aten._safe_softmax(s, -1)),
        ("max_equal_logical_not_cast", any_kept, [scores], None),
        ("layer_norm", layer_norm, [x, w, b],
         lambda xx, ww, bb: F.layer_norm(xx, (HIDDEN,), ww, bb, 1e-12)),
    ]


def build(func, schedule: str, target):
    """The CUDA library of `func` ("k") scheduled by the template or by dlight."""
    import tvm
    from tecc.schedules.gpu_default import _dlight, bind_unbound, with_cuda_limits
    from tecc.schedules.lower import build_te, lower_primitive
    from tvm import te
    from tvm.s_tir.schedule import Schedule

    from tecc.cuda_toolchain import compile_cuda

    if schedule == "template":
        prim, applied = lower_primitive(func, "k", target, None, return_info=True)
        note = ", ".join(f"{a.template} {a.source} {a.config}" for a in applied) or "generic"
    else:
        placeholders, outputs = build_te(func, target)
        sch = Schedule(tvm.IRModule({"main": te.create_prim_func(placeholders + outputs)}))
        limited = with_cuda_limits(target)
        sch = _dlight(sch, limited) or sch
        bind_unbound(sch, 1024)
        prim, note = sch.mod["main"].with_attr("global_symbol", "k"), "dlight"
    return compile_cuda(tvm.IRModule({"k": prim}), target), note


def cuda_ms(fns: dict[str, Callable[[], object]], rounds: int = 7, per_round: int = 50
            ) -> dict[str, float]:
    """Median milliseconds per call by CUDA events, competitors interleaved per round."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per_round):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples[name].append(start.elapsed_time(end) / per_round)
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    compare_schedules(groups, "gpu_reduce", "BERT-base row kernels on the GPU (fp32, ms per call)",
                      "seq 128, hidden 768, 12 heads")


def compare_schedules(make_groups: Callable, table: str, title: str, setting: str) -> None:
    """The command line of a template-against-dlight benchmark: `make_groups(batch)`
    gives (name, IR function maker, inputs, torch reference or None) per group; a group
    without a reference is timed under dlight only. Writes results/`table`.md."""
    parser = argparse.ArgumentParser(description=title)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--arch", default=None, help="sm_XX (default: the GPU's, else sm_90)")
    parser.add_argument("--dry-run", action="store_true", help="build only")
    args = parser.parse_args()
    from tecc.target import resolve_target

    arch = args.arch or (f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
                         if torch.cuda.is_available() else "sm_90")
    target = resolve_target(f"cuda:{arch}")
    rows, notes = [], []
    for batch in (int(b) for b in args.batches.split(",")):
        for name, make, inputs, reference in make_groups(batch):
            func = make()
            libs = {"dlight": build(func, "dlight", target)}
            if reference is not None:
                libs["tecc"] = build(func, "template", target)
            for schedule, (_, note) in libs.items():
                notes.append(f"- batch {batch} {name} {schedule}: {note}")
                print(notes[-1], flush=True)
            if args.dry_run:
                continue
            rows.append(measure(batch, name, func, libs, inputs, reference))
            print(rows[-1], flush=True)
    if args.dry_run:
        print("built every kernel (dry run: nothing timed)")
        return
    write_table(table, title,
                ["batch", "group", "tecc template", "dlight", "torch", "tecc / dlight",
                 "tecc / torch", "max abs error"], rows,
                [f"{torch.cuda.get_device_name()}, torch {torch.__version__}; medians of 7 "
                 f"rounds of 50 calls (CUDA events); {setting}. Configs:", *notes])


def measure(batch: int, name: str, func, libs: dict, inputs: list[torch.Tensor],
            reference: Callable | None) -> list[str]:
    import tvm

    device = [x.cuda() for x in inputs]
    out_type = func.body.ty
    dtype = {"float32": torch.float32, "int32": torch.int32}[str(out_type.dtype)]
    fns: dict[str, Callable[[], object]] = {}
    error = 0.0
    expected = reference(*device) if reference is not None else None
    for schedule, (lib, _) in libs.items():
        out = torch.empty(tuple(out_type.shape), dtype=dtype, device="cuda")
        args = [tvm.runtime.from_dlpack(t) for t in (*device, out)]
        kernel = lib["k"]
        kernel(*args)
        torch.cuda.synchronize()
        if expected is not None:
            diff = (out - expected).abs().nan_to_num(0.0)
            error = max(error, float(diff.max()))
        fns[schedule] = (lambda k=kernel, a=args: k(*a))
    if reference is not None:
        fns["torch"] = lambda: reference(*device)
    ms = cuda_ms(fns)
    tecc_ms, dlight_ms, torch_ms = ms.get("tecc"), ms["dlight"], ms.get("torch")

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    return [str(batch), name, fmt(tecc_ms), fmt(dlight_ms), fmt(torch_ms),
            "-" if tecc_ms is None else f"{tecc_ms / dlight_ms:.2f}",
            "-" if tecc_ms is None or torch_ms is None else f"{tecc_ms / torch_ms:.2f}",
            f"{error:.1e}" if reference is not None else "-"]


if __name__ == "__main__":
    main()
