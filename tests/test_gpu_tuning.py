"""Tuning on the GPU: CUDA candidates build here with their cubins, the GPU runner
records every fault of a candidate by kind and replaces its worker (a CUDA fault
breaks the process's context), the cost model's kernel features agree with the built
kernels, and whole-model tuning writes cuda records that compile applies. Where a GPU
is visible (the H200 runs this file), candidates are timed on it and real faults are
provoked; elsewhere the GPU's faults come from a stand-in job function."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch
import tvm
from tecc.autotune.builder import LocalBuilder, remove_built
from tecc.autotune.features import FeatureCache
from tecc.autotune.measure import MeasureInput, measure_batch
from tecc.autotune.records import load_records, target_relation
from tecc.autotune.runner import LocalRunner, RunJob
from tecc.autotune.tune import retarget_tasks, runner_options_for, tune_tasks
from tecc.schedules.gpu_conv import direct_features
from tecc.schedules.gpu_default import launch_extents
from tecc.schedules.gpu_templates import KERNEL_FEATURES, kernel_features
from tecc.schedules.tasks import task_from_workload

import tecc
from tecc.cuda_toolchain import compile_cuda, embedded_cuda_archs
from tecc.target import target_info
from tests.cuda_faults import CudaFaultTask, fake_cuda_run, fault_space
from tests.models import MatMul
from tests.test_cuda import ARCH, GPU

DENSE = {"template": "dense", "inputs": [[[128, 256], "float32"], [[384, 256], "float32"]],
         "attrs": {}}


def dense_task():
    return task_from_workload(DENSE, f"cuda:{ARCH}", name="dense_gpu")


def config_of(task, **values):
    base = {"rule": "simt", "tile": "8,8,1,1,4,4", "micro_k": 16, "vector": 4,
            "unroll": 256, "pipeline": "none"}
    return task.space.from_json({**base, **values})


@pytest.fixture(scope="module")
def builder():
    with LocalBuilder(n_parallel=2, timeout_s=120) as b:
        yield b


def test_cuda_candidates_build_with_their_cubins(builder):
    task = dense_task()
    configs = [config_of(task), config_of(task, tile="16,16,1,2,4,4", pipeline="double"),
               # 64 x (64 + 4 + 132 + 4) floats of shared memory: over a block's 48 KiB
               config_of(task, tile="16,16,1,2,4,4", micro_k=64, pipeline="double")]
    built = builder.build([MeasureInput(task, c) for c in configs])
    try:
        for b in built[:2]:
            assert b.error is None, b.error
            with open(b.path, "rb") as f:
                assert ("elf", int(ARCH[3:])) in embedded_cuda_archs(f.read())
            assert b.arg_specs == [((128, 256), "float32"), ((384, 256), "float32"),
                                   ((128, 384), "float32")]
        assert built[2].path is None
        assert built[2].error.startswith("build_error:") and "shared memory" in built[2].error
    finally:
        remove_built(built)


def _fault_jobs(tmp_path, faults):
    paths = []
    for i, fault in enumerate(faults):
        path = tmp_path / f"{i}-{fault}.so"
        path.write_bytes(b"")
        paths.append(str(path))
    a = np.ones((4, 4), "float32")
    return [RunJob(p, [a], [((4, 4), "float32")], None, "cuda", "k") for p in paths]


# serial: its run time-outs (5-8 s) assume the cores are this test's alone
@pytest.mark.serial
def test_gpu_faults_fail_their_candidate_and_replace_the_worker(tmp_path):
    faults = ["none", "illegal_address", "none", "launch_failure", "run_hang", "none",
              "abort", "none"]
    jobs = _fault_jobs(tmp_path, faults)
    with LocalRunner(device="cuda", timeout_s=5, run_fn=fake_cuda_run) as runner:
        outcomes = runner.run(jobs)
        restarts = runner.pool.restarts
    kinds = [o.error.split(":")[0] if o.error else None for o in outcomes]
    assert kinds == [None, "run_error", None, "run_error", "run_timeout", None,
                     "runtime_crash", None]
    assert "illegal memory access" in outcomes[1].error
    assert "too many resources" in outcomes[3].error
    # every candidate after a fault ran in a fresh process, and so was measured
    pids = [int(open(j.path + ".pid").read()) for j in jobs]
    assert pids[0] != pids[2] != pids[5] != pids[7]
    assert all(o.cost > 0 for o, k in zip(outcomes, kinds, strict=True) if k is None)
    assert restarts == 4


def test_a_cpu_runner_refuses_cuda_jobs(tmp_path):
    with LocalRunner(timeout_s=5) as runner, pytest.raises(ValueError, match="cuda job"):
        runner.run(_fault_jobs(tmp_path, ["none"]))


# serial: its run time-outs (5-8 s) assume the cores are this test's alone
@pytest.mark.serial
def test_real_cuda_faults_are_recorded_and_the_tuner_goes_on(builder, tmp_path):
    """On a GPU: a kernel that reads 16 GB out of bounds, one that never ends and one
    one step short fail alone; without one, every candidate fails saying so."""
    task = CudaFaultTask(target={"kind": "cuda", "arch": ARCH})
    space = fault_space()
    faults = ["none", "illegal_address", "none", "run_hang", "wrong", "none"]
    inputs = [MeasureInput(task, space.from_json({"fault": f})) for f in faults]
    with LocalRunner(device="cuda", timeout_s=8, cache_flush=True, number=1, repeat=5,
                     flush_bytes=8 << 20) as runner:
        results = measure_batch(builder, runner, inputs)
    kinds = [r.error_kind for r in results]
    if GPU:
        # an illegal address raises, or aborts the worker where TVM meets the sticky
        # error outside a call: either way that candidate alone fails
        assert kinds[1] in ("run_error", "runtime_crash")
        assert kinds[:1] + kinds[2:] == [None, None, "run_timeout", "wrong_result", None]
        assert all(len(r.costs_s) == 5 and min(r.costs_s) > 0
                   for r, f in zip(results, faults, strict=True) if f == "none")
    else:
        assert kinds == ["run_error"] * len(faults)
        assert all("CUDA" in r.error for r in results)


def test_kernel_features_agree_with_the_built_kernel():
    task = dense_task()
    info = target_info(task.target)
    for values in [{}, {"tile": "16,16,2,2,4,4", "micro_k": 8},
                   {"tile": "16,16,1,1,1,1", "pipeline": "double"},
                   {"tile": "8,16,1,1,4,4", "micro_k": 32, "vector": 2}]:
        config = config_of(task, **values)
        features = kernel_features(task.workload, config, info)
        prim = task.build_primfunc(config)
        extents = launch_extents(prim)
        assert features["threads"] == extents["threadIdx.x"] * extents["threadIdx.y"]
        assert features["blocks"] == extents["blockIdx.x"] * extents["blockIdx.y"]
        source = compile_cuda(tvm.IRModule({"main": prim}), task.tvm_target).mod.imports[
            0].inspect_source()
        shared = sum(4 * int(n) for n in re.findall(r"__shared__ .*float \w+\[(\d+)\]", source))
        assert features["shared_bytes"] == shared, (values, source[:2000])
    # k in 4 slices: a grid of blocks per slice (on blockIdx.y), a quarter of the k loop
    # each, and the partial sums through global memory
    whole, split = (kernel_features(task.workload, config_of(
        task, tile="16,16,1,1,4,4", split_k=s), info) for s in (1, 4))
    extents = launch_extents(task.build_primfunc(config_of(
        task, tile="16,16,1,1,4,4", split_k=4)))
    assert split["blocks"] == 4 * whole["blocks"] == 4 * 2 * 6
    assert extents["blockIdx.y"] == 4 * 2  # the slices times the row tiles
    assert split["k_steps"] == whole["k_steps"] // 4 == 4
    assert split["global_bytes"] > whole["global_bytes"]
    # the cost model reads the knobs and these, not the scheduled loop nest
    cache = FeatureCache(task)
    rows = cache([task.space.get(0), task.space.get(7)])
    assert rows.shape == (2, cache.dim) and cache.dim == len(
        task.space.features(task.space.get(0))) + len(KERNEL_FEATURES)
    assert not np.array_equal(rows[0], rows[1])


CONV = {"template": "conv2d", "data": [1, 64, 28, 28], "kernel": [64, 64, 3, 3],
        "dtype": "float32", "strides": [1, 1], "padding": [1, 1, 1, 1], "dilation": [1, 1],
        "groups": 1}


def test_direct_conv_features_agree_with_the_built_kernel():
    """The conv template's direct rule: its kernel features (threads, blocks, shared
    tiles) are those of the kernel it builds, in as many features as the matmul
    rules' (one cost model ranks both), and a config that exceeds the block's limits
    is no point of the space."""
    task = task_from_workload(CONV, f"cuda:{ARCH}", name="conv_gpu")
    info = target_info(task.target)
    template = task.template_obj
    direct = {"rule": "direct", "vector": 4, "unroll": 256, "tile_rc": [8, 8]}
    for knobs in [{"tile_oc": [4, 2, 4, 2], "tile_y": [7, 1, 4, 1], "tile_x": [2, 1, 7, 2],
                   "tile_ry": [1, 3], "tile_rx": [1, 3]},
                  {"tile_oc": [2, 1, 16, 2], "tile_y": [14, 1, 2, 1], "tile_x": [4, 1, 7, 1],
                   "tile_ry": [3, 1], "tile_rx": [3, 1]}]:
        config = task.space.from_json({**direct, **knobs})
        assert task.space.why_not(config) is None
        features = direct_features(task.workload, config)
        prim = task.build_primfunc(config)
        extents = launch_extents(prim)
        assert features["threads"] == extents["threadIdx.x"]
        assert features["blocks"] == (extents["blockIdx.x"] * extents["blockIdx.y"]
                                      * extents["blockIdx.z"])
        source = compile_cuda(tvm.IRModule({"main": prim}), task.tvm_target).mod.imports[
            0].inspect_source()
        shared = sum(4 * int(n) for n in re.findall(r"__shared__ .*float \w+\[(\d+)\]", source))
        assert features["shared_bytes"] == shared, (knobs, source[:2000])
        assert len(template.kernel_features(task.workload, config, info)) == len(
            KERNEL_FEATURES)
    # 32 x 14 x 14 threads: over a block's 1024
    too_many = task.space.from_json({**direct, "tile_oc": [2, 1, 32, 1],
                                     "tile_y": [2, 1, 14, 1], "tile_x": [2, 1, 14, 1],
                                     "tile_ry": [1, 3], "tile_rx": [1, 3]})
    assert "limits" in task.space.why_not(too_many)
    cache = FeatureCache(task)
    simt = task.space.from_json({"rule": "simt", "tile": "8,8,1,1,4,4", "micro_k": 16,
                                 "vector": 4, "unroll": 256, "pipeline": "none"})
    assert cache([simt, config]).shape == (2, cache.dim)


def test_runner_options_time_cuda_cold_by_default():
    cuda = runner_options_for(30.0, None, None, {"kind": "cuda", "arch": "sm_90"})
    assert cuda["device"] == "cuda" and cuda["cache_flush"] is True
    assert cuda["flush_bytes"] == 2 * target_info("cuda:sm_90").l2_bytes
    assert cuda["number"] == 1 and cuda["repeat"] >= 10
    warm = runner_options_for(30.0, False, None, {"kind": "cuda", "arch": "sm_90"})
    assert "cache_flush" not in warm and warm["device"] == "cuda"
    assert "device" not in runner_options_for(30.0, None, None, None)


def test_tuning_a_cuda_model_writes_records_that_compile_applies(tmp_path):
    """Tuning for cuda, measured by the stand-in runner here (real cubins built), then
    resumed; compile for the same arch applies the records, another arch does not."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(96, 160, generator=gen), torch.randn(160, 64, generator=gen)
    records = tmp_path / "cuda.jsonl"
    target = f"cuda:{ARCH}"
    options = None if GPU else {"run_fn": fake_cuda_run}
    states = _tune(MatMul(), (a, b), target, records, 8, options)
    assert [s.trials for s in states] == [8]
    lines, skipped = load_records(records)
    assert skipped == 0 and len(lines) >= 8
    assert {json.dumps(r.target, sort_keys=True) for r in lines} == {
        json.dumps({"kind": "cuda", "arch": ARCH}, sort_keys=True)}
    measured = {json.dumps(r.config, sort_keys=True) for r in lines if r.verify is None}
    assert len(measured) == 8
    # resumed: the next run measures 4 new configs, none of the earlier ones again
    _tune(MatMul(), (a, b), target, records, 4, options)
    again = [json.dumps(r.config, sort_keys=True) for r in load_records(records)[0]
             if r.verify is None]
    assert len(again) == 12 and len(set(again)) == 12
    compiled = tecc.compile(MatMul(), (a, b), target=target, records=str(records))
    assert [t["source"] for t in compiled.tasks()] == ["exact"]
    assert target_relation(lines[0].target, {"kind": "cuda", "arch": "sm_80"}) == "foreign"
    other = tecc.compile(MatMul(), (a, b), target="cuda:sm_80", records=str(records))
    assert [t["source"] for t in other.tasks()] == ["fallback"]
    if GPU:
        got = compiled(a.cuda(), b.cuda()).cpu()
        torch.testing.assert_close(got, a @ b, rtol=1e-4, atol=1e-4)


def test_cuda_records_of_another_arch_are_retargeted_on_the_gpu(tmp_path):
    """Records measured for another arch are foreign here; a retarget run measures
    them on the GPU (the stand-in runner without one) with tuning's cold cuda runner,
    and compile then reports the kernel retargeted and runs it."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 96, generator=gen), torch.randn(96, 80, generator=gen)
    options = None if GPU else {"run_fn": fake_cuda_run}
    tuned = tmp_path / "tuned.jsonl"
    _tune(MatMul(), (a, b), f"cuda:{ARCH}", tuned, 4, options)
    other_arch = "sm_80" if ARCH != "sm_80" else "sm_86"
    foreign = [dict(json.loads(line), target={"kind": "cuda", "arch": other_arch})
               for line in tuned.read_text().splitlines()]
    foreign_path = tmp_path / "foreign.jsonl"
    foreign_path.write_text("".join(json.dumps(r) + "\n" for r in foreign))

    records = tmp_path / "local.jsonl"
    tasks, weights = _tasks(MatMul(), (a, b), f"cuda:{ARCH}")
    states = retarget_tasks(tasks, weights, load_records(foreign_path)[0], records, k=2,
                            rounds=2, progress=False, runner_options=options)
    assert len(states) == 1 and states[0].measured == 2
    lines, skipped = load_records(records)
    assert skipped == 0 and lines and all(r.ok for r in lines)
    assert {r.target["arch"] for r in lines} == {ARCH}
    compiled = tecc.compile(MatMul(), (a, b), target=f"cuda:{ARCH}", records=str(records))
    assert [t["source"] for t in compiled.tasks()] == ["retargeted"]
    if GPU:
        got = compiled(a.cuda(), b.cuda()).cpu()
        torch.testing.assert_close(got, a @ b, rtol=1e-4, atol=1e-4)


def _tasks(model, inputs, target):
    from tecc.schedules.tasks import extract_tasks

    from tecc.api import fused_graph, task_weights

    _, part, _, _, info = fused_graph(model, inputs, target, 3, None, None, {})
    tasks = extract_tasks(part, info.tvm_target)
    return tasks, task_weights(part, info.tvm_target, tasks)


def _tune(model, inputs, target, records, trials, runner_options):
    tasks, weights = _tasks(model, inputs, target)
    return tune_tasks(tasks, weights, records, trials,
                      batch_size=4, early_stopping=None, progress=False, verify_top=1,
                      verify_rounds=1, runner_options=runner_options)


def test_tecc_tune_refuses_cuda_without_a_gpu_or_tunes_on_it(tmp_path, capsys):
    """`tecc tune --target cuda` on a machine without a GPU says so before any build."""
    from tecc.cli import main

    records = tmp_path / "r.jsonl"
    argv = ["tune", "benchmarks.models_factory:mlp", "--target", f"cuda:{ARCH}",
            "--records", str(records), "--trials", "4", "--verify-top", "0"]
    if GPU:
        assert main(argv) == 0
        assert load_records(records)[0]
    else:
        with pytest.raises(SystemExit, match="GPU"):
            main(argv)
        assert not os.path.exists(records)


class _PoolNet(torch.nn.Module):
    """A windowed max pool (the direct schedule: no task) and a global average pool
    written as a window over the whole plane (a row reduction: a task)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 3, 2, 1)
        return torch.nn.functional.avg_pool2d(y, y.shape[-2:])


def test_every_cuda_task_of_a_cnn_has_a_space_and_windowed_pools_are_none():
    """Whole-model tuning lists each task's space before it measures: a task whose
    template refuses its group would stop `tecc tune` there."""
    from tecc.schedules.tasks import extract_tasks

    from tecc.api import fused_graph

    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    _, part, _, _, info = fused_graph(_PoolNet(), (x,), f"cuda:{ARCH}", 3, None, None, {})
    tasks = extract_tasks(part, info.tvm_target)
    pools = [t.workload["attrs"]["pool_size"] for t in tasks if t.template == "pool"]
    assert pools == [[8, 8]]
    assert all(len(t.space) > 0 for t in tasks)


MATMUL_CONFIG = {"rule": "simt", "tile": "16,16,1,1,4,4", "micro_k": 16, "vector": 4,
                 "unroll": 256, "pipeline": "none", "split_k": 1}


def test_records_choose_winograd_or_the_direct_conv_per_layer(tmp_path):
    """A 3x3 layer on the GPU is Winograd when its three kernels' tuned costs sum to
    less than the direct conv's tuned cost, direct otherwise, and the default rule
    (Winograd for 64 channels and more) until both have records."""
    from tecc.autotune.records import Record, RecordWriter
    from tecc.frontend.ir import Call, Constant, TensorType, Var, post_order
    from tecc.graph_opt.winograd import winograd_conv
    from tecc.schedules.template import templates_for

    from tecc.target import target_to_json
    from tecc.tuning import TuningContext

    info = target_info(f"cuda:{ARCH}")
    # the conv's input is computed (a relu): only the conv's own kernels are costed
    x = Call("relu", (Var("x", TensorType((1, 64, 28, 28), "float32")),))
    weight = Constant(np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype("float32"))
    conv = Call("nn.conv2d", (x, weight), {"padding": (1, 1, 1, 1)})
    templates = templates_for("cuda")
    kernels = [n for n in post_order(winograd_conv(conv, x, weight, 4))
               if isinstance(n, Call) and n is not x]
    kinds = {"nn.winograd_input": "winograd_input", "nn.matmul": "batch_matmul",
             "nn.winograd_output": "winograd_output"}
    wino = [templates[kinds[k.op]].workload(k, kinds[k.op]) for k in kernels]
    direct = templates["conv2d"].workload(conv, "conv2d")
    assert TuningContext(None, info).gpu_winograd_tile(conv, info) == 4
    assert TuningContext(None, info, winograd=False).gpu_winograd_tile(conv, info) == 0

    def choice(direct_s: float, wino_s: list[float]) -> int:
        path = tmp_path / f"{direct_s}.jsonl"
        target = target_to_json(info.tvm_target)
        writer = RecordWriter(path)
        for workload, cost in [(direct, direct_s), *zip(wino, wino_s, strict=True)]:
            config = {"threads": 64} if "winograd" in workload["template"] else MATMUL_CONFIG
            writer.write(Record(target, workload, config, [cost]))
        writer.close()
        return TuningContext(path, info).gpu_winograd_tile(conv, info)

    assert choice(30e-6, [4e-6, 10e-6, 5e-6]) == 4
    assert choice(15e-6, [4e-6, 10e-6, 5e-6]) == 0


class _TwoConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 64, 3, padding=1)  # 3 input channels: direct only
        self.body = torch.nn.Conv2d(64, 64, 3, padding=1)  # Winograd by the default rule

    def forward(self, x):
        return torch.relu(self.body(torch.relu(self.stem(x))))


def test_model_tasks_name_the_two_forms_of_each_winograd_layer():
    """A GPU model's tasks include the direct conv of each layer the default rule gives
    to Winograd, and name it with its three Winograd kernels as alternatives (the
    scheduler counts the slower form only past the faster)."""
    from tecc.api import model_tasks

    x = torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    tasks, weights, alternatives = model_tasks([(_TwoConvNet(), (x,))], f"cuda:{ARCH}", True)
    assert len(alternatives) == 1
    (direct,), winograd = alternatives[0]
    assert tasks[direct].template == "conv2d"
    assert tasks[direct].workload["kernel"] == [64, 64, 3, 3]
    assert [tasks[i].template for i in winograd] == [
        "winograd_input", "batch_matmul", "winograd_output"]
    assert all(weights[i] == 1 for i in [direct, *winograd])
    # the stem is direct in both forms: one task, no alternative
    stems = [t for t in tasks if t.template == "conv2d" and t.workload["kernel"][1] == 3]
    assert len(stems) == 1
    _, _, none = model_tasks([(_TwoConvNet(), (x,))], f"cuda:{ARCH}", False)
    assert none == []
