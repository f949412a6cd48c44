"""GPU schedule templates (target kind "cuda").

dense / matmul / batch_matmul (and their _nt forms): thread-block tiles staged
through shared memory, a register tile per thread (micro tile, optionally split over
virtual threads so that a warp's shared-memory reads fall in distinct banks),
vectorized cooperative loads, the epilogue fused on the register tile; the schedule
is TVM's dlight Matmul rule run with the config the knobs pick (it normalizes any
dense-like block to C[b, i, j] += A[b, i, k] * B[b, j, k] and pads the edges). A
matrix-vector product (M = 1) or a short batch (M <= 16) takes dlight's GEMV /
LowBatchGEMV instead (a split of K across the threads of a block), as a knob.

The fallback config picks the largest block tile that still gives about one block
per multiprocessor (at least 90% of them) without padding the matrix by more than a
third: on the H200 (fp32, TF32 off) that picked the best of these tiles for 1024^3
(17.6 TFLOP/s, cuBLAS 37.5), 4096^3 (21.1; 51.2) and 128x768x768 (7.7; 9.0), and one
within 15% of the best for 128x3072x768 (8.6 against 10.2; cuBLAS 25.7).
"""

from __future__ import annotations

import math
from typing import Any

import tvm
from tecc.schedules.space import Config, ConfigSpace
from tecc.schedules.template import ScheduleContext, Template, get_template, register_template
from tvm.s_tir.schedule import Schedule

from tecc.target import target_info

# (threads along M, threads along N, vthreads M, vthreads N, micro M, micro N):
# largest block tile first.
TILES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (16, 16, 2, 2, 4, 4),  # 128 x 128, 256 threads, 64 accumulators each
    (16, 16, 1, 2, 4, 4),  # 64 x 128
    (16, 16, 2, 1, 4, 4),  # 128 x 64
    (16, 16, 1, 1, 4, 4),  # 64 x 64
    (8, 16, 1, 1, 4, 4),   # 32 x 64 (dlight's default)
    (8, 8, 1, 1, 4, 4),    # 32 x 32
    (8, 8, 1, 1, 2, 2),    # 16 x 16
)
RULES = ("tiled", "gemv", "low_batch_gemv")
MAX_PADDING = 4 / 3


def tile_name(tile: tuple[int, ...]) -> str:
    """A tile as the knob spells it: threads M, N, vthreads M, N, micro tile M, N."""
    return ",".join(str(v) for v in tile)


def tile_shape(tile: tuple[int, ...]) -> tuple[int, int]:
    tm, tn, vm, vn, mm, mn = tile
    return tm * vm * mm, tn * vn * mn


def matmul_dims(ctx: ScheduleContext) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of the anchor from its workload (the IR call's shapes)."""
    workload = ctx.workload or {}
    template = get_template(workload.get("template", "dense"))
    if template is None or not workload:
        raise ValueError("the GPU matmul template needs the anchor's workload")
    m, n, k = template.mnk_of_workload(workload)
    a_shape = workload["inputs"][0][0]
    batch = math.prod(a_shape[:-2]) if workload["template"] != "dense" else 1
    if workload["template"] == "dense":  # x[..., K]: the leading dims are rows
        m = math.prod(a_shape[:-1]) if len(a_shape) >= 2 else 1
    return batch, m, n, k


class GpuMatmulTemplate(Template):
    target_kind = "cuda"

    def __init__(self, name: str, aliases: tuple[str, ...]) -> None:
        self.name = name
        self.aliases = aliases

    def workload(self, call: Any, kind: str) -> dict[str, Any]:
        cpu = get_template(self.name)
        return cpu.workload(call, kind) if cpu is not None else super().workload(call, kind)

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        space = ConfigSpace()
        space.define_choice("rule", list(RULES))
        space.define_choice("tile", [tile_name(t) for t in TILES])
        space.define_choice("micro_k", [8, 16])
        space.define_choice("vector", [1, 2, 4])
        space.define_choice("unroll", [64, 256])
        return space

    def dims(self, ctx: ScheduleContext) -> tuple[int, int, int, int]:
        return matmul_dims(ctx)

    def fallback(self, space: ConfigSpace, ctx: ScheduleContext) -> Config:
        batch, m, n, k = self.dims(ctx)
        sms = target_info(ctx.target).multiprocessors or 108
        rule = "gemv" if m == 1 and batch == 1 else "low_batch_gemv" if m <= 16 else "tiled"
        tile = TILES[-1]
        for candidate in TILES:
            tm, tn = tile_shape(candidate)
            blocks = batch * -(-m // tm) * -(-n // tn)
            padding = (-(-m // tm) * tm * -(-n // tn) * tn) / (m * n)
            if blocks >= 0.9 * sms and padding <= MAX_PADDING:
                tile = candidate
                break
        vector = 4 if k % 4 == 0 and n % 4 == 0 else 2 if k % 2 == 0 and n % 2 == 0 else 1
        return space.from_json({"rule": rule, "tile": tile_name(tile),
                                "micro_k": 16 if k >= 64 else 8,
                                "vector": vector, "unroll": 256})

    def apply(self, ctx: ScheduleContext, config: Config) -> Schedule:
        import tvm.s_tir.dlight as dl

        func = ctx.sch.mod["main"]
        rule = config["rule"]
        with ctx.target:
            if rule == "gemv":
                result = dl.gpu.GEMV().apply(func, ctx.target, False)
            elif rule == "low_batch_gemv":
                result = dl.gpu.LowBatchGEMV().apply(func, ctx.target, False)
            else:
                result = None
            if result is None:  # the GEMV rules refuse some forms: the tiled one then
                result = _ConfiguredMatmul(config).apply(func, ctx.target, False)
        if result is None:
            raise ValueError(f"the {rule} rule does not apply to this group")
        return result[0] if isinstance(result, list) else result


class _ConfiguredMatmul:
    """dlight's Matmul rule with the template's config instead of its fixed one."""

    def __new__(cls, config: Config):
        import tvm.s_tir.dlight as dl

        tm, tn, vm, vn, mm, mn = (int(v) for v in config["tile"].split(","))
        vector = config["vector"]
        if mn % vector:
            vector = math.gcd(mn, vector)
        rule_config = dl.gpu.Matmul.Config(
            block_size_x=tm, block_size_y=tn, vthread_x=vm, vthread_y=vn, micro_size_x=mm,
            micro_size_y=mn, micro_size_k=config["micro_k"], vector_size=vector,
            unroll=config["unroll"], use_shared=True, storage_align=True, inner_x=False)

        class Configured(dl.gpu.Matmul):
            def get_configs(self, target: tvm.target.Target):
                return rule_config

        return Configured()


class GpuConvTemplate(GpuMatmulTemplate):
    """An NCHW conv2d as an implicit GEMM (M = N*OH*OW, N = OC, K = IC*KH*KW) with
    the matmul template's tiles. Depthwise and grouped convs are no single GEMM: the
    rule refuses them and the group gets the direct schedule (gpu_default.py)."""

    def workload(self, call: Any, kind: str) -> dict[str, Any]:
        return Template.workload(self, call, kind)

    def dims(self, ctx: ScheduleContext) -> tuple[int, int, int, int]:
        extents = ctx.loop_extents()
        if len(extents) != 7 or any(e is None for e in extents):
            raise ValueError("the GPU conv template expects n, oc, oh, ow, ic, kh, kw")
        n, oc, oh, ow, ic, kh, kw = extents
        return 1, n * oh * ow, oc, ic * kh * kw

    def define_space(self, ctx: ScheduleContext) -> ConfigSpace:
        space = ConfigSpace()
        space.define_choice("rule", ["tiled"])
        space.define_choice("tile", [tile_name(t) for t in TILES])
        space.define_choice("micro_k", [8, 16])
        space.define_choice("vector", [1, 2, 4])
        space.define_choice("unroll", [64, 256])
        return space


CONV2D = register_template(GpuConvTemplate("conv2d", ()))
DENSE = register_template(GpuMatmulTemplate("dense", ("dense_pack",)))
MATMUL = register_template(GpuMatmulTemplate("matmul", ("matmul_nt",)))
BATCH_MATMUL = register_template(GpuMatmulTemplate("batch_matmul", ("batch_matmul_nt",)))
