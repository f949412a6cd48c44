"""Schedule templates: a template schedules one kind of anchor block (a dense, a
conv2d_NCHWc, a pool, a reduction, an injective group) and exposes its choices as
knobs of a ConfigSpace, so the tuner can search them.

    class DenseTemplate(Template):
        name = "dense"                      # the anchor kind it schedules
        aliases = ("dense_pack",)           # further anchor kinds it schedules
        def define_space(self, ctx): ...   # knobs from the anchor's loop extents
        def fallback(self, space, ctx): ... # heuristic config: shapes + target
        def apply(self, ctx, config): ...   # schedule ctx.sch with the config
    register_template(DenseTemplate())

Registry: templates are registered per target kind (`Template.target_kind`, "llvm"
or "cuda") and anchor kind: `register_template(t)` (a second template for one
(target kind, anchor kind) is an error), `get_template(kind, target_kind)`,
`templates_for(target_kind)` (anchor kind -> template).

Dispatch (schedules/default.py): every root block whose "tecc.anchor" annotation
(computes.py) has a template for the target's kind is scheduled by it (a group of
injective ops only, by the "injective" template on its last output block), on a copy
of the schedule: define_space(ctx), then the config chosen for the workload (a tuning
record through the caller's callback) or fallback(space, ctx), then apply(ctx, cfg).
If apply raises, the copy is dropped (a chosen config falls back to the fallback
config first, then to the generic schedule): never wrong, maybe slow.

Every config of a space must give correct code: an invalid one is a template bug.
The space depends only on the anchor (its shapes, dtypes and attributes), never on
the fused epilogue, so one tuned config serves every fused variant of a workload.

A template reads target facts from `ctx.info` (tecc.target.TargetInfo: vector lanes,
cores, cache sizes of the target compiled for), never from the build host.

The workload (the tuning key's JSON) comes from the anchor's IR call:
`Template.workload(call, kind)`; the default is generic (template name, the
call's input shapes and dtypes, its attributes); conv templates override it to
speak NCHW terms, so that the channel blocks can be knobs; for an injective group
the call is one of its primitive Function, and the workload its input and output
shapes and dtypes.

Template modules register themselves on import; `load_templates()` imports the
modules named in TEMPLATE_MODULES (missing ones are skipped).
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any

import tvm
from tecc.schedules.blocks import loop_extent
from tecc.schedules.space import Config, ConfigSpace
from tvm.s_tir.schedule import Schedule

from tecc.target import TargetInfo, target_info

log = logging.getLogger(__name__)

# Modules whose import registers templates (in this order).
TEMPLATE_MODULES = (
    "tecc.schedules.templates_dense",
    "tecc.schedules.templates_conv",
    "tecc.schedules.templates_reduce",
    "tecc.schedules.templates_injective",
    "tecc.schedules.templates_attention",
    "tecc.schedules.gpu_templates",
    "tecc.schedules.gpu_reduce",
    "tecc.schedules.gpu_winograd",
    "tecc.schedules.gpu_injective",
    "tecc.schedules.gpu_attention",
)
# The anchor kind of a group of injective ops (it has no "tecc.anchor" block).
INJECTIVE_KIND = "injective"


@dataclass
class ScheduleContext:
    """What a template sees: the schedule, its anchor block, and the target's facts.

    info: the target's facts (tecc.target.TargetInfo); `target`, `lanes` (float32
        vector lanes) and `cores` are read from it.
    kind: the anchor's "tecc.anchor" annotation (a template may serve several).
    workload: the workload dict of the anchor (Template.workload of its IR call);
        None when the schedule was not lowered from IR (a hand-made PrimFunc).
    """

    sch: Schedule
    block: Any  # the anchor's SBlockRV
    info: TargetInfo
    kind: str = ""
    workload: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, sch: Schedule, block: Any, target: str | tvm.target.Target | TargetInfo,
               kind: str = "", workload: dict[str, Any] | None = None) -> ScheduleContext:
        """The context for `block` of `sch` compiled for `target`."""
        return cls(sch, block, target_info(target), kind, workload)

    @property
    def target(self) -> tvm.target.Target:
        return self.info.tvm_target

    @property
    def lanes(self) -> int:
        return self.info.vector_lanes("float32")

    @property
    def cores(self) -> int:
        return self.info.cores

    @property
    def block_name(self) -> str:
        return self.sch.get(self.block).name_hint

    def loop_extents(self) -> list[int | None]:
        """Extents of the anchor's loops (None: symbolic)."""
        return [loop_extent(self.sch, lp) for lp in self.sch.get_loops(self.block)]


def jsonable(value: Any) -> Any:
    """`value` with tuples as lists, dict keys as strings, other objects as strings."""
    if isinstance(value, tuple | list):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class Template:
    name: str = ""
    aliases: tuple[str, ...] = ()
    target_kind: str = "llvm"  # the TVM target kind it schedules for ("llvm", "cuda")
    # Knobs counted in vector lanes (channel blocks, packing blocks, vector widths): a
    # config measured on a CPU of another vector width is retargeted with these
    # scaled to this target's width (AVX2's oc_bn 8 becomes AVX-512's 16).
    lane_knobs: tuple[str, ...] = ()

    def workload(self, call: Any, kind: str) -> dict[str, Any]:
        """The workload dict of the anchor IR Call `call` (an op Call whose compute
        wrote the anchor block): template name, input shapes and dtypes, attributes.
        Canonical JSON of it (autotune.records.workload_key) is the tuning key."""
        return {
            "template": self.name,
            "inputs": [[list(a.shape), str(a.dtype)] for a in call.args],
            "attrs": jsonable(dict(call.attrs)),
        }

    def tunable(self, workload: dict[str, Any]) -> bool:
        """Whether the template schedules this workload by its knobs (a workload it
        hands to a fixed schedule is no tuning task)."""
        return True

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        raise NotImplementedError

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        raise NotImplementedError

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        raise NotImplementedError

    def accepts(self, ctx: ScheduleContext, config: Config) -> bool:
        """Whether `config` fits the PrimFunc at hand. Layout knobs (a conv's channel
        blocks, a dense's weight packing) are decided by the graph passes before the
        kernel exists; a config whose layout knobs differ from the kernel's actual
        layout is refused and the fallback (which reads the actual layout) used."""
        return True


# (target kind, anchor kind) -> template
TEMPLATES: dict[tuple[str, str], Template] = {}


def register_template(template: Template) -> Template:
    """Register `template` for its target kind under its name and each alias (anchor
    kinds). A second template for one (target kind, anchor kind) is refused."""
    if not template.name:
        raise ValueError("a template needs a name")
    keys = [(template.target_kind, kind) for kind in (template.name, *template.aliases)]
    for key in keys:
        if key in TEMPLATES:
            raise ValueError(f"a {key[0]} template for anchor kind {key[1]!r} is already "
                             f"registered ({type(TEMPLATES[key]).__name__}); give the new "
                             "one another anchor kind or target kind")
    for key in keys:
        TEMPLATES[key] = template
    return template


def get_template(name: str, target_kind: str = "llvm") -> Template | None:
    """The template for anchor kind `name` on targets of `target_kind`, else None."""
    load_templates()
    return TEMPLATES.get((target_kind, name))


def templates_for(target_kind: str = "llvm") -> dict[str, Template]:
    """Anchor kind -> template for targets of `target_kind`."""
    load_templates()
    return {kind: t for (tk, kind), t in TEMPLATES.items() if tk == target_kind}


@functools.cache
def _import_template_modules() -> None:
    for module in TEMPLATE_MODULES:
        importlib.import_module(module)


def load_templates() -> dict[tuple[str, str], Template]:
    """Import the template modules (once) and return the registry."""
    _import_template_modules()
    return TEMPLATES
