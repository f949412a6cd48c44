"""compile(..., fallback="torch"): a model with ops tecc cannot import is split into
regions tecc compiles and ops torch runs between them; results match eager, the model
says which ops run in torch, refuses to be exported, and the torch.compile backend and
tuning use the regions."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from tecc.frontend.importer import UnsupportedOperatorError
from tecc.runtime import cuda as runtime_cuda
from tecc.schedules.tasks import workload_json

import tecc
import tecc.backend
from tecc.partition import PartitionedModel, TorchFallbackError
from tests.util import assert_close


class OneUnsupported(torch.nn.Module):
    """cumprod (no converter) between two compiled regions."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x))
        z = torch.cumprod(y, dim=1)
        return torch.tanh(self.b(z * y))


class SeveralUnsupported(torch.nn.Module):
    """Convs around cumprod and sort: the first region hands two tensors to torch, the
    last takes two from it (and one of the first's), and the model has three outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = torch.relu(self.conv1(x))
        s = torch.sigmoid(y) * 2.0
        ranked = torch.sort(y, dim=3).values  # torch
        summed = torch.cumprod(s, dim=2)  # torch
        z = torch.relu(self.conv2(ranked + summed)) + s
        logits = self.head(z.flatten(1))
        return {"logits": logits, "ranked": ranked, "scores": torch.cumprod(logits, 1)}


def _fresh(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _compile_quietly(model, inputs, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tecc.compile(model, inputs, fallback="torch", **options)


@pytest.fixture(scope="module")
def one() -> tuple[torch.nn.Module, PartitionedModel]:
    torch.manual_seed(0)
    model = OneUnsupported().eval()
    return model, _compile_quietly(model, (_fresh(4, 16, seed=1),))


@pytest.fixture(scope="module")
def several() -> tuple[torch.nn.Module, PartitionedModel]:
    torch.manual_seed(1)
    model = SeveralUnsupported().eval()
    return model, _compile_quietly(model, (_fresh(2, 3, 8, 8, seed=2),))


def test_one_unsupported_op_runs_in_torch_between_two_regions(one):
    model, compiled = one
    assert isinstance(compiled, PartitionedModel)
    assert compiled.torch_ops == {"aten.cumprod.default": 1}
    assert compiled.unsupported_ops == {"aten.cumprod.default": 1}
    assert len(compiled.regions) == 2
    for seed in (3, 4):
        x = _fresh(4, 16, seed=seed)
        with torch.no_grad():
            assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_several_unsupported_ops_multiple_outputs_and_wide_boundaries(several):
    model, compiled = several
    assert compiled.torch_ops == {"aten.cumprod.default": 2, "aten.sort.default": 1}
    calls = [n for n in compiled.glue.graph.nodes if n.op == "call_module"]
    assert len(calls) == len(compiled.regions) == 2
    first, last = calls
    assert len(first.users) >= 2  # a region output of several tensors
    assert len(last.args) >= 3  # and one taking several, from torch and from a region
    x = _fresh(2, 3, 8, 8, seed=5)
    with torch.no_grad():
        expected = model(x)
    got = compiled(x)
    assert isinstance(got, dict) and list(got) == ["logits", "ranked", "scores"]
    for key in expected:
        assert_close(got[key], expected[key], rtol=1e-4, atol=1e-4)
    # numpy in, numpy out
    flat = compiled(x.numpy())
    assert isinstance(flat["logits"], np.ndarray)
    assert_close(flat["logits"], expected["logits"].numpy(), rtol=1e-4, atol=1e-4)


def test_a_small_region_stays_in_torch():
    class LoneOps(torch.nn.Module):
        def forward(self, x):
            y = torch.cumprod(x, 1)
            y = torch.relu(y).reshape(4, 3, 4)  # a lone op and a view: not worth a call
            return torch.sort(y, dim=2).values

    x = _fresh(4, 12, seed=6)
    compiled = _compile_quietly(LoneOps(), (x,))
    assert compiled.regions == []
    assert "aten.relu.default" in compiled.torch_ops
    assert_close(compiled(x), LoneOps()(x), rtol=1e-6, atol=1e-6)


def test_a_scalar_torch_computes_keeps_its_consumer_in_torch():
    class ItemScale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = torch.relu(self.a(x))
            return torch.tanh(y * y.sum().item()) * 2 + 1  # a Python float per call

    torch.manual_seed(4)
    model = ItemScale().eval()
    compiled = _compile_quietly(model, (_fresh(2, 8, seed=19),))
    assert compiled.torch_ops == {"aten._local_scalar_dense.default": 1, "aten.mul.Tensor": 1}
    for seed in (20, 21):
        x = _fresh(2, 8, seed=seed)
        with torch.no_grad():
            assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_shape_that_depends_on_the_data_runs_in_torch():
    """A boolean mask's selection has a length known only at run time: the mask and
    what reads the selection run in torch, the layers before it are compiled."""
    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 16)

        def forward(self, x):
            y = torch.tanh(self.a(x)) * 2.0
            return y[y > 0.5].sum() + y.mean(), y

    torch.manual_seed(5)
    model = Masked().eval()
    compiled = _compile_quietly(model, (_fresh(4, 8, seed=22),))
    assert isinstance(compiled, PartitionedModel) and compiled.regions
    assert "aten.index.Tensor" in compiled.torch_ops, compiled.torch_ops
    for seed in (23, 24):  # other inputs select other counts
        x = _fresh(4, 8, seed=seed)
        with torch.no_grad():
            assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(tecc.frontend.importer.ImportError_, match='fallback="torch"'):
        tecc.compile(model, (_fresh(4, 8, seed=22),))


def test_the_first_call_warns_once_naming_the_ops(one):
    model, _ = one
    compiled = _compile_quietly(model, (_fresh(4, 16, seed=7),))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(_fresh(4, 16, seed=8))
        compiled(_fresh(4, 16, seed=9))
    messages = [str(w.message) for w in caught if "run in torch" in str(w.message)]
    assert len(messages) == 1 and "aten.cumprod.default x1" in messages[0], messages


def test_summary_shows_the_torch_ops(several):
    _, compiled = several
    summary = compiled.summary()
    assert summary.torch_ops == compiled.torch_ops and summary.regions == 2
    text = str(summary)
    assert "runs in torch" in text and "aten.sort.default x1" in text
    assert any(k.name.startswith("region_") for k in summary.kernels)
    assert summary.memory["planned_bytes"] > 0


def test_strict_is_the_default_and_lists_every_unsupported_op():
    with pytest.raises(UnsupportedOperatorError) as caught:
        tecc.compile(SeveralUnsupported().eval(), (_fresh(2, 3, 8, 8, seed=10),))
    message = str(caught.value)
    assert set(caught.value.unsupported) == {"aten.cumprod.default", "aten.sort.default"}
    assert "aten.cumprod.default: 2 use(s)" in message and "test_partition.py" in message
    assert 'fallback="torch"' in message


def test_a_model_tecc_imports_whole_is_compiled_as_with_strict(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = _fresh(2, 8, seed=11)
    compiled = tecc.compile(model, (x,), fallback="torch")
    assert isinstance(compiled, tecc.CompiledModel) and compiled.torch_ops == {}
    compiled.export(tmp_path / "model.tar")
    assert_close(tecc.load(tmp_path / "model.tar")(x.numpy()), model(x).detach().numpy(),
                 rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="fallback"):
        tecc.compile(model, (x,), fallback="eager")


def test_export_is_refused(one, tmp_path):
    _, compiled = one
    with pytest.raises(TorchFallbackError, match=r"aten\.cumprod\.default.*fallback=\"strict\""):
        compiled.export(tmp_path / "model.tar")
    with pytest.raises(TorchFallbackError, match="deployment wheel"):
        compiled.export_python_package(tmp_path, "partitioned")
    assert not list(tmp_path.iterdir())


def test_a_region_tecc_fails_to_compile_runs_in_torch(monkeypatch):
    import tecc.api

    real = tecc.api.compile_strict

    def refuse_convs(model, *args, **kwargs):
        if any(n.target == torch.ops.aten.convolution.default
               for n in model.gm.graph.nodes):
            raise NotImplementedError("no conv today")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(tecc.api, "compile_strict", refuse_convs)
    torch.manual_seed(2)
    model = SeveralUnsupported().eval()
    compiled = _compile_quietly(model, (_fresh(2, 3, 8, 8, seed=12),))
    assert len(compiled.regions) == 0 and len(compiled.failed) == 2
    assert compiled.torch_ops["aten.convolution.default"] == 2
    assert "no conv today" in compiled.fallback_message()
    x = _fresh(2, 3, 8, 8, seed=13)
    with torch.no_grad():
        assert_close(compiled(x)["scores"], model(x)["scores"], rtol=1e-5, atol=1e-5)


def test_a_cuda_model_builds_its_regions_for_the_gpu(one):
    model, _ = one
    arch = runtime_cuda.device_arch(0) if torch.cuda.is_available() else "sm_90"
    compiled = _compile_quietly(model, (_fresh(4, 16, seed=17),), target=f"cuda:{arch}")
    assert len(compiled.regions) == 2 and compiled.device.type == "cuda"
    assert all(r.target_info.is_gpu for r in compiled.regions)
    x = _fresh(4, 16, seed=18)
    if not torch.cuda.is_available():
        with pytest.raises(runtime_cuda.CudaError, match="torch sees none"):
            compiled(x)
        return
    got = compiled(x.cuda())  # the regions read torch's GPU tensors in place
    assert got.is_cuda
    with torch.no_grad():
        assert_close(got.cpu(), model(x), rtol=1e-4, atol=1e-5)


def test_the_backend_compiles_a_graph_with_unsupported_ops_in_regions(monkeypatch):
    seen: list = []
    original = tecc.backend.tecc_backend

    def spy(gm, example_inputs, options=None):
        result = original(gm, example_inputs, options)
        seen.append(getattr(result, "compiled", "torch"))
        return result

    monkeypatch.setattr(tecc.backend, "tecc_backend", spy)
    torch._dynamo.reset()
    torch.manual_seed(3)
    model = OneUnsupported().eval()
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            compiled = torch.compile(model, backend=tecc.backend.tecc_backend)
            for seed in (14, 15):
                x = _fresh(4, 16, seed=seed)
                assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    finally:
        torch._dynamo.reset()
    assert seen == ["partitioned"]
    assert any("aten.cumprod.default" in str(w.message) for w in caught)


def test_tuning_tunes_the_regions_tasks(tmp_path, one, monkeypatch):
    import tecc.autotune.tune

    model, compiled = one
    x = _fresh(4, 16, seed=16)
    with pytest.raises(UnsupportedOperatorError, match="fallback"):
        tecc.tune(model, (x,), records=tmp_path / "strict.jsonl", trials=1, progress=False)
    handed: list = []  # what the tuner gets: the measuring itself is test_tune's

    def spy_tune_tasks(tasks, weights, records, trials, **options):
        handed.append((tasks, weights))
        return []

    monkeypatch.setattr(tecc.autotune.tune, "tune_tasks", spy_tune_tasks)
    tecc.tune(model, (x,), records=tmp_path / "partitioned.jsonl", trials=8,
              progress=False, fallback="torch")
    [(tasks, weights)] = handed
    keys = [workload_json(t.workload) for t in tasks]
    # the workloads of both regions (two dense layers, the product), named apart
    assert sorted(keys) == sorted(t["workload_key"] for t in compiled.tasks())
    assert len(keys) == 3 and weights == [1, 1, 1] and len({t.name for t in tasks}) == 3
