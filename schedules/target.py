"""Targets from the short strings users type: "llvm", "llvm:<cpu>", "cuda", "cuda:sm_90".

TVM 0.27 takes targets as JSON dicts; `mcpu="native"` silently falls back to a
generic CPU on LLVM 22, so for "llvm" we detect the host's features ourselves and
name a real LLVM cpu (see TVM_NOTES.md).
"""

from __future__ import annotations

import os
import platform
from typing import Any

import tvm

# LLVM cpu names whose vector unit is 512 bits wide (16 float32 lanes).
AVX512_CPUS = {
    "skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
    "icelake-server", "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids",
    "graniterapids-d", "znver4", "znver5", "x86-64-v4", "rocketlake", "knl", "knm",
}
# 256-bit AVX2 cpus (8 float32 lanes).
AVX2_CPUS = {
    "core-avx2", "haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
    "arrowlake", "lunarlake", "gracemont", "znver1", "znver2", "znver3", "x86-64-v3",
    "bdver4",
}

DEFAULT_CUDA_ARCH = "sm_90"


def _cpu_flags() -> set[str]:
    """CPU feature flags of this host, from /proc/cpuinfo (x86 "flags", arm "Features")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def host_num_cores() -> int:
    """Cores this process may run on (affinity-aware: containers pin fewer cores)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def host_cpu_info() -> dict[str, Any]:
    """What `resolve_target("llvm")` needs: arch, LLVM cpu name, cores, vector flags."""
    machine = platform.machine().lower()
    flags = _cpu_flags()
    if machine in ("aarch64", "arm64"):
        mcpu = "generic"
        isa = "neon"
    elif machine in ("x86_64", "amd64", "i686", "i386", "x86"):
        avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
        if avx512 <= flags:
            # Newer names only when their defining features are present; skylake-avx512
            # is the safe floor every AVX-512 server CPU supports.
            if {"amx_tile", "amx_bf16", "avx512_bf16"} <= flags:
                mcpu = "sapphirerapids"
            elif {"avx512_vnni", "avx512_vbmi2", "avx512ifma"} <= flags and "gfni" in flags:
                mcpu = "icelake-server"
            else:
                mcpu = "skylake-avx512"
            isa = "avx512"
        elif {"avx2", "fma"} <= flags:
            mcpu, isa = "core-avx2", "avx2"
        else:
            mcpu, isa = "x86-64", "sse"
    else:
        mcpu, isa = "generic", "unknown"
    return {
        "arch": machine,
        "mcpu": mcpu,
        "isa": isa,
        "num_cores": host_num_cores(),
        "model": platform.processor() or machine,
    }


def resolve_target(spec: str | tvm.target.Target = "llvm") -> tvm.target.Target:
    """A TVM Target from a short string; a Target passes through unchanged."""
    if isinstance(spec, tvm.target.Target):
        return spec
    kind, _, detail = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "llvm":
        info = host_cpu_info()
        config: dict[str, Any] = {"kind": "llvm", "num-cores": info["num_cores"]}
        mcpu = detail or info["mcpu"]
        if info["arch"] in ("aarch64", "arm64") and not detail:
            config["mtriple"] = "aarch64-linux-gnu"
            config["mattr"] = ["+neon"]
        config["mcpu"] = mcpu
        return tvm.target.Target(config)
    if kind == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": detail or DEFAULT_CUDA_ARCH})
    raise ValueError(f"unknown target {spec!r}: use llvm, llvm:<cpu>, cuda or cuda:sm_XX")


def _attr(target: tvm.target.Target, key: str) -> Any:
    return target.attrs.get(key)


def target_mcpu(target: tvm.target.Target) -> str:
    mcpu = _attr(target, "mcpu")
    return str(mcpu) if mcpu is not None else ""


def vector_lanes(target: tvm.target.Target, dtype: str = "float32") -> int:
    """SIMD lanes of `dtype` for the target's vector unit (AVX-512: 512 bits)."""
    bits = 128
    if target.kind.name == "llvm":
        mcpu = target_mcpu(target)
        mattr = [str(a) for a in (_attr(target, "mattr") or [])]
        if mcpu in AVX512_CPUS or "+avx512f" in mattr:
            bits = 512
        elif mcpu in AVX2_CPUS or "+avx2" in mattr:
            bits = 256
    elif target.kind.name == "cuda":
        bits = 128  # one float4 load; schedules for GPU pick their own widths
    elem_bits = 8 if dtype == "bool" else tvm.runtime.DataType(dtype).bits
    return max(1, bits // max(elem_bits, 8))


def num_cores(target: tvm.target.Target) -> int:
    """Cores the target runs on: its "num-cores" attribute, else this host's."""
    n = _attr(target, "num-cores")
    return int(n) if n is not None and int(n) > 0 else host_num_cores()


def target_to_json(target: tvm.target.Target) -> dict[str, Any]:
    """The stable fields of a target for manifests and tuning records."""
    out: dict[str, Any] = {"kind": target.kind.name}
    for key in ("mcpu", "num-cores", "arch", "mtriple"):
        value = _attr(target, key)
        if value is not None:
            out[key] = int(value) if key == "num-cores" else str(value)
    return out
