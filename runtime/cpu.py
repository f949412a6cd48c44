"""CPU instruction-set facts that both the compiler and the runtime need, in one table.

Feature names are LLVM's (`avx512f`, `sse4.1`, `avx512bf16`): that is what a target's
`mcpu`/`mattr` enable and what the code generator may use. The host reports the same
features under Linux's /proc/cpuinfo names (`avx512_bf16`, `sse4_1`, `pni`); this
module maps one onto the other. It imports nothing of TVM, so a deployment host can
check a package against its CPU with the runtime alone.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable

# LLVM feature -> /proc/cpuinfo flag, for the instruction-set extensions a kernel can
# use (tuning hints such as "fast-15bytenop" are not instructions and are not listed).
# Names that are spelled the same in both are listed too: the table is the whole set
# of features a package is checked for.
LLVM_TO_CPUINFO: dict[str, str] = {
    "sse": "sse", "sse2": "sse2", "sse3": "pni", "ssse3": "ssse3",
    "sse4.1": "sse4_1", "sse4.2": "sse4_2", "sse4a": "sse4a",
    "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c", "fma4": "fma4",
    "bmi": "bmi1", "bmi2": "bmi2", "lzcnt": "abm", "popcnt": "popcnt", "movbe": "movbe",
    "aes": "aes", "pclmul": "pclmulqdq", "vpclmulqdq": "vpclmulqdq", "vaes": "vaes",
    "gfni": "gfni", "sha": "sha_ni", "adx": "adx", "xsave": "xsave",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
    "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "avx512vp2intersect": "avx512_vp2intersect",
    "avxvnni": "avx_vnni", "avxifma": "avx_ifma", "avxvnniint8": "avx_vnni_int8",
    "amx-tile": "amx_tile", "amx-bf16": "amx_bf16", "amx-int8": "amx_int8",
    "amx-fp16": "amx_fp16",
    # aarch64
    "neon": "asimd", "fp-armv8": "fp", "fullfp16": "asimdhp", "dotprod": "asimddp",
    "sve": "sve", "sve2": "sve2", "i8mm": "i8mm", "bf16": "bf16",
}

X86_MACHINES = frozenset({"x86_64", "amd64", "i686", "i386", "x86"})
ARM_MACHINES = frozenset({"aarch64", "arm64"})


def isa_features(features: Iterable[str]) -> frozenset[str]:
    """The instruction-set extensions among LLVM `features` (tuning hints dropped)."""
    return frozenset(f for f in features if f in LLVM_TO_CPUINFO)


def vector_bits(features: Iterable[str]) -> int:
    """Width of the widest float32 vector unit these features give."""
    have = set(features)
    if "avx512f" in have:
        return 512
    if "avx2" in have or "avx" in have:
        return 256
    return 128


def isa_level(features: Iterable[str], machine: str = "x86_64") -> str:
    """A short name of the vector instruction set: records of one level share a
    vector width and the instructions their schedules assume."""
    have = set(features)
    if normalize_machine(machine) == "aarch64":
        return "aarch64-sve" if "sve" in have else "aarch64-neon"
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= have:
        return "x86-avx512"
    if {"avx2", "fma"} <= have:
        return "x86-avx2"
    return "x86-sse"


def normalize_machine(name: str) -> str:
    name = name.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def host_machine() -> str:
    return normalize_machine(platform.machine())


@functools.cache
def host_cpuinfo_flags() -> frozenset[str] | None:
    """This host's CPU flags from /proc/cpuinfo (x86 "flags", arm "Features"); None
    where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return None


# The /proc/cpuinfo fields that name a chip: x86's CPUID vendor, family, model and
# stepping; Arm's implementer, part and variant.
_CHIP_FIELDS = {"x86": ("vendor_id", "cpu family", "model", "stepping"),
                "arm": ("CPU implementer", "CPU part", "CPU variant", "CPU revision")}


@functools.cache
def host_cpu_id() -> str | None:
    """This host's chip as its CPUID (Arm: its MIDR) names it, e.g. "AuthenticAMD
    25-1-1": the same for every machine of one chip model and stepping (as a virtual
    machine presents it), whatever LLVM calls it; None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return chip_of_cpuinfo(f.read())
    except OSError:
        return None


def chip_of_cpuinfo(text: str) -> str | None:
    """The chip that /proc/cpuinfo's `text` names (its first processor's block)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    for names in _CHIP_FIELDS.values():
        if all(fields.get(n) for n in names):
            first, *rest = (fields[n] for n in names)
            return f"{first} {'-'.join(rest)}"
    return None


@functools.cache
def host_cpu_model() -> str:
    """The host CPU's marketing name, for records' provenance only."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_cores() -> int:
    """Cores this process may run on (affinity-aware: containers pin fewer cores)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@functools.cache
def host_cache_bytes(level: int) -> int | None:
    """Size of this host's level-`level` data or unified cache per core (sysfs)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            path = os.path.join(base, entry)
            with open(os.path.join(path, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() not in ("Data", "Unified"):
                    continue
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return None
    return None


def missing_on_host(features: Iterable[str], host_flags: Iterable[str]) -> list[str]:
    """The LLVM `features` (instruction-set ones) that a host with /proc/cpuinfo
    `host_flags` lacks, in the table's order (a base extension before its additions:
    avx512f before avx512bw)."""
    wanted, have = isa_features(features), set(host_flags)
    return [f for f in LLVM_TO_CPUINFO if f in wanted and LLVM_TO_CPUINFO[f] not in have]
