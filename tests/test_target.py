"""Target facts (tecc.target) and the CPU feature table (tecc.runtime.cpu): the host
named by LLVM, named CPUs by LLVM's features, unknown names refused."""

import pytest
from tecc.runtime import cpu

from tecc.target import resolve_target, target_from_json, target_info, target_to_json


def test_unknown_cpu_is_refused():
    with pytest.raises(ValueError, match=r"unknown CPU 'notacpu'.*e\.g\. skylake-avx512"):
        resolve_target("llvm:notacpu")
    with pytest.raises(ValueError, match="unknown CPU 'notacpu'"):
        target_from_json({"kind": "llvm", "mcpu": "notacpu"})
    with pytest.raises(ValueError, match="unknown target"):
        resolve_target("opencl")


def test_the_host_is_named_by_llvm_and_can_run_its_own_code():
    from tvm.target import codegen

    host = target_info("llvm")
    assert host.is_host and host.cpu == str(codegen.llvm_get_system_cpu())
    assert host.cores == cpu.host_cores()
    flags = cpu.host_cpuinfo_flags()
    assert flags is not None and cpu.missing_on_host(host.features, flags) == []
    assert host.features and host.features <= set(cpu.LLVM_TO_CPUINFO)


def test_the_host_turns_off_what_its_cpu_name_implies_but_it_lacks(monkeypatch):
    # a virtual machine that LLVM names sapphirerapids but that hides AMX from its guest
    import tecc.target as target_module

    implied = target_info("llvm:sapphirerapids").features
    assert {"amx-tile", "amx-bf16", "amx-int8"} <= implied
    flags = {cpu.LLVM_TO_CPUINFO[f] for f in implied if not f.startswith("amx")}
    monkeypatch.setattr(target_module, "host_llvm_cpu", lambda: "sapphirerapids")
    monkeypatch.setattr(cpu, "host_cpuinfo_flags", lambda: frozenset(flags))
    target = resolve_target("llvm")
    host = target_info(target)
    assert host.cpu == "sapphirerapids" and host.is_host
    assert not {f for f in host.features if f.startswith("amx")}
    assert "avx512fp16" in host.features and cpu.missing_on_host(host.features, flags) == []
    # the features travel with the target into records and manifests
    data = target_to_json(target)
    assert data["mattr"] == ["-amx-tile", "-amx-bf16", "-amx-int8"]
    assert target_info(target_from_json(data)).features == host.features


def test_named_cpus_get_llvms_features_and_no_host_readings():
    zen4 = target_info("llvm:znver4")
    assert {"avx512f", "avx512bw", "avx512vl", "avx512bf16"} <= zen4.features
    assert zen4.isa_level == "x86-avx512" and zen4.vector_lanes() == 16
    avx2 = target_info("llvm:core-avx2")
    assert avx2.isa_level == "x86-avx2" and avx2.vector_lanes() == 8
    assert avx2.vector_lanes("float64") == 4 and "avx512f" not in avx2.features
    if not avx2.is_host:  # caches of a named CPU are defaults, not this machine's
        assert avx2.l2_bytes == 256 * 1024
    assert target_info("llvm:x86-64-v3").isa_level == "x86-avx2"


def test_json_round_trip():
    target = resolve_target("llvm:skylake-avx512")
    data = target_to_json(target)
    assert data == {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": cpu.host_cores()}
    again = target_info(target_from_json(data))
    assert again.features == target_info(target).features
    assert target_info("cuda:sm_80").isa_level == "cuda-sm_80"


def test_missing_features_are_named_by_llvm_base_first():
    flags = {"sse", "sse2", "avx", "avx2", "fma"}
    assert cpu.missing_on_host({"avx2", "avx512bw", "avx512f", "sse4.1", "fast-gather"},
                               flags) == ["sse4.1", "avx512f", "avx512bw"]
    assert cpu.isa_level({"avx2", "fma"}) == "x86-avx2"
    assert cpu.isa_level({"neon"}, "arm64") == "aarch64-neon"
