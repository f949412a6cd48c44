"""The tecc command line, after tvmc: `tecc compile`, `tecc run`."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any

import numpy as np

NO_WINOGRAD_HELP = ("direct 3x3 convs only: a smaller package (Winograd's kernels are "
                    "1.8-4x the size) for some speed")


def load_model_spec(spec: str) -> tuple[Any, tuple | None]:
    """A `.pt2` file (torch.export.save), or `module:function` returning
    (model, example_inputs)."""
    if spec.endswith(".pt2"):
        return spec, None
    if ":" not in spec:
        raise SystemExit(f"tecc: model {spec!r} must be a .pt2 file or module:function")
    module_name, func_name = spec.split(":", 1)
    sys.path.insert(0, ".")
    factory = getattr(importlib.import_module(module_name), func_name)
    model, example_inputs = factory()
    return model, tuple(example_inputs)


def cmd_compile(args: argparse.Namespace) -> int:
    import tecc
    from tecc.autotune.records import SOURCES

    model, example_inputs = load_model_spec(args.model)
    compiled = tecc.compile(model, example_inputs, target=args.target, records=args.records,
                            winograd=not args.no_winograd)
    compiled.export(args.output)
    print(f"compiled {args.model} for {compiled.target}: "
          f"{len(compiled.build_result.kernels)} kernels -> {args.output}")
    tasks = compiled.tasks()
    counts = {source: sum(t["source"] == source for t in tasks) for source in SOURCES}
    counts["generic"] = len(tasks) - sum(counts.values())
    print(f"configs of {len(tasks)} workloads: "
          + ", ".join(f"{n} {source}" for source, n in counts.items() if n or source != "generic"))
    if args.records:
        print(compiled.tuning_report())
    return 0


def print_retarget(states: list, records: str) -> None:
    """The table of a retarget run: per task, configs measured here and the times."""
    print(f"{'task':28s} {'calls':>5s} {'configs':>7s} {'fallback ms':>11s} {'best ms':>9s} "
          f"{'speedup':>7s}")
    for s in states:
        print(f"{s.task.name:28s} {s.weight:5d} {len(s.configs):7d} {s.fallback_s * 1e3:11.4f} "
              f"{s.best_s * 1e3:9.4f} {s.speedup:7.2f}")
    print(f"records: {records}")


def _retarget(args: argparse.Namespace, model_spec: str, foreign: list[str] | None,
              records: str) -> int:
    import tecc
    from tecc.autotune.pool import WorkerStartError
    from tecc.autotune.records import RecordsBusyError

    model, example_inputs = load_model_spec(model_spec)
    try:
        states = tecc.retarget(model, example_inputs, foreign=foreign, records=records,
                               target=args.target, k=args.k, time_budget=args.time_budget,
                               rounds=args.rounds, timeout=args.timeout,
                               winograd=not args.no_winograd, cache_flush=args.cache_flush)
    except (RecordsBusyError, WorkerStartError, ValueError) as err:
        raise SystemExit(f"tecc {args.command}: {err}") from None
    print_retarget(states, records)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    import tecc
    from tecc.autotune.pool import WorkerStartError
    from tecc.autotune.records import RecordsBusyError
    from tecc.frontend.importer import UnsupportedOperatorError
    from tecc.runtime.cuda import CudaError

    if args.retarget:
        return _retarget(args, args.model, args.transfer, args.records)
    model, example_inputs = load_model_spec(args.model)
    try:
        states = tecc.tune(model, example_inputs, target=args.target, records=args.records,
                           trials=args.trials, timeout=args.timeout, tuner=args.tuner,
                           early_stopping=args.early_stopping or None, plot=args.plot,
                           verify_top=args.verify_top, verify_rounds=args.verify_rounds,
                           winograd=not args.no_winograd,
                           transfer=False if args.no_transfer else (args.transfer or True),
                           cache_flush=args.cache_flush, fallback=args.fallback)
    except (RecordsBusyError, CudaError, UnsupportedOperatorError, WorkerStartError) as err:
        raise SystemExit(f"tecc tune: {err}") from None
    print(f"{'task':28s} {'calls':>5s} {'trials':>6s} {'best GFLOP/s':>12s}")
    for s in states:
        print(f"{s.task.name:28s} {s.weight:5d} {s.trials:6d} {s.best_gflops:12.1f}")
    print(f"records: {args.records}" + (f", curve: {args.plot}" if args.plot else ""))
    return 0


def cmd_records(args: argparse.Namespace) -> int:
    """Inspect, merge, or keep the best record per workload and target."""
    import json

    from tecc.autotune.records import (
        best_records,
        exact_target_key,
        isa_family,
        load_records,
        measured_on_chip,
        target_relation,
    )
    from tecc.canonical import canonical_json
    from tecc.runtime import cpu

    if args.action == "retarget":
        if not args.model or not args.output:
            raise SystemExit("tecc records retarget: --model MODEL and -o LOCAL are needed "
                             "(the model whose kernels to measure, the records to write)")
        return _retarget(args, args.model, args.files, args.output)
    records, skipped = load_records(args.files)
    if args.action == "show":
        from tecc.target import target_info

        host_info = target_info(args.target)
        host = host_info.to_json()
        chip = cpu.host_cpu_id() if host_info.is_host else None
        by_workload: dict[tuple[str, str], list] = {}
        targets: dict[str, dict] = {}
        for r in records:
            tkey = exact_target_key(r.target)
            by_workload.setdefault((r.key, tkey), []).append(r)
            targets.setdefault(tkey, r.target)
        print(f"{len(records)} records ({skipped} broken lines skipped), "
              f"{len(by_workload)} workload/target pairs")
        for tkey, tgt in sorted(targets.items()):
            n = sum(len(rs) for (_, t), rs in by_workload.items() if t == tkey)
            relation = target_relation(tgt, host)
            if relation == "exact":
                verdict = "applied by compile"
            elif tgt.get("kind") != host.get("kind"):
                verdict = "not applied (another kind of target)"
            else:
                same_chip = sum(measured_on_chip(r, chip) for (_, t), rs in by_workload.items()
                                if t == tkey for r in rs) if relation == "compatible" else 0
                verdict = ((f"{same_chip} measured on this chip ({chip}): applied by compile; "
                            f"the other {n - same_chip}: ") if same_chip else "not applied; ") \
                    + "`tecc records retarget` measures them here"
            print(f"target {canonical_json(tgt)} ({isa_family(tgt)}): {n} records, "
                  f"{relation} for {args.target} "
                  f"({host.get('mcpu') or host.get('arch')}, {host.get('num-cores')} cores): "
                  + verdict)
        for (key, tkey), rs in sorted(by_workload.items()):
            ok = [r for r in rs if r.ok]
            best = min((r.cost for r in ok), default=float("inf"))
            wl, tgt = json.loads(key), targets[tkey]
            print(f"  {wl.get('template', '?'):24s} {len(rs):5d} measured, {len(rs) - len(ok):4d} "
                  f"failed, best {best * 1e3:9.4f} ms  {tgt.get('mcpu') or tgt.get('arch') or ''} "
                  f"({isa_family(tgt)})")
        return 0
    if not args.output:
        raise SystemExit("tecc records: --output is needed to merge or pick the best")
    if args.action == "best":
        records = best_records(records)
    with open(args.output, "w", encoding="utf-8") as f:
        for r in records:
            f.write(canonical_json(r.to_json()) + "\n")
    print(f"wrote {len(records)} records to {args.output}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A compiled package as a pip-installable wheel."""
    from tecc.deploy import write_python_package
    from tecc.runtime import PackageError

    try:
        wheel = write_python_package(args.package, args.python_package, args.name, args.version)
    except (PackageError, ValueError) as err:
        raise SystemExit(f"tecc export: {err}") from None
    print(f"wrote {wheel} ({wheel.stat().st_size / 1e6:.1f} MB); install it with "
          f"`pip install {wheel}`, then `import {args.name}; model = {args.name}.load()`")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from tecc import runtime

    if args.repeat < 1:
        raise SystemExit(f"tecc run: --repeat must be at least 1, got {args.repeat}")
    try:
        package = runtime.load_package(args.package)
    except runtime.PackageError as err:
        raise SystemExit(f"tecc run: {err}") from None
    specs = package.input_specs
    if args.inputs:
        with np.load(args.inputs) as data:
            missing = [s.name for s in specs if s.name not in data]
            if missing:
                raise SystemExit(f"tecc run: {args.inputs} lacks input(s) {missing}; "
                                 f"it has {sorted(data.files)}")
            arrays = [data[s.name] for s in specs]
    else:
        rng = np.random.default_rng(0)
        arrays = [rng.standard_normal(s.shape).astype(s.dtype)
                  if s.dtype.startswith("float")
                  else rng.integers(0, 2, s.shape).astype(s.dtype) for s in specs]
    try:
        flat = package.run_flat(*arrays)
    except (ValueError, TypeError) as err:  # wrong shapes or dtypes: the input is named
        raise SystemExit(f"tecc run: {err}") from None
    if args.print_time:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            package.run_flat(*arrays)
            times.append(time.perf_counter() - start)
        ms = np.array(times) * 1e3
        print(f"Execution time summary ({args.repeat} runs):\n"
              f" mean (ms)   median (ms)    max (ms)     min (ms)     std (ms)\n"
              f" {ms.mean():9.4f}   {np.median(ms):9.4f}   {ms.max():9.4f}   "
              f"{ms.min():9.4f}   {ms.std():9.4f}")
    if args.outputs:
        np.savez(args.outputs, **{s.name: a for s, a in zip(package.output_specs, flat,
                                                                strict=True)})
    else:
        for spec, array in zip(package.output_specs, flat, strict=True):
            print(f"{spec.name}: shape {array.shape} {array.dtype}")
    return 0


def add_retarget_options(p: argparse.ArgumentParser) -> None:
    from tecc.autotune.records import RETARGET_BUDGET_S, RETARGET_K

    p.add_argument("--k", type=int, default=RETARGET_K,
                   help="retarget: at most this many foreign configs per kernel")
    p.add_argument("--time-budget", type=float, default=RETARGET_BUDGET_S,
                   help="retarget: seconds for the whole run (the largest kernels get the "
                        "most configs)")
    p.add_argument("--rounds", type=int, default=3,
                   help="retarget: interleaved rounds of measurement")
    p.add_argument("--cache-flush", action=argparse.BooleanOptionalAction, default=None,
                   help="time kernels with their weights flushed from the caches, as in a "
                        "model whose weights do not fit in cache (default: on for cuda, "
                        "where L2 is overwritten before every call; off for CPUs)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tecc", description="Compile PyTorch models with TVM.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile a model into a deployment package")
    p.add_argument("model", help="a .pt2 file, or module:function returning (model, inputs)")
    p.add_argument("--target", default="llvm", help="llvm, llvm:<cpu>, cuda, cuda:sm_90")
    p.add_argument("--records", nargs="*", help="tuning records to apply (files or folders)")
    p.add_argument("-o", "--output", default="model.tar", help="package path (.tar or dir)")
    p.add_argument("--no-winograd", action="store_true", help=NO_WINOGRAD_HELP)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("tune", help="tune the kernels of a model, writing tuning records")
    p.add_argument("model", help="a .pt2 file, or module:function returning (model, inputs)")
    p.add_argument("--target", default="llvm")
    p.add_argument("--records", default="tuning.jsonl", help="JSON Lines file (appended)")
    p.add_argument("--trials", type=int, default=2000, help="measurements in all")
    p.add_argument("--tuner", default="xgb", choices=["xgb", "random", "grid"])
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per candidate run")
    p.add_argument("--early-stopping", type=int, default=128,
                   help="stop a task after this many trials without improvement (0: never)")
    p.add_argument("--plot", help="write best GFLOP/s against trials to this PNG")
    p.add_argument("--no-winograd", action="store_true", help=NO_WINOGRAD_HELP)
    p.add_argument("--verify-top", type=int, default=4,
                   help="re-measure this many best configs per kernel, and its fallback, "
                        "at the end (0: no verification)")
    p.add_argument("--verify-rounds", type=int, default=3,
                   help="interleaved rounds of that re-measurement")
    p.add_argument("--transfer", nargs="+", metavar="RECORDS",
                   help="also pre-train new kernels' cost models on these records (files "
                        "or folders, e.g. tuning_logs/); the --records file always counts")
    p.add_argument("--no-transfer", action="store_true",
                   help="start every new kernel's cost model from scratch")
    p.add_argument("--fallback", choices=["strict", "torch"], default="strict",
                   help="torch: a model with ops tecc cannot import has the kernels of its "
                   "compiled regions tuned (as tecc.compile(..., fallback='torch') builds it)")
    p.add_argument("--retarget", action="store_true",
                   help="instead of tuning, measure here the best configs of the records "
                        "of other machines (--records and --transfer files), a few minutes")
    add_retarget_options(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("records", help="inspect, merge, pick the best or retarget tuning "
                                       "records")
    p.add_argument("action", choices=["show", "merge", "best", "retarget"],
                   help="retarget: measure the best configs of FILES (another machine's) "
                        "for --model here, into -o")
    p.add_argument("files", nargs="+", help="record files or folders")
    p.add_argument("-o", "--output")
    p.add_argument("--model", help="retarget: a .pt2 file, or module:function")
    p.add_argument("--target", default="llvm",
                   help="the target records relate to (show) or are measured for (retarget)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per candidate run")
    p.add_argument("--no-winograd", action="store_true", help=NO_WINOGRAD_HELP)
    add_retarget_options(p)
    p.set_defaults(func=cmd_records)

    p = sub.add_parser("export", help="turn a deployment package into a pip-installable "
                       "wheel that needs neither torch nor tecc")
    p.add_argument("package", help="a package written by `tecc compile` (directory or .tar)")
    p.add_argument("--python-package", required=True, metavar="OUT",
                   help="folder to write the wheel into")
    p.add_argument("--name", required=True, help="the Python package name (an identifier)")
    p.add_argument("--version", default="1.0")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("run", help="run a deployment package")
    p.add_argument("package")
    p.add_argument("--inputs", help=".npz with one array per input name")
    p.add_argument("--outputs", help="write the outputs to this .npz")
    p.add_argument("--print-time", action="store_true")
    p.add_argument("--repeat", type=int, default=10)
    p.set_defaults(func=cmd_run)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
