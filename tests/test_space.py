"""Config spaces: enumeration, index <-> config, sampling, neighbours, JSON, features."""

import json
import math
import random

import pytest
from tecc.schedules.space import ConfigSpace, factorizations


def make_space() -> ConfigSpace:
    space = ConfigSpace()
    space.define_split("tile_m", 24, num_outputs=3)
    space.define_split("tile_n", 100, num_outputs=2, policy="power2", max_factor=32)
    space.define_choice("unroll", [0, 8, 32])
    space.define_bool("vectorize")
    return space


def test_factorizations_cover_exact_and_power2_splits():
    splits = factorizations(12, 2)
    assert splits == [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]
    assert all(math.prod(s) == 24 for s in factorizations(24, 3))
    p2 = factorizations(100, 2, "power2", max_factor=16)
    assert (100, 1) in p2 and (7, 16) in p2  # outer = ceil(100 / 16)
    assert all(s[1] & (s[1] - 1) == 0 and s[1] <= 16 for s in p2)


def test_size_enumeration_and_index_round_trip():
    space = make_space()
    assert len(space) == len(factorizations(24, 3)) * len(
        factorizations(100, 2, "power2", 32)) * 3 * 2
    seen = set()
    for config in space:
        assert space.get(config.index) == config
        assert space.from_json(json.loads(space.dumps(config))).index == config.index
        seen.add(space.dumps(config))
    assert len(seen) == len(space)
    with pytest.raises(IndexError):
        space.get(len(space))


def test_neighbours_differ_in_exactly_one_knob():
    space = make_space()
    rng = random.Random(0)
    for config in space.sample(rng, 20):
        neighbours = space.neighbours(config)
        assert len(neighbours) == sum(len(k) - 1 for k in space.knobs)
        for other in neighbours:
            assert sum(config[k] != other[k] for k in config) == 1
        step = space.random_neighbour(config, rng)
        assert sum(config[k] != step[k] for k in config) == 1


def test_sampling_is_uniform_and_distinct():
    space = make_space()
    picks = space.sample(random.Random(1), 50)
    assert len({c.index for c in picks}) == 50
    small = ConfigSpace()
    small.define_bool("b")
    assert len(small.sample(random.Random(0), 10)) == 2


def test_features_are_numeric_per_knob():
    space = make_space()
    config = space.get(7)
    features = space.features(config)
    assert len(features) == 3 + 2 + 1 + 1
    assert all(isinstance(f, float) for f in features)


def test_bad_json_is_refused():
    space = make_space()
    values = space.get(0).to_json()
    values["unroll"] = 5
    with pytest.raises(ValueError, match="no option"):
        space.from_json(values)
    del values["unroll"]
    with pytest.raises(KeyError):
        space.from_json(values)


def test_a_knob_added_later_gives_old_configs_its_default():
    """A record written before a knob existed parses with the knob's default (the
    value that schedules as the template did then); without a default it is refused."""
    space = ConfigSpace()
    space.define_choice("tile", [4, 8])
    space.define_choice("split_k", [1, 2, 4], default=1)
    old = space.from_json({"tile": 8})
    assert dict(old) == {"tile": 8, "split_k": 1}
    assert space.from_json({"tile": 8, "split_k": 4})["split_k"] == 4
    with pytest.raises(KeyError, match="tile"):
        space.from_json({"split_k": 2})
    with pytest.raises(ValueError, match="default"):
        ConfigSpace().define_choice("x", [1, 2], default=3)


def test_configs_a_constraint_refuses_are_never_proposed_nor_measured():
    """A knob value that excludes another (split_k > 1 with a rule that does not split):
    the tuner marks such configs visited without spending a trial on them."""
    from types import SimpleNamespace

    from tecc.autotune.search import RandomSearch
    from tecc.autotune.tuner import Tuner

    space = ConfigSpace()
    space.define_choice("rule", ["simt", "tiled"])
    space.define_choice("split_k", [1, 2, 4])
    space.add_constraint(lambda c: c["split_k"] == 1 or c["rule"] == "simt", "no split")
    assert space.why_not(space.from_json({"rule": "tiled", "split_k": 2})) == "no split"
    assert space.why_not(space.from_json({"rule": "simt", "split_k": 2})) is None
    tuner = Tuner(SimpleNamespace(space=space), RandomSearch(seed=1))
    seen = []
    while not tuner.exhausted:
        batch = tuner.next_batch(2)
        if not batch:
            break
        seen += batch
        tuner.record(batch, [1.0] * len(batch))
    assert sorted((c["rule"], c["split_k"]) for c in seen) == [
        ("simt", 1), ("simt", 2), ("simt", 4), ("tiled", 1)]
    assert tuner.exhausted


def rule_space() -> ConfigSpace:
    """Two rules with knobs of their own (the GPU conv's "gemm" and "direct")."""
    space = ConfigSpace()
    space.define_choice("rule", ["gemm", "direct"])
    space.define_choice("tile", [16, 32, 64], when=("rule", ["gemm"]))
    space.define_choice("unroll", [0, 8])
    space.define_split("tile_x", 12, num_outputs=2, when=("rule", ["direct"]))
    return space


def test_a_knob_that_does_not_apply_is_one_config_left_out_of_its_json():
    space = rule_space()
    configs = list(space)
    # gemm: 3 tiles x 2 unrolls; direct: 2 unrolls x 6 splits of 12
    assert len(configs) == 3 * 2 + 2 * 6
    assert len({c.index for c in configs}) == len(configs)
    for config in configs:
        assert space.canonical_index(config.index) == config.index
        values = config.to_json()
        assert ("tile" in values) == (config["rule"] == "gemm")
        assert ("tile_x" in values) == (config["rule"] == "direct")
        assert space.from_json(values) == config
    # an index whose inactive knob is off its first option stands for the first
    direct = next(c for c in configs if c["rule"] == "direct")
    digits = space.indices_of(direct.index)
    digits[1] = 2  # tile 64, which does not apply to "direct"
    assert space.get(space.index_of(digits)).index == direct.index
    # a record may give the value of a knob that does not apply: it is dropped
    assert space.from_json({**direct.to_json(), "tile": 64}) == direct
    with pytest.raises(ValueError, match="no option"):
        space.from_json({"rule": "gemm", "tile": 48, "unroll": 0})


def test_neighbours_move_the_knobs_that_apply_and_sampling_covers_each_rule():
    space = rule_space()
    rng = random.Random(0)
    gemm = space.from_json({"rule": "gemm", "tile": 32, "unroll": 8})
    neighbours = space.neighbours(gemm)
    # tile (2 others), unroll (1), rule (1: to direct, its split at the first option)
    assert len(neighbours) == 4 and gemm not in neighbours
    assert all("tile_x" not in n.to_json() or n["rule"] == "direct" for n in neighbours)
    into_direct = set()
    for _ in range(60):
        step = space.random_neighbour(gemm, rng)
        assert step.index != gemm.index
        if step["rule"] == "direct":  # its own knobs start anywhere in it
            assert step["unroll"] == gemm["unroll"]
            into_direct.add(step["tile_x"])
        else:
            assert step["tile_x"] == space.options("tile_x")[0]
    assert len(into_direct) > 1
    rules = [c["rule"] for c in space.sample(random.Random(2), 12)]
    assert set(rules) == {"gemm", "direct"}


def _wide_x(config) -> bool:
    return config["rule"] != "direct" or config["tile_x"][1] >= 6


def test_a_rule_whose_knobs_are_mostly_refused_keeps_its_share_of_samples():
    """Only 2 of direct's 6 splits pass the constraint: drawn again under the same
    rule, direct still gets about half of the samples."""
    space = rule_space()
    space.add_constraint(_wide_x, "x tile too narrow")
    rng = random.Random(3)
    picks = [space.get(space.sample_index(rng)) for _ in range(400)]
    assert all(space.why_not(c) is None for c in picks)
    direct = sum(c["rule"] == "direct" for c in picks)
    assert 150 < direct < 250, direct


def test_a_condition_names_an_earlier_knob_and_its_options():
    space = ConfigSpace()
    with pytest.raises(ValueError, match="not defined before"):
        space.define_choice("tile", [1, 2], when=("rule", ["gemm"]))
    space.define_choice("rule", ["gemm", "direct"])
    with pytest.raises(ValueError, match="no option 'winograd'"):
        space.define_choice("tile", [1, 2], when=("rule", ["winograd"]))
