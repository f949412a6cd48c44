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
    name = str(codegen.llvm_get_system_cpu())
    # a chip LLVM does not know is named by its x86-64 level (the test below)
    assert host.is_host and (host.cpu == name or name == "generic" and "x86-64" in host.cpu)
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


@pytest.mark.parametrize("level, lanes", [("x86-64-v4", 16), ("x86-64-v3", 8), ("x86-64-v2", 4)])
def test_a_host_llvm_does_not_know_gets_the_highest_level_its_flags_allow(monkeypatch, level,
                                                                         lanes):
    # a virtual machine that hides its chip's family and model: LLVM names it "generic",
    # and its code would use SSE2 only, though /proc/cpuinfo lists AVX-512
    from tvm.target import codegen

    import tecc.target as target_module

    flags = {cpu.LLVM_TO_CPUINFO[f] for f in target_info(f"llvm:{level}").features}
    if level != "x86-64-v4":  # one flag short of the next level
        flags |= {cpu.LLVM_TO_CPUINFO[f] for f in target_info("llvm:x86-64-v4").features}
        flags -= {"avx512f" if level == "x86-64-v3" else "avx2"}
    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: "generic")
    monkeypatch.setattr(cpu, "host_cpuinfo_flags", lambda: frozenset(flags))
    monkeypatch.setattr(cpu, "host_machine", lambda: "x86_64")
    # facts of the named level, read above, are not this (pretended) host's
    monkeypatch.setattr(target_module, "_INFO", {})
    target_module.host_llvm_cpu.cache_clear()
    try:
        with pytest.warns(UserWarning, match=rf"does not know this host's CPU.*'{level}'"):
            target = resolve_target("llvm")
        host = target_info(target)
        assert host.cpu == level and host.is_host and host.vector_lanes() == lanes
        assert cpu.missing_on_host(host.features, flags) == []
    finally:
        target_module.host_llvm_cpu.cache_clear()


def test_code_for_a_level_runs_and_matches_eager():
    # what such a host gets: a model built for x86-64-v3 (AVX2, which every x86 host of
    # the suite has) matches torch
    import torch

    import tecc
    from tests.models import MLP
    from tests.util import assert_close

    model = MLP().eval()
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    compiled = tecc.compile(model, (x,), target="llvm:x86-64-v3")
    fresh = torch.randn_like(x)
    with torch.no_grad():
        assert_close(compiled(fresh), model(fresh), rtol=1e-4, atol=1e-5)
