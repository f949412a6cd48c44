"""Tuning records: append-only JSON Lines, broken lines skipped with a count, and
the exact > fallback choice of a config."""

import json
import warnings

import pytest
from tecc.autotune.records import (
    Choice,
    Record,
    RecordDatabase,
    RecordWriter,
    isa_family,
    load_records,
)

AVX2 = {"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2}
ZEN = {"kind": "llvm", "mcpu": "znver3", "num-cores": 16}
AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
DENSE = {"template": "dense", "shapes": [[64, 128], [256, 128]], "dtype": "float32"}


def rec(target, cost, tile, error=None, workload=DENSE):
    return Record(target, workload, {"tile": tile}, [] if error else [cost, cost * 1.1],
                  error)


def test_round_trip_and_flush(tmp_path):
    path = tmp_path / "r.jsonl"
    with RecordWriter(path, "0.1.0", "0.27") as writer:
        writer.write(rec(AVX2, 1e-3, 4))
        # flushed per record: readable before the writer closes
        assert len(path.read_text().splitlines()) == 1
        writer.write(rec(AVX2, 0, 8, error="runtime: crashed"))
    records, skipped = load_records(path)
    assert skipped == 0 and len(records) == 2
    line = json.loads(path.read_text().splitlines()[0])
    assert {"version", "target", "workload", "config", "costs_s", "error", "timestamp",
            "host", "tecc", "tvm"} <= set(line)
    assert records[1].error == "runtime: crashed" and records[1].cost == float("inf")


def test_broken_lines_are_skipped_with_one_warning(tmp_path):
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as writer:
        writer.write(rec(AVX2, 1e-3, 4))
    with open(path, "a") as f:
        f.write("{not json\n")
        f.write(json.dumps({"version": 1, "target": AVX2}) + "\n")
        f.write('{"version": 1, "target": {}, "workload": {}, "config": {}, "costs_s": "x", '
                '"error": null}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, skipped = load_records([path])
    assert len(records) == 1 and skipped == 3
    assert len(caught) == 1 and "skipped 3 broken" in str(caught[0].message)


def test_choice_takes_the_exact_targets_records_else_the_fallback(tmp_path):
    db = RecordDatabase([rec(AVX2, 2e-3, 4), rec(AVX2, 1e-3, 8), rec(AVX2, 1e-4, 16,
                                                                       error="build: x"),
                         rec(ZEN, 5e-4, 32)])
    exact = db.choose(DENSE, AVX2)
    assert exact.source == "exact" and exact.config == {"tile": 8}
    # haswell: AVX2 as znver3, other features, znver3's core count: compatible, and
    # not applied
    compatible = db.choose(DENSE, {"kind": "llvm", "mcpu": "haswell", "num-cores": 16})
    assert compatible.source == "fallback" and compatible.config is None
    assert db.choose(DENSE, ZEN).config == {"tile": 32}
    assert db.choose(DENSE, AVX512).source == "fallback"
    other = dict(DENSE, shapes=[[1, 2], [3, 2]])
    assert db.choose(other, AVX2).config is None


def test_folders_merge(tmp_path):
    for i, target in enumerate([AVX2, AVX512]):
        with RecordWriter(tmp_path / f"{i}.jsonl") as w:
            w.write(rec(target, 1e-3, 4))
    records, _ = load_records(tmp_path)
    assert len(records) == 2
    with pytest.raises(FileNotFoundError):
        load_records(tmp_path / "missing.jsonl")


def test_isa_families():
    assert isa_family(AVX2) == isa_family(ZEN) == "x86-avx2"
    assert isa_family(AVX512) == "x86-avx512"
    assert isa_family({"kind": "cuda", "arch": "sm_90"}) == "cuda-sm_90"


def test_isa_family_comes_from_the_cpus_features_not_its_name():
    # CPUs no name table listed: LLVM's features of each decide
    assert isa_family({"kind": "llvm", "mcpu": "x86-64-v3"}) == "x86-avx2"
    assert isa_family({"kind": "llvm", "mcpu": "x86-64-v4"}) == "x86-avx512"
    assert isa_family({"kind": "llvm", "mcpu": "znver4", "num-cores": 64}) == "x86-avx512"
    assert isa_family({"kind": "llvm", "mcpu": "emeraldrapids"}) == isa_family(AVX512)
    assert isa_family({"kind": "llvm", "mcpu": "x86-64"}) == "x86-sse"
    # a CPU this LLVM does not know matches only itself
    assert isa_family({"kind": "llvm", "mcpu": "notacpu"}) == "llvm-notacpu"


def test_records_of_an_earlier_host_name_are_exact():
    # records measured when the host was named sapphirerapids serve it as emeraldrapids:
    # LLVM gives both names one feature set
    db = RecordDatabase([rec({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2},
                             1e-3, 8)])
    choice = db.choose(DENSE, {"kind": "llvm", "mcpu": "emeraldrapids", "num-cores": 2})
    assert choice.source == "exact" and choice.config == {"tile": 8}
    assert db.choose(DENSE, AVX2).source == "fallback"  # AVX2: another ISA level


def test_host_info_names_the_cpu_and_its_usable_cores():
    import os

    from tecc.autotune.records import host_info

    info = host_info()
    assert isinstance(info["cpu"], str) and info["cpu"]
    assert info["cores"] == len(os.sched_getaffinity(0))


def test_choose_where_prefers_a_matching_layout():
    conv = {"template": "conv2d_NCHWc", "data": [1, 64, 56, 56]}
    records = [Record(AVX2, conv, {"ic_bn": 16, "oc_bn": 8}, [1e-3], None),
               Record(AVX2, conv, {"ic_bn": 8, "oc_bn": 8}, [1.2e-3], None),
               Record(AVX2, conv, {"ic_bn": 8, "oc_bn": 16}, [0.9e-3], "run_timeout: x")]
    db = RecordDatabase(records)
    assert db.choose(conv, AVX2).config == {"ic_bn": 16, "oc_bn": 8}
    match = db.choose_where(conv, AVX2, lambda c: c["ic_bn"] == 8)
    assert match.config == {"ic_bn": 8, "oc_bn": 8} and match.source == "exact"
    assert db.choose_where(conv, AVX2, lambda c: c["ic_bn"] == 4) is None


def _session(name: str, timestamp: float, costs: dict[int, list[float | None]]) -> list[Record]:
    """One verification session: per tile, one record per round (None: that round failed)."""
    return [Record(AVX2, DENSE, {"tile": tile}, [] if c is None else [c],
                   None if c is not None else "run_error: crashed", timestamp, verify=name)
            for tile, rounds in costs.items() for c in rounds]


def test_latest_verification_session_decides_by_median(tmp_path):
    lucky = [rec(AVX2, 1.0e-3, 4), rec(AVX2, 1.5e-3, 8), rec(AVX2, 1.2e-3, 16)]
    for r in lucky:  # measured before the sessions
        r.timestamp = 5.0
    older = _session("s1", 10.0, {4: [2e-3] * 3, 16: [0.5e-3] * 3})
    latest = _session("s2", 20.0, {4: [2.0e-3, 1.0e-3, 2.1e-3], 8: [1.4e-3, 3.0e-3, 1.5e-3],
                                   16: [0.4e-3, None, 0.4e-3]})
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as writer:
        for r in lucky + older + latest:
            writer.write(r)
    records, skipped = load_records(path)
    assert skipped == 0 and sum(r.verify == "s2" for r in records) == 9
    db = RecordDatabase(records)
    # the single lucky measurement (tile 4) and the config that failed a round (16) lose
    choice = db.choose(DENSE, AVX2)
    assert choice.config == {"tile": 8} and choice.cost_s == pytest.approx(1.5e-3)
    assert db.choose_where(DENSE, AVX2, lambda c: c["tile"] != 8).config == {"tile": 4}
    # no session among the configs that fit: the best single measurement
    assert RecordDatabase(lucky + older).choose_where(
        DENSE, AVX2, lambda c: c["tile"] == 8).config == {"tile": 8}
    # not on a compatible target (same width and cores, other features)
    assert RecordDatabase(records).choose(DENSE, dict(ZEN, **{"num-cores": 2})
                                          ).config is None

    from tecc.autotune.records import best_records

    kept = best_records(records)
    assert {r.verify for r in kept} == {"s2"} and len(kept) == 9
    assert [r.config for r in best_records(lucky)] == [{"tile": 4}]


def test_measurements_after_the_latest_session_decide_by_the_best_single_one():
    """A tuning run stopped before its verification (killed, or out of time) measured
    configs the older session never saw: the session no longer decides alone."""
    session = _session("s1", 10.0, {4: [2e-3] * 3, 8: [3e-3] * 3})
    later = rec(AVX2, 1.0e-3, 16)
    later.timestamp = 11.0
    assert RecordDatabase(session).choose(DENSE, AVX2).config == {"tile": 4}
    choice = RecordDatabase([*session, later]).choose(DENSE, AVX2)
    assert choice.config == {"tile": 16} and choice.cost_s == pytest.approx(later.cost)
    # a failed later measurement leaves the session deciding
    failed = rec(AVX2, 1.0e-3, 32, error="run_error: crashed")
    failed.timestamp = 12.0
    assert RecordDatabase([*session, failed]).choose(DENSE, AVX2).config == {"tile": 4}

    from tecc.autotune.records import best_records

    assert [r.config for r in best_records([*session, later])] == [{"tile": 16}]


def test_verify_field_must_name_a_session(tmp_path):
    path = tmp_path / "r.jsonl"
    good = rec(AVX2, 1e-3, 4)
    good.verify = "s1"
    bad = dict(good.to_json(), verify=3)
    path.write_text(json.dumps(good.to_json()) + "\n" + json.dumps(bad) + "\n")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        records, skipped = load_records(path)
    assert skipped == 1 and records[0].verify == "s1"


# -- how a record's target relates to the compile target: ISA features and cores

HASWELL = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
EMERALD = {"kind": "llvm", "mcpu": "emeraldrapids", "num-cores": 2}


def test_another_cpu_name_with_identical_features_is_exact():
    from tecc.autotune.records import target_relation

    # LLVM gives core-avx2 and haswell one feature set: the name does not matter
    assert target_relation(AVX2, HASWELL) == "exact"
    choice = RecordDatabase([rec(AVX2, 1e-3, 8)]).choose(DENSE, HASWELL)
    assert choice.source == "exact" and choice.config == {"tile": 8}


def test_same_vector_width_and_cores_other_features_is_compatible_and_not_applied():
    """Records of another CPU model of the same vector width ran models slower than the
    fallbacks (results/retarget_rocketlake.md): they are retargeted, not applied."""
    from tecc.autotune.records import target_relation

    assert target_relation(AVX512, EMERALD) == "compatible"  # skylake-avx512: fewer features
    db = RecordDatabase([rec(AVX512, 1e-4, 8), rec(AVX2, 1e-4, 4)])
    assert db.choose(DENSE, EMERALD) == Choice(None, "fallback")
    assert db.choose(DENSE, AVX512).config == {"tile": 8}
    # a record of the exact target applies, however slower than the compatible one
    db.add(rec(dict(EMERALD, mcpu="sapphirerapids"), 2e-3, 16))
    assert db.choose(DENSE, EMERALD).config == {"tile": 16}


def test_other_core_counts_and_other_widths_are_foreign_and_not_applied():
    from tecc.autotune.records import target_relation

    more_cores = dict(EMERALD, **{"num-cores": 16})
    assert target_relation(more_cores, EMERALD) == "foreign"
    assert target_relation(AVX2, EMERALD) == "foreign"
    assert target_relation(dict(AVX2, **{"num-cores": 4}), HASWELL) == "foreign"
    db = RecordDatabase([rec(more_cores, 1e-4, 8), rec(AVX2, 1e-4, 4)])
    assert db.choose(DENSE, EMERALD).source == "fallback"
    assert db.choose(DENSE, dict(HASWELL, **{"num-cores": 16})).source == "fallback"


def test_an_unknown_cpu_matches_only_its_identical_target():
    from tecc.autotune.records import target_relation

    unknown = {"kind": "llvm", "mcpu": "notacpu", "num-cores": 2}
    assert target_relation(unknown, dict(unknown)) == "exact"
    assert target_relation(unknown, dict(unknown, mtriple="x86_64-linux-gnu")) == "foreign"
    assert target_relation(unknown, AVX2) == "foreign"
    db = RecordDatabase([rec(unknown, 1e-3, 8)])
    assert db.choose(DENSE, unknown).source == "exact"
    assert db.choose(DENSE, AVX2).source == "fallback"


def test_cuda_records_relate_by_arch():
    from tecc.autotune.records import target_relation

    h100 = {"kind": "cuda", "arch": "sm_90"}
    assert target_relation(h100, dict(h100, **{"max_num_threads": 1024})) == "exact"
    assert target_relation({"kind": "cuda", "arch": "sm_80"}, h100) == "foreign"


def test_a_retarget_session_is_reported_until_a_later_session_decides():
    from tecc.autotune.records import RETARGET_SESSION

    retarget = _session(RETARGET_SESSION + "1", 10.0, {4: [2e-3] * 3, 8: [1e-3] * 3})
    db = RecordDatabase([rec(AVX2, 0.5e-3, 16), *retarget])
    choice = db.choose(DENSE, AVX2)
    assert choice.source == "retargeted" and choice.config == {"tile": 8}
    db = RecordDatabase([*retarget, *_session("2", 20.0, {8: [1e-3] * 3, 16: [0.9e-3] * 3})])
    choice = db.choose(DENSE, AVX2)
    assert choice.source == "exact" and choice.config == {"tile": 16}


def test_the_chip_is_read_from_cpuinfo_on_x86_and_arm():
    from tecc.runtime.cpu import chip_of_cpuinfo

    x86 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
           "model name\t: AMD EPYC\nstepping\t: 1\n\nprocessor\t: 1\nvendor_id\t: Other\n")
    assert chip_of_cpuinfo(x86) == "AuthenticAMD 25-1-1"
    arm = ("processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\n"
           "CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd0c\nCPU revision\t: 1\n")
    assert chip_of_cpuinfo(arm) == "0x41 0xd0c-0x1-1"
    assert chip_of_cpuinfo("processor\t: 0\nmodel name\t: QEMU\n") is None
