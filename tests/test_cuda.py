"""The CUDA backend: every op and test model builds for cuda on a machine without a
GPU (cubins embedded, every kernel bound to blocks and threads); where a GPU is
visible (the H200 runs `pytest tests/test_cuda.py`), each also runs there against
torch eager."""

import numpy as np
import pytest
import torch
from tecc.runtime import cuda as runtime_cuda
from tecc.schedules.gpu_default import UnboundKernelError, check_bound, launch_extents
from tecc.schedules.gpu_templates import split_k_tile

import tecc
from tecc import runtime
from tecc.cuda_toolchain import (
    CudaToolchainError,
    build_stub_driver,
    compile_cuda,
    embedded_cuda_archs,
    find_nvcc,
)
from tecc.target import resolve_target
from tests.models import MLP, BasicBlock, randomize_batchnorm
from tests.test_models import TOLERANCE
from tests.test_models import make as make_model
from tests.test_ops import CASES, build_case
from tests.util import assert_close, lowered_group, lowered_matmul, max_rel_error, to_cpu


def _gpu() -> bool:
    try:
        runtime_cuda.cuda_device(0)
    except runtime_cuda.CudaError:
        return False
    return torch.cuda.is_available()


GPU = _gpu()
ARCH = runtime_cuda.device_arch(0) if GPU else "sm_90"


def _archs(tmp_path, compiled) -> list[tuple[str, int]]:
    compiled.export(tmp_path / "pkg")
    return embedded_cuda_archs((tmp_path / "pkg" / "lib.so").read_bytes())


def _on_gpu(inputs):
    return tuple(x.cuda() for x in inputs)


# Without a GPU every op builds at its first shapes (CI's time goes to building, nvcc
# per kernel); on a GPU each runs at both.
@pytest.mark.parametrize("shape_set", [1, 2] if GPU else [1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_builds_for_cuda_and_matches_torch(name, shape_set):
    module, inputs = build_case(name, CASES[name][shape_set])
    compiled = tecc.compile(module, inputs, target=f"cuda:{ARCH}")
    with torch.no_grad():
        expected = module(*inputs)
    if GPU:
        got = compiled(*_on_gpu(inputs))
        got = [g.cpu() for g in got] if isinstance(got, tuple) else got.cpu()
        assert_close(got, expected, rtol=1e-4, atol=1e-5)
        # numpy in, numpy out, on the same executor
        flat = compiled(*(x.numpy() for x in inputs))
        assert_close(flat, tuple(e.numpy() for e in expected) if isinstance(expected, tuple)
                     else expected.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_model_builds_for_cuda_and_matches_torch(name, tmp_path):
    torch.manual_seed(0)
    model, inputs = make_model(name)
    model.eval()
    compiled = tecc.compile(model, inputs, target=f"cuda:{ARCH}")
    archs = _archs(tmp_path, compiled)
    assert ("elf", int(ARCH[3:])) in archs, archs
    if name == "bert":  # each layer's query, key and value projections are one dense
        denses = [k["name"] for k in compiled.plan["kernels"] if "dense" in k["name"]]
        assert len(denses) == 2 * 4 + 1, denses
    if not GPU:
        return
    with torch.no_grad():
        expected = model(*inputs)
    for graph in (True, False):
        compiled.cuda_graph = graph
        compiled._executor = None
        for _ in range(3):  # the warm-up run, the capture, a replay
            got = compiled(*_on_gpu(inputs))
        error = max_rel_error(to_cpu(got), expected)
        assert error < TOLERANCE[name], f"{name}, graph {graph}: max relative error {error:.2e}"
    if name != "bert":
        fresh = tuple(torch.randn_like(x) for x in inputs)
        with torch.no_grad():
            assert_close(to_cpu(compiled(*_on_gpu(fresh))), model(*fresh),
                         rtol=TOLERANCE[name] * 10, atol=TOLERANCE[name])



class HeadAttention(torch.nn.Module):
    """Self-attention with one fused q/k/v projection, the heads split and merged by
    views: the layout ops a GPU matmul takes into its shared-memory fetch."""

    def __init__(self, heads: int, dim: int) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)
        self.out = torch.nn.Linear(heads * dim, heads * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, self.dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = (q / self.dim ** 0.5) @ k.transpose(-1, -2)
        merged = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, -1)
        return self.out(merged)


# head dims of whole 4-float vectors (fused into one attention kernel), of 2-float
# ones and of single floats
@pytest.mark.parametrize("heads,dim,seq", [(4, 64, 40), (3, 6, 33), (2, 5, 17)])
def test_attention_heads_split_in_the_matmuls_fetch_match_torch(heads, dim, seq):
    torch.manual_seed(0)
    model = HeadAttention(heads, dim).eval()
    x = torch.randn(2, seq, heads * dim)
    compiled = tecc.compile(model, (x,), target=f"cuda:{ARCH}")
    kernels = [k["name"] for k in compiled.plan["kernels"]]
    # no kernel of layout ops alone: qkv, the fused attention (where its GPU template
    # takes the shape: rows and head size in whole blocks of 8), output; else qkv,
    # scores, softmax, P V, output
    if seq % 8 == 0 and dim % 8 == 0:
        assert len(kernels) == 3 and "attention" in kernels[1], kernels
    else:
        assert len(kernels) == 5 and all("dense" in k or "matmul" in k or "softmax" in k
                                          for k in kernels), kernels
    if GPU:
        with torch.no_grad():
            expected = model(x)
        assert_close(compiled(x.cuda()).cpu(), expected, rtol=1e-4, atol=1e-5)


def test_winograd_convs_build_for_cuda_and_match_torch():
    """A 3x3 conv of 64 channels and more runs as Winograd's F(4x4, 3x3) on the GPU:
    three kernels (input transform, GEMM, output transform with the epilogue: bias,
    relu, the residual add); 14 x 14 planes end in partial tiles."""
    torch.manual_seed(0)
    model = BasicBlock(64, 64).eval()
    randomize_batchnorm(model)
    x = torch.randn(2, 64, 14, 14)
    compiled = tecc.compile(model, (x,), target=f"cuda:{ARCH}")
    names = [k["name"] for k in compiled.plan["kernels"]]
    assert sum("winograd_input" in n for n in names) == 2, names
    assert any("winograd_output" in n and "add_relu" in n for n in names), names
    direct = tecc.compile(model, (x,), target=f"cuda:{ARCH}", winograd=False)
    assert not any("winograd" in k["name"] for k in direct.plan["kernels"])
    if GPU:
        with torch.no_grad():
            expected = model(x)
        for built in (compiled, direct):
            assert_close(to_cpu(built(x.cuda())), expected, rtol=1e-4, atol=1e-4)


def test_nan_and_inf_go_through_exp_tanh_erf_and_softmax_on_the_gpu():
    """CUDA's max and min return the other operand of a NaN: the fast polynomials'
    clamps and the softmax's row maximum must not turn NaN into numbers."""
    from tests.test_semantics import Transcendental, transcendental_input

    x = transcendental_input()
    compiled = tecc.compile(Transcendental(), (x,), target=f"cuda:{ARCH}")
    if GPU:
        with torch.no_grad():
            expected = Transcendental().cuda()(x.cuda())
        for i, (g, e) in enumerate(zip(compiled(x.cuda()), expected, strict=True)):
            g, e = g.cpu(), e.cpu()
            if i == 4:  # gelu at inf: see tests/test_semantics.py
                g, e = g[x != float("inf")], e[x != float("inf")]
            torch.testing.assert_close(g, e, equal_nan=True, msg=f"output {i}")


def test_package_records_the_arch_and_runs_only_on_it(tmp_path):
    module, inputs = build_case("linear", CASES["linear"][2])
    compiled = tecc.compile(module, inputs, target=f"cuda:{ARCH}")
    compiled.export(tmp_path / "pkg")
    manifest = (tmp_path / "pkg" / "manifest.json").read_text()
    assert f'"arch": "{ARCH}"' in manifest
    if not GPU:
        with pytest.raises(runtime.PackageError, match="no CUDA device"):
            tecc.load(tmp_path / "pkg")
        return
    package = tecc.load(tmp_path / "pkg")
    expected = module(*inputs).detach().numpy()
    np.testing.assert_allclose(package(inputs[0].numpy()), expected, rtol=1e-4, atol=1e-5)
    other = tecc.compile(module, inputs, target="cuda:sm_80" if ARCH != "sm_80" else "cuda:sm_86")
    other.export(tmp_path / "other")
    with pytest.raises(runtime.PackageError, match="built for"):
        tecc.load(tmp_path / "other")


def test_every_kernel_is_bound_and_unbound_ones_are_refused():
    import tvm
    from tvm import te

    target = resolve_target("cuda")
    a = te.placeholder((64, 32), name="a")
    k = te.reduce_axis((0, 32), name="k")
    b = te.compute((64,), lambda i: te.sum(a[i, k], axis=k), name="b")
    naive = te.create_prim_func([a, b]).with_attr("global_symbol", "naive")
    with pytest.raises(UnboundKernelError, match="not bound"):
        check_bound(naive, "naive")
    with pytest.raises(UnboundKernelError):
        compile_cuda(tvm.IRModule({"naive": naive}), target)

    from tecc.schedules.gpu_default import gpu_schedule
    from tvm.s_tir.schedule import Schedule

    scheduled = gpu_schedule(Schedule(tvm.IRModule({"main": naive})), target).mod["main"]
    check_bound(scheduled)
    assert any(t.startswith("threadIdx.") for t in launch_extents(scheduled))


def test_a_kernel_binding_one_thread_axis_at_two_extents_is_refused():
    """A reduction over 32 lanes and a store over 25 in one kernel: TVM launches one
    extent and leaves part of the loops without threads (a wrong sum, no error)."""
    import tvm
    from tvm import te
    from tvm.s_tir.schedule import Schedule

    a = te.placeholder((8, 32), name="a")
    k = te.reduce_axis((0, 32), name="k")
    total = te.compute((8,), lambda i: te.sum(a[i, k], axis=k), name="total")
    b = te.compute((8, 25), lambda i, j: a[i, j] - total[i], name="b")
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([a, b])}))
    out = sch.get_sblock("b")
    i, j = sch.get_loops(out)
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    red = sch.get_sblock("total")
    sch.compute_at(red, i)
    sch.bind(sch.get_loops(red)[-1], "threadIdx.x")
    with pytest.raises(UnboundKernelError, match=r"threadIdx.x: \[25, 32\]"):
        check_bound(sch.mod["main"], "uneven")


def test_nvcc_missing_is_a_clear_error(monkeypatch, tmp_path):
    import tecc.cuda_toolchain as toolchain

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(toolchain, "DEFAULT_CUDA_ROOTS", (str(tmp_path),))
    with pytest.raises(CudaToolchainError, match="needs nvcc"):
        find_nvcc()


def test_stub_driver_defines_the_symbols_tvm_imports(tmp_path):
    import ctypes

    stub = build_stub_driver(tmp_path)
    lib = ctypes.CDLL(str(stub))
    for name in ("cuModuleLoadData", "cuLaunchKernelEx", "cuTensorMapEncodeTiled"):
        assert getattr(lib, name)() == 100  # CUDA_ERROR_NO_DEVICE


def test_cuda_graphs_follow_the_input_addresses():
    """Inputs are read in place: one graph per set of input addresses, then copies into
    the plan's own buffers once MAX_GRAPHS are captured; every call must see its own
    input. Without a GPU, calling the model says that it needs one."""
    module, inputs = build_case("conv2d", CASES["conv2d"][2])
    compiled = tecc.compile(module, inputs, target=f"cuda:{ARCH}")
    if not GPU:
        with pytest.raises(runtime_cuda.CudaError, match="no CUDA device"):
            compiled(*inputs)
        return
    fresh = [torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(s))
             for s in range(runtime.CudaExecutor.MAX_GRAPHS + 3)]
    alive = [x.cuda() for x in fresh]  # all alive: distinct addresses
    for _ in range(2):
        for x, gx in zip(fresh, alive, strict=True):
            with torch.no_grad():
                assert_close(compiled(gx).cpu(), module(x), rtol=1e-4, atol=1e-5)
    assert len(compiled._executor._graphs) == runtime.CudaExecutor.MAX_GRAPHS + 1


_RUNTIME_ONLY = r"""
import sys

class NoTorch:  # a deployment host without torch
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch' (blocked by the test)")

sys.meta_path.insert(0, NoTorch())
import numpy as np
import tecc

try:
    package = tecc.load(sys.argv[1])
except tecc.runtime.PackageError as err:
    print("REFUSED", err)
    sys.exit(0)
np.save(sys.argv[4], package(np.load(sys.argv[2]), np.load(sys.argv[3])))
maps = open("/proc/self/maps").read()
assert "libtvm_compiler" not in maps, "the TVM compiler library was loaded"
print("RAN")
"""


def test_cuda_package_runs_with_the_runtime_alone(tmp_path):
    """TVM_USE_RUNTIME_LIB=1, no torch: the package runs on a GPU of its arch; without
    a GPU it is refused with PackageError before any kernel runs."""
    import os
    import subprocess
    import sys

    module, inputs = build_case("mm", CASES["mm"][2])
    compiled = tecc.compile(module, inputs, target=f"cuda:{ARCH}")
    compiled.export(tmp_path / "pkg.tar")
    a, b = (x.numpy() for x in inputs)
    np.save(tmp_path / "a.npy", a)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "TVM_USE_RUNTIME_LIB": "1"}
    np.save(tmp_path / "b.npy", b)
    proc = subprocess.run([sys.executable, "-c", _RUNTIME_ONLY, str(tmp_path / "pkg.tar"),
                           str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                           str(tmp_path / "out.npy")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if not GPU:
        assert "REFUSED" in proc.stdout and "no CUDA device" in proc.stdout, proc.stdout
        return
    assert "RAN" in proc.stdout, proc.stdout + proc.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), a @ b, rtol=1e-4, atol=1e-5)


def test_cuda_wheel_runs_in_a_venv_without_torch_or_tecc(tmp_path):
    """The Python deployment package of a cuda model carries TVM's CUDA runtime and a
    cubin for its arch; installed offline into a venv that has numpy and apache-tvm-ffi
    only, it runs on a GPU of that arch and matches torch; without a GPU, load() refuses
    it with PackageError before any kernel runs."""
    import zipfile

    from tecc.deploy import run_in_venv, runtime_venv

    model = MLP().eval()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    compiled = tecc.compile(model, (x,), target=f"cuda:{ARCH}")
    wheel = compiled.export_python_package(tmp_path / "dist", "mlp_cuda", "1.0")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        lib = zf.read("mlp_cuda/model/lib.so")
    assert {"mlp_cuda/_runtime/libtvm_runtime.so", "mlp_cuda/_runtime/libtvm_runtime_cuda.so",
            "mlp_cuda/_runtime/cuda.py", "mlp_cuda/_runtime/LICENSE.tvm"} <= names
    assert ("elf", int(ARCH[3:])) in embedded_cuda_archs(lib), embedded_cuda_archs(lib)
    python, _ = runtime_venv(tmp_path / "venv", wheel, offline=True)
    np.savez(tmp_path / "x.npz", x=x.numpy())
    if not GPU:
        with pytest.raises(RuntimeError, match="PackageError.*no CUDA device"):
            run_in_venv(python, "mlp_cuda", tmp_path / "x.npz", tmp_path / "y.npz", repeat=0)
        return
    result = run_in_venv(python, "mlp_cuda", tmp_path / "x.npz", tmp_path / "y.npz", repeat=20)
    assert result["importable"] == [] and result["imported"] == [], result
    assert result["info"]["target"]["arch"] == ARCH, result["info"]
    with np.load(tmp_path / "y.npz") as data, torch.no_grad():
        np.testing.assert_allclose(data["arr_0"], model(x).numpy(), rtol=TOLERANCE["mlp"],
                                   atol=1e-5)
    print(f"cuda wheel: import + first call {result['import_and_first_call_s']:.2f} s, "
          f"{result['median_ms']:.3f} ms per call")


# (rule, tile, micro_k, pipeline) on shapes that do and do not divide the tiles
_MATMUL_CONFIGS = [("simt", "16,16,2,2,4,4", 16, "none"), ("simt", "16,16,1,2,4,4", 8, "double"),
                   ("simt", "8,8,1,1,2,2", 64, "double"), ("simt", "8,16,1,1,4,4", 32, "none"),
                   ("simt", "16,16,1,1,1,1", 64, "double"),
                   ("simt", "8,16,2,2,4,4", 16, "double"),  # 64 accumulators, 128 threads
                   # three virtual threads along N: 128 x 96 and 64 x 192 (WAVE_TILES)
                   ("simt", "16,8,2,3,4,4", 16, "double"), ("simt", "8,16,2,3,4,4", 8, "none"),
                   ("tiled", "16,16,1,1,4,4", 16, "none")]


@pytest.mark.parametrize("shape", [(256, 384, 512), (197, 130, 72)])
@pytest.mark.parametrize("rule,tile,micro_k,pipeline", _MATMUL_CONFIGS)
def test_matmul_template_configs_build_and_match_torch(rule, tile, micro_k, pipeline, shape):
    import tvm

    m, n, k = shape
    gen = torch.Generator().manual_seed(m)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    config = {"rule": rule, "tile": tile, "micro_k": micro_k, "vector": 4, "unroll": 256,
              "pipeline": pipeline}
    prim, applied, info = lowered_matmul(a, b, f"cuda:{ARCH}", config)
    assert [(t.source, t.error) for t in applied] == [("given", None)]
    check_bound(prim, "mm")
    lib = compile_cuda(tvm.IRModule({"mm": prim}), info.tvm_target)
    if GPU:
        dev = tvm.cuda(0)
        out = tvm.runtime.empty((m, n), "float32", dev)
        lib["mm"](tvm.runtime.tensor(a.numpy(), dev), tvm.runtime.tensor(b.numpy(), dev), out)
        assert_close(torch.from_numpy(out.numpy()), a @ b, rtol=1e-4, atol=1e-4)


def test_double_buffered_k_loop_loads_ahead_of_the_fmas():
    """pipeline "double": inside the k loop, the next tile's global loads go to
    registers before this tile's FMAs and reach shared memory after them; the k step
    is unrolled (no inner loop) and no staging array is left in local memory."""
    import re

    import tvm

    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(256, 128, generator=gen), torch.randn(128, 256, generator=gen)
    config = {"rule": "simt", "tile": "16,16,1,1,4,4", "micro_k": 16, "vector": 4,
              "unroll": 256, "pipeline": "double"}
    prim, _, info = lowered_matmul(a, b, f"cuda:{ARCH}", config)
    lib = compile_cuda(tvm.IRModule({"mm": prim}), info.tvm_target)
    source = lib.mod.imports[0].inspect_source()
    body = source[source.index("for (int ax3_0"):]
    body = body[:body.index("matmul_ptr[")]  # the k loop and the last step's FMAs
    first_load = re.search(r"= \*\(float4\*\)\(p\d_p\d_ptr", body).start()
    first_fma = re.search(r"local_ptr\[\d+\] = \(", body).start()
    last_shared_store = max(m.start() for m in re.finditer(
        r"_shared_ptr\[[^\]]+\] = |\(float4\*\)\(p\d_p\d_reindex_shared_ptr [^=]*\) = ", body))
    assert first_load < first_fma < last_shared_store
    assert "for (" not in body[body.index("{") + 1:], "the k step is not unrolled"
    if GPU:
        dev = tvm.cuda(0)
        out = tvm.runtime.empty((256, 256), "float32", dev)
        lib["mm"](tvm.runtime.tensor(a.numpy(), dev), tvm.runtime.tensor(b.numpy(), dev), out)
        assert_close(torch.from_numpy(out.numpy()), a @ b, rtol=1e-4, atol=1e-4)


class _ConvResidual(torch.nn.Module):
    """ResNet-18's last 3x3 conv at batch 16 (784 x 512 x 4608 as a GEMM), with its
    bias, residual add and relu."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(512, 512, 3, padding=1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + residual)


def _split_k_cases():
    gen = torch.Generator().manual_seed(3)
    conv = (_ConvResidual().eval(), (torch.randn(16, 512, 7, 7, generator=gen),
                                     torch.randn(16, 512, 7, 7, generator=gen)))
    dense = (torch.nn.Sequential(torch.nn.Linear(4608, 512), torch.nn.GELU()).eval(),
             (torch.randn(784, 4608, generator=gen),))
    # BERT-base's FFN output at batch 1: 24 blocks of 64 x 64, 32 x 64 in 8 slices
    ffn_out = (torch.nn.Linear(3072, 768).eval(), (torch.randn(1, 128, 3072, generator=gen),))
    return {"conv": (conv, 4), "dense": (dense, 4), "ffn_out": (ffn_out, 8)}


@pytest.mark.parametrize("name", ["conv", "dense", "ffn_out"])
def test_a_grid_too_small_for_the_gpu_splits_k_and_matches_torch(name):
    """104 blocks of 64 x 64 (24 for ffn_out) on the H200's 132 multiprocessors: the
    fallback splits k (partial sums, then their sum with the epilogue in a second
    kernel). The conv is kept direct: this is the direct conv's split."""
    (module, inputs), slices = _split_k_cases()[name]
    compiled = tecc.compile(module, inputs, target=f"cuda:{ARCH}", winograd=False)
    (task,) = compiled.tasks()
    assert task["source"] == "fallback" and task["config"]["split_k"] == slices, task
    if GPU:
        with torch.no_grad():
            expected = module(*inputs)
        got = to_cpu(compiled(*_on_gpu(inputs)))
        assert max_rel_error(got, expected) < 1e-4, max_rel_error(got, expected)


def test_the_fallback_splits_k_for_small_grids_and_for_larger_tiles_on_long_k():
    """split_k_tile on the H200's 132 multiprocessors, shapes measured there
    (benchmarks/results/gpu_gemm_configs.md)."""
    sms = 132
    # no 64 x 64 grid fills the GPU: the fewest slices, else 32 x 64 tiles
    assert split_k_tile(1, 784, 512, 4608, sms) == ((16, 16, 1, 1, 4, 4), 4)
    assert split_k_tile(1, 128, 768, 3072, sms) == ((8, 16, 1, 1, 4, 4), 8)
    assert split_k_tile(1, 128, 3072, 768, sms) == ((8, 16, 1, 1, 4, 4), 2)
    # 64 x 64 fills it: 128 x 128 in slices of 768 (BERT-base's FFN output at batch 16)
    assert split_k_tile(1, 2048, 768, 3072, sms) == ((16, 16, 2, 2, 4, 4), 4)
    # slices shorter than 768, or a grid of the largest tile that fills the GPU: whole
    for m, n, k in ((2048, 768, 768), (1024, 1024, 1024), (2048, 3072, 768),
                    (4096, 4096, 4096), (49, 512, 4608)):
        assert split_k_tile(1, m, n, k, sms) is None, (m, n, k)


class _ConvEpilogue(torch.nn.Module):
    """A conv with its bias, a residual add and relu (the residual where the shapes
    allow)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + residual)


# (cin, cout, kernel, stride, batch, size; the direct rule's config): taps inside the
# step (one patch with its halo) or outside it, a stride-2 conv, a batch of 2, a 1x1
# conv whose weights load in vectors, virtual threads and per-thread tiles on each axis
_DIRECT_CASES = {
    "3x3_halo_batch2": ((16, 32, 3, 1, 2, 14), {
        "tile_oc": [2, 1, 8, 2], "tile_y": [1, 1, 7, 2], "tile_x": [1, 2, 7, 1],
        "tile_rc": [4, 4], "tile_ry": [1, 3], "tile_rx": [1, 3], "vector": 4}),
    "3x3_taps_outside": ((24, 32, 3, 1, 1, 12), {
        "tile_oc": [1, 2, 8, 2], "tile_y": [3, 2, 2, 1], "tile_x": [1, 1, 4, 3],
        "tile_rc": [3, 8], "tile_ry": [3, 1], "tile_rx": [3, 1], "vector": 1}),
    "3x3_stride2": ((8, 16, 3, 2, 1, 15), {
        "tile_oc": [1, 2, 8, 1], "tile_y": [2, 1, 4, 1], "tile_x": [1, 1, 8, 1],
        "tile_rc": [2, 4], "tile_ry": [1, 3], "tile_rx": [3, 1], "vector": 2}),
    "1x1_vector_weights": ((32, 64, 1, 1, 1, 8), {
        "tile_oc": [2, 1, 8, 4], "tile_y": [1, 1, 1, 8], "tile_x": [1, 1, 8, 1],
        "tile_rc": [1, 32], "tile_ry": [1, 1], "tile_rx": [1, 1], "vector": 4}),
}


@pytest.mark.parametrize("name", sorted(_DIRECT_CASES))
def test_direct_conv_configs_build_and_match_torch(name):
    """The conv template's direct rule (schedules/gpu_conv.py) with its epilogue: every
    kernel bound, the input patch and weights staged in shared memory, and on a GPU the
    result of torch."""
    import re

    import tvm

    (cin, cout, k, stride, batch, size), knobs = _DIRECT_CASES[name]
    gen = torch.Generator().manual_seed(cin + size)
    module = _ConvEpilogue(cin, cout, k, stride).eval()
    x = torch.randn(batch, cin, size, size, generator=gen)
    out_size = (size + 2 * (k // 2) - k) // stride + 1
    residual = torch.randn(batch, cout, out_size, out_size, generator=gen)
    config = {"rule": "direct", "unroll": 256, **knobs}
    prim, applied, info = lowered_group(module, (x, residual), f"cuda:{ARCH}", config,
                                        winograd=False)
    assert [(t.template, t.source, t.error) for t in applied] == [("conv2d", "given", None)]
    check_bound(prim, "main")
    lib = compile_cuda(tvm.IRModule({"main": prim}), info.tvm_target)
    source = lib.mod.imports[0].inspect_source()
    # two tiles in shared memory: the input patch and the weights
    assert len(re.findall(r"__shared__ .*float \w+\[", source)) == 2, source[:3000]
    if GPU:
        dev = tvm.cuda(0)
        with torch.no_grad():
            expected = module(x, residual)
        # the group's parameters by shape (each case's four differ)
        by_shape = {tuple(t.shape): t.detach() for t in (
            x, residual, module.conv.weight, module.conv.bias.reshape(1, cout, 1, 1),
            module.conv.bias)}
        shapes = [tuple(int(d) for d in p.shape) for p in prim.params]
        args = [tvm.runtime.tensor(by_shape[s].contiguous().numpy(), dev)
                for s in shapes[:-1]]
        out = tvm.runtime.empty(shapes[-1], "float32", dev)
        lib["main"](*args, out)
        assert_close(torch.from_numpy(out.numpy()), expected, rtol=1e-4, atol=1e-4)
