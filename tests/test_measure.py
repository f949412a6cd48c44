"""Measurement: candidates built in worker processes and run in an isolated one. Good
candidates get positive costs; a build error, a build hang, a crashing kernel, a
hanging kernel and a wrong result are each recorded with their error kind, and the
batch goes on. One record line per candidate, written as each is measured."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import tvm
from tecc.autotune.builder import Builder, LocalBuilder, remove_built
from tecc.autotune.measure import MeasureInput, MeasureResult, measure_batch
from tecc.autotune.pool import WorkerPool, WorkerStartError
from tecc.autotune.records import RecordWriter, load_records
from tecc.autotune.runner import (
    CUTOFF_FLOOR_S,
    LocalRunner,
    RunJob,
    Runner,
    RunOptions,
    RunOutcome,
    compare_outputs,
)
from tecc.autotune.task import TunableTask
from tecc.schedules.space import Config, ConfigSpace
from tvm import te
from tvm.s_tir.schedule import Schedule

from tecc.target import resolve_target, target_to_json

# Serial (make test's second phase): runner time-outs and cost ratios assume the cores are
# this test's alone.
pytestmark = pytest.mark.serial

N = 64
SLOW = 512
FAULTS = ["none", "build_error", "build_hang", "crash", "run_hang", "wrong", "slow"]


def matmul_space() -> ConfigSpace:
    space = ConfigSpace()
    space.define_split("tile_i", N, 2, max_factor=16)
    space.define_split("tile_j", N, 2, max_factor=32)
    space.define_bool("parallel")
    # Only this test task has this knob: configs that misbehave on purpose.
    space.define_choice("fault", FAULTS)
    return space


@dataclass
class MatmulTask:
    """C = A @ B, N x N x N, float32; module level so the build workers can unpickle it."""

    target: dict[str, Any]
    name: str = "test_matmul"
    workload: dict[str, Any] = field(default_factory=lambda: {
        "template": "test_matmul", "shapes": [[N, N], [N, N]], "dtype": "float32"})

    def build_primfunc(self, config: Config) -> tvm.tirx.PrimFunc:
        fault = config["fault"]
        if fault == "build_hang":
            time.sleep(3600)
        # wrong: one reduction step short; run_hang: a reduction of 2^30 steps per output;
        # slow: every product SLOW times, scaled by 1/SLOW (exact: a power of two)
        extent = {"wrong": N - 1, "run_hang": 1 << 30, "slow": N * SLOW}.get(fault, N)
        scale = 1.0 / SLOW if fault == "slow" else 1.0
        # crash: reads 2^24 rows past A (gigabytes away: unmapped, a real SIGSEGV)
        offset = 1 << 24 if fault == "crash" else 0
        a = te.placeholder((N, N), name="A")
        b = te.placeholder((N, N), name="B")
        k = te.reduce_axis((0, extent), name="k")
        c = te.compute((N, N), lambda i, j: te.sum(a[i + offset, k % N] * b[k % N, j] * scale,
                                                    axis=k), name="C")
        sch = Schedule(tvm.IRModule({"main": te.create_prim_func([a, b, c])}))
        block = sch.get_sblock("C")
        i, j, kk = sch.get_loops(block)
        if fault == "build_error":
            sch.vectorize(kk)  # a reduction loop cannot be vectorized: ScheduleError
        io, ii = sch.split(i, list(config["tile_i"]))
        jo, ji = sch.split(j, list(config["tile_j"]))
        sch.reorder(io, jo, kk, ii, ji)
        sch.vectorize(ji)
        if config["parallel"]:
            sch.parallel(io)
        return sch.mod["main"]

    def reference_inputs(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.uniform(-1, 1, (N, N)).astype("float32") for _ in range(2)]

    def reference_outputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [inputs[0] @ inputs[1]]


@pytest.fixture(scope="module")
def task() -> MatmulTask:
    return MatmulTask(target_to_json(resolve_target("llvm")))


@pytest.fixture(scope="module")
def builder():
    with LocalBuilder(n_parallel=2, timeout_s=8) as b:
        yield b


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(number=2, repeat=2, min_repeat_ms=0, timeout_s=4) as r:
        yield r


def cfg(tile_i: int = 8, tile_j: int = 16, parallel: bool = True, fault: str = "none"
        ) -> Config:
    return matmul_space().from_json({"tile_i": [N // tile_i, tile_i],
                                     "tile_j": [N // tile_j, tile_j],
                                     "parallel": parallel, "fault": fault})


def test_task_satisfies_protocol(task):
    assert isinstance(task, TunableTask)


def test_failures_are_recorded_and_the_batch_goes_on(task, builder, runner, tmp_path):
    configs = [cfg(), cfg(fault="build_error"), cfg(fault="build_hang"), cfg(fault="crash"),
               cfg(4, 32, False), cfg(fault="run_hang"), cfg(fault="wrong"), cfg(16, 8)]
    expected = [None, "build_error", "build_timeout", "runtime_crash", None, "run_timeout",
                "wrong_result", None]
    path = tmp_path / "records.jsonl"
    lines_when_delivered: list[int] = []

    def seen(index: int, result: MeasureResult) -> None:
        # written and flushed before the candidate is reported, so a kill loses nothing
        lines_when_delivered.append(len(path.read_text().splitlines()))

    with RecordWriter(path) as writer:
        results = measure_batch(builder, runner, [MeasureInput(task, c) for c in configs],
                                writer, callback=seen)

    kinds = [r.error_kind for r in results]
    assert kinds == expected, [r.error for r in results]
    for r, kind in zip(results, expected, strict=True):
        if kind is None:
            assert r.ok and len(r.costs_s) == 2 and all(c > 0 for c in r.costs_s)
            assert 0 < r.cost < 0.1
        else:
            assert not r.ok and r.costs_s == [] and r.cost == float("inf")
    assert "max abs err" in results[6].error
    assert "SIGSEGV" in results[3].error
    assert lines_when_delivered == list(range(1, len(configs) + 1))

    records, skipped = load_records(path)
    assert skipped == 0 and len(records) == len(configs)
    for rec, c, res in zip(records, configs, results, strict=True):
        assert rec.config == c.to_json() and rec.workload == task.workload
        assert rec.target == task.target and rec.error == res.error
        assert rec.costs_s == res.costs_s
    assert json.loads(path.read_text().splitlines()[0])["config"]["tile_i"] == [8, 8]


def test_workers_serve_the_next_batch(task, builder, runner):
    # after the kills above (or on a fresh pool) the same builder and runner go on
    results = measure_batch(builder, runner, [MeasureInput(task, cfg(2, 32)),
                                              MeasureInput(task, cfg(fault="crash")),
                                              MeasureInput(task, cfg(8, 8, False))])
    assert [r.error_kind for r in results] == [None, "runtime_crash", None]
    assert all(r.all_cost > 0 and r.timestamp > 0 for r in results)


def test_slow_candidates_keep_their_first_call(task, builder):
    # once a batch has measured the workload, a candidate SLOW times slower than its best
    # is timed by its checked first call alone; without slow_ratio, in full
    for slow_ratio, n_costs in ((3.0, 1), (None, 2)):
        with LocalRunner(number=2, repeat=2, min_repeat_ms=0, timeout_s=4,
                         slow_ratio=slow_ratio) as runner:
            fast, = measure_batch(builder, runner, [MeasureInput(task, cfg())])
            slow, = measure_batch(builder, runner, [MeasureInput(task, cfg(fault="slow"))])
        assert fast.ok and len(fast.costs_s) == 2
        assert slow.ok and len(slow.costs_s) == n_costs, slow.costs_s
        assert slow.cost > max(3 * fast.cost, CUTOFF_FLOOR_S)


def test_measure_module_imports_without_tvm():
    # the running side ships with the TVM runtime only; importing it loads no tvm
    code = ("import sys, tecc.autotune.measure, tecc.autotune.builder, "
            "tecc.autotune.runner, tecc.autotune.task; "
            "sys.exit(1 if 'tvm' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_compare_outputs():
    ref = np.array([[1.0, -2.0], [3.0, 1e-6]], dtype="float32")
    assert compare_outputs([ref + 1e-5], [ref], 1e-3, 1e-4) is None
    assert "max abs err 0.5" in compare_outputs([ref + 0.5], [ref], 1e-3, 1e-4)
    nan = ref.copy()
    nan[0, 0] = np.nan
    assert "max abs err inf" in compare_outputs([nan], [ref], 1e-3, 1e-4)
    assert "shape" in compare_outputs([ref[:1]], [ref], 1e-3, 1e-4)
    assert compare_outputs([np.array([True])], [np.array([False])], 0, 0) is not None
    # atol scales with the output's RMS: rounding of a near-zero value of a tensor of
    # magnitude 16 (a 2304-term conv) passes; an error of one term of it does not
    big = np.random.default_rng(0).standard_normal((64, 64)) * 16
    big[0, 0] = 0.0
    near = big.copy()
    near[0, 0] = 3e-4
    assert compare_outputs([near], [big], 1e-3, 1e-4) is None
    near[0, 0] = 0.3
    assert "max abs err 0.3" in compare_outputs([near], [big], 1e-3, 1e-4)


def test_worker_pool_survives_its_jobs():
    # stdlib functions as jobs: the workers need not import tvm, so this is quick
    with_pool = WorkerPool(2, warm_imports=())
    try:
        out = with_pool.map(math.sqrt, [4.0, -1.0, 9.0], timeout_s=30)
        assert [(o.status, o.value) for o in out] == [
            ("ok", 2.0), ("error", "ValueError: math domain error"), ("ok", 3.0)]
        died = with_pool.map(signal.raise_signal, [signal.SIGSEGV], timeout_s=30)[0]
        assert (died.status, died.value) == ("died", "signal SIGSEGV")
        out = with_pool.map(time.sleep, [0.01, 60, 0.01], timeout_s=1.5)
        assert [o.status for o in out] == ["ok", "timeout", "ok"]
        bad = with_pool.map(math.sqrt, [lambda: 0], timeout_s=30)[0]
        assert bad.status == "error" and "cannot send the job" in bad.value
        assert with_pool.restarts == 2
    finally:
        with_pool.close()


def test_cache_flush_times_every_call_cold(task, builder):
    # one call per repeat, each after TVM flushed the non-data arguments
    with LocalRunner(number=1, repeat=3, min_repeat_ms=0, timeout_s=4,
                     cache_flush=True) as cold:
        result, = measure_batch(builder, cold, [MeasureInput(task, cfg())])
    assert result.ok and len(result.costs_s) == 3 and all(c > 0 for c in result.costs_s)


def test_a_worker_that_cannot_start_reports_why():
    # spawn can refuse (a script without a __main__ guard): that error reaches the
    # caller, and cleaning up the worker afterwards is a no-op
    import multiprocessing

    from tecc.autotune.pool import _Worker

    class Refusing:
        Pipe = staticmethod(multiprocessing.get_context("spawn").Pipe)

        class Process:
            def __init__(self, **kwargs):
                pass

            def start(self):
                raise RuntimeError("bootstrapping")

    worker = _Worker(Refusing(), {}, [])
    with pytest.raises(RuntimeError, match="bootstrapping"):
        worker.start(1.0)
    worker.kill()
    assert worker.proc is None and worker.state == "down"


def test_workers_that_cannot_start_stop_the_pool_with_the_cause(tmp_path, monkeypatch):
    # a worker that exits while importing (here, code 3) is the environment's fault:
    # the pool says so instead of failing every job as if it had crashed it
    (tmp_path / "exits_at_import.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers get the parent's path
    pool = WorkerPool(1, warm_imports=("exits_at_import",), start_timeout_s=30)
    try:
        with pytest.raises(WorkerStartError, match="3 starts; the last: exit code 3"):
            pool.map(math.sqrt, [4.0, 9.0], timeout_s=30)
        assert all(w.proc is None for w in pool.workers)
    finally:
        pool.close()


UNGUARDED_TUNING_SCRIPT = """
import sys
import torch
import tecc

model = torch.nn.Linear(16, 32).eval()
tecc.tune(model, (torch.randn(4, 16),), records=sys.argv[1], trials=4, progress=False,
          transfer=False, verify_rounds=0)
"""


def test_a_script_tuning_without_a_main_guard_is_told_to_add_one(tmp_path):
    # spawned workers import the main script again: without the guard each would tune
    # anew; they stop at once and the tuner names the script and the fix
    script = tmp_path / "tune_it.py"
    script.write_text(UNGUARDED_TUNING_SCRIPT)
    records = tmp_path / "records.jsonl"
    proc = subprocess.run([sys.executable, str(script), str(records)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tecc.autotune.pool.WorkerStartError") and str(script) in last
    assert 'if __name__ == "__main__":' in last
    assert not records.exists() or records.read_text() == ""


RUNNER_WITHOUT_COMPILER = r"""
import json, sys

class NoCompiler:
    # A GPU host that has the TVM runtime only: no torch, none of tecc's compiler.
    BLOCKED = ("torch", "tecc.frontend", "tecc.graph_opt", "tecc.schedules", "tecc.api",
               "tecc.autotune.builder", "tecc.autotune.measure")

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in self.BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoCompiler())
import numpy as np
from tecc.autotune.runner import LocalRunner, RunJob

data = np.load(sys.argv[2])
inputs, expected = [data["a"], data["b"]], [data["c"]]
specs = [(tuple(s), d) for s, d in json.loads(sys.argv[3])]
with LocalRunner(number=2, repeat=2, min_repeat_ms=0, timeout_s=30) as runner:
    good, wrong = runner.run([RunJob(sys.argv[1], inputs, specs, expected),
                              RunJob(sys.argv[1], inputs, specs, [expected[0] + 1])])
assert good.ok and len(good.costs_s) == 2, good
assert wrong.error.startswith("wrong_result: "), wrong
assert "libtvm_compiler" not in open("/proc/self/maps").read()
print("OK")
"""


def test_runner_runs_without_the_compiler(task, builder, tmp_path):
    # a library built here, timed by a process that cannot import the compiler or torch
    config = cfg()
    built, = builder.build([MeasureInput(task, config)])
    try:
        assert built.error is None and built.path
        a, b = task.reference_inputs(7)
        np.savez(tmp_path / "io.npz", a=a, b=b, c=task.reference_outputs([a, b])[0])
        proc = subprocess.run(
            [sys.executable, "-c", RUNNER_WITHOUT_COMPILER, built.path,
             str(tmp_path / "io.npz"), json.dumps(built.arg_specs[2:])],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "TVM_USE_RUNTIME_LIB": "1"})
        assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    finally:
        remove_built([built])


@dataclass
class RecordingRunner:
    """Another Runner: takes the jobs measure_batch hands it, reports fixed timings."""

    options: RunOptions = field(default_factory=RunOptions)
    jobs: list[RunJob] = field(default_factory=list)

    def run(self, jobs, on_done=None):
        self.jobs += jobs
        outcomes = [RunOutcome([1e-3 * (i + 1)], None, 0.5) for i in range(len(jobs))]
        for i, outcome in enumerate(outcomes):
            if on_done is not None:
                on_done(i, outcome)
        return outcomes

    def close(self) -> None:
        pass


def test_measure_batch_takes_any_runner(task, builder, runner, tmp_path):
    assert isinstance(runner, Runner) and isinstance(builder, Builder)
    runner = RecordingRunner()
    assert isinstance(runner, Runner)
    configs = [cfg(), cfg(fault="build_error"), cfg(4, 32)]
    with RecordWriter(tmp_path / "r.jsonl") as writer:
        results = measure_batch(builder, runner, [MeasureInput(task, c) for c in configs],
                                writer)
    # the failed build never reaches the runner; the others come back in order
    assert [r.error_kind for r in results] == [None, "build_error", None]
    assert [r.costs_s for r in results] == [[1e-3], [], [2e-3]]
    assert results[0].all_cost > 0.5
    assert len(runner.jobs) == 2 and len({j.key for j in runner.jobs}) == 1
    inputs = task.reference_inputs(runner.options.seed)
    for job in runner.jobs:
        assert job.device == "cpu" and job.output_specs == [((N, N), "float32")]
        np.testing.assert_array_equal(job.inputs[0], inputs[0])
        np.testing.assert_allclose(job.expected[0], inputs[0] @ inputs[1], rtol=1e-6)
    records, _ = load_records(tmp_path / "r.jsonl")
    assert [r.costs_s for r in records] == [[1e-3], [], [2e-3]]

    unchecked = RecordingRunner(RunOptions(check_correctness=False))
    measure_batch(builder, unchecked, [MeasureInput(task, cfg())])
    assert unchecked.jobs[0].expected is None


@dataclass
class BlasThreadsTask(MatmulTask):
    """MatmulTask noting how many threads numpy's BLAS may use for its reference."""

    name: str = "test_matmul_blas_threads"
    blas_threads: list[int] = field(default_factory=list)

    def reference_outputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        from threadpoolctl import threadpool_info

        self.blas_threads = [p["num_threads"] for p in threadpool_info()
                             if p["user_api"] == "blas"]
        return super().reference_outputs(inputs)


def test_the_reference_runs_on_one_blas_thread(builder):
    # numpy's idle BLAS threads spin for about 0.1 s after a multi-threaded matmul, on
    # the cores where the runner times the next candidate: the first candidates of each
    # task timed 10-25x slow on 2 cores
    task = BlasThreadsTask(target_to_json(resolve_target("llvm")))
    results = measure_batch(builder, RecordingRunner(), [MeasureInput(task, cfg())])
    assert results[0].error is None
    assert task.blas_threads and set(task.blas_threads) == {1}
