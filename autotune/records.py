"""Tuning records: JSON Lines, one measurement a line, appended and flushed as each
is measured (a killed run loses nothing), and the choice of a config per workload.

A line:
  {"version": 1, "target": {...}, "workload": {...}, "config": {...},
   "costs_s": [...], "error": null | "kind: message", "timestamp": ...,
   "host": {"cpu": ..., "cpu_id": ..., "cores": ...}, "tecc": ..., "tvm": ...}
A line that does not parse, lacks a field or holds a cost that is not finite positive
seconds is skipped; one warning counts them. A tuning run holds records_lock on its
file.

A line may also carry "verify": "<session>": a re-measurement at the end of tuning,
where a task's best configs and its fallback ran in interleaved rounds (one line per
config and round). A single measurement can be lucky or unlucky by 2x on a busy
machine; the rounds of one session ran under the same conditions, so at compile time
the latest session decides (lowest median over its rounds), the other lines only
where a workload has no session, or where measurements are later than its latest
session (a run stopped before it verified): then the best single measurement.

Which records serve a compile target is decided by what the code needs from the
machine and what it was timed with, never by CPU names (`target_relation`):
  "exact"       the record's target has the identical LLVM ISA feature set (the
                features LLVM gives its mcpu, tecc.target.TargetInfo.features) and
                the same core count (CUDA: the same arch): applied as it is;
  "compatible"  the same vector width (TargetInfo.isa_level) and core count, other
                features (another CPU model, or the same chip under another LLVM
                name): not applied at compile time either. A config is fast for the
                code LLVM generates for its target and for the fallback of its day:
                the emeraldrapids records, applied as they are on a host LLVM calls
                rocketlake, ran ResNet-18 1.08x and MobileNetV2 1.03x slower than the
                fallbacks, and retargeted there they did not
                (benchmarks/results/retarget_rocketlake.md);
  "foreign"     another vector width or core count: never applied at compile time.
A compatible record measured on this very chip (its host's cpu_id, the CPUID vendor,
family, model and stepping, equals this host's, and the compile target is this host)
is adopted: applied as exact (`adopt_same_chip`). It is the same hardware under
another LLVM name, as after an LLVM that names the chip anew: the AVX2 records
measured on an "AMD EPYC" for core-avx2, relabelled on a Zen 3 EPYC that LLVM calls
znver3, ran 1.02-1.17x faster than the fallbacks, about as fast as retargeted
(benchmarks/results/retarget_znver3.md), while the emeraldrapids records on another
Xeon (above) were slower. Records written before cpu_id was recorded are never
adopted.
Compatible and foreign records feed the retarget step (autotune.tune.retarget_tasks:
their best configs measured here against the fallback, a few minutes) and transfer
learning. A record whose mcpu LLVM does not know relates only to an identical target
JSON.
Retargeting writes its measurements as a verification session whose name starts
with RETARGET_SESSION ("retarget-..."), with the local target: a workload decided by
such a session is reported "retargeted" at compile time; a later tuning run's own
session, being later, then decides instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import math
import os
import statistics
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tecc.canonical import canonical_json

# This module imports no TVM (tecc.runtime included): the measuring side imports it
# with the TVM runtime only, so target facts are imported where they are needed.

RECORD_VERSION = 1
REQUIRED = ("version", "target", "workload", "config", "costs_s", "error")


def workload_key(workload: dict[str, Any]) -> str:
    """Canonical JSON of a workload: the same string for the same layer anywhere."""
    return canonical_json(workload)


RETARGET_SESSION = "retarget-"  # the name prefix of a retarget run's session
RETARGET_K = 8  # foreign configs measured per task at most
RETARGET_BUDGET_S = 180.0  # seconds for a whole retarget run


def isa_family(target: dict[str, Any]) -> str:
    """TargetInfo.isa_level of a record's target JSON ("x86-avx512", "x86-avx2",
    "cuda-sm_90"): what code built for it needs from the machine, decided by the
    instruction-set features LLVM gives its CPU; a CPU LLVM does not know is its own
    family."""
    return _target_keys(canonical_json(target))[2]


def exact_target_key(target: dict[str, Any]) -> str:
    """Targets of one key have identical ISA features and core counts (CUDA: arch)."""
    return _target_keys(canonical_json(target))[0]


def compatible_target_key(target: dict[str, Any]) -> str:
    """Targets of one key share the vector width (isa_level) and the core count."""
    return _target_keys(canonical_json(target))[1]


def target_relation(record_target: dict[str, Any], target: dict[str, Any]) -> str:
    """How a record measured for `record_target` serves `target`: "exact",
    "compatible" or "foreign" (see the module docstring)."""
    if exact_target_key(record_target) == exact_target_key(target):
        return "exact"
    if compatible_target_key(record_target) == compatible_target_key(target):
        return "compatible"
    return "foreign"


def vector_bits(target: dict[str, Any]) -> int:
    """The vector width of a record's target JSON (0 for a CPU LLVM does not know)."""
    return _target_keys(canonical_json(target))[3]


@functools.cache
def _target_keys(target_json: str) -> tuple[str, str, str, int]:
    """(exact key, compatible key, isa level, vector bits) of a target JSON, from
    LLVM's features of its CPU; computed once per target spelling."""
    from tecc.target import target_from_json, target_info

    target = json.loads(target_json)
    cores = target.get("num-cores")
    try:
        info = target_info(target_from_json(target))
    except (ValueError, TypeError, RuntimeError):
        # a CPU this LLVM does not know (or no target at all): only itself matches
        own = canonical_json({"target": target})
        return own, own, f"{target.get('kind') or 'llvm'}-{target.get('mcpu') or 'generic'}", 0
    level = info.isa_level
    if info.is_gpu:
        own = canonical_json({"kind": info.kind, "arch": info.arch})
        return own, own, level, info.vector_bits
    exact = canonical_json({"kind": info.kind, "machine": info.machine,
                            "features": sorted(info.features), "cores": cores})
    compatible = canonical_json({"kind": info.kind, "isa": level, "cores": cores})
    return exact, compatible, level, info.vector_bits


def host_info() -> dict[str, Any]:
    """Where a record was measured: provenance, and the chip for adopt_same_chip
    (matching goes by the target otherwise)."""
    from tecc.runtime import cpu

    info: dict[str, Any] = {"cpu": cpu.host_cpu_model(), "cores": cpu.host_cores()}
    chip = cpu.host_cpu_id()
    if chip:
        info["cpu_id"] = chip
    return info


def measured_on_chip(record: Record, cpu_id: str | None) -> bool:
    """Whether `record` was measured on the chip `cpu_id` names (None: unknown)."""
    return bool(cpu_id) and (record.host or {}).get("cpu_id") == cpu_id


def adopt_same_chip(records: Sequence[Record], target: Any) -> list[Record]:
    """`records` with those compatible with `target` (a TargetInfo) and measured on
    this host's chip relabelled with its target, so that they apply as exact (see the
    module docstring); unchanged unless `target` is this host."""
    if not target.is_host:
        return list(records)
    from tecc.runtime import cpu

    chip, target_json = cpu.host_cpu_id(), target.to_json()
    return [dataclasses.replace(r, target=dict(target_json))
            if measured_on_chip(r, chip) and target_relation(r.target, target_json) == "compatible"
            else r for r in records]


class Timed:
    """A measured candidate's verdict from its error and repeated timings."""

    error: str | None
    costs_s: list[float]

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.costs_s)

    @property
    def cost(self) -> float:
        """Median measured seconds (inf for a failed candidate)."""
        return statistics.median(self.costs_s) if self.ok else float("inf")


@dataclass
class Record(Timed):
    target: dict[str, Any]
    workload: dict[str, Any]
    config: dict[str, Any]
    costs_s: list[float]
    error: str | None = None
    timestamp: float = 0.0
    host: dict[str, Any] | None = None
    tecc: str = ""
    tvm: str = ""
    verify: str | None = None  # the verification session of a re-measurement

    @property
    def key(self) -> str:
        return workload_key(self.workload)

    @property
    def config_key(self) -> str:
        return canonical_json(self.config)

    def to_json(self) -> dict[str, Any]:
        data = {"version": RECORD_VERSION, "target": self.target, "workload": self.workload,
                "config": self.config, "costs_s": self.costs_s, "error": self.error,
                "timestamp": self.timestamp, "host": self.host, "tecc": self.tecc,
                "tvm": self.tvm}
        if self.verify is not None:
            data["verify"] = self.verify
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ValueError(f"missing fields {missing}")
        if data["version"] != RECORD_VERSION:
            raise ValueError(f"version {data['version']!r}")
        if not isinstance(data["costs_s"], list):
            raise ValueError("costs_s must be a list of seconds")
        costs = [_finite(c, "costs_s") for c in data["costs_s"]]
        if not all(c > 0 for c in costs):
            raise ValueError("costs_s must be positive seconds")
        timestamp = _finite(data.get("timestamp") or 0, "timestamp")
        if not all(isinstance(data[k], dict) for k in ("target", "workload", "config")):
            raise ValueError("target, workload and config must be objects")
        if not isinstance(data.get("host") or {}, dict):
            raise ValueError("host must be an object")
        if data["error"] is not None and not isinstance(data["error"], str):
            raise ValueError("error must be null or a message")
        verify = data.get("verify")
        if verify is not None and not isinstance(verify, str):
            raise ValueError("verify must be a session name")
        return cls(data["target"], data["workload"], data["config"], costs, data["error"],
                   timestamp, data.get("host"), str(data.get("tecc", "")),
                   str(data.get("tvm", "")), verify)


def _finite(value: Any, field: str) -> float:
    """A record's number as a finite float (a bool, a string or an integer too large for
    a float is no number here: such a line is broken, not a winner)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} must hold numbers")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{field} holds a number too large") from None
    if not math.isfinite(number):
        raise ValueError(f"{field} must be finite")
    return number


class RecordWriter:
    """Appends records to a JSON Lines file, flushed (and fsynced) one by one."""

    def __init__(self, path: str | os.PathLike, tecc_version: str = "", tvm_version: str = ""):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        if not _ends_a_line(self.path):
            # a torn last line (a write cut mid-line): the next record starts a new one
            self._file.write("\n")
        self._host = host_info()
        self._versions = (tecc_version, tvm_version)

    def write(self, record: Record) -> None:
        if not record.timestamp:
            record.timestamp = time.time()
        record.host = record.host or self._host
        record.tecc = record.tecc or self._versions[0]
        record.tvm = record.tvm or self._versions[1]
        self._file.write(canonical_json(record.to_json()) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordsBusyError(RuntimeError):
    """Another tuning run holds the records file."""


@contextlib.contextmanager
def records_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an advisory lock (flock) on a records file for a tuning run: a second run
    on the same file would measure the same configs again. Released when the run
    ends, also when it is killed (the kernel drops the lock with the process)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RecordsBusyError(
                f"another tuning run is writing {path}: wait for it to finish, or tune "
                "into another records file (--records) and merge them with "
                "`tecc records merge`") from None
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _ends_a_line(path: Path) -> bool:
    """Whether `path` is empty or ends with a newline."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def record_files(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
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
    for path in record_files(paths):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    records.append(Record.from_json(json.loads(line)))
                except (ValueError, TypeError, AttributeError, OverflowError):
                    skipped[str(path)] = skipped.get(str(path), 0) + 1
    total = sum(skipped.values())
    if total and warn:
        where = ", ".join(f"{p}: {n}" for p, n in skipped.items())
        warnings.warn(f"skipped {total} broken tuning record line(s) ({where})", stacklevel=2)
    return records, total


SOURCES = ("exact", "retargeted", "fallback")


@dataclass
class Choice:
    config: dict[str, Any] | None  # None: the template's fallback
    source: str  # one of SOURCES: how the record's target relates, or "fallback"
    cost_s: float | None = None


def _latest_session(records: Sequence[Record]) -> list[Record]:
    """The records of the latest verification session among `records`; none ([]) when
    there is none or when a measurement outside sessions is later than it: a tuning
    run stopped before its own verification measured configs (perhaps of knobs or
    fallbacks newer than the session) that the older session never saw."""
    sessions: dict[str, list[Record]] = {}
    for r in records:
        if r.verify is not None:
            sessions.setdefault(r.verify, []).append(r)
    if not sessions:
        return []
    latest = max(sessions.values(), key=lambda rs: max(r.timestamp for r in rs))
    ended = max(r.timestamp for r in latest)
    if any(r.verify is None and r.ok and r.timestamp > ended for r in records):
        return []
    return latest


def _by_median(records: Sequence[Record]) -> tuple[Record, float] | None:
    """The config with the lowest median cost over its records (one of its records
    and that median); a config that failed in any round does not count."""
    costs: dict[str, list[float]] = {}
    first: dict[str, Record] = {}
    for r in records:
        costs.setdefault(r.config_key, []).append(r.cost)
        first.setdefault(r.config_key, r)
    medians = {k: statistics.median(c) for k, c in costs.items() if all(map(math.isfinite, c))}
    if not medians:
        return None
    best = min(medians, key=medians.__getitem__)
    return first[best], medians[best]


def best_records(records: Iterable[Record]) -> list[Record]:
    """Per workload and exact target, the records compile time decides by: the latest
    verification session in full, or else the single best measurement."""
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((r.key, exact_target_key(r.target)), []).append(r)
    kept: list[Record] = []
    for group in groups.values():
        session = _latest_session(group)
        ok = [r for r in group if r.ok]
        if session:
            kept += session
        elif ok:
            kept.append(min(ok, key=lambda r: r.cost))
    return kept


class RecordDatabase:
    """The config to use per (workload, target), for compile time: from the latest
    verification session when there is one, else the best single measurement; records
    of the exact target only (compatible and foreign ones are retargeted first: see
    target_relation)."""

    def __init__(self, records: Iterable[Record] = ()) -> None:
        self._exact: dict[tuple[str, str], list[Record]] = {}
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
        if not record.ok and record.verify is None:
            return  # a failed round still counts against its config in a session
        self._exact.setdefault((record.key, exact_target_key(record.target)), []).append(record)

    @staticmethod
    def _pick(records: Sequence[Record], wanted: Any = None
              ) -> tuple[Record, float, bool] | None:
        """The best record among those whose config satisfies `wanted`, its cost and
        whether a retarget session decided."""
        fits = [r for r in records if wanted is None or wanted(r.config)]
        session = _latest_session(fits)
        if session:
            picked = _by_median(session)
            if picked is not None:
                return (*picked, str(session[0].verify).startswith(RETARGET_SESSION))
        ok = [r for r in fits if r.ok]
        if not ok:
            return None
        best = min(ok, key=lambda r: r.cost)
        return best, best.cost, False

    def choose_where(self, workload: dict[str, Any], target: dict[str, Any],
                     wanted: Any) -> Choice | None:
        """The config to use among those satisfying `wanted(config)`, from the exact
        target's records; None if no measured config does. For layout-aware choices: a
        config whose input layout matches the producer's avoids a transform; for the
        config space check: a config outside the template's space is never used."""
        picked = self._pick(self._exact.get((workload_key(workload), exact_target_key(target)),
                                            []), wanted)
        if picked is None:
            return None
        record, cost, retargeted = picked
        return Choice(record.config, "retargeted" if retargeted else "exact", cost)

    def choose(self, workload: dict[str, Any], target: dict[str, Any]) -> Choice:
        return self.choose_where(workload, target, None) or Choice(None, "fallback")
