"""The op registry: one definition per op, refused twice, and the facts read from it."""

import ast
from pathlib import Path

import pytest
from tecc.autotune.tune import estimate_flops
from tecc.frontend.op_defs.common import same_type
from tecc.frontend.ops import OPS, OpRegistry, Pattern, get_op
from tecc.schedules.tasks import task_from_workload

TARGET = {"kind": "llvm", "mcpu": "core-avx2", "num-cores": 2}
FRONTEND = Path(__file__).resolve().parents[1] / "frontend"


def _compute(args, attrs, out_type):
    return args[0]


def test_a_second_registration_of_a_name_raises():
    registry = OpRegistry()
    registry.register("twice", same_type, Pattern.ELEMWISE, 1, compute=_compute)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("twice", same_type, Pattern.ELEMWISE, 1, compute=_compute)
    registry.converter("aten.twice.default")(lambda *args: None)
    with pytest.raises(ValueError, match="registered twice"):
        registry.converter("aten.twice.default")(lambda *args: None)
    with pytest.raises(ValueError, match="registered twice"):
        OPS.register("relu", same_type, Pattern.ELEMWISE, 1, compute=_compute)
    with pytest.raises(KeyError, match="no op named 'nonexistent'"):
        get_op("nonexistent")


def test_the_ir_does_not_import_the_op_definitions():
    tree = ast.parse((FRONTEND / "ir.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any("op_defs" in m for m in imported), imported
    assert "tecc.frontend.ops" in imported  # the registry, filled by op_defs


def test_every_converted_op_and_its_facts_are_registered():
    assert OPS.converter_for("aten.roll.default") is not None
    assert OPS.converter_for("aten.hardswish.default") is not None
    # decomposed by torch on purpose, so no converter (see op_defs.linalg, op_defs.nn)
    assert OPS.converter_for("aten.linear.default") is None
    assert get_op("nn.max_pool2d").blocked_layout and get_op("mean").blocked_layout
    assert not get_op("prod").blocked_layout and not get_op("nn.softmax").blocked_layout


@pytest.mark.parametrize("workload, macs", [
    ({"template": "conv2d_NCHWc", "data": [1, 32, 14, 14], "kernel": [64, 32, 3, 3],
      "dtype": "float32", "strides": [2, 2], "padding": [1, 1, 1, 1], "dilation": [1, 1],
      "groups": 1}, 64 * 7 * 7 * 32 * 9),
    ({"template": "depthwise_conv2d_NCHWc", "data": [1, 32, 14, 14], "kernel": [32, 1, 3, 3],
      "dtype": "float32", "strides": [1, 1], "padding": [1, 1, 1, 1], "dilation": [1, 1],
      "groups": 32}, 32 * 14 * 14 * 9),
    ({"template": "dense", "inputs": [[[8, 96], "float32"], [[40, 96], "float32"]]},
     8 * 40 * 96),
])
def test_flops_counted_on_the_tir_are_two_per_multiply_add(workload, macs):
    assert estimate_flops(task_from_workload(workload, TARGET)) == 2 * macs
