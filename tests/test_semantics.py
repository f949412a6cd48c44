"""Eager's semantics where tecc's kernels would differ: NaN goes through max/min-based
ops as in torch, an input indexing a table out of range raises IndexError, and shapes
or dtypes tecc does not compile (dynamic dimensions, data-dependent shapes, bfloat16)
get tecc's own error naming what to do."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tecc.frontend.importer import ImportError_

import tecc

NAN, INF = float("nan"), float("inf")


class MaxMin(torch.nn.Module):
    def forward(self, x, y):
        return (torch.relu(x), F.relu6(x), torch.clamp(x, -0.5, 0.5), F.hardtanh(x),
                torch.maximum(x, y), torch.minimum(x, y), x.amax(dim=1), x.amin(dim=1),
                F.hardsigmoid(x), F.hardswish(x), torch.clamp(x, min=0.1))


def _with_nan(shape, seed, spots):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    for index, value in spots:
        x[index] = value
    return x


class RowMaxMin(torch.nn.Module):
    def forward(self, x):
        return x.amax(-1), x.amin(-1), x.amax(0), torch.max(x), x.amin((0, 1), keepdim=True)


def test_amax_and_amin_keep_infinite_rows_and_nan():
    """A row of -inf has the max -inf (not the lowest finite float, the plain max's
    identity), a row of +inf the min +inf, a NaN anywhere in the row gives NaN; rows
    of 1500 (a ragged vector split) and a column reduction."""
    x = torch.randn(6, 1500, generator=torch.Generator().manual_seed(2))
    x[1, :] = -INF
    x[2, :] = INF
    x[3, 700] = NAN
    x[4, 9] = -INF
    x[5, 1499] = INF
    got = tecc.compile(RowMaxMin(), (x,))(x)
    expected = RowMaxMin()(x)
    assert expected[0][1] == -INF and expected[1][2] == INF
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(g, e, equal_nan=True, msg=f"output {i}")


def test_nan_goes_through_max_and_min_as_in_eager():
    x = _with_nan((4, 8), 0, [((0, 1), NAN), ((2, 3), INF), ((3, 0), -INF)])
    y = _with_nan((4, 8), 1, [((1, 2), NAN), ((0, 1), 2.0)])
    got = tecc.compile(MaxMin(), (x, y))(x, y)
    expected = MaxMin()(x, y)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert torch.isnan(e).any(), i  # every output has a NaN to keep
        torch.testing.assert_close(g, e, equal_nan=True, msg=f"output {i}")


class Transcendental(torch.nn.Module):
    def forward(self, x):
        return (torch.exp(x), torch.sigmoid(x), torch.tanh(x), torch.erf(x), F.gelu(x),
                F.silu(x), torch.softmax(x, -1), torch.log_softmax(x, -1))


def transcendental_input() -> torch.Tensor:
    """A NaN in row 0 (softmax: the whole row NaN), inf and -inf in row 1, a row of
    -inf, values past exp's range."""
    x = _with_nan((4, 40), 3, [((0, 5), NAN), ((1, 2), INF), ((1, 3), -INF),
                               ((2, 0), 100.0), ((2, 1), -100.0)])
    x[3] = -INF
    return x


def test_nan_and_inf_go_through_exp_tanh_erf_and_softmax_as_in_eager():
    x = transcendental_input()
    got = tecc.compile(Transcendental(), (x,))(x)
    for i, (g, e) in enumerate(zip(got, Transcendental()(x), strict=True)):
        assert torch.isnan(e).any(), i
        if i == 4:  # eager's CPU gelu gives NaN at inf (inf * erf's 1 is inf, as here)
            g, e = g[x != INF], e[x != INF]
        torch.testing.assert_close(g, e, equal_nan=True, msg=f"output {i}")


class Pool(torch.nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 2), F.max_pool2d(x, 3, stride=2, padding=1)


def test_a_pool_window_holding_nan_gives_nan():
    x = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(2))
    x[0, 0, 0, :4] = torch.tensor([NAN, 1.0, 0.5, INF])
    x[0, 5, 3, 3] = NAN
    got = tecc.compile(Pool(), (x,))(x)
    for g, e in zip(got, Pool()(x), strict=True):
        assert torch.isnan(e).sum() >= 2
        torch.testing.assert_close(g, e, equal_nan=True)


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 4)

    def forward(self, ids, rows):
        return self.table(ids), torch.index_select(self.table.weight, 0, rows)


@pytest.mark.parametrize("bad", [10, -11, -1, 2**40])
def test_an_index_out_of_range_raises_index_error(bad):
    ids = torch.tensor([[1, 2, 9]])
    rows = torch.tensor([0, 3])
    model = Lookup().eval()
    compiled = tecc.compile(model, (ids, rows))
    torch.testing.assert_close(compiled(ids, rows), model(ids, rows))
    wrong = ids.clone()
    wrong[0, 1] = bad
    with pytest.raises(IndexError):
        model(wrong, rows)  # torch raises too
    with pytest.raises(IndexError, match=rf"input 'ids': index {bad} is out of range for a "
                                         r"table of 10 rows"):
        compiled(wrong, rows)
    with pytest.raises(IndexError, match="input 'rows'"):
        compiled(ids, torch.tensor([0, bad]))
    # numpy callers and packages check the same
    with pytest.raises(IndexError):
        compiled(wrong.numpy(), rows.numpy())


def test_bfloat16_gets_teccs_own_error():
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(ImportError_, match=r"input 'x' is bfloat16.*float32 or float16"):
        tecc.compile(Double(), (torch.randn(2, 3).to(torch.bfloat16),))
    with pytest.raises(ImportError_, match=r"parameter '.*' is bfloat16"):
        tecc.compile(torch.nn.Linear(3, 2).to(torch.bfloat16), (torch.randn(2, 3),))


def test_float16_runs_as_in_eager():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).half()
    x = torch.randn(4, 16).half()
    got = tecc.compile(model, (x,))(x)
    torch.testing.assert_close(got, model(x), rtol=2e-3, atol=2e-3)


def test_a_dynamic_dimension_is_named(tmp_path):
    model = torch.nn.Linear(8, 4)
    batch = torch.export.Dim("batch", min=2, max=64)
    exported = torch.export.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(exported, tmp_path / "dyn.pt2")
    with pytest.raises(ImportError_, match=r"input '.*' has dynamic dimension\(s\) \[0\].*"
                                           r"static shapes"):
        tecc.compile(str(tmp_path / "dyn.pt2"))


def test_a_boolean_mask_is_named():
    class Mask(torch.nn.Module):
        def forward(self, x):
            return x[x > 0]

    with pytest.raises(ImportError_, match=r"depends on the data.*boolean mask.*torch.where"):
        tecc.compile(Mask(), (torch.randn(4, 5),))


def test_nan_semantics_keep_integer_max_plain():
    class IntMax(torch.nn.Module):
        def forward(self, a, b):
            return torch.maximum(a, b), torch.clamp(a, 0, 3)

    a = torch.tensor([[-3, 5, 2]], dtype=torch.int32)
    b = torch.tensor([[1, -7, 2]], dtype=torch.int32)
    got = tecc.compile(IntMax(), (a, b))(a, b)
    for g, e in zip(got, IntMax()(a, b), strict=True):
        assert np.array_equal(g.numpy(), e.numpy())


class SafeSoftmax(torch.nn.Module):
    """What SDPA decomposes to under torch.export."""

    def forward(self, x):
        return torch.ops.aten._safe_softmax.default(x, -1)


@pytest.mark.parametrize("keys", [40, 1500])  # a row kept in a stack buffer, and not
def test_safe_softmax_gives_zero_for_a_fully_masked_row_and_nan_for_nan(keys):
    x = torch.randn(5, keys, generator=torch.Generator().manual_seed(4)) * 4
    x[0] = -INF  # fully masked: 0, not NaN
    x[1, 3] = NAN  # NaN for the whole row
    x[2, ::2] = -INF  # half masked
    x[3] = torch.finfo(torch.float32).min  # a finite mask value: uniform, as in eager
    expected = SafeSoftmax()(x)
    assert (expected[0] == 0).all() and expected[1].isnan().all()
    got = tecc.compile(SafeSoftmax(), (x,))(x)
    torch.testing.assert_close(got, expected, equal_nan=True, rtol=1e-5, atol=1e-7)
