"""runtime/: the executor, the deployment package and its manifest checks.

A tiny library is built here with TE (dense+relu, bias add, a bool mask) and a plan
is written by hand, so these tests need neither the frontend nor the compiler driver.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tvm
from tecc.runtime import Executor, PackageError, cpu, load_package, unflatten_outputs, write_package
from tecc.runtime import package as package_mod
from tecc.runtime.executor import PlanError
from tvm import te

from tecc import runtime
from tecc.target import target_from_json, target_info

REPO = Path(__file__).resolve().parents[1]
def _features(mcpu: str, **target) -> list[str]:
    """LLVM's instruction-set features of `mcpu`, as the compiler lists them in a manifest."""
    return sorted(target_info(target_from_json({"kind": "llvm", "mcpu": mcpu, **target})).features)


TARGET = {"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2, "features": _features("core-avx2")}
M, K, N = 4, 8, 16
RTOL = 1e-5


def _build_library() -> tvm.runtime.Executable:
    x = te.placeholder((M, K), "float32", name="x")
    w = te.placeholder((K, N), "float32", name="w")
    k = te.reduce_axis((0, K), name="k")
    mm = te.compute((M, N), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="mm")
    y = te.compute((M, N), lambda i, j: te.max(mm[i, j], tvm.tirx.const(0, "float32")), name="y")

    y_in = te.placeholder((M, N), "float32", name="y_in")
    b = te.placeholder((N,), "float32", name="b")
    z = te.compute((M, N), lambda i, j: y_in[i, j] + b[j], name="z")

    z_in = te.placeholder((M, N), "float32", name="z_in")
    mask = te.compute((M, N), lambda i, j: z_in[i, j] > tvm.tirx.const(0.5, "float32"), name="mask")

    funcs = {
        "k0_dense_relu": te.create_prim_func([x, w, y]),
        "k1_add": te.create_prim_func([y_in, b, z]),
        "k2_mask": te.create_prim_func([z_in, mask]),
    }
    mod = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
    return tvm.compile(mod, target=target_from_json(TARGET))


def _plan() -> dict:
    # Storage 0: x (input) and z share offset 0 (x is dead once k0 ran); y at 256.
    # Storage 1: params, the mask, and the bool input that is also an output.
    return {
        "version": 1,
        "storages": [{"id": 0, "nbytes": 512}, {"id": 1, "nbytes": 768}],
        "tensors": [
            {"id": 0, "storage": 0, "offset": 0, "shape": [M, K], "dtype": "float32"},
            {"id": 1, "storage": 1, "offset": 0, "shape": [K, N], "dtype": "float32"},
            {"id": 2, "storage": 0, "offset": 256, "shape": [M, N], "dtype": "float32"},
            {"id": 3, "storage": 1, "offset": 512, "shape": [N], "dtype": "float32"},
            {"id": 4, "storage": 0, "offset": 0, "shape": [M, N], "dtype": "float32"},
            {"id": 5, "storage": 1, "offset": 576, "shape": [M, N], "dtype": "bool"},
            {"id": 6, "storage": 1, "offset": 640, "shape": [3], "dtype": "int64"},
            {"id": 7, "storage": 1, "offset": 704, "shape": [5], "dtype": "bool"},
        ],
        "inputs": [{"name": "x", "tensor": 0}, {"name": "flag", "tensor": 7}],
        "params": [
            {"name": "w", "tensor": 1},
            {"name": "b", "tensor": 3},
            {"name": "steps", "tensor": 6},
        ],
        "outputs": [
            {"name": "z", "tensor": 4},
            {"name": "mask", "tensor": 5},
            {"name": "steps", "tensor": 6},
            {"name": "flag", "tensor": 7},
        ],
        "kernels": [
            {"name": "k0_dense_relu", "args": [0, 1, 2]},
            {"name": "k1_add", "args": [2, 3, 4]},
            {"name": "k2_mask", "args": [4, 5]},
        ],
        "output_structure": {
            "kind": "tuple",
            "items": [
                {"kind": "tensor", "index": 0},
                {
                    "kind": "dict",
                    "keys": ["mask", "extras"],
                    "items": [
                        {"kind": "tensor", "index": 1},
                        {"kind": "list", "items": [
                            {"kind": "tensor", "index": 2}, {"kind": "tensor", "index": 3}
                        ]},
                    ],
                },
            ],
        },
    }


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((K, N)).astype("float32"),
        "b": rng.standard_normal(N).astype("float32"),
        "steps": np.array([3, -7, 1 << 40], dtype="int64"),
    }


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype("float32"), rng.random(5) > 0.5


def _expected(x: np.ndarray, flag: np.ndarray, params: dict) -> tuple:
    z = np.maximum(x @ params["w"], 0) + params["b"]
    return z, {"mask": z > 0.5, "extras": [params["steps"], flag]}


def _check(result, expected) -> None:
    z, rest = result
    ez, erest = expected
    np.testing.assert_allclose(z, ez, rtol=RTOL, atol=1e-6)
    assert isinstance(rest, dict) and list(rest) == ["mask", "extras"]
    np.testing.assert_array_equal(rest["mask"], erest["mask"])
    assert rest["mask"].dtype == np.bool_
    assert isinstance(rest["extras"], list)
    np.testing.assert_array_equal(rest["extras"][0], erest["extras"][0])
    assert rest["extras"][0].dtype == np.int64
    np.testing.assert_array_equal(rest["extras"][1], erest["extras"][1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    ex = _build_library()
    so = tmp_path_factory.mktemp("lib") / "lib.so"
    ex.export_library(str(so))
    return ex, so


@pytest.fixture
def executor(built) -> Executor:
    return Executor(tvm.runtime.load_module(str(built[1])), _plan(), _params())


def _extra(**target) -> dict:
    return {"tecc": "0.0-test", "target": target or TARGET, "records_digest": None}


# ---------------------------------------------------------------------------- executor


def test_matches_numpy(executor):
    params = _params()
    for seed in (1, 2):
        x, flag = _inputs(seed)
        assert np.abs(x).min() > 0  # never test on zeros
        _check(executor(x, flag), _expected(x, flag, params))


def test_specs_and_flat(executor):
    assert [(s.name, s.shape, s.dtype) for s in executor.input_specs] == [
        ("x", (M, K), "float32"), ("flag", (5,), "bool")]
    assert [s.name for s in executor.output_specs] == ["z", "mask", "steps", "flag"]
    flat = executor.run_flat(*_inputs(3))
    assert [a.shape for a in flat] == [(M, N), (M, N), (3,), (5,)]


def test_repeated_calls_are_independent(executor):
    params = _params()
    x1, f1 = _inputs(4)
    x2, f2 = _inputs(5)
    r1 = executor(x1, f1)
    r2 = executor(x2, f2)
    _check(r1, _expected(x1, f1, params))
    _check(r2, _expected(x2, f2, params))
    # Results are copies: changing them changes neither the params nor later results.
    r1[1]["extras"][0][:] = 0
    r1[0][:] = 0
    _check(executor(x1, f1), _expected(x1, f1, params))


def test_input_errors_name_the_input(executor):
    x, flag = _inputs(6)
    with pytest.raises(ValueError, match=r"expected 2 input\(s\).*x: \(4, 8\) float32.*got 1"):
        executor(x)
    with pytest.raises(
        ValueError,
        match=r"input 'x' \(#0\): expected shape \(4, 8\) float32, got \(4, 7\) float32",
    ):
        executor(x[:, :7], flag)
    with pytest.raises(
        ValueError,
        match=r"input 'flag' \(#1\): expected shape \(5,\) bool, got \(5,\) int64",
    ):
        executor(x, flag.astype("int64"))
    with pytest.raises(ValueError, match=r"input 'x' \(#0\).*float32, got \(4, 8\) float64"):
        executor(x.astype("float64"), flag)


def _broken(mutate) -> dict:
    plan = _plan()
    mutate(plan)
    return plan


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p["kernels"][1].update(name="k9_nope"), "kernel 'k9_nope'.*not in the library"),
        (lambda p: p["kernels"][0]["args"].append(42), "argument tensor 42 does not exist"),
        (lambda p: p["outputs"].append({"name": "o", "tensor": 99}), "output 'o': tensor 99"),
        (lambda p: p["storages"][0].update(nbytes=400), "tensor 2.*storage 0 has only 400 bytes"),
        (lambda p: p["tensors"][2].update(offset=260), "offset 260.*multiple of 64"),
        (lambda p: p["tensors"][0].update(storage=7), "storage 7 does not exist"),
        (lambda p: p.update(version=2), "plan version 2"),
        (lambda p: p["output_structure"]["items"][0].update(index=9), "output #9"),
        (lambda p: p.update(output_structure={"kind": "set"}), "unknown output_structure kind"),
    ],
)
def test_plan_errors(built, mutate, message):
    with pytest.raises(PlanError, match=message):
        Executor(tvm.runtime.load_module(str(built[1])), _broken(mutate), _params())


def test_param_errors(built):
    mod = tvm.runtime.load_module(str(built[1]))
    params = _params()
    del params["b"]
    with pytest.raises(PlanError, match=r"params missing.*\['b'\]"):
        Executor(mod, _plan(), params)
    params = _params()
    params["w"] = params["w"].astype("float64")
    with pytest.raises(PlanError, match=r"param 'w'.*\(8, 16\) float32.*\(8, 16\) float64"):
        Executor(mod, _plan(), params)


def test_unflatten_outputs():
    flat = ["a", "b", "c"]
    t = {"kind": "tensor", "index": 1}
    assert unflatten_outputs(t, flat) == "b"
    assert unflatten_outputs({"kind": "none"}, flat) is None
    assert unflatten_outputs({"kind": "list", "items": [t, t]}, flat) == ["b", "b"]
    s = {"kind": "dict", "keys": ["k"], "items": [{"kind": "tuple", "items": [t]}]}
    assert unflatten_outputs(s, flat) == {"k": ("b",)}


def test_executor_accepts_any_indexable_module(built):
    ex = built[0]  # a tvm.compile Executable: ex[name] is its function
    x, flag = _inputs(7)
    _check(Executor(ex, _plan(), _params())(x, flag), _expected(x, flag, _params()))


# ---------------------------------------------------------------------------- package


@pytest.mark.parametrize("name", ["pkg", "pkg.tar"])
def test_package_round_trip(built, tmp_path, name):
    ex, so = built
    path = tmp_path / name
    # The directory takes the exported .so path, the .tar the module object.
    write_package(path, so if name == "pkg" else ex, _plan(), _params(), _extra())
    if name.endswith(".tar"):
        assert path.is_file()
        with tarfile.open(path) as tf:
            assert sorted(tf.getnames()) == ["lib.so", "manifest.json", "params.npz", "plan.json"]
    pkg = load_package(path)
    m = pkg.manifest
    assert m["format_version"] == 1 and m["tecc"] == "0.0-test" and m["tvm"] == tvm.__version__
    assert m["target"] == TARGET and m["records_digest"] is None
    assert m["inputs"] == [
        {"name": "x", "shape": [M, K], "dtype": "float32"},
        {"name": "flag", "shape": [5], "dtype": "bool"},
    ]
    assert [o["name"] for o in m["outputs"]] == ["z", "mask", "steps", "flag"]
    assert sorted(m["files"]) == ["lib.so", "params.npz", "plan.json"]
    assert pkg.input_specs[0].shape == (M, K)
    for seed in (8, 9):
        x, flag = _inputs(seed)
        _check(pkg(x, flag), _expected(x, flag, _params()))


@pytest.mark.parametrize("victim", ["params.npz", "plan.json", "lib.so"])
def test_changed_package_is_refused_before_loading(built, tmp_path, monkeypatch, victim):
    path = tmp_path / "pkg"
    write_package(path, built[1], _plan(), _params(), _extra())
    if victim == "plan.json":
        plan = json.loads((path / victim).read_text())
        plan["kernels"].reverse()
        (path / victim).write_text(json.dumps(plan))
    else:
        with open(path / victim, "r+b") as f:
            f.seek(-40, os.SEEK_END)
            f.write(b"\x00" * 8)

    def no_machine_code(*args, **kwargs):
        raise AssertionError("load_module called on a changed package")

    monkeypatch.setattr(tvm.runtime, "load_module", no_machine_code)
    with pytest.raises(PackageError, match=rf"{victim} was changed.*re-export"):
        load_package(path)


def test_changed_tar_is_refused(built, tmp_path):
    src, tar = tmp_path / "pkg", tmp_path / "pkg.tar"
    write_package(src, built[1], _plan(), _params(), _extra())
    np.savez(src / "params.npz", **{k: v + 1 for k, v in _params().items()})
    with tarfile.open(tar, "w") as tf:
        for name in ("manifest.json", "lib.so", "plan.json", "params.npz"):
            tf.add(src / name, arcname=name)
    with pytest.raises(PackageError, match="params.npz was changed"):
        load_package(tar)


def test_missing_file_is_refused(built, tmp_path):
    path = tmp_path / "pkg"
    write_package(path, built[1], _plan(), _params(), _extra())
    (path / "lib.so").unlink()
    with pytest.raises(PackageError, match="lib.so is missing"):
        load_package(path)


def _fake_host(monkeypatch, flags: set[str]) -> None:
    monkeypatch.setattr(cpu, "host_cpuinfo_flags", lambda: frozenset(flags))
    monkeypatch.setattr(cpu, "host_machine", lambda: "x86_64")


def _host_flags(mcpu: str) -> set[str]:
    """/proc/cpuinfo flags of a host that has exactly `mcpu`'s features."""
    return {cpu.LLVM_TO_CPUINFO[f] for f in _features(mcpu)}


AVX512_FLAGS = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
AVX2_HOST = _host_flags("skylake-avx512") - AVX512_FLAGS  # a Skylake without AVX-512


def test_foreign_target_is_refused(built, tmp_path, monkeypatch):
    path = tmp_path / "pkg"
    target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2,
              "features": _features("skylake-avx512")}
    write_package(path, built[1], _plan(), _params(), _extra(**target))
    _fake_host(monkeypatch, AVX2_HOST)

    def no_machine_code(*args, **kwargs):
        raise AssertionError("load_module called for a foreign target")

    with monkeypatch.context() as m:
        m.setattr(tvm.runtime, "load_module", no_machine_code)
        with pytest.raises(PackageError, match=r"skylake-avx512.*lacks avx512f.*Recompile"):
            load_package(path)

    # The accept path: the same package on a host with AVX-512 loads and runs. (The
    # library itself is core-avx2, so it runs here whatever this machine has.)
    _fake_host(monkeypatch, AVX2_HOST | AVX512_FLAGS)
    x, flag = _inputs(10)
    _check(load_package(path)(x, flag), _expected(x, flag, _params()))


@pytest.mark.parametrize(
    ("mcpu", "flags", "ok"),
    [
        ("core-avx2", _host_flags("core-avx2"), True),
        ("core-avx2", _host_flags("core-avx2") - {"avx2", "fma"}, False),
        ("znver3", _host_flags("znver3") - {"fma"}, False),
        ("x86-64", {"sse", "sse2"}, True),
        ("generic", {"sse", "sse2"}, True),
        ("cortex-a72", AVX2_HOST, False),  # an aarch64 CPU on an x86 host
    ],
)
def test_target_check(monkeypatch, mcpu, flags, ok):
    _fake_host(monkeypatch, flags)
    triple = {"mtriple": "aarch64-linux-gnu"} if mcpu.startswith("cortex") else {}
    target = {"kind": "llvm", "mcpu": mcpu, **triple, "features": _features(mcpu, **triple)}
    if ok:
        package_mod._check_target(target)
    else:
        with pytest.raises(PackageError, match=rf"built for .*{mcpu}.*Recompile"):
            package_mod._check_target(target)


def test_package_needing_a_feature_the_host_lacks_is_refused(built, tmp_path, monkeypatch):
    # code compiled with AMX-FP16 (say for graniterapids) on a host without it
    path = tmp_path / "pkg"
    target = dict(TARGET, features=sorted([*TARGET["features"], "amx-fp16"]))
    write_package(path, built[1], _plan(), _params(), _extra(**target))
    _fake_host(monkeypatch, _host_flags("core-avx2"))

    def no_machine_code(*args, **kwargs):
        raise AssertionError("load_module called for a package the host cannot run")

    monkeypatch.setattr(tvm.runtime, "load_module", no_machine_code)
    with pytest.raises(PackageError, match=r"core-avx2.*lacks amx-fp16\. Recompile"):
        load_package(path)


def test_manifest_features_the_runtime_cannot_check_are_refused(monkeypatch):
    _fake_host(monkeypatch, _host_flags("core-avx2"))
    with pytest.raises(PackageError, match="cannot check: fake-feature"):
        package_mod._check_target(dict(TARGET, features=["avx2", "fake-feature"]))
    # a manifest without features (an older tecc's) is not guessed at either
    with pytest.raises(PackageError, match="does not list the instruction-set features"):
        package_mod._check_target({"kind": "llvm", "mcpu": "core-avx2"})


def test_write_package_needs_the_features_of_a_cpu_target(built, tmp_path):
    with pytest.raises(ValueError, match="needs 'features'"):
        write_package(tmp_path / "pkg", built[1], _plan(), _params(),
                      _extra(kind="llvm", mcpu="core-avx2"))


def test_write_package_checks_params(built, tmp_path):
    params = _params()
    params["w"] = params["w"][:4]
    with pytest.raises(PlanError, match="param 'w'"):
        write_package(tmp_path / "pkg", built[1], _plan(), params, _extra())


# ---------------------------------------------------------------------------- runtime only

_RUNTIME_ONLY_SCRIPT = r"""
import sys

class NoTorch:
    # A deployment host without torch: tvm_ffi tries `import torch` when it is installed.
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch' (blocked by the test)")

sys.meta_path.insert(0, NoTorch())
import numpy as np
from tecc import runtime

pkg = runtime.load_package(sys.argv[1])
x = np.load(sys.argv[2])
flag = np.load(sys.argv[3])
z, rest = pkg(x, flag)
np.save(sys.argv[4], z)
np.save(sys.argv[5], rest["mask"])
maps = open("/proc/self/maps").read()
assert "libtvm_compiler" not in maps, "the TVM compiler library was loaded"
assert "torch" not in sys.modules, "torch was imported"
bad = [m for m in sys.modules if m == "tecc.api" or m.split(".")[:2] in
       (["tecc", "frontend"], ["tecc", "graph_opt"], ["tecc", "schedules"], ["tecc", "autotune"])]
assert not bad, bad
print("RUNTIME-ONLY OK")
"""


def test_runtime_only_subprocess(built, tmp_path):
    path = tmp_path / "model.tar"
    write_package(path, built[0], _plan(), _params(), _extra())
    x, flag = _inputs(11)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "flag.npy", flag)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(REPO),
        "TVM_USE_RUNTIME_LIB": "1",
    }
    outs = [str(tmp_path / "z.npy"), str(tmp_path / "mask.npy")]
    proc = subprocess.run(
        [sys.executable, "-c", _RUNTIME_ONLY_SCRIPT, str(path),
         str(tmp_path / "x.npy"), str(tmp_path / "flag.npy"), *outs],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RUNTIME-ONLY OK" in proc.stdout
    ez, erest = _expected(x, flag, _params())
    np.testing.assert_allclose(np.load(outs[0]), ez, rtol=RTOL, atol=1e-6)
    np.testing.assert_array_equal(np.load(outs[1]), erest["mask"])


# ---------------------------------------------------------------------------- imports

_ALLOWED_TVM = {"tvm", "tvm.runtime", "tvm.cpu", "tvm.cuda", "tvm.device"}
_ALLOWED_TVM_ATTRS = {"runtime", "cpu", "cuda", "device", "__version__"}
_FORBIDDEN = {"torch", "frontend", "graph_opt", "schedules", "autotune", "tecc"}


def test_runtime_imports_neither_torch_nor_the_compiler():
    # tvm_ffi: the FFI layer the TVM runtime sits on (a deployment wheel's _tvm module)
    allowed = {"numpy", "tvm", "tvm_ffi"} | set(sys.stdlib_module_names)
    files = sorted((REPO / "runtime").glob("*.py"))
    assert files
    for f in files:
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: runtime's own modules
                    continue
                names = [node.module or ""]
                if node.module == "tvm":  # from tvm import te
                    names += [f"tvm.{a.name}" for a in node.names]
            else:
                names = []
            for name in names:
                top = name.split(".")[0]
                where = f"{f.name}:{node.lineno} imports {name}"
                assert top not in _FORBIDDEN, where
                assert top in allowed, where
                if top == "tvm":
                    assert name in _ALLOWED_TVM, f"{where}: only tvm's runtime API is allowed"
            # Attribute use of tvm (tvm.te, tvm.compile, ...): runtime APIs only.
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "tvm"
            ):
                assert node.attr in _ALLOWED_TVM_ATTRS, f"{f.name}:{node.lineno} uses tvm.{node.attr}"


def test_public_api():
    for name in ("Executor", "load_package", "write_package", "PackageError", "unflatten_outputs"):
        assert hasattr(runtime, name)
    assert issubclass(PackageError, RuntimeError)


def test_one_thread_per_physical_core(monkeypatch):
    from tecc.runtime import threads

    # 4 CPUs, two SMT siblings each on cores 0 and 1 of one package: 2 cores
    topology = {f"/sys/devices/system/cpu/cpu{c}/topology/{f}": v
                for c, core in enumerate([0, 0, 1, 1])
                for f, v in (("physical_package_id", "0"), ("core_id", str(core)))}
    real_open = open

    def fake_open(path, *args, **kwargs):
        if str(path).startswith("/sys/devices/system/cpu/"):
            import io

            if path not in topology:
                raise FileNotFoundError(path)
            return io.StringIO(topology[path] + "\n")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr("builtins.open", fake_open)
    assert threads.physical_cores() == 2
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 2})
    assert threads.physical_cores() == 2
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    assert threads.physical_cores() == 1
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 7})
    assert threads.physical_cores() == 2  # no topology for cpu7: every CPU counts
    for var in threads.THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.kernel_threads() == 3
    monkeypatch.setenv("TVM_NUM_THREADS", "5")
    assert threads.kernel_threads() == 5


def test_kernels_run_on_every_core():
    """TVM alone would size its pool at half the logical CPUs (it assumes SMT); importing
    the runtime sizes it at one thread per physical core."""
    code = ("import os, tvm\nfrom tecc import runtime\n"
            "print(tvm.get_global_func('runtime.NumThreads')(), "
            "runtime.threads.physical_cores())")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout.split()
    assert int(out[0]) == int(out[1]) >= 1
    env["TVM_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout.split()
    assert int(out[0]) == 1
