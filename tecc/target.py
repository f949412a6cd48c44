"""Target facts, in one place: what a pass or a template may assume about the machine
the code is compiled for.

`target_info(target)` derives them from the target alone. Only where the target *is*
this host (the short string "llvm") do host readings enter: its CPU named by LLVM,
its core count and its cache sizes. A named CPU ("llvm:znver4") gets LLVM's feature
set for that CPU and table defaults for what LLVM does not know (caches), never the
build host's, so a package compiled for another machine does not depend on the one
that built it.

A leaf module: it imports TVM and tecc.runtime.cpu only, so every stage may use it.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import tvm

from tecc.runtime import cpu

DEFAULT_CUDA_ARCH = "sm_90"

# What LLVM does not say about a CPU: cache sizes per core. Used for named CPUs that
# are not the host. Server cores of the AVX-512 era have 1-2 MiB of L2; older and
# desktop cores 256-512 KiB.
_DEFAULT_L1D = 32 * 1024
_DEFAULT_L2 = {"x86-avx512": 1024 * 1024, "x86-avx2": 256 * 1024}
_DEFAULT_L2_OTHER = 512 * 1024

# CUDA compute capability -> (shared memory per block usable without opt-in, per SM,
# L2 bytes, multiprocessors of the usual part). Per-block limits are the architecture's;
# L2 and SM counts are those of the data-center part of each generation.
_CUDA_ARCHS: dict[str, dict[str, int]] = {
    "sm_70": {"smem_block": 48 * 1024, "smem_sm": 96 * 1024, "l2": 6 << 20, "sms": 80},
    "sm_75": {"smem_block": 48 * 1024, "smem_sm": 64 * 1024, "l2": 4 << 20, "sms": 40},
    "sm_80": {"smem_block": 48 * 1024, "smem_sm": 164 * 1024, "l2": 40 << 20, "sms": 108},
    "sm_86": {"smem_block": 48 * 1024, "smem_sm": 100 * 1024, "l2": 6 << 20, "sms": 84},
    "sm_89": {"smem_block": 48 * 1024, "smem_sm": 100 * 1024, "l2": 72 << 20, "sms": 128},
    "sm_90": {"smem_block": 48 * 1024, "smem_sm": 228 * 1024, "l2": 50 << 20, "sms": 132},
}


@dataclass(frozen=True)
class TargetInfo:
    """Facts about one compilation target. `kind` is "llvm" or "cuda"."""

    kind: str
    tvm_target: tvm.target.Target = field(compare=False, repr=False)
    # CPU (llvm)
    machine: str = ""  # x86_64 / aarch64
    cpu: str = ""  # LLVM cpu name (mcpu)
    features: frozenset[str] = frozenset()  # LLVM instruction-set features enabled
    cores: int = 1
    l1d_bytes: int = _DEFAULT_L1D
    l2_bytes: int = _DEFAULT_L2_OTHER
    is_host: bool = False
    # CUDA
    arch: str = ""  # sm_XX
    max_threads_per_block: int = 0
    max_shared_memory_per_block: int = 0
    max_shared_memory_per_sm: int = 0
    warp_size: int = 0
    multiprocessors: int = 0

    @property
    def is_cpu(self) -> bool:
        return self.kind == "llvm"

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def vector_bits(self) -> int:
        """Width of the vector unit (CUDA: one 128-bit load per thread)."""
        return cpu.vector_bits(self.features) if self.is_cpu else 128

    def vector_lanes(self, dtype: str = "float32") -> int:
        """SIMD lanes of `dtype` in the target's vector unit (AVX-512: 16 float32)."""
        elem_bits = 8 if dtype == "bool" else tvm.runtime.DataType(dtype).bits
        return max(1, self.vector_bits // max(elem_bits, 8))

    @property
    def isa_level(self) -> str:
        """Records of one level are interchangeable starting points ("x86-avx512",
        "x86-avx2", "cuda-sm_90")."""
        if self.is_gpu:
            return f"cuda-{self.arch}"
        return cpu.isa_level(self.features, self.machine)

    def to_json(self) -> dict[str, Any]:
        """The stable fields of the target for manifests and tuning records."""
        return target_to_json(self.tvm_target)


def _attr(target: tvm.target.Target, key: str) -> Any:
    return target.attrs.get(key)


def _llvm_features(target: tvm.target.Target) -> frozenset[str]:
    from tvm.target import codegen

    return cpu.isa_features(str(f) for f in codegen.llvm_get_cpu_features(target))


# What LLVM calls an x86 host whose chip it does not know (a virtual machine that hides
# the CPUID family and model, a chip newer than LLVM): code for it would use SSE2 only.
_UNKNOWN_X86_CPU = "generic"
# x86-64 psABI levels, highest first: LLVM knows each as a CPU name with its features.
_X86_LEVELS = ("x86-64-v4", "x86-64-v3", "x86-64-v2")


@functools.cache
def host_llvm_cpu() -> str:
    """This host's CPU as LLVM names it (`emeraldrapids`, `znver4`); where LLVM does not
    know the chip, the highest x86-64 level (`x86-64-v4`: AVX-512) the host's own
    /proc/cpuinfo flags allow, with a warning."""
    from tvm.target import codegen

    name = str(codegen.llvm_get_system_cpu())
    flags = cpu.host_cpuinfo_flags()
    if name != _UNKNOWN_X86_CPU or cpu.host_machine() != "x86_64" or flags is None:
        return name
    triple = str(codegen.llvm_get_system_triple())
    level = next((lv for lv in _X86_LEVELS if not _absent_features(lv, triple, flags)), name)
    warnings.warn(
        f"LLVM does not know this host's CPU (CPUID {cpu.host_cpu_id()}, named {name!r}): "
        f"tecc builds for {level!r}, the highest x86-64 level its flags allow; name the "
        "chip (target='llvm:<cpu>', e.g. znver4) if you know it, for code tuned to it",
        stacklevel=2)
    return level


def host_absent_features(config: Mapping[str, Any]) -> list[str]:
    """The instruction-set features the host's CPU name implies to LLVM but this host
    does not report (a virtual machine that hides AMX from an Emerald Rapids guest):
    the host target turns them off, so its code, and the package's manifest, never
    need them."""
    have = cpu.host_cpuinfo_flags()
    if have is None:
        return []
    return list(_absent_features(str(config["mcpu"]), str(config.get("mtriple") or ""), have))


@functools.cache
def _absent_features(mcpu: str, triple: str, have: frozenset[str]) -> tuple[str, ...]:
    # once per CPU name and flags: LLVM's feature query costs about 0.4 ms, and
    # target_info("llvm") resolves the host target on every call
    config = {"kind": "llvm", "mcpu": mcpu, **({"mtriple": triple} if triple else {})}
    return tuple(cpu.missing_on_host(_llvm_features(tvm.target.Target(config)), have))


def _cpu_info(target: tvm.target.Target) -> TargetInfo:
    mcpu = str(_attr(target, "mcpu") or "")
    triple = str(_attr(target, "mtriple") or "")
    machine = cpu.normalize_machine(triple.split("-")[0]) if triple else cpu.host_machine()
    features = _llvm_features(target)
    # The host's readings apply to code for the host's own CPU model, whichever way
    # the target was spelled; any other CPU gets defaults.
    is_host = machine == cpu.host_machine() and mcpu == host_llvm_cpu()
    cores = _attr(target, "num-cores")
    level = cpu.isa_level(features, machine)
    l1d, l2 = _DEFAULT_L1D, _DEFAULT_L2.get(level, _DEFAULT_L2_OTHER)
    if is_host:
        l1d = cpu.host_cache_bytes(1) or l1d
        l2 = cpu.host_cache_bytes(2) or l2
    return TargetInfo(
        kind="llvm", tvm_target=target, machine=machine, cpu=mcpu, features=features,
        cores=int(cores) if cores is not None and int(cores) > 0 else cpu.host_cores(),
        l1d_bytes=l1d, l2_bytes=l2, is_host=is_host)


def _cuda_info(target: tvm.target.Target) -> TargetInfo:
    arch = str(_attr(target, "arch") or DEFAULT_CUDA_ARCH)
    facts = _CUDA_ARCHS.get(arch, _CUDA_ARCHS[DEFAULT_CUDA_ARCH])
    threads = _attr(target, "max_num_threads") or 1024
    smem = _attr(target, "max_shared_memory_per_block") or facts["smem_block"]
    warp = _attr(target, "thread_warp_size") or 32
    return TargetInfo(kind="cuda", tvm_target=target, arch=arch,
                      max_threads_per_block=int(threads),
                      max_shared_memory_per_block=int(smem),
                      max_shared_memory_per_sm=facts["smem_sm"], warp_size=int(warp),
                      multiprocessors=facts["sms"], l2_bytes=facts["l2"])


def _target_key(target: tvm.target.Target) -> str:
    return json.dumps(target.export(), sort_keys=True, default=str)


_INFO: dict[str, TargetInfo] = {}


def target_info(target: str | Mapping[str, Any] | tvm.target.Target | TargetInfo
                ) -> TargetInfo:
    """The facts of `target` (a short string, its JSON, a TVM Target, or facts)."""
    if isinstance(target, TargetInfo):
        return target
    target = resolve_target(target)
    key = _target_key(target)
    if key not in _INFO:
        kind = target.kind.name
        if kind == "llvm":
            _INFO[key] = _cpu_info(target)
        elif kind == "cuda":
            _INFO[key] = _cuda_info(target)
        else:
            raise ValueError(f"target kind {kind!r} is not supported: use llvm or cuda")
    return _INFO[key]


def resolve_target(spec: str | Mapping[str, Any] | tvm.target.Target | TargetInfo = "llvm"
                   ) -> tvm.target.Target:
    """A TVM Target from a short string ("llvm", "llvm:<cpu>", "cuda", "cuda:sm_XX");
    a Target passes through unchanged. "llvm" is this host, its CPU named by LLVM; an
    unknown CPU name is an error, not a silent generic build."""
    if isinstance(spec, tvm.target.Target):
        return spec
    if isinstance(spec, TargetInfo):
        return spec.tvm_target
    if isinstance(spec, Mapping):  # a record's or a manifest's target
        return target_from_json(spec)
    kind, _, detail = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "llvm":
        config: dict[str, Any] = {"kind": "llvm"}
        if detail:
            from tvm.target import codegen

            if not codegen.llvm_is_valid_cpu(detail, str(codegen.llvm_get_system_triple())):
                raise ValueError(f"unknown CPU {detail!r} in target {spec!r}: LLVM knows no such "
                                 f"cpu (e.g. skylake-avx512, znver4, core-avx2)")
            config["mcpu"] = detail
            config["num-cores"] = cpu.host_cores()
        else:
            config["mcpu"] = host_llvm_cpu()
            config["num-cores"] = cpu.host_cores()
            if cpu.host_machine() == "aarch64":
                config["mtriple"] = "aarch64-linux-gnu"
            absent = host_absent_features(config)
            if absent:
                config["mattr"] = [f"-{f}" for f in absent]
        return tvm.target.Target(config)
    if kind == "cuda":
        arch = detail or DEFAULT_CUDA_ARCH
        facts = _CUDA_ARCHS.get(arch, _CUDA_ARCHS[DEFAULT_CUDA_ARCH])
        return tvm.target.Target({
            "kind": "cuda", "arch": arch, "max_num_threads": 1024, "max_threads_per_block": 1024,
            "thread_warp_size": 32,
            "max_shared_memory_per_block": facts["smem_block"]})
    raise ValueError(f"unknown target {spec!r}: use llvm, llvm:<cpu>, cuda or cuda:sm_XX")


def target_from_json(data: Mapping[str, Any]) -> tvm.target.Target:
    """The Target that `target_to_json` wrote `data` for (a tuning record's or a
    manifest's target). A CPU LLVM does not know is an error, as in resolve_target."""
    kind = str(data.get("kind") or "llvm")
    config: dict[str, Any] = {"kind": kind}
    for key in ("mcpu", "num-cores", "arch", "mtriple", "mattr"):
        if data.get(key) is not None:
            config[key] = data[key]
    if kind == "llvm" and config.get("mcpu"):
        from tvm.target import codegen

        triple = str(config.get("mtriple") or codegen.llvm_get_system_triple())
        if not codegen.llvm_is_valid_cpu(str(config["mcpu"]), triple):
            raise ValueError(f"unknown CPU {config['mcpu']!r} in target {dict(data)}: LLVM "
                             f"knows no such cpu")
    return tvm.target.Target(config)


def target_to_json(target: tvm.target.Target) -> dict[str, Any]:
    """The stable fields of a target for manifests and tuning records."""
    out: dict[str, Any] = {"kind": target.kind.name}
    for key in ("mcpu", "num-cores", "arch", "mtriple"):
        value = _attr(target, key)
        if value is not None:
            out[key] = int(value) if key == "num-cores" else str(value)
    mattr = _attr(target, "mattr")
    if mattr:  # features turned off (host_absent_features)
        out["mattr"] = [str(f) for f in mattr]
    return out
