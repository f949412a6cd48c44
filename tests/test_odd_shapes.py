"""Odd extents (prime, few divisors: 197, 77, 50, 1000 and small stand-ins) keep full
tiles: the dense-like templates pad rows and columns to whole register tiles, a dense
weight is packed with zero rows to whole blocks. Kernels and compiled models against
torch eager on random inputs, for the fallback and for configs whose tiles divide
nothing; old configs still apply, the cost model's features exist for the new ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tecc.autotune.features import FeatureCache
from tecc.graph_opt.dense_pack import pack_dense_weight, unpack_dense_weight
from tecc.schedules.tasks import task_from_workload
from tecc.schedules.templates_dense import register_tile_rows, tile_accumulators

import tecc
from tecc.target import resolve_target, target_info
from tests.util import assert_close

TARGET = resolve_target("llvm")
LANES = target_info(TARGET).vector_lanes("float32")
DEV = tvm.cpu()


def _mm(template: str, a: list[int], b: list[int], tb: bool = False) -> dict:
    attrs = {} if template == "dense" else {"transpose_a": False, "transpose_b": tb}
    return {"template": template, "inputs": [[a, "float32"], [b, "float32"]], "attrs": attrs}


def _eager(workload: dict, inputs: list[np.ndarray]) -> np.ndarray:
    a, b = (torch.from_numpy(x) for x in inputs)
    if workload["template"] == "dense":
        return torch.nn.functional.linear(a, b).numpy()
    if workload["attrs"]["transpose_b"]:
        b = b.transpose(-1, -2)
    return torch.matmul(a, b).numpy()


def _run_configs(workload: dict, configs: list[dict | None]) -> None:
    """Each config (None: the fallback) of the workload's task, built into one module,
    against torch eager on the task's random inputs (outputs start as NaN)."""
    task = task_from_workload(workload, TARGET)
    chosen = [task.config(c) for c in configs]
    prims = {f"k{i}": task.build_primfunc(c).with_attr("global_symbol", f"k{i}")
             for i, c in enumerate(chosen)}
    ex = tvm.compile(tvm.IRModule(prims), target=TARGET)
    inputs = task.reference_inputs(3)
    expected = [_eager(workload, inputs)]
    for i, cfg in enumerate(chosen):
        k_in, k_out = task.adapt_io(cfg, inputs, expected)
        out = tvm.runtime.tensor(np.full(k_out[0].shape, np.nan, "float32"), DEV)
        ex[f"k{i}"](*[tvm.runtime.tensor(a, DEV) for a in k_in], out)
        np.testing.assert_allclose(out.numpy(), k_out[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{workload} config {cfg.to_json()}")


def _config(task_wl: dict, **values) -> dict:
    task = task_from_workload(task_wl, TARGET)
    return {**task.fallback_config().to_json(), **values}


# (workload, configs besides the fallback): tile_m and tile_n dividing nothing
CASES = {
    "dense_13x40x50": (_mm("dense", [13, 40], [50, 40]),
                       [{"tile_m": 8, "tile_n": 2 * LANES}, {"tile_m": 6, "tile_n": 3 * LANES,
                                                             "order": "k_mn"}]),
    "dense_3d_7": (_mm("dense", [2, 7, 24], [19, 24]), [{"tile_m": 4, "tile_n": LANES}]),
    "matmul_nt_11x16x37": (_mm("matmul", [11, 16], [37, 16], tb=True),
                           [{"tile_m": 8, "tile_n": LANES, "tile_mo": 2}]),
    "bmm_attention_2x3x13": (_mm("batch_matmul", [2, 3, 13, 8], [2, 3, 8, 13]),
                             [{"tile_m": 6, "tile_n": LANES, "pack_b": True},
                              {"tile_m": 4, "tile_n": LANES, "tile_mo": 2, "pack_b": False}]),
    "bmm_k13": (_mm("batch_matmul", [3, 13, 13], [3, 13, 8]), [{"tile_m": 8}]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_padded_tiles_match_eager(name):
    workload, extra = CASES[name]
    _run_configs(workload, [None, *[_config(workload, **c) for c in extra]])


def test_spaces_offer_vector_tiles_for_odd_n():
    """Column tiles of whole vectors for N with no such divisor (the divisors stay:
    configs of records written before are still points of the space); the fallback
    takes a vector tile and a tall row tile."""
    for workload in (_mm("dense", [197, 64], [1000, 64]),
                     _mm("batch_matmul", [12, 197, 64], [12, 64, 197])):
        task = task_from_workload(workload, TARGET)
        tiles = next(k for k in task.space.knobs if k.name == "tile_n").options
        assert {LANES, 2 * LANES} <= set(tiles)
        n = workload["inputs"][1][0][-2 if workload["template"] == "dense" else -1]
        assert [t for t in tiles if n % t == 0][:1] == [tiles[0]]  # divisors first
        fallback = task.fallback_config()
        # a tall row tile: as many rows as the vector registers hold (8 on AVX-512's
        # 32 registers, 6 on AVX2's 16 with two-vector columns), or as this CPU's
        # accumulator limit allows (16 vectors on Zen 4: 4 rows of 4 vectors)
        assert fallback["tile_n"] % LANES == 0
        limit = tile_accumulators(target_info(TARGET).cpu)
        assert fallback["tile_m"] == register_tile_rows(197, fallback["tile_n"], LANES,
                                                        limit) >= 4


def test_row_tiles_weigh_their_padded_rows():
    """A register tile's rows: the least time per useful row, padded rows counted. A
    dense on [1, H, W, C] has M = W (ConvNeXt's 7 to 56 on AVX-512): 4 rows there, not
    6 (12 rows computed for 7); a long M keeps the tallest tile the registers hold."""
    assert register_tile_rows(7, 64, 16) == 4
    assert register_tile_rows(28, 64, 16) == 4
    assert register_tile_rows(14, 64, 16) == 3
    assert register_tile_rows(197, 64, 16) == 6
    assert register_tile_rows(3136, 16, 16) == 8
    assert register_tile_rows(64, 16, 8) == 6  # AVX2, two-vector columns
    # Zen 4's limit of 16 accumulators: 4 rows of 4 vectors, 8 of one or two
    assert tile_accumulators("znver4") == 16 and tile_accumulators("skylake-avx512") is None
    assert tile_accumulators("znver5") is None  # full 512-bit FMA units, as Intel's
    assert register_tile_rows(197, 64, 16, 16) == 4
    assert register_tile_rows(3136, 16, 16, 16) == register_tile_rows(3136, 32, 16, 16) == 8
    _run_configs(_mm("dense", [1, 7, 7, 40], [50, 40]), [None])


def test_old_configs_apply_or_are_refused():
    """A config tuned before (tile_n dividing N, say 13 of 1001: no vector divides it
    on AVX2 or AVX-512) still builds and computes; one naming a tile no space has is
    refused by name."""
    workload = _mm("dense", [50, 32], [1001, 32])
    old = _config(workload, tile_n=13, tile_m=6)
    _run_configs(workload, [old])
    task = task_from_workload(workload, TARGET)
    assert not task.space.contains({**old, "tile_n": 9})
    with pytest.raises(ValueError, match="tile_n"):
        task.config({**old, "tile_n": 9})


def test_features_of_padded_configs():
    workload, extra = CASES["bmm_attention_2x3x13"]
    task = task_from_workload(workload, TARGET)
    configs = [task.fallback_config(), *[task.config(_config(workload, **c)) for c in extra]]
    features = FeatureCache(task)(configs)
    assert features.shape == (len(configs), FeatureCache(task).dim)
    assert np.isfinite(features).all() and (features[:, -100:] != 0).any(axis=1).all()


def test_padded_weight_packing_round_trip():
    w = np.random.default_rng(0).standard_normal((50, 8)).astype("float32")
    packed = pack_dense_weight(w, 16)
    assert packed.shape == (4, 8, 16) and not packed[3, :, 2:].any()
    np.testing.assert_array_equal(unpack_dense_weight(packed, 50), w)


class _Vit(torch.nn.Module):
    """A ViT's odd shapes, small: patch embedding to a 7x7 grid (49 + 1 tokens), a
    linear layer, attention scores and their softmax over 50 tokens, layer norm and a
    classifier of 1000 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 32, 4, stride=4)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 32))
        self.qk = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(32)
        self.head = torch.nn.Linear(32, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)  # [1, 49, 32]
        tokens = torch.cat([self.cls, tokens], dim=1)  # [1, 50, 32]
        q, k = self.qk(tokens).chunk(2, dim=-1)
        attn = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)  # [1, 50, 50]
        mixed = self.norm(attn @ tokens)
        return self.head(mixed[:, 0]) + self.head(mixed).mean(1)


def test_compiled_odd_model_matches_eager():
    torch.manual_seed(0)
    model = _Vit().eval()
    x = torch.randn(1, 3, 28, 28)
    compiled = tecc.compile(model, (x,))
    with torch.no_grad():
        expected = model(x)
    assert_close(compiled(x), expected, rtol=1e-4, atol=1e-4)
    dense = [t for t in compiled.tasks() if t["template"] == "dense"]
    # the 1000-class head packed in blocks of whole vectors (1000 has none as divisor)
    head = next(t for t in dense if t["workload"]["inputs"][1][0][0] == 1000)
    assert head["config"]["tile_n"] % LANES == 0 and head["source"] == "fallback"
