"""Schedule templates: a template schedules one kind of anchor block (a dense, a
conv2d_NCHWc, a pool, a reduction, an injective group) and exposes its choices as
knobs of a ConfigSpace, so the tuner can search them.

    class DenseTemplate(Template):
        name = "dense"                      # the anchor kind it schedules
        def define_space(self, ctx): ...   # knobs from the anchor's loop extents
        def fallback(self, space, ctx): ... # heuristic config: shapes + target
        def apply(self, ctx, config): ...   # schedule ctx.sch with the config

Every config of a space must give correct code: an invalid one is a template bug.
The space depends only on the anchor (its shapes, dtypes and attributes), never on
the fused epilogue, so one tuned config serves every fused variant of a workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm.s_tir.schedule import Schedule

from schedules.space import Config, ConfigSpace


@dataclass
class ScheduleContext:
    """What a template sees: the schedule, its anchor block, and the target facts."""

    sch: Schedule
    block: Any  # the anchor's SBlockRV
    target: tvm.target.Target
    lanes: int  # float32 vector lanes of the target
    cores: int


class Template:
    name: str = ""

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        raise NotImplementedError

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        raise NotImplementedError

    def apply(self, ctx: ScheduleContext, config: Config) -> None:
        raise NotImplementedError


TEMPLATES: dict[str, Template] = {}


def register_template(template: Template) -> Template:
    if not template.name:
        raise ValueError("a template needs a name")
    if template.name in TEMPLATES:
        raise ValueError(f"template {template.name!r} registered twice")
    TEMPLATES[template.name] = template
    return template


def get_template(name: str) -> Template | None:
    return TEMPLATES.get(name)
