"""Tuning records at compile time: which config each workload gets, and the report.

The driver (tecc/api.py) makes one TuningContext per compile. It answers the graph
passes' tuning callbacks (graph_opt.pass_manager.TuningCallbacks, given to them in
the PassContext by `callbacks()`) and the scheduler's with the record database
(autotune.records: the exact target's records, else the template's fallback; records
of compatible and foreign targets are never applied, `tecc records retarget` turns
them into local ones):
  - winograd_tile(conv call, lanes) and conv_blocks(conv call, producer block, tile)
    for graph_opt's layout pass: Winograd or direct, and the channel blocks (ic_bn,
    oc_bn) of the layer's tuned config, or None (default choice);
  - gpu_winograd_tile(conv call, target facts) for graph_opt's winograd_gpu pass:
    Winograd's F(m x m) or direct, by the summed costs of its three kernels against
    the direct conv's where all have records;
  - dense_block(dense call, lanes) for graph_opt's pack_dense_weights: the packing
    block (tile_n) of the tuned config, else the dense template's fallback;
  - config(workload, space) for schedules.lower: the tuned config JSON and its source
    ("exact", "retargeted").
A retarget run (autotune.tune.retarget_tasks) measures few configs per workload, so
a conv may have no measured config that reads its producer's block, or only a slow
one, where a full tuning has fast ones: LayoutChainPlan runs the layout pass as
compile would and names the fastest configs with their producers' blocks (chaining
the layers without a layout_transform), for the run to measure too.
The config space check, for every template, is here (`_fits`): a record whose config
is not a point of its template's config space (a knob value not among the knob's
options, as JSON types them: ConfigSpace.from_json) is never chosen; the next-best
valid record is, and one warning after the build counts the skipped ones. The space
is the kernel's own, which the scheduler passes; the graph passes decide layouts
before the kernel exists, from the spaces the conv and dense templates derive from
the workload alone (config_spaces).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tvm

from tecc.autotune.records import (
    Choice,
    RecordDatabase,
    adopt_same_chip,
    load_records,
    record_files,
    target_relation,
    workload_key,
)
from tecc.canonical import canonical_json
from tecc.frontend.ir import Call, Constant, Function
from tecc.graph_opt.layout import WINOGRAD_DEFAULT_TILE, default_winograd_tile, winograd_eligible
from tecc.graph_opt.pass_manager import PassContext, TuningCallbacks
from tecc.graph_opt.pipeline import optimize
from tecc.graph_opt.winograd import GPU_WINOGRAD_TILE, default_gpu_winograd_tile, winograd_conv
from tecc.schedules.space import ConfigSpace
from tecc.schedules.tasks import CONV_TEMPLATES
from tecc.schedules.template import templates_for
from tecc.schedules.templates_conv import CONV2D, DEPTHWISE, WINOGRAD, conv_blocks, conv_workload
from tecc.schedules.templates_dense import DENSE, DenseLikeTemplate, dense_pack_block
from tecc.target import TargetInfo, target_info

# The sources of a config that come from a tuning record (CompiledModel.tasks()).
TUNED_SOURCES = ("exact", "retargeted")

RecordsArg = str | os.PathLike | Sequence[str | os.PathLike] | None

# A layout_transform's bytes read and written per second, as measured for an NCHW
# tensor into a few-channel block (the RGB input into NCHW3c) alone on a 2-core AVX2
# CPU (benchmarks/layout_transform.py: 3x224x224 in 74.5 us; 93 us inside
# MobileNetV2); taken for a transform between channel blocks too
LAYOUT_TRANSFORM_BYTES_PER_S = 16e9


def gpu_winograd_workloads(call: Call, info: TargetInfo, tile: int) -> list[dict[str, Any]]:
    """The workloads of the three kernels (input transform, GEMM, output transform) that
    compute the 3x3 conv `call` (its weight a Constant) by Winograd with `tile` on a GPU."""
    templates = templates_for(info.kind)
    out = winograd_conv(call, call.args[0], call.args[1], tile)
    workloads = []
    for kernel in (out.args[0].args[1], out.args[0], out):
        kind = {"nn.matmul": "batch_matmul"}.get(str(kernel.op), str(kernel.op)[3:])
        workloads.append(templates[kind].workload(kernel, kind))
    return workloads


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
        # records of this very chip under another LLVM name apply as exact
        self.records = adopt_same_chip(load_records(records, warn=True)[0] if records else [],
                                       self.target)
        self.db = RecordDatabase(self.records)
        self._spaces: dict[str, list[ConfigSpace] | None] = {}
        self._outside: dict[tuple[str, str], str] = {}  # (workload, config) -> template
        self.cores = self.target.cores
        self.digest = records_digest(records) if records else None
        self._chosen: dict[str, list[Choice]] = {}

    def _fits(self, workload: dict[str, Any], space: ConfigSpace | None = None
              ) -> Callable[[dict[str, Any]], bool]:
        """Whether a config of `workload` is a point of its template's space: `space`
        (the kernel's), else the spaces known from the workload (none known: any
        config passes here, and the scheduler checks it against the kernel's)."""
        key = workload_key(workload)
        if space is not None:
            spaces: list[ConfigSpace] | None = [space]
        else:
            if key not in self._spaces:
                self._spaces[key] = config_spaces(workload, self.target.kind, self.lanes)
            spaces = self._spaces[key]

        def fits(config: dict[str, Any]) -> bool:
            if spaces is None or any(s.contains(config) for s in spaces):
                return True
            self._outside[(key, canonical_json(config))] = str(workload.get("template"))
            return False

        return fits

    def choose(self, workload: dict[str, Any], space: ConfigSpace | None = None) -> Choice:
        return (self.db.choose_where(workload, self.target_json, self._fits(workload, space))
                or Choice(None, "fallback"))

    def choose_where(self, workload: dict[str, Any], wanted: Callable[[dict[str, Any]], bool]
                     ) -> Choice | None:
        fits = self._fits(workload)
        return self.db.choose_where(workload, self.target_json,
                                    lambda c: fits(c) and wanted(c))

    # -- graph_opt callbacks
    def callbacks(self) -> TuningCallbacks:
        """The graph passes' callbacks, answered from these records."""
        return TuningCallbacks(winograd_tile=self.winograd_tile, conv_blocks=self.conv_blocks,
                               dense_block=self.dense_block,
                               gpu_winograd_tile=self.gpu_winograd_tile)

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

    def gpu_winograd_tile(self, call: Call, info: TargetInfo) -> int:
        """Winograd or the direct conv for a 3x3 layer on a GPU: by the tuning records
        where both the direct conv and each of the Winograd kernels (input transform,
        GEMM, output transform) have some (their costs summed), else the default rule."""
        if not self.winograd:
            return 0
        default = default_gpu_winograd_tile(call, info)
        templates = templates_for(info.kind)
        direct = self.choose(templates["conv2d"].workload(call, "conv2d"))
        if direct.cost_s is None or not isinstance(call.args[1], Constant):
            return default
        tile = default or GPU_WINOGRAD_TILE
        costs = [self.choose(wl).cost_s for wl in gpu_winograd_workloads(call, info, tile)]
        if any(c is None for c in costs):
            return default
        return tile if sum(costs) < direct.cost_s else 0

    def conv_blocks(self, call: Call, producer_block: int | None,
                    tile: int = 0) -> tuple[int, int] | None:
        wl, choice = self.conv_choice(call, producer_block, tile)
        return self._use(wl, choice)

    def _use(self, wl: dict[str, Any], choice: Choice) -> tuple[int, int] | None:
        """`choice` made for a conv of `wl`: kept for the scheduler, its blocks."""
        if choice.config is not None:
            chosen = self._chosen.setdefault(workload_key(wl), [])
            if choice not in chosen:
                chosen.append(choice)
        return conv_blocks(wl, choice.config, self.lanes)

    def conv_choice(self, call: Call, producer_block: int | None,
                    tile: int = 0) -> tuple[dict[str, Any], Choice]:
        """A conv's workload and its config by the records, given the block its
        producer writes (None: NCHW data)."""
        data = call.args[0]
        groups = call.attrs["groups"]
        depthwise = groups > 1 and groups == data.shape[1] == call.shape[1]
        template = WINOGRAD if tile else DEPTHWISE if depthwise else CONV2D
        wl = conv_workload(template.name, call, tile)
        choice = self.choose(wl)
        if choice.config is not None and producer_block is None and not depthwise:
            choice = self._in_place_or(choice, wl, data)
        if choice.config is not None and producer_block is not None:
            # Prefer the best measured config that reads the producer's block as is,
            # unless slower by more than the layout transform it saves (the tuner
            # measures kernels, not the transforms between them), as for the input.
            key = self._reads_key(wl)
            matching = self.choose_where(wl, lambda c: c.get(key) == producer_block)
            if matching is not None:
                choice = self._reading_as_is_or(choice, matching, data)
        return wl, choice

    @staticmethod
    def _reads_key(wl: dict[str, Any]) -> str:
        """The knob of a conv template's config that is its input block."""
        return "c_bn" if wl["template"] == DEPTHWISE.name else "ic_bn"

    def _in_place_or(self, choice: Choice, wl: dict[str, Any], data: Any) -> Choice:
        """For a conv on NCHW data (the model's input): a config reading it one channel
        at a time (ic_bn 1; NCHW1c is NCHW's bytes) needs no layout_transform before
        the layer, so it wins unless slower by more than that transform costs."""
        in_place = self.choose_where(wl, lambda c: c.get("ic_bn") == 1)
        if in_place is None:
            return choice
        return self._reading_as_is_or(choice, in_place, data)

    @staticmethod
    def _reading_as_is_or(best: Choice, as_is: Choice, data: Any) -> Choice:
        """`as_is` (a config reading `data` in the layout it lies in) unless slower than
        `best` by more than the layout_transform of `data` that `best` needs costs
        (read and written once)."""
        if as_is.config == best.config or best.cost_s is None or as_is.cost_s is None:
            return as_is
        transform_s = 2 * data.ty.nbytes / LAYOUT_TRANSFORM_BYTES_PER_S
        return as_is if as_is.cost_s <= best.cost_s + transform_s else best

    def dense_block(self, call: Call, lanes: int) -> int | None:
        wl = DENSE.workload(call, "dense")
        return dense_pack_block(wl, self.choose(wl).config, lanes, self.cores)

    # -- schedules callback
    def config(self, workload: dict[str, Any], space: ConfigSpace | None = None):
        """The config for a kernel's anchor of `workload` whose template's space is
        `space`: (config JSON, source), a list of them (the layout pass's choices, one
        per producer block, so that blocks and kernel agree: the scheduler takes the
        one that fits), or None (the template's fallback)."""
        fits = self._fits(workload, space)
        chosen = [c for c in self._chosen.get(workload_key(workload), []) if fits(c.config)]
        if chosen:
            return [(c.config, c.source) for c in chosen]
        choice = self.choose(workload, space)
        if choice.config is None:
            return None
        return choice.config, choice.source

    @property
    def unapplied_counts(self) -> dict[str, int]:
        """Records given for this kind of target (llvm, cuda) that are not applied, by
        how their target relates to this one: {"compatible": n, "foreign": m}."""
        counts = {"compatible": 0, "foreign": 0}
        for r in self.records:
            if r.target.get("kind") != self.target_json.get("kind"):
                continue  # a GPU's records say nothing of a CPU, and back
            relation = target_relation(r.target, self.target_json)
            if relation in counts:
                counts[relation] += 1
        return counts

    def warn_outside_space(self) -> None:
        """One warning for the records whose configs were skipped as outside their
        templates' spaces (after the build: the scheduler checks some)."""
        if not self._outside:
            return
        skipped = [r for r in self.records
                   if (r.key, r.config_key) in self._outside
                   and target_relation(r.target, self.target_json) == "exact"]
        templates = sorted(set(self._outside.values()))
        warnings.warn(f"skipped {len(skipped)} tuning record(s) whose config is outside its "
                      f"template's config space (templates {', '.join(templates)}): a knob "
                      "value not among its options; the next-best valid record is used. "
                      "Re-tune these workloads or remove the lines.", stacklevel=3)


class LayoutChainPlan(TuningContext):
    """The layout pass under these records as compile runs it, and the configs it
    lacks: compile gives a conv the best measured config that reads its producer's
    block, so where the best config of all reads another block, that config with its
    input block (ic_bn, a depthwise conv's c_bn) set to the producer's, if a point of
    its space and not measured yet, is named (a retarget run measures few configs: the
    only one reading the producer's block may be the fallback, and a transform before
    the best one costs as much as a kernel). The pass goes on as if that variant were
    chosen, so the variants chain through the layers (a depthwise conv's block is its
    output's too). `variants`: workload key -> config JSONs."""

    def __init__(self, records: RecordsArg, target: TargetInfo | tvm.target.Target | str,
                 winograd: bool = True) -> None:
        super().__init__(records, target, winograd)
        self.variants: dict[str, list[dict[str, Any]]] = {}

    def conv_blocks(self, call: Call, producer_block: int | None,
                    tile: int = 0) -> tuple[int, int] | None:
        wl, choice = self.conv_choice(call, producer_block, tile)
        key = self._reads_key(wl)
        best = self.choose(wl) if producer_block is not None else Choice(None, "fallback")
        if best.config is not None and best.config.get(key) != producer_block:
            variant = dict(best.config, **{key: producer_block})
            if self._fits(wl)(variant) and \
                    self.choose_where(wl, lambda c: c == variant) is None:
                wanted = self.variants.setdefault(workload_key(wl), [])
                if variant not in wanted:
                    wanted.append(variant)
                choice = Choice(variant, best.source, best.cost_s)
        return self._use(wl, choice)


def layout_chain_variants(func: Function, target: TargetInfo, records: RecordsArg,
                          winograd: bool = True) -> dict[str, list[dict[str, Any]]]:
    """The configs (workload key -> config JSONs) that would spare `func`'s layout, as
    compile chooses it from `records`, its transforms between convs (LayoutChainPlan)."""
    plan = LayoutChainPlan(records, target, winograd)
    with PassContext(target=target, opt_level=3, tuning=plan.callbacks()):
        optimize(func)
    return plan.variants


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


def warn_untuned(tasks: list[dict[str, Any]],
                 unapplied: Mapping[str, int] | None = None) -> None:
    """One warning listing the workloads without a tuning record (and how the others
    got theirs); `unapplied`: records given for other targets, by relation
    (TuningContext.unapplied_counts), which the hint points to retargeting."""
    untuned = [t for t in tasks if t["source"] not in TUNED_SOURCES]
    if not untuned:
        return
    tuned = ", ".join(f"{sum(t['source'] == s for t in tasks)} {s}" for s in TUNED_SOURCES)
    lines = "\n".join(f"  {t['template']}: {t['workload_key']}" for t in untuned)
    unapplied = unapplied or {}
    kinds = [f"{unapplied[relation]} record(s) {what}" for relation, what in (
        ("compatible", "of another CPU model of this vector width and core count"),
        ("foreign", "of other vector widths or core counts (GPUs: archs)"))
        if unapplied.get(relation)]
    hint = (f"; {' and '.join(kinds)} were not applied (a config is measured for the code "
            "LLVM generates for its own target): `tecc records retarget FILES -o LOCAL "
            "--model MODEL` measures their best configs here against the fallbacks in a "
            "few minutes" if kinds else "")
    warnings.warn(f"{len(untuned)} of {len(tasks)} workload(s) have no tuning record for "
                  f"this target (fallback configs used; {tuned}){hint}:\n{lines}",
                  stacklevel=3)
