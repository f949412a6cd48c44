"""What the measurement layer needs from a tuning task.

A task is one distinct workload on one target (DESIGN.md, "Tasks and workload keys").
autotune/measure.py only talks to tasks through this protocol, so a task may be a
fused group of a model or a hand-written kernel in a test.

Tasks are pickled and sent to the build worker processes (spawned interpreters), so a
task class must be importable by its module path and its fields picklable (shapes,
dtypes, attributes, an IR Function; a tvm Target pickles too, a JSON dict is safer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # the protocol must import without tvm (the runner side needs none)
    import numpy as np
    import tvm
    from tecc.schedules.space import Config


@runtime_checkable
class TunableTask(Protocol):
    """One tunable kernel.

    name:      a short readable name (logs, file names).
    workload:  the workload key's JSON (template, shapes, dtypes, anchor attributes);
               written to every tuning record as is.
    target:    a tvm.target.Target or its JSON dict (tecc.target.target_to_json).

    build_primfunc(config): the scheduled PrimFunc for `config`, arguments in the
        order inputs then outputs, static shapes. Runs in a build worker process.
    reference_inputs(seed): random inputs for the kernel (never all zeros, so a
        kernel that ignores an input shows), the same for the same seed.
    reference_outputs(inputs): the trusted outputs for those inputs, computed
        WITHOUT the schedule under test: numpy, or the task's own untuned fallback
        build if it has one it trusts. Measured candidates are compared with these;
        the first candidate that happens to run is never used as the reference, since
        it may be the wrong one. Runs in the tuner's process, once per task.
    adapt_io(config, inputs, expected) (optional): the reference inputs and outputs
        in the layout `config`'s kernel takes (schedules.tasks.Task: a conv's channel
        blocks and a dense's weight packing are knobs); the runner calls it per
        candidate when the task has it.
    """

    name: str
    workload: dict[str, Any]
    target: tvm.target.Target | dict[str, Any]

    def build_primfunc(self, config: Config) -> tvm.tirx.PrimFunc: ...

    def reference_inputs(self, seed: int) -> list[np.ndarray]: ...

    def reference_outputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]: ...
