"""Tuning records at compile time: which config each workload gets, and the report.

The driver (tecc/api.py) makes one TuningContext per compile. It answers the graph
passes' tuning callbacks (graph_opt.pass_manager.TuningCallbacks, given to them in
the PassContext by `callbacks()`) and the scheduler's with the record database
(autotune.records: exact target > compatible target > the template's fallback):
  - winograd_tile(conv call, lanes) and conv_blocks(conv call, producer block, tile)
    for graph_opt's layout pass: Winograd or direct, and the channel blocks (ic_bn,
    oc_bn) of the layer's tuned config, or None (default choice);
  - dense_block(dense call, lanes) for graph_opt's pack_dense_weights: the packing
    block (tile_n) of the tuned config, else the dense template's fallback;
  - config(workload) for schedules.lower: the tuned config JSON and its source.
A record whose config is not a point of its template's config space (a knob value
not among the knob's options, as JSON types them) is never chosen: the next-best
valid record is, and one warning counts the skipped ones.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm

from tecc.autotune.records import (
    Choice,
    Record,
    RecordDatabase,
    isa_family,
    load_records,
    record_files,
    workload_key,
)
from tecc.frontend.ir import Call
from tecc.graph_opt.layout import WINOGRAD_DEFAULT_TILE, default_winograd_tile, winograd_eligible
from tecc.graph_opt.pass_manager import TuningCallbacks
from tecc.schedules.space import ConfigSpace
from tecc.schedules.tasks import CONV_TEMPLATES
from tecc.schedules.template import templates_for
from tecc.schedules.templates_conv import CONV2D, DEPTHWISE, WINOGRAD, conv_blocks, conv_workload
from tecc.schedules.templates_dense import DENSE, DenseLikeTemplate, dense_pack_block
from tecc.target import TargetInfo, target_info

RecordsArg = str | os.PathLike | Sequence[str | os.PathLike] | None

# An NCHW tensor into a few-channel block (the RGB input into NCHW3c): bytes read and
# written per second, measured alone on a 2-core AVX2 CPU (benchmarks/
# layout_transform.py: 3x224x224 in 74.5 us; 93 us inside MobileNetV2)
NCHW_TO_BLOCKS_BYTES_PER_S = 16e9


class TuningContext:
    """The tuning records of one compile for `target` (facts, or anything
    tecc.target.target_info takes); `winograd=False` keeps every conv direct."""

    def __init__(self, records: RecordsArg, target: TargetInfo | tvm.target.Target | str,
                 winograd: bool = True) -> None:
        self.given = bool(records)
        self.winograd = winograd
        self.target: TargetInfo = target_info(target)
        self.target_json = self.target.to_json()
        self.lanes = self.target.vector_lanes() if self.target.is_cpu else 0
        self._spaces: dict[str, list[ConfigSpace] | None] = {}
        self.db = RecordDatabase(load_records(records, warn=True)[0] if records else (),
                                 valid=self._in_space)
        warn_outside_space(self.db.invalid)
        self.cores = self.target.cores
        self.digest = records_digest(records) if records else None
        self._chosen: dict[str, list[Choice]] = {}

    def _in_space(self, record: Record) -> bool:
        """Whether a record's config is a point of its template's space here (records
        of other ISA levels are never chosen for this target: not checked)."""
        if isa_family(record.target) != self.target.isa_level:
            return True
        key = record.key
        if key not in self._spaces:
            self._spaces[key] = config_spaces(record.workload, self.target.kind, self.lanes)
        spaces = self._spaces[key]
        return spaces is None or any(config_in_space(space, record.config) for space in spaces)

    def choose(self, workload: dict[str, Any]):
        return self.db.choose(workload, self.target_json)

    # -- graph_opt callbacks
    def callbacks(self) -> TuningCallbacks:
        """The graph passes' callbacks, answered from these records."""
        return TuningCallbacks(winograd_tile=self.winograd_tile, conv_blocks=self.conv_blocks,
                               dense_block=self.dense_block)

    def winograd_tile(self, call: Call, lanes: int) -> int:
        """Winograd or the direct conv for a 3x3 layer: the faster by its tuning records
        when both have some, Winograd when only it has, else the default rule."""
        if not self.winograd or lanes <= 0 or not winograd_eligible(call):
            return 0
        default = default_winograd_tile(call, lanes)
        tile = default or WINOGRAD_DEFAULT_TILE
        wino = self.choose(conv_workload(WINOGRAD.name, call, tile))
        if wino.cost_s is None:
            return default
        direct = self.choose(conv_workload(CONV2D.name, call))
        return tile if direct.cost_s is None or wino.cost_s < direct.cost_s else 0

    def conv_blocks(self, call: Call, producer_block: int | None,
                    tile: int = 0) -> tuple[int, int] | None:
        data = call.args[0]
        groups = call.attrs["groups"]
        depthwise = groups > 1 and groups == data.shape[1] == call.shape[1]
        template = WINOGRAD if tile else DEPTHWISE if depthwise else CONV2D
        wl = conv_workload(template.name, call, tile)
        choice = self.choose(wl)
        if choice.config is not None and producer_block is None and not depthwise:
            choice = self._in_place_or(choice, wl, data)
        if choice.config is not None and producer_block is not None:
            # Prefer the best measured config that reads the producer's block as is:
            # a layout transform between two layers costs more than a few percent of
            # kernel speed (the tuner measures kernels, not the transforms).
            key = "c_bn" if depthwise else "ic_bn"
            matching = self.db.choose_where(
                wl, self.target_json, lambda c: int(c.get(key, -1)) == producer_block)
            if matching is not None:
                choice = matching
        if choice.config is not None:
            chosen = self._chosen.setdefault(workload_key(wl), [])
            if choice not in chosen:
                chosen.append(choice)
        return conv_blocks(wl, choice.config, self.lanes)

    def _in_place_or(self, choice: Choice, wl: dict[str, Any], data: Any) -> Choice:
        """For a conv on NCHW data (the model's input): a config reading it one channel
        at a time (ic_bn 1; NCHW1c is NCHW's bytes) needs no layout_transform before
        the layer, so it wins unless slower by more than that transform costs."""
        in_place = self.db.choose_where(wl, self.target_json,
                                        lambda c: int(c.get("ic_bn", -1)) == 1)
        if in_place is None or in_place.config == choice.config or choice.cost_s is None:
            return choice
        transform_s = 2 * data.ty.nbytes / NCHW_TO_BLOCKS_BYTES_PER_S
        return in_place if in_place.cost_s <= choice.cost_s + transform_s else choice

    def dense_block(self, call: Call, lanes: int) -> int | None:
        wl = DENSE.workload(call, "dense")
        return dense_pack_block(wl, self.choose(wl).config, lanes, self.cores)

    # -- schedules callback
    def config(self, workload: dict[str, Any]):
        # The choices the layout pass made for this workload (one per producer block),
        # so that blocks and kernel agree: the scheduler takes the one that fits.
        chosen = self._chosen.get(workload_key(workload))
        if chosen:
            return [(c.config, c.source) for c in chosen]
        choice = self.choose(workload)
        if choice.config is None:
            return None
        return choice.config, choice.source


def config_spaces(workload: dict[str, Any], target_kind: str, lanes: int
                  ) -> list[ConfigSpace] | None:
    """The config spaces a workload's template may have for a target of `lanes`
    float32 lanes (a dense-like template's packing knob depends on the anchor kind,
    which the workload leaves out: both); None where the space needs the kernel
    itself (the scheduler's own check applies then) or the workload is malformed."""
    template = templates_for(target_kind).get(str(workload.get("template")))
    if template is None or lanes <= 0:
        return None
    try:
        if isinstance(template, DenseLikeTemplate):
            m, n, k = template.mnk_of_workload(workload)
            kinds = {template.pack_choice_kinds[0] if template.pack_choice_kinds else "", ""}
            return [template.space_for(m, n, k, lanes, kind) for kind in sorted(kinds)]
        if template.name in CONV_TEMPLATES:
            return [template.space_for(workload, lanes)]
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
        return None
    return None


def config_in_space(space: ConfigSpace, config: dict[str, Any]) -> bool:
    """Whether `config` (JSON) gives every knob of `space` one of its options, with
    the option's type (1.5, true or "8" is no block size of 8)."""
    return all(knob.name in config and any(_same_value(config[knob.name], option)
                                           for option in knob.options)
               for knob in space.knobs)


def _same_value(value: Any, option: Any) -> bool:
    if isinstance(option, tuple):
        return (isinstance(value, list | tuple) and len(value) == len(option)
                and all(map(_same_value, value, option)))
    return type(value) is type(option) and value == option


def warn_outside_space(records: Sequence[Record]) -> None:
    """One warning for the records whose configs are outside their templates' spaces."""
    if not records:
        return
    templates = sorted({str(r.workload.get("template")) for r in records})
    warnings.warn(f"skipped {len(records)} tuning record(s) whose config is outside its "
                  f"template's config space (templates {', '.join(templates)}): a knob "
                  "value not among its options; the next-best valid record is used. "
                  "Re-tune these workloads or remove the lines.", stacklevel=4)


def records_digest(records: RecordsArg) -> str:
    """sha256 over the record files' bytes (in path order)."""
    h = hashlib.sha256()
    for path in record_files(records):  # type: ignore[arg-type]
        h.update(Path(path).read_bytes())
    return h.hexdigest()


def task_table(kernels: dict) -> list[dict[str, Any]]:
    """One entry per distinct workload of the built kernels (see CompiledModel.tasks)."""
    table: dict[str, dict[str, Any]] = {}
    for kernel in kernels.values():
        for applied in getattr(kernel, "templates", []):
            if applied.workload is None:
                continue
            key = workload_key(applied.workload)
            entry = table.get(key)
            if entry is None:
                entry = table[key] = {
                    "workload_key": key, "workload": applied.workload,
                    "template": applied.template, "anchor": applied.kind,
                    "space_size": applied.space_size, "config": applied.config,
                    "source": applied.source, "error": applied.error, "kernels": []}
            entry["kernels"].append(kernel.name)
    return list(table.values())


def warn_untuned(tasks: list[dict[str, Any]]) -> None:
    untuned = [t for t in tasks if t["source"] not in ("exact", "compatible")]
    if not untuned:
        return
    lines = "\n".join(f"  {t['template']}: {t['workload_key']}" for t in untuned)
    warnings.warn(f"{len(untuned)} of {len(tasks)} workload(s) have no tuning record for "
                  f"this target (fallback configs used):\n{lines}", stacklevel=3)
