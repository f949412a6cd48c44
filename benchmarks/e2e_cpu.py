"""End-to-end latency on this CPU: torch eager, torch.compile, ONNX Runtime and tecc,
measured in one run on the same number of threads, batch 1.

    python benchmarks/e2e_cpu.py [--models resnet18,mlp] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tecc.autotune.records import load_records  # noqa: E402

import tecc  # noqa: E402
from benchmarks.common import host_line, interleaved_ms, write_table  # noqa: E402
from tests.models import example_models  # noqa: E402
from tests.util import max_rel_error  # noqa: E402


def onnxruntime_session(model, inputs, threads: int):
    import onnxruntime as ort

    path = Path(tempfile.mkdtemp()) / "model.onnx"
    names = [f"input{i}" for i in range(len(inputs))]
    torch.onnx.export(model, inputs, str(path), input_names=names, dynamo=True,
                      verbose=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs, strict=True)}
    return lambda: session.run(None, feeds)


def tuning_trials(cm, records: list) -> int:
    """Measurements the records hold for the compiled model's workloads (the tuning
    trials it got; the re-measurements of the verification rounds not counted)."""
    keys = {t["workload_key"] for t in cm.tasks()}
    return sum(1 for r in records if r.verify is None and r.key in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="mlp,resnet18,mobilenet_v2,transformer_layer,bert")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default="e2e_cpu")
    parser.add_argument("--records", default=None,
                        help="tuning records (file or folder) to compile with")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = example_models(batch=1)
    records = load_records(args.records)[0] if args.records else []
    rows = []
    for name in args.models.split(","):
        model, inputs = models[name]
        print(f"== {name}", flush=True)
        competitors = {}
        with torch.no_grad():
            expected = model(*inputs)
            competitors["eager"] = lambda: model(*inputs)  # noqa: B023
            try:
                compiled_torch = torch.compile(model)
                compiled_torch(*inputs)
                competitors["inductor"] = lambda: compiled_torch(*inputs)  # noqa: B023
            except Exception as err:  # a competitor failing is reported, not fatal
                print(f"torch.compile failed: {err}")
        try:
            competitors["ort"] = onnxruntime_session(model, inputs, args.threads)
        except Exception as err:
            print(f"ONNX Runtime failed: {type(err).__name__}: {err}")
        start = time.perf_counter()
        cm = tecc.compile(model, inputs, records=args.records)
        compile_s = time.perf_counter() - start
        np_inputs = [x.numpy() for x in inputs]
        error = max_rel_error(cm(*inputs), expected)
        competitors["tecc"] = lambda: cm(*np_inputs)  # noqa: B023
        if args.records:  # the fallback configs too, in the same rounds
            untuned = tecc.compile(model, inputs)
            competitors["untuned"] = lambda: untuned(*np_inputs)  # noqa: B023

        with torch.no_grad():
            times = interleaved_ms(competitors)
        eager, tecc_ms = times["eager"], times["tecc"]
        inductor, ort_ms = times.get("inductor", float("nan")), times.get("ort", float("nan"))
        untuned_col = [f"{times['untuned']:.3f}"] if args.records else []
        trials_col = [str(tuning_trials(cm, records))] if args.records else []
        rows.append([name, f"{eager:.3f}", f"{inductor:.3f}", f"{ort_ms:.3f}", *untuned_col,
                     f"{tecc_ms:.3f}", f"{eager / tecc_ms:.2f}x", f"{ort_ms / tecc_ms:.2f}x",
                     f"{len(cm.plan['kernels'])}", *trials_col, f"{compile_s:.0f}",
                     f"{error:.1e}"])
        print(rows[-1], flush=True)
    write_table(
        args.output, "End-to-end latency, CPU, batch 1 (median ms)",
        ["model", "torch eager", "torch.compile", "ONNX Runtime"]
        + (["tecc untuned"] if args.records else [])
        + ["tecc", "tecc vs eager", "tecc vs ORT", "kernel calls"]
        + (["tuning trials"] if args.records else []) + ["tecc compile s", "max rel err"],
        rows,
        [f"Host: {host_line()}; {args.threads} threads for every framework.",
         f"torch {torch.__version__}, tecc {tecc.__version__}, tuning records: "
         f"{args.records or 'none (fallback configs)'}.",
         "Medians over interleaved rounds (every competitor measured in each round).",
         "Ratios above 1 mean tecc is faster. Command: `python benchmarks/e2e_cpu.py"
         + (f" --records {args.records} --output {args.output}`." if args.records else "`.")],
    )


if __name__ == "__main__":
    main()
