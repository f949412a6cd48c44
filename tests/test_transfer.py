"""Transfer learning: records of other conv workloads pre-train a new conv task's cost
model, whose first batch then follows them. The records are synthetic: their cost is
the same function of the knobs on every workload, so a model that learned it from two
workloads must rank a third one's configs by it."""

import math
import random

import numpy as np
import pytest
from tecc.autotune.records import Record
from tecc.autotune.transfer import PER_WORKLOAD, TransferSource
from tecc.autotune.tune import TaskState, _pretrain
from tecc.autotune.tuner import XGBTuner
from tecc.schedules.tasks import task_from_workload

from tecc.target import resolve_target, target_to_json

TARGET = resolve_target("llvm")


def conv(c: int, hw: int, o: int) -> dict:
    return {"template": "conv2d_NCHWc", "data": [1, c, hw, hw], "kernel": [o, c, 3, 3],
            "dtype": "float32", "strides": [1, 1], "padding": [1, 1, 1, 1],
            "dilation": [1, 1], "groups": 1}


def synthetic_cost(config) -> float:
    """Fastest with 4-wide column tiles, the icc-first reduction and kw unrolled."""
    return 1e-3 * (1 + abs(config["tile_ow"] - 4)) * (
        1 if config["reduce_order"] == "icc_kh_kw" else 2) * (1 if config["unroll_kw"] else 1.5)


def records_of(workload: dict, n: int, seed: int) -> list[Record]:
    task = task_from_workload(workload, TARGET)
    rng = random.Random(seed)
    out = []
    for config in task.space.sample(rng, n):
        costs = [synthetic_cost(config)]
        if rng.random() < 0.1:  # some failures: throughput 0
            out.append(Record(target_to_json(TARGET), workload, config.to_json(), [],
                              "build_error: x", 1.0))
        else:
            out.append(Record(target_to_json(TARGET), workload, config.to_json(), costs,
                              None, 1.0))
    return out


@pytest.fixture(scope="module")
def source_records() -> list[Record]:
    return records_of(conv(16, 14, 32), 60, 0) + records_of(conv(32, 10, 16), 60, 1)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def test_pretrained_model_ranks_a_new_workload(source_records):
    task = task_from_workload(conv(24, 12, 48), TARGET)
    data = TransferSource(source_records, TARGET).data_for(task)
    # per source workload its best half and a random half, up to PER_WORKLOAD configs
    assert data is not None and data.groups == [PER_WORKLOAD] * 2
    assert data.throughputs.max() == pytest.approx(1.0) and (data.throughputs == 0).any()

    sample = task.space.sample(random.Random(2), 120)
    truth = np.array([-synthetic_cost(c) for c in sample])
    pretrained = XGBTuner(task)
    pretrained.pretrain(data.features, data.throughputs, data.groups)
    assert spearman(pretrained._score(sample), truth) > 0.6

    # the first batch follows the model: its configs are far better than a random batch
    first = pretrained.next_batch(16)
    random_first = XGBTuner(task, seed=3).next_batch(16)
    mean = np.mean([synthetic_cost(c) for c in first])
    assert mean < 0.5 * np.mean([synthetic_cost(c) for c in random_first])
    assert min(synthetic_cost(c) for c in first) == pytest.approx(1e-3)


def test_only_other_workloads_of_the_template_are_used(source_records):
    own = conv(16, 14, 32)  # the first source workload: its own records do not count
    task = task_from_workload(own, TARGET)
    dense = Record(target_to_json(TARGET), {"template": "dense", "shapes": [[1, 8], [8, 8]]},
                   {}, [1e-3], None, 1.0)
    broken = Record(target_to_json(TARGET), conv(8, 8, 8), {"ic_bn": 999}, [1e-3], None, 1.0)
    data = TransferSource(source_records + [dense, broken], TARGET).data_for(task)
    assert data is not None and data.groups == [PER_WORKLOAD]

    alone = TransferSource([r for r in source_records if r.workload == own], TARGET)
    assert alone.data_for(task) is None


def test_tuning_pretrains_tasks_without_records(source_records):
    fresh = task_from_workload(conv(24, 12, 48), TARGET)
    seen = task_from_workload(conv(16, 14, 32), TARGET)
    states = [TaskState(t, 1, XGBTuner(t), 1.0) for t in (fresh, seen)]
    states[1].trials = 60  # resumed from its own records: no transfer needed
    assert _pretrain(states, source_records, target_to_json(TARGET), 0) == 1
    assert states[0].tuner.model.trained and not states[1].tuner.model.trained
    assert math.isfinite(min(synthetic_cost(c) for c in states[0].tuner.next_batch(4)))
