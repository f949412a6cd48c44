"""tecc as a torch.compile backend: registered by name, each Dynamo graph compiled by
tecc with its weights frozen in, graph breaks and new shapes handled by Dynamo, and a
graph tecc cannot compile run in torch with a warning; results match eager."""

from __future__ import annotations

import warnings

import pytest
import torch

import tecc.backend
from tests.models import MLP, resnet18


def _spy(monkeypatch) -> list[str]:
    """What the backend returned for each graph: "tecc" or "torch"."""
    seen: list[str] = []
    original = tecc.backend.tecc_backend

    def spy(gm, example_inputs, options=None):
        result = original(gm, example_inputs, options)
        seen.append("tecc" if hasattr(result, "compiled") else "torch")
        return result

    monkeypatch.setattr(tecc.backend, "tecc_backend", spy)
    return seen


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_backend_is_registered_by_name():
    assert "tecc" in torch._dynamo.list_backends()
    model = MLP().eval()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = torch.compile(model, backend="tecc")(x)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)


def test_graphs_compile_with_tecc_and_match_eager_across_shapes(monkeypatch):
    seen = _spy(monkeypatch)
    model = resnet18(num_classes=10).eval()
    compiled = torch.compile(model, backend=tecc.backend.tecc_backend,
                             options={"target": "llvm"})
    gen = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        # the second batch size makes Dynamo's graph dynamic: tecc builds it per size
        for batch in (1, 2, 2, 1):
            x = torch.randn(batch, 3, 64, 64, generator=gen)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert seen and set(seen) == {"tecc"}
    assert not [w for w in caught if "runs in torch" in str(w.message)]


class Breaks(torch.nn.Module):
    """Two graphs: a data-dependent branch breaks the first."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = torch.relu(self.a(x))
        if y.sum().item() > 0:  # a graph break
            y = y * 2
        return self.b(y)


def test_graph_breaks_give_several_tecc_graphs(monkeypatch):
    seen = _spy(monkeypatch)
    model = Breaks().eval()
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = torch.compile(model, backend=tecc.backend.tecc_backend)(x)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
    assert seen.count("tecc") >= 2


class BrokenBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        x = torch.relu(self.fc(x))
        torch._dynamo.graph_break()
        return torch.tanh(self.fc(x))


class RepeatedBlocks(torch.nn.Module):
    """Three blocks of one code and shapes: Dynamo hands over one graph per half-block
    and runs it with each block's weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.blocks = torch.nn.ModuleList(BrokenBlock() for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_one_graph_run_with_each_blocks_weights_uses_them(monkeypatch):
    seen = _spy(monkeypatch)
    model = RepeatedBlocks().eval()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        compiled = torch.compile(model, backend=tecc.backend.tecc_backend)
        for _ in range(2):  # the second call reuses each weight set's build
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    # fewer graphs than blocks: the check above is of a graph run with others' weights
    assert 1 <= seen.count("tecc") < 3


class Sorted(torch.nn.Module):
    def forward(self, x):
        return torch.sort(torch.relu(x), dim=1).values * 2


def test_a_graph_tecc_cannot_compile_runs_in_torch(monkeypatch):
    seen = _spy(monkeypatch)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = torch.compile(Sorted(), backend=tecc.backend.tecc_backend)(x)
    torch.testing.assert_close(got, Sorted()(x))
    assert seen == ["torch"]
    assert any("runs in torch" in str(w.message) and "aten.sort" in str(w.message)
               for w in caught), [str(w.message) for w in caught]


def test_unknown_options_are_refused():
    with pytest.raises(Exception, match="unknown option"):
        with torch.no_grad():
            torch.compile(MLP().eval(), backend="tecc", options={"tile": 4})(torch.randn(1, 64))


def _spin_state(first: str, env: dict[str, str]) -> list[str]:
    """GOMP_SPINCOUNT and tecc.OPENMP_SPINS_LONG in a fresh process that imports `first`
    (tecc or torch) and then the other, with `env` for the OpenMP variables."""
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    other = "torch" if first == "tecc" else "tecc"
    code = (f"import os, {first}, {other}; "
            "print(os.environ.get('GOMP_SPINCOUNT'), tecc.OPENMP_SPINS_LONG)")
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def test_torchs_openmp_spin_is_shortened_only_where_it_can_be_and_the_user_chose_none():
    import tecc

    assert _spin_state("tecc", {}) == [tecc.OPENMP_SPIN_COUNT, "False"]
    # libgomp has read it already: set for the processes this one starts, and told
    assert _spin_state("torch", {}) == [tecc.OPENMP_SPIN_COUNT, "True"]
    assert _spin_state("tecc", {"GOMP_SPINCOUNT": "77"}) == ["77", "False"]
    assert _spin_state("tecc", {"OMP_WAIT_POLICY": "PASSIVE"}) == ["None", "False"]


def test_a_long_openmp_spin_is_named_where_torch_runs_between_cpu_graphs(monkeypatch):
    import tecc

    monkeypatch.setattr(tecc, "OPENMP_SPINS_LONG", True)
    monkeypatch.setattr(tecc.backend, "_cpu_graphs", 0)
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            torch.compile(Breaks().eval(), backend=tecc.backend.tecc_backend)(x)
    spin = [str(w.message) for w in caught if "GOMP_SPINCOUNT" in str(w.message)]
    assert len(spin) == 1 and "import tecc before torch" in spin[0], spin
    monkeypatch.setattr(tecc, "OPENMP_SPINS_LONG", False)
    assert tecc.partition.openmp_spin_hint() == ""
