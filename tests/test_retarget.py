"""Retargeting: records of another machine (another CPU model, vector width or core
count) are never applied as they are; a retarget run measures their best configs that are valid
here, and the fallback, and writes local records that compile reports "retargeted"
and a later tuning run continues from."""

import json
import re
import warnings

import numpy as np
import pytest
import torch
from tecc.autotune.records import (
    RETARGET_SESSION,
    host_info,
    load_records,
    target_relation,
    workload_key,
)
from tecc.runtime import cpu
from tecc.schedules.tasks import extract_tasks

import tecc
from tecc.api import fused_graph, import_model
from tecc.cli import main
from tecc.target import target_info

# Serial (make test's second phase): retargeting picks configs by their measured times.
pytestmark = pytest.mark.serial

FOREIGN_CONFIGS = 5  # valid foreign configs written per workload


def conv_example():
    """One conv and its ReLU (a `tecc` CLI model factory)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, 1, 1), torch.nn.ReLU()).eval()
    return model, (torch.randn(1, 16, 12, 12),)


def _wrong(value):
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else [value]


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """Records of the conv's workloads for this host's CPU with one core more (a
    foreign target): per workload, FOREIGN_CONFIGS valid configs of this target's
    space other than the fallback (costs rising in order), a faster config outside
    the space and a failed one. Returns (path, {workload key: (valid configs in rank
    order, fallback)}, the local target JSON)."""
    model, inputs = conv_example()
    _, fused, _, _, info = fused_graph(model, inputs, "llvm", 3, None, None, {})
    local = info.to_json()
    other = dict(local, **{"num-cores": info.cores + 1})
    assert target_relation(other, local) == "foreign"
    path = tmp_path_factory.mktemp("foreign") / "foreign.jsonl"
    expected = {}
    with open(path, "w") as f:
        def write(task, config, cost, error=None):
            f.write(json.dumps({"version": 1, "target": other, "workload": task.workload,
                                "config": config, "costs_s": [] if error else [cost],
                                "error": error, "timestamp": 1.0}) + "\n")

        for task in extract_tasks(fused, info.tvm_target):
            if task.template == "injective":
                continue  # a workload without foreign records is left alone
            fallback = task.fallback_config()
            configs = [c for c in task.space if c.index != fallback.index][:FOREIGN_CONFIGS]
            for rank, config in enumerate(configs):
                write(task, config.to_json(), 1e-3 * (rank + 1))
            knob = next(k.name for k in task.space.knobs if len(k) > 1)
            write(task, dict(configs[0].to_json(), **{knob: _wrong(configs[0][knob])}), 1e-5)
            write(task, configs[-1].to_json(), 0, error="run_error: crashed")
            expected[json.dumps(task.workload, sort_keys=True)] = (configs, fallback)
    assert expected
    return path, expected, local


def _key(config):
    return json.dumps(config, sort_keys=True)


def _by_workload(records):
    out = {}
    for r in records:
        out.setdefault(json.dumps(r.workload, sort_keys=True), []).append(r)
    return out


def test_retarget_measures_the_best_valid_foreign_configs_and_the_fallback(foreign, tmp_path,
                                                                           capsys):
    path, expected, local = foreign
    model, inputs = conv_example()
    want = model(*inputs).detach().numpy()
    # as they are, foreign records are not applied
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        untuned = tecc.compile(model, inputs, records=[path])
    assert {t["source"] for t in untuned.tasks()} <= {"fallback"}
    assert any("tecc records retarget" in str(w.message) for w in caught)

    records = tmp_path / "local.jsonl"
    states = tecc.retarget(model, inputs, foreign=path, records=records, k=3, rounds=2,
                           progress=False)
    assert len(states) == len(expected) and all(s.measured == 3 for s in states)
    lines, skipped = load_records(records)
    assert skipped == 0
    assert len({r.verify for r in lines}) == 1
    assert lines[0].verify.startswith(RETARGET_SESSION)
    assert all(r.target == local and r.ok for r in lines)
    by_workload = _by_workload(lines)
    assert set(by_workload) == set(expected)
    for key, (configs, fallback) in expected.items():
        measured = [r.config for r in by_workload[key]]
        wanted = [c.to_json() for c in configs[:3]] + [fallback.to_json()]
        # the 3 best valid configs (the one outside the space skipped) and the
        # fallback, each once per round
        assert sorted(map(_key, measured)) == sorted(map(_key, wanted * 2))

    tuned = tecc.compile(model, inputs, records=[records])
    retargeted = [t for t in tuned.tasks() if t["template"] != "injective"]
    assert retargeted and all(t["source"] == "retargeted" for t in retargeted)
    np.testing.assert_allclose(tuned(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)

    # a later tuning run resumes from the retargeted records, and its own
    # verification session (of two configs and the fallback) then decides
    capsys.readouterr()
    tecc.tune(model, inputs, records=records, trials=2, tuner="random", verify_top=2,
              verify_rounds=1)
    assert f"resumed from {4 * len(expected)} earlier measurement(s)" in capsys.readouterr().out
    tuned = tecc.compile(model, inputs, records=[records])
    assert {t["source"] for t in tuned.tasks() if t["template"] != "injective"} == {"exact"}
    np.testing.assert_allclose(tuned(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)


# CPUs LLVM knows, for a target of this host's vector width with other features
OTHER_CPUS = ("skylake-avx512", "icelake-server", "sapphirerapids", "znver4", "haswell",
              "znver3", "alderlake", "skylake")


def test_records_of_another_cpu_model_are_not_applied_and_retarget_takes_them(tmp_path):
    """A compatible target (this vector width and core count, other ISA features): its
    records are counted in the warning, which points to retarget, and retargeted they
    apply."""
    model, inputs = conv_example()
    _, fused, _, _, info = fused_graph(model, inputs, "llvm", 3, None, None, {})
    local = info.to_json()
    other = next(t for cpu in OTHER_CPUS
                 if target_relation(t := dict(local, mcpu=cpu), local) == "compatible")
    path = tmp_path / "other_cpu.jsonl"
    written = 0
    with open(path, "w") as f:
        for task in extract_tasks(fused, info.tvm_target):
            fallback = task.fallback_config()
            config = next(c for c in task.space if c.index != fallback.index)
            f.write(json.dumps({"version": 1, "target": other, "workload": task.workload,
                                "config": config.to_json(), "costs_s": [1e-6],
                                "error": None, "timestamp": 1.0}) + "\n")
            written += 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        untuned = tecc.compile(model, inputs, records=[path])
    assert {t["source"] for t in untuned.tasks()} == {"fallback"}
    assert untuned.unapplied_records == {"compatible": written, "foreign": 0}
    message = next(str(w.message) for w in caught if "no tuning record" in str(w.message))
    assert f"{written} record(s) of another CPU model" in message
    assert "tecc records retarget" in message

    records = tmp_path / "local.jsonl"
    tecc.retarget(model, inputs, foreign=path, records=records, k=1, rounds=1, progress=False)
    tuned = tecc.compile(model, inputs, records=[path, records])
    assert {t["source"] for t in tuned.tasks() if t["template"] != "injective"} == {"retargeted"}
    np.testing.assert_allclose(tuned(*inputs).numpy(), model(*inputs).detach().numpy(),
                               rtol=1e-4, atol=1e-4)


def test_records_of_this_chip_under_another_cpu_name_apply_as_exact(tmp_path, capsys):
    """A compatible record measured on this very chip (its host's cpu_id is this
    host's: the same hardware that LLVM named otherwise) applies as exact, its config
    used; one of another chip, or of none recorded, does not."""
    model, inputs = conv_example()
    _, fused, _, _, info = fused_graph(model, inputs, "llvm", 3, None, None, {})
    local = info.to_json()
    other = next(t for cpu_name in OTHER_CPUS
                 if target_relation(t := dict(local, mcpu=cpu_name), local) == "compatible")
    chip = cpu.host_cpu_id()
    assert chip and host_info()["cpu_id"] == chip  # Linux: /proc/cpuinfo names the chip
    picked = {}
    for host, expected in (({"cpu": "x", "cores": info.cores, "cpu_id": chip}, "exact"),
                           ({"cpu": "x", "cores": info.cores, "cpu_id": "GenuineIntel 6-1-0"},
                            "fallback"),
                           ({"cpu": "x", "cores": info.cores}, "fallback")):
        path = tmp_path / f"{expected}_{len(host)}.jsonl"
        with open(path, "w") as f:
            for task in extract_tasks(fused, info.tvm_target):
                fallback = task.fallback_config()
                config = [c for c in task.space if c.index != fallback.index][-1].to_json()
                picked[workload_key(task.workload)] = config
                f.write(json.dumps({"version": 1, "target": other, "workload": task.workload,
                                    "config": config, "costs_s": [1e-6], "error": None,
                                    "timestamp": 1.0, "host": host}) + "\n")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cm = tecc.compile(model, inputs, records=[path])
        tuned = [t for t in cm.tasks() if t["workload_key"] in picked]
        assert tuned and {t["source"] for t in tuned} == {expected}, host
        if expected == "exact":
            assert all(t["config"] == picked[t["workload_key"]] for t in tuned)
            assert cm.unapplied_records == {"compatible": 0, "foreign": 0}
            x = torch.randn_like(inputs[0])
            np.testing.assert_allclose(cm(x).numpy(), model(x).detach().numpy(),
                                       rtol=1e-4, atol=1e-4)
            assert main(["records", "show", str(path)]) == 0
            # every record of the file counts, also one whose layout the chosen configs
            # no longer need (the conv's last config may read another channel block)
            assert f"{len(picked)} measured on this chip ({chip}): applied by compile" in \
                capsys.readouterr().out
        else:
            assert cm.unapplied_records["compatible"] == len(tuned)


def test_retarget_without_foreign_records_says_what_it_needs(tmp_path):
    model, inputs = conv_example()
    with pytest.raises(ValueError, match="records of another machine"):
        tecc.retarget(model, inputs, records=tmp_path / "none.jsonl", progress=False)


def test_the_cli_retargets_compiles_and_shows_how_records_relate(foreign, tmp_path, capsys,
                                                                 monkeypatch):
    path, expected, _ = foreign
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent.parent))
    spec = "tests.test_retarget:conv_example"
    assert main(["records", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"foreign for llvm ({target_info('llvm').cpu}" in out
    assert "not applied; `tecc records retarget` measures them here" in out

    local = tmp_path / "local.jsonl"
    assert main(["records", "retarget", str(path), "-o", str(local), "--model", spec,
                 "--k", "1", "--rounds", "1"]) == 0
    assert "speedup" in capsys.readouterr().out
    lines, _ = load_records(local)
    assert len(lines) == 2 * len(expected) and lines[0].verify.startswith(RETARGET_SESSION)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["compile", spec, "--records", str(local), "-o",
                     str(tmp_path / "m.tar")]) == 0
    out = capsys.readouterr().out
    assert f"{len(expected)} retargeted" in out
    assert sum(line.startswith("retargeted ") for line in out.splitlines()) == len(expected)

    # tecc tune --retarget: the foreign records as --transfer, into --records
    again = tmp_path / "again.jsonl"
    assert main(["tune", spec, "--retarget", "--records", str(again), "--transfer", str(path),
                 "--k", "1", "--rounds", "1"]) == 0
    lines, _ = load_records(again)
    assert len(lines) == 2 * len(expected) and lines[0].verify.startswith(RETARGET_SESSION)
    with pytest.raises(SystemExit, match="--model MODEL and -o LOCAL"):
        main(["records", "retarget", str(path)])


def test_configs_of_another_vector_width_are_tried_scaled_to_this_one():
    """An AVX2 record's channel blocks (8 lanes) become AVX-512's (16 lanes) as the
    first candidate, the config as measured follows where it is valid here."""
    from tecc.autotune.records import Record
    from tecc.autotune.tune import foreign_candidates

    model, inputs = conv_example()
    _, fused, _, _, info = fused_graph(model, inputs, "llvm:skylake-avx512", 3, None, None, {})
    conv = next(t for t in extract_tasks(fused, info.tvm_target)
                if "oc_bn" in t.template_obj.lane_knobs)
    avx2 = {"kind": "llvm", "mcpu": "core-avx2", "num-cores": info.cores}
    assert target_relation(avx2, info.to_json()) == "foreign"
    measured = dict(conv.fallback_config().to_json(), ic_bn=8, oc_bn=8)
    record = Record(target=avx2, workload=conv.workload, config=measured, costs_s=[1e-3])
    candidates, _ = foreign_candidates(conv, [record])
    assert [(c["ic_bn"], c["oc_bn"]) for c in candidates] == [(16, 16), (8, 8)]
    assert all(c[k] == measured[k] for c in candidates for k in measured
               if k not in ("ic_bn", "oc_bn"))


def conv_depthwise_example():
    """A 1x1 conv into a depthwise 3x3 conv: the depthwise conv's block is its input's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 32, 3, 1, 1, groups=32),
                                torch.nn.ReLU()).eval()
    return model, (torch.randn(1, 16, 12, 12),)


def _block_changes(compiled) -> int:
    """layout_transforms between two blocked layouts (between layers)."""
    return len(re.findall(r'layout_transform\([^)]*dst_layout="NCHW\d+c", '
                          r'src_layout="NCHW\d+c"', compiled.astext()))


def _conv_and_depthwise(info, model, inputs):
    _, fused, _, _, _ = fused_graph(model, inputs, "llvm", 3, None, None, {})
    tasks = {t.template: t for t in extract_tasks(fused, info.tvm_target)}
    return tasks["conv2d_NCHWc"], tasks["depthwise_conv2d_NCHWc"]


def _two_other_blocks(conv, depthwise) -> tuple[int, int]:
    """Two channel blocks, the larger first, that neither fallback uses (the blocks
    offered and the fallbacks' depend on the vector width)."""
    blocks = [k for k in conv.space.knobs if k.name == "oc_bn"][0].options
    others = [b for b in blocks if b not in (conv.fallback_config()["oc_bn"],
                                            depthwise.fallback_config()["c_bn"])]
    assert len(others) >= 2, (blocks, others)
    return max(others), min(others)


def _write_retarget_record(path, info, task, config, cost):
    """One record of a retarget session on this target appended to `path`."""
    from tecc.autotune.records import Record, RecordWriter

    with RecordWriter(path) as writer:
        writer.write(Record(info.to_json(), task.workload, config, [cost], timestamp=1.0,
                            verify=RETARGET_SESSION + "test"))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_layout_chain_plan_asks_for_the_configs_that_spare_block_changes(tmp_path):
    """A retarget session where the conv's best config writes another block than any
    measured depthwise config reads: compile changes the block between the two; the
    plan asks for the depthwise config with the conv's block, and once it is
    measured (slower than the best, by less than a transform) compile uses it, with no
    transform between the layers."""
    from tecc.tuning import layout_chain_variants

    model, inputs = conv_depthwise_example()
    info = target_info("llvm")
    conv, depthwise = _conv_and_depthwise(info, model, inputs)
    written, read = _two_other_blocks(conv, depthwise)
    conv_best = dict(conv.fallback_config().to_json(), oc_bn=written)
    dw_best = dict(depthwise.fallback_config().to_json(), c_bn=read)
    path = tmp_path / "local.jsonl"

    def write(task, config, cost):
        _write_retarget_record(path, info, task, config, cost)

    write(conv, conv_best, 1e-5)
    write(conv, conv.fallback_config().to_json(), 2e-5)
    write(depthwise, dw_best, 1e-5)
    write(depthwise, depthwise.fallback_config().to_json(), 2e-5)
    want = model(*inputs).detach().numpy()
    assert _block_changes(tecc.compile(model, inputs, records=path)) == 1

    func = import_model(model, inputs).func
    variants = layout_chain_variants(func, info, path)
    variant = dict(dw_best, c_bn=written)
    assert variants == {workload_key(depthwise.workload): [variant]}

    # slower alone than the others, by less than the transform it spares
    from tecc.tuning import LAYOUT_TRANSFORM_BYTES_PER_S

    data_bytes = 4 * int(np.prod(depthwise.workload["data"]))
    write(depthwise, variant, 1e-5 + data_bytes / LAYOUT_TRANSFORM_BYTES_PER_S)
    chained = tecc.compile(model, inputs, records=path)
    assert _block_changes(chained) == 0
    dw_task = next(t for t in chained.tasks() if t["template"] == depthwise.template)
    assert dw_task["config"] == variant and dw_task["source"] == "retargeted"
    np.testing.assert_allclose(chained(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)
    assert layout_chain_variants(func, info, path) == {}


@pytest.fixture(scope="module")
def foreign_chain(tmp_path_factory):
    """Foreign records (one core more) of conv_depthwise_example where every conv
    config writes a block that no depthwise config reads. Returns (path, conv task,
    depthwise task, the conv's block, the local target facts)."""
    model, inputs = conv_depthwise_example()
    info = target_info("llvm")
    conv, depthwise = _conv_and_depthwise(info, model, inputs)
    written, read = _two_other_blocks(conv, depthwise)
    other = dict(info.to_json(), **{"num-cores": info.cores + 1})
    path = tmp_path_factory.mktemp("chain") / "foreign.jsonl"
    with open(path, "w") as f:
        for task, config in ((conv, dict(conv.fallback_config().to_json(), oc_bn=written)),
                             (depthwise, dict(depthwise.fallback_config().to_json(),
                                              c_bn=read))):
            f.write(json.dumps({"version": 1, "target": other, "workload": task.workload,
                                "config": config, "costs_s": [1e-4], "error": None,
                                "timestamp": 1.0}) + "\n")
    return path, conv, depthwise, written, info


def test_retarget_measures_the_layout_chains_configs_in_its_session(foreign_chain, tmp_path):
    """retarget_tasks measures the configs layout_variants asks for (after the foreign
    ones, in the same session) until it asks for none new."""
    from tecc.autotune.tune import retarget_tasks

    path, conv, depthwise, written, _ = foreign_chain
    variant = dict(depthwise.fallback_config().to_json(), c_bn=written)
    asked = []

    def layout_variants():
        asked.append(len(load_records(records)[0]))
        return {workload_key(depthwise.workload): [variant]}

    records = tmp_path / "local.jsonl"
    states = retarget_tasks([conv, depthwise], [1, 1], load_records(path)[0], records, k=1,
                            rounds=2, progress=False, layout_variants=layout_variants)
    # first after the foreign configs and fallbacks (2 rounds of 2 tasks x 2 configs),
    # then once more, when the variant is measured
    assert asked == [8, 10]
    dw_state = next(s for s in states if s.task is depthwise)
    assert [c.to_json() for c in dw_state.variants] == [variant]
    lines, _ = load_records(records)
    assert len({r.verify for r in lines}) == 1
    assert sum(r.config == variant for r in lines) == 2 and all(r.ok for r in lines)


def test_a_retargeted_model_keeps_its_blocks_between_layers(foreign_chain, tmp_path):
    model, inputs = conv_depthwise_example()
    path, conv, depthwise, written, _ = foreign_chain
    records = tmp_path / "local.jsonl"
    tecc.retarget(model, inputs, foreign=path, records=records, k=1, rounds=2,
                  progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the layout transforms have no records
        tuned = tecc.compile(model, inputs, records=records)
    assert _block_changes(tuned) == 0
    np.testing.assert_allclose(tuned(*inputs).numpy(), model(*inputs).detach().numpy(),
                               rtol=1e-4, atol=1e-4)


def test_a_lane_knob_is_scaled_to_this_width_or_the_nearest_option():
    """A packing block of 1000 features: 8 on AVX2 becomes 16 on AVX-512 (the weight
    is padded to whole blocks, so 16 is an option though it does not divide 1000);
    40 (five AVX2 vectors) would be 80, which is no option: the nearest one, 64."""
    from tecc.autotune.records import Record
    from tecc.autotune.tune import foreign_candidates

    model = torch.nn.Linear(64, 1000).eval()
    inputs = (torch.randn(1, 64),)
    _, fused, _, _, info = fused_graph(model, inputs, "llvm:skylake-avx512", 3, None, None, {})
    dense = next(t for t in extract_tasks(fused, info.tvm_target)
                 if "tile_n" in t.template_obj.lane_knobs)
    options = next(k.options for k in dense.space.knobs if k.name == "tile_n")
    assert 8 not in options and 16 in options and 25 in options
    avx2 = {"kind": "llvm", "mcpu": "core-avx2", "num-cores": info.cores}
    measured = dict(dense.fallback_config().to_json(), tile_n=8)
    record = Record(target=avx2, workload=dense.workload, config=measured, costs_s=[1e-3])
    candidates, _ = foreign_candidates(dense, [record])
    assert [c.to_json() for c in candidates] == [dict(measured, tile_n=16)]
    assert 80 not in options
    wide = dict(measured, tile_n=40)
    record = Record(target=avx2, workload=dense.workload, config=wide, costs_s=[1e-3])
    candidates, _ = foreign_candidates(dense, [record])
    # the scaled config first, then the measured one, which is valid here too
    assert [c.to_json() for c in candidates] == [dict(wide, tile_n=64), wide]


def test_the_layout_chain_plan_asks_for_the_best_config_with_the_producers_block(tmp_path):
    """The only measured depthwise config reading the conv's block is a slow one: the
    plan asks for the fastest one with the conv's block."""
    from tecc.tuning import layout_chain_variants

    model, inputs = conv_depthwise_example()
    info = target_info("llvm")
    conv, depthwise = _conv_and_depthwise(info, model, inputs)
    written, read = _two_other_blocks(conv, depthwise)
    path = tmp_path / "local.jsonl"
    _write_retarget_record(path, info, conv,
                           dict(conv.fallback_config().to_json(), oc_bn=written), 1e-5)
    fallback = depthwise.fallback_config().to_json()
    dw_best = dict(fallback, c_bn=read, tile_ow=2)
    slow = dict(fallback, c_bn=written, tile_ow=1)
    _write_retarget_record(path, info, depthwise, dw_best, 1e-5)
    _write_retarget_record(path, info, depthwise, slow, 9e-5)
    variants = layout_chain_variants(import_model(model, inputs).func, info, path)
    assert variants == {workload_key(depthwise.workload): [dict(dw_best, c_bn=written)]}


@pytest.mark.parametrize("cache_flush", [None, True])
def test_retarget_times_its_candidates_as_tuning_does(foreign_chain, tmp_path, monkeypatch,
                                                      cache_flush):
    """A retarget session's timings sit next to a tuning run's in one file: its runner
    gets the options tune's does for the same target and `cache_flush` (cold weights
    when asked; a CUDA target cold unless told not to)."""
    from tecc.autotune import tune

    path, conv, depthwise, _, _ = foreign_chain
    seen = []

    class Recording(tune.LocalRunner):
        def __init__(self, **options):
            seen.append(options)
            super().__init__(**options)

    monkeypatch.setattr(tune, "LocalRunner", Recording)
    records = tmp_path / "local.jsonl"
    tune.retarget_tasks([conv, depthwise], [1, 1], load_records(path)[0], records, k=1,
                        rounds=1, progress=False, cache_flush=cache_flush)
    assert seen == [tune.runner_options_for(30.0, cache_flush, None, conv.target)]
    assert seen[0].get("cache_flush", False) is bool(cache_flush)
    assert all(r.ok for r in load_records(records)[0])
