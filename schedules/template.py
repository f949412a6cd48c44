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

Dispatch (schedules/default.py): every root block whose "tecc.anchor" annotation
(computes.py) is a key of TEMPLATES is scheduled by that template, on a copy of the
schedule: define_space(ctx), then the config chosen for the workload (a tuning
record through the caller's callback) or fallback(space, ctx), then apply(ctx, cfg).
If apply raises, the copy is dropped (a chosen config falls back to the fallback
config first, then to the generic schedule): never wrong, maybe slow.

Every config of a space must give correct code: an invalid one is a template bug.
The space depends only on the anchor (its shapes, dtypes and attributes), never on
the fused epilogue, so one tuned config serves every fused variant of a workload.

The workload (the tuning key's JSON) comes from the anchor's IR call:
`Template.workload(call, kind)`; the default is generic (template name, the
call's input shapes and dtypes, its attributes); conv templates override it to
speak NCHW terms, so that the channel blocks can be knobs.

Template modules register themselves on import; `load_templates()` imports the
modules named in TEMPLATE_MODULES (missing ones are skipped).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import Any

import tvm
from tecc.schedules.space import Config, ConfigSpace
from tvm.s_tir.schedule import Schedule

log = logging.getLogger(__name__)

# Modules whose import registers templates (in this order).
TEMPLATE_MODULES = (
    "tecc.schedules.templates_dense",
    "tecc.schedules.templates_conv",
    "tecc.schedules.templates_reduce",
)


@dataclass
class ScheduleContext:
    """What a template sees: the schedule, its anchor block, and the target facts.

    kind: the anchor's "tecc.anchor" annotation (a template may serve several).
    workload: the workload dict of the anchor (Template.workload of its IR call);
        None when the schedule was not lowered from IR (a hand-made PrimFunc).
    """

    sch: Schedule
    block: Any  # the anchor's SBlockRV
    target: tvm.target.Target
    lanes: int  # float32 vector lanes of the target
    cores: int
    kind: str = ""
    workload: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def block_name(self) -> str:
        return self.sch.get(self.block).name_hint

    def loop_extents(self) -> list[int | None]:
        out = []
        for lp in self.sch.get_loops(self.block):
            ext = self.sch.get(lp).extent
            out.append(int(ext) if isinstance(ext, tvm.tirx.IntImm) else None)
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class Template:
    name: str = ""
    aliases: tuple[str, ...] = ()
    target_kind: str = "llvm"  # the TVM target kind it schedules for ("llvm", "cuda")

    def workload(self, call: Any, kind: str) -> dict[str, Any]:
        """The workload dict of the anchor IR Call `call` (an op Call whose compute
        wrote the anchor block): template name, input shapes and dtypes, attributes.
        Canonical JSON of it (autotune.records.workload_key) is the tuning key."""
        return {
            "template": self.name,
            "inputs": [[list(a.shape), str(a.dtype)] for a in call.args],
            "attrs": _jsonable(dict(call.attrs)),
        }

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


# (target kind, anchor kind) -> template; TEMPLATES: the llvm ones by anchor kind.
REGISTRY: dict[tuple[str, str], Template] = {}
TEMPLATES: dict[str, Template] = {}


def register_template(template: Template) -> Template:
    """Register `template` under its name and each alias (anchor kinds), for its
    target kind."""
    if not template.name:
        raise ValueError("a template needs a name")
    for kind in (template.name, *template.aliases):
        key = (template.target_kind, kind)
        if key in REGISTRY and REGISTRY[key] is not template:
            raise ValueError(f"template {kind!r} for {template.target_kind} registered twice")
        REGISTRY[key] = template
        if template.target_kind == "llvm":
            TEMPLATES[kind] = template
    return template


def get_template(name: str, target_kind: str = "llvm") -> Template | None:
    load_templates(target_kind)
    return REGISTRY.get((target_kind, name))


def templates_for(target_kind: str = "llvm") -> dict[str, Template]:
    """Anchor kind -> template for targets of `target_kind`."""
    return dict(load_templates(target_kind))


# Modules whose import registers the templates of other target kinds.
TARGET_TEMPLATE_MODULES = {"cuda": ("tecc.schedules.gpu_templates",)}
_loaded: set[str] = set()


def load_templates(target_kind: str = "llvm") -> dict[str, Template]:
    """Import the template modules of `target_kind` (once) and return its templates
    by anchor kind."""
    if target_kind not in _loaded:
        _loaded.add(target_kind)
        modules = TEMPLATE_MODULES if target_kind == "llvm" else \
            TARGET_TEMPLATE_MODULES.get(target_kind, ())
        for module in modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as err:
                if err.name != module:
                    raise
                log.debug("template module %s not present", module)
    if target_kind == "llvm":
        return TEMPLATES
    return {kind: t for (tk, kind), t in REGISTRY.items() if tk == target_kind}
