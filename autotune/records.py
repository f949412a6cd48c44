"""Tuning records: JSON Lines, one measurement a line, appended and flushed as each
is measured (a killed run loses nothing), and the choice of a config per workload.

A line:
  {"version": 1, "target": {...}, "workload": {...}, "config": {...},
   "costs_s": [...], "error": null | "kind: message", "timestamp": ...,
   "host": {"cpu": ..., "cores": ...}, "tecc": ..., "tvm": ...}
A line that does not parse or lacks a field is skipped; one warning counts them.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD_VERSION = 1
REQUIRED = ("version", "target", "workload", "config", "costs_s", "error")

# LLVM CPU names by the vector instruction set their code needs.
_AVX512 = ("skylake-avx512", "cascadelake", "cooperlake", "icelake-server", "icelake-client",
           "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5")
_AVX2 = ("haswell", "broadwell", "skylake", "core-avx2", "znver1", "znver2", "znver3",
         "alderlake", "raptorlake")


def workload_key(workload: dict[str, Any]) -> str:
    """Canonical JSON of a workload: the same string for the same layer anywhere."""
    return json.dumps(workload, sort_keys=True, separators=(",", ":"))


def isa_family(target: dict[str, Any]) -> str:
    """What code built for `target` needs from the machine: records of targets of one
    family are interchangeable starting points."""
    kind = target.get("kind", "llvm")
    if kind == "cuda":
        return f"cuda-{target.get('arch', 'sm_90')}"
    mcpu = str(target.get("mcpu", "generic"))
    if mcpu in _AVX512:
        return "x86-avx512"
    if mcpu in _AVX2:
        return "x86-avx2"
    return f"{kind}-{mcpu}"


def exact_target_key(target: dict[str, Any]) -> str:
    keys = ("kind", "mcpu", "arch", "num-cores")
    return json.dumps({k: target.get(k) for k in keys}, sort_keys=True)


def host_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count()}


@dataclass
class Record:
    target: dict[str, Any]
    workload: dict[str, Any]
    config: dict[str, Any]
    costs_s: list[float]
    error: str | None = None
    timestamp: float = 0.0
    host: dict[str, Any] | None = None
    tecc: str = ""
    tvm: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.costs_s)

    @property
    def cost(self) -> float:
        """Median measured seconds (inf for a failed candidate)."""
        return statistics.median(self.costs_s) if self.ok else float("inf")

    @property
    def key(self) -> str:
        return workload_key(self.workload)

    def to_json(self) -> dict[str, Any]:
        return {"version": RECORD_VERSION, "target": self.target, "workload": self.workload,
                "config": self.config, "costs_s": self.costs_s, "error": self.error,
                "timestamp": self.timestamp, "host": self.host, "tecc": self.tecc,
                "tvm": self.tvm}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ValueError(f"missing fields {missing}")
        if data["version"] != RECORD_VERSION:
            raise ValueError(f"version {data['version']!r}")
        if not isinstance(data["costs_s"], list) or not all(
                isinstance(c, int | float) for c in data["costs_s"]):
            raise ValueError("costs_s must be a list of numbers")
        if not isinstance(data["workload"], dict) or not isinstance(data["config"], dict):
            raise ValueError("workload and config must be objects")
        return cls(data["target"], data["workload"], data["config"],
                   [float(c) for c in data["costs_s"]], data["error"],
                   float(data.get("timestamp") or 0), data.get("host"),
                   str(data.get("tecc", "")), str(data.get("tvm", "")))


class RecordWriter:
    """Appends records to a JSON Lines file, flushed (and fsynced) one by one."""

    def __init__(self, path: str | os.PathLike, tecc_version: str = "", tvm_version: str = ""):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        self._host = host_info()
        self._versions = (tecc_version, tvm_version)

    def write(self, record: Record) -> None:
        if not record.timestamp:
            record.timestamp = time.time()
        record.host = record.host or self._host
        record.tecc = record.tecc or self._versions[0]
        record.tvm = record.tvm or self._versions[1]
        self._file.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _record_files(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.glob("*.jsonl"))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"tuning records {p} do not exist")
    return files


def load_records(paths: str | os.PathLike | Sequence[str | os.PathLike],
                 warn: bool = True) -> tuple[list[Record], int]:
    """All records of the given files or folders (*.jsonl), and how many lines were
    skipped as broken (one warning says how many and where)."""
    records: list[Record] = []
    skipped: dict[str, int] = {}
    for path in _record_files(paths):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    records.append(Record.from_json(json.loads(line)))
                except (ValueError, TypeError, AttributeError):
                    skipped[str(path)] = skipped.get(str(path), 0) + 1
    total = sum(skipped.values())
    if total and warn:
        where = ", ".join(f"{p}: {n}" for p, n in skipped.items())
        warnings.warn(f"skipped {total} broken tuning record line(s) ({where})", stacklevel=2)
    return records, total


@dataclass
class Choice:
    config: dict[str, Any] | None  # None: the template's fallback
    source: str  # "exact", "compatible" or "fallback"
    cost_s: float | None = None


class RecordDatabase:
    """The best measured config per (workload, target), for compile time."""

    def __init__(self, records: Iterable[Record] = ()) -> None:
        self._best: dict[tuple[str, str], Record] = {}
        self._best_family: dict[tuple[str, str], Record] = {}
        self._all: dict[tuple[str, str], list[Record]] = {}
        self._all_family: dict[tuple[str, str], list[Record]] = {}
        self.count = 0
        for r in records:
            self.add(r)

    @classmethod
    def load(cls, paths: str | os.PathLike | Sequence[str | os.PathLike] | None
             ) -> RecordDatabase:
        if not paths:
            return cls()
        records, _ = load_records(paths)
        return cls(records)

    def add(self, record: Record) -> None:
        self.count += 1
        if not record.ok:
            return
        for table, every, tkey in (
                (self._best, self._all, exact_target_key(record.target)),
                (self._best_family, self._all_family, isa_family(record.target))):
            key = (record.key, tkey)
            every.setdefault(key, []).append(record)
            if key not in table or record.cost < table[key].cost:
                table[key] = record

    def choose_where(self, workload: dict[str, Any], target: dict[str, Any],
                     wanted: Any) -> Choice | None:
        """The best record whose config satisfies `wanted(config)` (exact target, then
        compatible); None if no measured config does. For layout-aware choices: a
        config whose input layout matches the producer's avoids a transform."""
        key = workload_key(workload)
        for every, tkey, source in ((self._all, exact_target_key(target), "exact"),
                                    (self._all_family, isa_family(target), "compatible")):
            fits = [r for r in every.get((key, tkey), []) if wanted(r.config)]
            if fits:
                best = min(fits, key=lambda r: r.cost)
                return Choice(best.config, source, best.cost)
        return None

    def choose(self, workload: dict[str, Any], target: dict[str, Any]) -> Choice:
        key = workload_key(workload)
        exact = self._best.get((key, exact_target_key(target)))
        if exact is not None:
            return Choice(exact.config, "exact", exact.cost)
        compatible = self._best_family.get((key, isa_family(target)))
        if compatible is not None:
            return Choice(compatible.config, "compatible", compatible.cost)
        return Choice(None, "fallback")
