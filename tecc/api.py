"""The public API: compile a PyTorch model, call it, export a deployment package."""

from __future__ import annotations

import dataclasses
import itertools
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import tvm
from torch.export import ExportedProgram

from tecc import __version__, runtime
from tecc.autotune.records import RETARGET_BUDGET_S, RETARGET_K, load_records
from tecc.build import BuildResult, build, index_checks
from tecc.frontend.importer import (
    ImportedModel,
    UnsupportedOperatorError,
    from_exported_program,
    from_torch,
    load_pt2,
)
from tecc.frontend.ir import Call, Function, post_order
from tecc.frontend.printer import astext
from tecc.graph_opt.fuse_ops import primitive_per_op
from tecc.graph_opt.pass_manager import PassContext, PassTrace, run_passes
from tecc.graph_opt.pipeline import compile_pipeline
from tecc.summary import CompileSummary, summarize
from tecc.target import TargetInfo, target_info
from tecc.tuning import (
    RecordsArg,
    TuningContext,
    layout_chain_variants,
    task_table,
    warn_untuned,
)

if TYPE_CHECKING:
    from tecc.partition import PartitionedModel


class CompiledModel:
    """A model compiled by tecc. Call it with torch tensors (torch tensors come back)
    or numpy arrays (numpy arrays come back), in the order of the model's inputs."""

    def __init__(self, imported: ImportedModel, optimized: Function, result: BuildResult,
                 target: TargetInfo, timings: dict[str, float]) -> None:
        self.imported = imported
        self.ir = optimized
        self.build_result = result
        self.target_info = target
        self.target: tvm.target.Target = target.tvm_target
        self.timings = timings
        self.plan = result.plan
        self.records_digest: str | None = None
        # records given for other targets, not applied (TuningContext.unapplied_counts)
        self.unapplied_records: dict[str, int] = {}
        self.cuda_graph = True  # a cuda model replays one CUDA graph per call
        # A cuda model builds without a GPU; its executor is made at the first call.
        self._executor = (None if target.is_gpu else
                          runtime.Executor(result.executable, result.plan, result.params))

    @property
    def input_specs(self) -> list[dict]:
        return [s.to_json() for s in self.imported.inputs]

    @property
    def output_specs(self) -> list[dict]:
        return [s.to_json() for s in self.imported.outputs]

    @property
    def torch_ops(self) -> dict[str, int]:
        """The ATen ops that run in torch and how often: none here (see
        tecc.partition.PartitionedModel, what compile(..., fallback="torch") gives a
        model with ops tecc cannot compile)."""
        return {}

    def __call__(self, *inputs: Any) -> Any:
        if self.target_info.is_gpu:
            if self._executor is None:
                self._executor = runtime.make_executor(
                    self.build_result.executable, self.plan, self.build_result.params,
                    "cuda", self.cuda_graph)
            return runtime.unflatten_outputs(self.plan["output_structure"],
                                             self._executor.run_flat(*inputs))
        as_torch = any(isinstance(x, torch.Tensor) for x in inputs)
        arrays = [_to_numpy(x) for x in inputs]
        flat = self._executor.run_flat(*arrays)
        if as_torch:
            flat = [torch.from_numpy(a) for a in flat]
        return runtime.unflatten_outputs(self.plan["output_structure"], flat)

    def export(self, path: str | os.PathLike) -> None:
        """Write a deployment package (a directory, or a .tar when `path` ends so)
        that `tecc.load` runs with the TVM runtime alone."""
        runtime.write_package(
            os.fspath(path),
            self.build_result.executable,
            self.plan,
            self.build_result.params,
            {"tecc": __version__, "target": _manifest_target(self.target_info),
             "records_digest": self.records_digest},
        )

    def export_python_package(self, out_dir: str | os.PathLike, name: str,
                              version: str = "1.0") -> Path:
        """Write a wheel `name`-`version` into `out_dir` that runs this model with numpy
        and apache-tvm-ffi alone (`pip install` it; `import name; name.load()`); returns
        its path. See tecc.deploy."""
        from tecc.deploy import write_python_package

        with tempfile.TemporaryDirectory(prefix="tecc-wheel-") as tmp:
            self.export(Path(tmp) / "package")
            return write_python_package(Path(tmp) / "package", out_dir, name, version)

    def tasks(self) -> list[dict]:
        """The model's tuning tasks, one per distinct workload: workload_key (canonical
        JSON), workload, template, anchor kind, space_size, the config used and its
        source ("exact": a tuning record of this target, "retargeted": a
        record measured here by a retarget run; "fallback": the template's heuristic;
        "generic": the template refused), and the kernels using it."""
        return task_table(self.build_result.kernels)

    def tuning_report(self) -> str:
        rows = [f"{t['source']:<10} {t['template']:<24} space {t['space_size']:<7} "
                f"{t['workload_key']}" for t in self.tasks()]
        return "\n".join(rows)

    def summary(self) -> CompileSummary:
        """Kernels (one per fused group: ops, shapes, name, anchor op) and memory
        (planned peak against one buffer per tensor); printing it gives a table."""
        return summarize(self)

    def astext(self) -> str:
        """The optimized IR, Relay-style."""
        return astext(self.ir)

    def __repr__(self) -> str:
        return (f"CompiledModel({len(self.plan['kernels'])} kernel calls, "
                f"{len(self.build_result.kernels)} kernels, target={self.target})")


def _manifest_target(info: TargetInfo) -> dict[str, Any]:
    """The target in a package's manifest: for a CPU, with the LLVM instruction-set
    features the code was compiled for, which loading checks against the host."""
    out = info.to_json()
    if info.is_cpu:
        out["features"] = sorted(info.features)
    return out


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"inputs must be torch tensors or numpy arrays, got {type(x).__name__}")


def import_model(model: torch.nn.Module | str | os.PathLike | ExportedProgram,
                 example_inputs: Sequence[Any] | None = None) -> ImportedModel:
    """A module with example inputs, the path of a .pt2 file (torch.export.save) or an
    ExportedProgram."""
    if isinstance(model, str | os.PathLike):
        return load_pt2(model)
    if isinstance(model, ExportedProgram):
        return from_exported_program(model)
    if example_inputs is None:
        raise ValueError("example_inputs are needed to compile a torch.nn.Module")
    return from_torch(model, example_inputs)


def fused_graph(model: Any, example_inputs: Sequence[Any] | None, target: str, opt_level: int,
                print_after: Sequence[str] | None, records: RecordsArg,
                timings: dict[str, float], winograd: bool = True
                ) -> tuple[ImportedModel, Function, TuningContext, PassTrace, TargetInfo]:
    """Import, optimize and partition into kernels: the graph that compile builds and
    tune tunes, by one pipeline in one PassContext."""
    start = time.perf_counter()
    imported = import_model(model, example_inputs)
    timings["import_s"] = time.perf_counter() - start
    info = target_info(target)
    start = time.perf_counter()
    trace = PassTrace()
    tuning = TuningContext(records, info, winograd)
    with PassContext(target=info, opt_level=opt_level, print_after=print_after or (),
                     trace=trace, tuning=tuning.callbacks()):
        partitioned = run_passes(imported.func, compile_pipeline())
    if opt_level < 1:  # fuse_ops did not run: one kernel per op
        partitioned = primitive_per_op(partitioned)
    timings["graph_s"] = time.perf_counter() - start
    return imported, partitioned, tuning, trace, info


def tune(
    model: torch.nn.Module | str | os.PathLike,
    example_inputs: Sequence[Any] | None = None,
    target: str = "llvm",
    records: str | os.PathLike = "tuning.jsonl",
    trials: int = 2000,
    timeout: float = 30.0,
    tuner: str = "xgb",
    early_stopping: int | None = 128,
    batch_size: int = 16,
    plot: str | os.PathLike | None = None,
    progress: bool = True,
    seed: int = 0,
    verify_top: int = 4,
    verify_rounds: int = 3,
    winograd: bool = True,
    transfer: bool | str | os.PathLike | Sequence[str | os.PathLike] = True,
    cache_flush: bool | None = None,
    fallback: str = "strict",
) -> list:
    """Tune the kernels of `model` for `target` with `trials` measurements in all,
    appending every measurement to `records` (re-running on the same file resumes).
    Then each kernel's `verify_top` best configs and its untuned fallback are measured
    again in `verify_rounds` interleaved rounds (0: skip), and compile time decides by
    those rounds. `tecc.compile(model, ..., records=records)` then uses the best
    configs. `winograd` as in compile. `transfer`: kernels without records of their own
    start from a cost model pre-trained on the records of other workloads of the same
    template, in `records` (True), also in these files or folders, or not (False).
    `cache_flush`: time every call with the kernel's weights flushed from the CPU caches
    (for models whose weights do not fit in cache; keep such records in their own file).
    None: off on CPUs; on CUDA every call starts with a cold L2 unless it is False.
    `fallback="torch"`: a model with ops tecc cannot import has the tasks of the regions
    compile(..., fallback="torch") compiles tuned (strict: the error listing the ops).
    Returns the per-task tuning states (their histories and best GFLOP/s)."""
    from tecc.autotune.pool import exit_if_in_worker
    from tecc.autotune.tune import plot_curves, require_plotting, tune_tasks

    exit_if_in_worker()  # a script without a main guard, run again by a worker
    check_fallback(fallback)
    if plot:  # before tuning: a missing matplotlib found after hours of it is no help
        require_plotting()
    if target_info(target).is_gpu:
        require_gpu(target)
    if fallback == "torch":
        from tecc.partition import region_graphs

        graphs = region_graphs(model, example_inputs)
    else:
        graphs = [(model, example_inputs)]
    try:
        tasks, weights, alternatives = model_tasks(graphs, target, winograd)
    except UnsupportedOperatorError as err:
        raise with_fallback_hint(err) from None
    if progress:
        print(f"{len(tasks)} tuning tasks, {trials} trials, tuner {tuner}, records {records}")
        for t, w in zip(tasks, weights, strict=True):
            print(f"  {t.name:28s} x{w}  space {len(t.space)}")
    states = tune_tasks(tasks, weights, records, trials, tuner=tuner, batch_size=batch_size,
                        early_stopping=early_stopping, timeout_s=timeout, seed=seed,
                        progress=progress, tecc_version=__version__,
                        tvm_version=tvm.__version__, verify_top=verify_top,
                        verify_rounds=verify_rounds, transfer=transfer,
                        cache_flush=cache_flush, alternatives=alternatives)
    if plot:
        plot_curves(states, plot)
    return states


def require_gpu(target: str) -> None:
    """Tuning measures on the device: refuse a cuda target on a machine without a GPU
    before anything is built."""
    from tecc.runtime.cuda import CudaError, cuda_device

    try:
        cuda_device(0)
    except CudaError as err:
        raise CudaError(f"tuning for {target} measures every candidate on an NVIDIA GPU, "
                        f"and there is none here: {err}. Tune on a machine with the GPU "
                        "(the records it writes apply to compiles for that arch on any "
                        "machine)") from None


def retarget(
    model: torch.nn.Module | str | os.PathLike,
    example_inputs: Sequence[Any] | None = None,
    foreign: RecordsArg = None,
    records: str | os.PathLike = "tuning.jsonl",
    target: str = "llvm",
    k: int = RETARGET_K,
    time_budget: float = RETARGET_BUDGET_S,
    rounds: int = 3,
    timeout: float = 30.0,
    winograd: bool = True,
    progress: bool = True,
    cache_flush: bool | None = None,
) -> list:
    """A quick local tuning from another machine's records: for each kernel of `model`
    on `target`, the best `k` configs of `foreign` (files or folders of records, e.g.
    measured for another vector width or core count; the `records` file counts too)
    that are valid here, and the kernel's fallback, are measured here in `rounds`
    interleaved rounds and appended to `records` as one retarget session, within
    about `time_budget` seconds (the largest kernels get the most configs); on a CPU,
    then the variants of the configs compile would choose whose input blocks are what
    their producers write (no layout_transform between layers; tecc.tuning.
    LayoutChainPlan). `cache_flush` as in tune. `tecc.compile(..., records=records)`
    then reports those workloads "retargeted";
    `tecc.tune(..., records=records)` continues from them. Returns the per-task
    retarget states (configs measured, fallback and best times here)."""
    from tecc.autotune.pool import exit_if_in_worker
    from tecc.autotune.tune import retarget_tasks
    from tecc.schedules.tasks import extract_tasks

    exit_if_in_worker()  # a script without a main guard, run again by a worker
    started = time.perf_counter()
    sources: list[str | os.PathLike] = [records] if os.path.exists(records) else []
    if foreign:
        sources += [foreign] if isinstance(foreign, str | os.PathLike) else list(foreign)
    foreign_records = load_records(sources, warn=True)[0] if sources else []
    if not foreign_records:
        raise ValueError("retarget needs tuning records of another machine: pass them as "
                         "`foreign` (files or folders, e.g. tuning_logs/)")
    timings: dict[str, float] = {}
    imported, partitioned, _, _, info = fused_graph(model, example_inputs, target, 3, None,
                                                    None, timings, winograd)
    tasks = extract_tasks(partitioned, info.tvm_target)
    weights = task_weights(partitioned, info.tvm_target, tasks)

    def layout_variants() -> dict[str, list[dict[str, Any]]]:
        # from the layout compile would choose by the records written so far
        return layout_chain_variants(imported.func, info, records, winograd)

    left = time_budget - (time.perf_counter() - started)
    states = retarget_tasks(tasks, weights, foreign_records, records, k=k,
                            time_budget_s=left, rounds=rounds, timeout_s=timeout,
                            progress=progress, tecc_version=__version__,
                            tvm_version=tvm.__version__,
                            layout_variants=layout_variants if info.is_cpu else None,
                            cache_flush=cache_flush)
    if progress:
        print(f"retargeted {len(states)} of {len(tasks)} tasks in "
              f"{time.perf_counter() - started:.0f} s into {records}")
    return states


def model_tasks(graphs: Sequence[tuple[Any, Sequence[Any] | None]], target: str,
                winograd: bool) -> tuple[list, list[int], list[list[list[int]]]]:
    """The tuning tasks of the models `graphs` (model, example inputs: one model, or the
    regions of a partitioned one), their kernel calls, one task per workload, and the
    alternatives among them. On a GPU the 3x3 convs the default rule gives to Winograd
    are tuned both ways (its three kernels and the direct conv), so that compile
    chooses by the records (TuningContext.gpu_winograd_tile); each such conv shape is
    one alternative: [[its direct conv task], [its three Winograd tasks]] (indices into
    the tasks), of which a model runs the faster."""
    from tecc.schedules.tasks import extract_tasks, workload_json

    merged: dict[str, Any] = {}
    calls: dict[str, int] = {}
    first_form: set[str] = set()
    forms = [winograd]
    if winograd and target_info(target).is_gpu:
        forms.append(False)
    for form, (model, example_inputs) in itertools.product(forms, graphs):
        _, partitioned, _, _, info = fused_graph(model, example_inputs, target, 3, None, None,
                                                 {}, form)
        tasks = extract_tasks(partitioned, info.tvm_target)
        for task, weight in zip(tasks, task_weights(partitioned, info.tvm_target, tasks),
                                strict=True):
            key = workload_json(task.workload)
            if form != winograd and key in first_form:
                continue  # the direct form adds its convs, not a second count of the rest
            if key not in merged:  # named as extract_tasks names them, over all graphs
                merged[key] = dataclasses.replace(task, name=f"{task.template}_{len(merged)}")
            calls[key] = calls.get(key, 0) + weight
            if form == winograd:
                first_form.add(key)
    keys = list(merged)
    alternatives = []
    for key in keys:
        if key not in first_form and merged[key].template == "conv2d":
            rival = [workload_json(wl) for wl in winograd_rival(merged[key].workload, target)]
            if rival and all(k in merged for k in rival):
                alternatives.append([[keys.index(key)], [keys.index(k) for k in rival]])
    return list(merged.values()), [calls[key] for key in merged], alternatives


def winograd_rival(conv: dict[str, Any], target: str) -> list[dict[str, Any]]:
    """The workloads of the Winograd kernels that would compute the GPU conv of workload
    `conv` instead (as graph_opt.winograd does), or [] for a conv Winograd cannot do."""
    from tecc.frontend.ir import Constant, TensorType, Var
    from tecc.graph_opt.layout import winograd_eligible
    from tecc.graph_opt.winograd import GPU_WINOGRAD_TILE, default_gpu_winograd_tile
    from tecc.tuning import gpu_winograd_workloads

    info = target_info(target)
    data = Var("data", TensorType(tuple(conv["data"]), conv["dtype"]))
    # only the weight's shape enters the workloads
    weight = Constant(np.zeros(conv["kernel"], dtype=conv["dtype"]))
    attrs = {"strides": tuple(conv["strides"]), "padding": tuple(conv["padding"]),
             "dilation": tuple(conv["dilation"]), "groups": conv["groups"]}
    call = Call("nn.conv2d", [data, weight], attrs)
    if not winograd_eligible(call):
        return []
    tile = default_gpu_winograd_tile(call, info) or GPU_WINOGRAD_TILE
    return gpu_winograd_workloads(call, info, tile)


def task_weights(partitioned: Function, target: Any, tasks: list) -> list[int]:
    """How many kernel calls of the model run each task's workload."""
    from tecc.schedules.tasks import anchors_of, workload_json

    index = {workload_json(t.workload): i for i, t in enumerate(tasks)}
    counts = [0] * len(tasks)
    for node in post_order(partitioned.body):
        if isinstance(node, Call) and isinstance(node.op, Function):
            for call, kind, template in anchors_of(node.op, target):
                key = workload_json(template.workload(call, kind))
                if key in index:
                    counts[index[key]] += 1
    return [max(c, 1) for c in counts]


FALLBACKS = ("strict", "torch")


def check_fallback(fallback: str) -> None:
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback={fallback!r}: use 'strict' (an error listing the ops tecc "
                         "cannot compile) or 'torch' (those ops run in torch)")


def with_fallback_hint(err: UnsupportedOperatorError) -> UnsupportedOperatorError:
    """The strict error with how to run the model anyway."""
    err.args = (f"{err}\nOr pass fallback=\"torch\" (tecc.compile, tecc.tune; tecc tune "
                "--fallback torch): those ops then run in torch and the rest is compiled by "
                "tecc (which cannot be exported as a deployment package).",)
    return err


def compile(  # noqa: A001 - the natural name, as torch.compile
    model: torch.nn.Module | str | os.PathLike | ExportedProgram,
    example_inputs: Sequence[Any] | None = None,
    target: str = "llvm",
    opt_level: int = 3,
    print_after: Sequence[str] | None = None,
    records: RecordsArg = None,
    winograd: bool = True,
    cuda_graph: bool = True,
    fallback: str = "strict",
) -> CompiledModel | PartitionedModel:
    """Compile `model` for `target` ("llvm" = this CPU, "llvm:<cpu>", "cuda[:sm_XX]").

    opt_level 0 runs no graph optimization (one kernel per op); 3 runs them all.
    `print_after` names passes after which the IR is printed (as TECC_PRINT_AFTER).
    `records`: tuning records (a .jsonl path, a folder of them or a list, merged); each
    workload gets its best record measured for this exact target (the identical ISA
    feature set and core count; CUDA: arch), else its template's fallback config; one
    warning lists the untuned workloads and counts the records of other targets,
    which `tecc.retarget` measures here.
    `cm.tasks()` tells what each workload got. `winograd=False` keeps every conv
    direct: Winograd's transformed 3x3 kernels are 1.8-4x the size of the originals
    (ResNet-18's package: 97 MB instead of 47 MB with the direct convs).
    `fallback="strict"`: a model with ops tecc cannot import raises one error listing
    them all; "torch": such a model is split into regions tecc compiles and ops torch
    runs (a tecc.partition.PartitionedModel; its `torch_ops` names them), and a model
    without such ops is compiled as with "strict"."""
    check_fallback(fallback)
    if fallback == "torch":
        from tecc.partition import compile_with_fallback

        return compile_with_fallback(model, example_inputs, target=target,
                                     opt_level=opt_level, print_after=print_after,
                                     records=records, winograd=winograd,
                                     cuda_graph=cuda_graph)
    try:
        return compile_strict(model, example_inputs, target, opt_level, print_after, records,
                              winograd, cuda_graph)
    except UnsupportedOperatorError as err:
        raise with_fallback_hint(err) from None


def compile_strict(model: torch.nn.Module | str | os.PathLike | ExportedProgram,
                   example_inputs: Sequence[Any] | None, target: str, opt_level: int,
                   print_after: Sequence[str] | None, records: RecordsArg, winograd: bool,
                   cuda_graph: bool, warn_records: bool = True) -> CompiledModel:
    """compile with fallback="strict"; `warn_records=False` leaves the warning on
    untuned workloads to the caller (one for all regions of a partitioned model)."""
    timings: dict[str, float] = {}
    imported, partitioned, tuning, trace, info = fused_graph(
        model, example_inputs, target, opt_level, print_after, records, timings, winograd)
    result = build(partitioned, info, [s.name for s in imported.inputs],
                   [s.name for s in imported.outputs], imported.output_structure,
                   imported.param_names, config_fn=tuning.config)
    timings["build_s"] = result.build_seconds
    checks = index_checks(imported.func, [s.name for s in imported.inputs])
    if checks:
        result.plan["index_checks"] = checks
    compiled = CompiledModel(imported, partitioned, result, info, timings)
    compiled.passes = [name for name, _ in trace.ran]
    compiled.records_digest = tuning.digest
    compiled.unapplied_records = tuning.unapplied_counts
    compiled.cuda_graph = cuda_graph
    if tuning.given:
        tuning.warn_outside_space()
        if warn_records:
            warn_untuned(compiled.tasks(), compiled.unapplied_records)
    return compiled
