"""End-to-end latency on a CUDA GPU, fp32 with TF32 off everywhere: torch eager,
torch.compile (default, mode="reduce-overhead", optionally "max-autotune"), tecc
untuned and, with --records, tecc with those tuning records, measured in one process
with CUDA events; plus GEMMs against cuBLAS.

    python benchmarks/e2e_gpu.py [--models resnet18,mlp] [--batches 1,16] [--gemm 1024,4096]
        [--records tuning_logs/cuda-sm_90.jsonl]

Each run adds its rows to results/e2e_gpu.json (keyed by model and batch) and
writes results/e2e_gpu.md from every stored row, so the batches may run apart.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tecc  # noqa: E402
from benchmarks.common import RESULTS, write_table  # noqa: E402
from tests.models import MLP, MatMul, MobileNetV2, bert_encoder, resnet18  # noqa: E402
from tests.util import max_rel_error, to_cpu  # noqa: E402

COMPETITORS = ("eager", "compile", "reduce-overhead", "tecc", "tecc-direct")
TORCH_MODES = {"compile": None, "reduce-overhead": "reduce-overhead",
               "max-autotune": "max-autotune"}


def bert_base(batch: int):
    model = bert_encoder(hidden=768, layers=12, heads=12)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (batch, 128), generator=gen)
    mask = torch.ones(batch, 128, dtype=torch.int64)
    mask[:, 120:] = 0
    return model, (ids, mask)


def make_model(name: str, batch: int):
    gen = torch.Generator().manual_seed(0)
    if name == "resnet18":
        return resnet18(), (torch.randn(batch, 3, 224, 224, generator=gen),)
    if name == "mobilenet_v2":
        return MobileNetV2(), (torch.randn(batch, 3, 224, 224, generator=gen),)
    if name == "bert_base":
        return bert_base(batch)
    if name == "mlp":
        return MLP(), (torch.randn(batch, 64, generator=gen),)
    raise KeyError(name)


def cuda_ms(fns: dict[str, Callable[[], object]], rounds: int = 5, per_round: int = 20,
            warmup: int = 5) -> dict[str, float]:
    """Median milliseconds of each function by CUDA events around each call, in
    interleaved rounds (every competitor measured in each round)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(per_round)]
            for start, end in events:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            samples[name] += [s.elapsed_time(e) for s, e in events]
    return {name: statistics.median(v) for name, v in samples.items()}


def run_model(name: str, batch: int, competitors: list[str], records: str | None = None
              ) -> dict:
    model, cpu_inputs = make_model(name, batch)
    model = model.eval()
    with torch.no_grad():
        expected = model(*cpu_inputs)
    gpu_model = copy.deepcopy(model).cuda()
    inputs = tuple(x.cuda() for x in cpu_inputs)
    fns: dict[str, Callable[[], object]] = {}
    compile_s: dict[str, float] = {}
    with torch.no_grad():
        if "eager" in competitors:
            fns["eager"] = lambda: gpu_model(*inputs)
        for mode, torch_mode in TORCH_MODES.items():
            if mode not in competitors:
                continue
            try:
                start = time.perf_counter()
                compiled_torch = torch.compile(gpu_model, dynamic=False, mode=torch_mode)
                compiled_torch(*inputs)
                compiled_torch(*inputs)
                compile_s[mode] = time.perf_counter() - start
                fns[mode] = lambda f=compiled_torch: f(*inputs)
            except Exception as err:  # a competitor failing is reported, not fatal
                print(f"torch.compile {mode} failed: {type(err).__name__}: {err}")
    start = time.perf_counter()
    cm = tecc.compile(model, cpu_inputs, target="cuda")
    compile_s["tecc"] = time.perf_counter() - start
    error = max_rel_error(to_cpu(cm(*inputs)), expected)
    fns["tecc"] = lambda: cm(*inputs)
    if "tecc-direct" in competitors and any("winograd" in k["name"] for k in cm.plan["kernels"]):
        # the same build with every conv direct: what Winograd brings
        direct = tecc.compile(model, cpu_inputs, target="cuda", winograd=False)
        error = max(error, max_rel_error(to_cpu(direct(*inputs)), expected))
        fns["tecc direct convs"] = lambda: direct(*inputs)
    tuned_from = {}
    if records:
        start = time.perf_counter()
        tuned = tecc.compile(model, cpu_inputs, target="cuda", records=records)
        compile_s["tecc tuned"] = time.perf_counter() - start
        error = max(error, max_rel_error(to_cpu(tuned(*inputs)), expected))
        fns["tecc tuned"] = lambda: tuned(*inputs)
        for task in tuned.tasks():
            tuned_from[task["source"]] = tuned_from.get(task["source"], 0) + 1
    with torch.no_grad():
        times = cuda_ms(fns)
    if records:
        cm = tuned  # the profile below is of the tuned model (after timing: fns hold cm)
    # where tecc's time goes: each kernel call synchronized (launch overhead included)
    per_kernel = sorted(cm._executor.profile(*inputs, repeat=10), key=lambda r: -r[1])
    used = {}
    for task in cm.tasks():
        config = task["config"] or {}
        for kernel in task["kernels"]:
            used[kernel] = (f"{task['template']} {config.get('rule', '')} "
                            f"{config.get('tile', '')} {task['workload_key'][:90]}")
    top = [[k, round(sec * 1e3, 4), used.get(k, "")] for k, sec in per_kernel[:10]]
    print(f"slowest kernels (ms): {top}", flush=True)
    # each kernel summed over its calls (one model layer's kernel runs once per layer)
    totals: dict[str, list[float]] = {}
    for kernel, sec in per_kernel:
        total = totals.setdefault(kernel, [0.0, 0])
        total[0] += sec * 1e3
        total[1] += 1
    by_kernel = [[k, round(ms, 4), calls, used.get(k, "")]
                 for k, (ms, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0])]
    print("time by kernel (ms, calls):", flush=True)
    for kernel, ms, calls, what in by_kernel[:16]:
        print(f"  {ms:8.3f} {calls:4d}  {kernel}  {what}", flush=True)
    return {"model": name, "batch": batch, "ms": times, "compile_s": compile_s,
            "kernel_calls": len(cm.plan["kernels"]), "max_rel_err": error,
            "tuned_sources": tuned_from,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "slowest_kernels_ms": top,
            "kernel_totals_ms": by_kernel[:16]}



def run_gemm(n: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen) for _ in range(2))
    cm = tecc.compile(MatMul(), (a, b), target="cuda")
    ga, gb = a.cuda(), b.cuda()
    error = max_rel_error(cm(ga, gb).cpu(), (ga @ gb).cpu())
    times = cuda_ms({"cublas": lambda: ga @ gb, "tecc": lambda: cm(ga, gb)}, rounds=3)
    tflops = {k: 2 * n**3 / (v * 1e-3) / 1e12 for k, v in times.items()}
    return {"n": n, "ms": times, "tflops": tflops, "max_rel_err": error,
            "device": torch.cuda.get_device_name()}


def carried_torch_times(old: dict | None, new: dict) -> dict[str, float]:
    """The torch modes the row's previous run measured and `new`'s run left out (a
    max-autotune compile takes minutes): kept, marked as earlier, in the table."""
    if old is None:
        return {}
    earlier = {**old.get("earlier_ms", {}), **old["ms"]}
    return {k: v for k, v in earlier.items()
            if not k.startswith("tecc") and k not in new["ms"]}


def check_same_device(store: dict, path: Path, device: str) -> None:
    """A table speaks of one GPU: rows of another device go to another --output."""
    rows = [*store["models"].values(), *store.get("gemm", {}).values()]
    held = {row.get("device") for row in rows} - {None, device}
    if held:
        raise SystemExit(f"{path} holds rows measured on {', '.join(sorted(held))}, and this "
                         f"GPU is {device}: give this device its own --output NAME")


def write_markdown(store: dict, output: str) -> None:
    rows = []
    for key in sorted(store["models"], key=lambda k: (k.split("@")[0], int(k.split("@")[1]))):
        r = store["models"][key]
        ms, earlier = r["ms"], r.get("earlier_ms", {})
        eager, ours = ms.get("eager", earlier.get("eager", float("nan"))), ms["tecc"]

        def cell(name: str, ms: dict = ms, earlier: dict = earlier) -> str:
            if name in ms:
                return f"{ms[name]:.3f}"
            return f"{earlier[name]:.3f}*" if name in earlier else "-"

        # records tuned against an older fallback can be slower than today's fallback
        best = min(ours, ms.get("tecc tuned", ours))
        torch_best = min(v for k, v in {**earlier, **ms}.items() if not k.startswith("tecc"))
        rows.append([r["model"], str(r["batch"]), cell("eager"), cell("compile"),
                     cell("reduce-overhead"), cell("max-autotune"), f"{ours:.3f}",
                     cell("tecc direct convs"), cell("tecc tuned"), f"{eager / best:.2f}x", f"{torch_best / best:.2f}x",
                     str(r["kernel_calls"]), f"{r['compile_s']['tecc']:.0f}",
                     f"{r['max_rel_err']:.1e}"])
    gemm_rows = [[str(g["n"]), f"{g['ms']['cublas']:.3f}", f"{g['ms']['tecc']:.3f}",
                  f"{g['tflops']['cublas']:.1f}", f"{g['tflops']['tecc']:.1f}",
                  f"{g['tflops']['tecc'] / g['tflops']['cublas']:.2f}x", f"{g['max_rel_err']:.1e}"]
                 for g in sorted(store.get("gemm", {}).values(), key=lambda g: g["n"])]
    first = next(iter(store["models"].values()), {})
    device = first.get("device", "a CUDA GPU")
    # the torch the rows were measured with (a table rewritten elsewhere keeps it)
    torch_version = first.get("torch", torch.__version__)
    notes = [f"Device: {device}; torch {torch_version}, tecc {tecc.__version__}. "
             "\"tecc\": untuned (fallback configs; Winograd for the 3x3 convs the default "
             "rule picks); \"tecc direct convs\": the same with every conv direct "
             "(winograd=False); \"tecc tuned\": with the tuning records "
             "given (--records); the ratios are of tecc's faster column against eager and "
             "against the fastest torch mode measured.",
             "fp32 everywhere, TF32 off (torch.backends.cuda.matmul.allow_tf32 = "
             "torch.backends.cudnn.allow_tf32 = False); inputs and outputs are torch CUDA tensors.",
             "Median ms by CUDA events around each call, interleaved rounds, one process per "
             "batch. tecc replays one CUDA graph per call; ratios above 1 mean tecc is faster.",
             "*: a torch mode this row's latest run left out, from the row's previous run "
             "on the same device (torch's time does not depend on tecc's version).",
             f"Command: `python benchmarks/e2e_gpu.py{'' if output == 'e2e_gpu' else ' --output ' + output}`"
             " (see --help)."]
    path = write_table(output, "End-to-end latency, CUDA GPU, fp32 (median ms)",
                       ["model", "batch", "torch eager", "torch.compile",
                        "torch.compile reduce-overhead", "torch.compile max-autotune", "tecc",
                        "tecc direct convs", "tecc tuned", "tecc vs eager", "tecc vs fastest torch",
                        "kernel calls", "tecc compile s", "max rel err"], rows, notes)
    # what a row's run had that the table does not say (records tuned in the same call):
    # written by hand into the store, dropped when the row is measured again
    row_notes = [f"{r['model']} at batch {r['batch']}: {r['note']}"
                 for r in store["models"].values() if r.get("note")]
    if row_notes:
        with open(path, "a") as f:
            f.write("\n" + "\n\n".join(row_notes) + "\n")
    if gemm_rows:
        lines = ["", "## GEMM (n x n x n, fp32)", "",
                 "| n | cuBLAS ms | tecc ms | cuBLAS TFLOP/s | tecc TFLOP/s | tecc / cuBLAS "
                 "| max rel err |", "|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(r) + " |" for r in gemm_rows]
        with open(path, "a") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert_base,mlp")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--gemm", default="1024,4096", help="GEMM sizes ('' for none)")
    parser.add_argument("--competitors", default=",".join(COMPETITORS),
                        help=f"of {', '.join(('eager', *TORCH_MODES, 'tecc'))}")
    parser.add_argument("--records", default=None,
                        help="tuning records: also time tecc with them (\"tecc tuned\")")
    parser.add_argument("--output", default="e2e_gpu",
                        help="results/NAME.json and .md: one store a device (default e2e_gpu, "
                             "the H200's)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        # the tables name the GPU they were measured on: nothing to add without one
        raise SystemExit("e2e_gpu.py measures on a CUDA GPU, and torch sees none here")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    competitors = args.competitors.split(",")
    store_path = RESULTS / f"{args.output}.json"
    store = (json.loads(store_path.read_text()) if store_path.exists()
             else {"models": {}, "gemm": {}})
    check_same_device(store, store_path, torch.cuda.get_device_name())
    for batch in [int(b) for b in args.batches.split(",") if b]:
        for name in [m for m in args.models.split(",") if m]:
            print(f"== {name} batch {batch}", flush=True)
            try:
                row = run_model(name, batch, competitors, args.records)
            except Exception as err:  # noqa: BLE001 - report and go on with the others
                print(f"{name} batch {batch} failed: {type(err).__name__}: {err}", flush=True)
                continue
            print(json.dumps(row), flush=True)
            key = f"{name}@{batch}"
            row["earlier_ms"] = carried_torch_times(store["models"].get(key), row)
            store["models"][key] = row
            store_path.parent.mkdir(parents=True, exist_ok=True)
            store_path.write_text(json.dumps(store, indent=1))
    for n in [int(v) for v in args.gemm.split(",") if v]:
        print(f"== gemm {n}", flush=True)
        store["gemm"][str(n)] = run_gemm(n)
        print(json.dumps(store["gemm"][str(n)]), flush=True)
        store_path.write_text(json.dumps(store, indent=1))
    write_markdown(store, args.output)


if __name__ == "__main__":
    main()
