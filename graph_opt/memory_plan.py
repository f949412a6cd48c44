"""Static memory planning over the kernel sequence of a fused graph.

Each intermediate tensor gets a storage slot for its lifetime (from the kernel that
writes it to the last kernel that reads it). A slot whose tensors are all dead is
reused by a later tensor (best fit by size, grown when needed), as TVM's graph
planner does. Two refinements:
- in-place: an elementwise kernel may write its output over an input that dies at
  that kernel and has the same size (it reads each element before writing it);
- aliases: a reshape-only kernel is no kernel at all; its output is a view of its
  input's storage, which then lives as long as either does.
Model outputs are never reused (they are read after the last kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Step:
    """One kernel call: the tensors it reads and writes, by id."""

    inputs: list[int]
    outputs: list[int]
    inplace: dict[int, int] = field(default_factory=dict)  # output -> input it may overwrite
    alias: dict[int, int] = field(default_factory=dict)  # output -> input it is a view of


@dataclass
class MemoryPlan:
    storage_of: dict[int, int]  # tensor id -> storage slot
    storage_bytes: list[int]  # size of each slot
    naive_bytes: int  # one buffer per tensor

    @property
    def planned_bytes(self) -> int:
        return sum(self.storage_bytes)

    def summary(self) -> dict[str, int]:
        return {"planned_bytes": self.planned_bytes, "naive_bytes": self.naive_bytes,
                "storages": len(self.storage_bytes)}


ALIGN = 64


def _aligned(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


def plan_memory(steps: list[Step], nbytes: dict[int, int], keep_alive: set[int],
                reuse: bool = True) -> MemoryPlan:
    """Assign a storage slot to every tensor in `nbytes` (the planned tensors: the
    intermediates). Tensors in `keep_alive` (model outputs) are never reused."""
    planned = set(nbytes)
    # Resolve aliases to the tensor that owns the bytes.
    owner: dict[int, int] = {}

    def root(t: int) -> int:
        while t in owner:
            t = owner[t]
        return t

    for step in steps:
        for out, src in step.alias.items():
            if out in planned and src in planned:
                owner[out] = src

    last_use: dict[int, int] = {}
    for i, step in enumerate(steps):
        for t in step.inputs + step.outputs:
            if t in planned:
                last_use[root(t)] = max(last_use.get(root(t), -1), i)
    end = len(steps)
    for t in keep_alive:
        if t in planned:
            last_use[root(t)] = end
    # An owner must hold as many bytes as its largest view.
    need: dict[int, int] = {}
    for t in planned:
        need[root(t)] = max(need.get(root(t), 0), _aligned(nbytes[t]))

    storage_of: dict[int, int] = {}
    sizes: list[int] = []
    free: list[int] = []  # free slots
    live_in: dict[int, set[int]] = {}  # slot -> owner tensors using it

    def release_dead(i: int) -> None:
        for slot, users in live_in.items():
            if users and all(last_use.get(u, -1) < i for u in users):
                users.clear()
                free.append(slot)

    for i, step in enumerate(steps):
        release_dead(i)
        for out in step.outputs:
            if out not in planned or out in owner:
                continue
            size = need[out]
            slot = None
            src = step.inplace.get(out)
            if (reuse and src is not None and src in planned and root(src) not in keep_alive
                    and last_use.get(root(src)) == i and need[root(src)] >= size
                    and len(live_in[storage_of[root(src)]]) == 1):
                slot = storage_of[root(src)]  # write over the dying input
            elif reuse and free:
                fits = [s for s in free if sizes[s] >= size]
                slot = min(fits, key=lambda s: sizes[s]) if fits else max(free, key=lambda s: sizes[s])
                free.remove(slot)
                sizes[slot] = max(sizes[slot], size)
            if slot is None:
                slot = len(sizes)
                sizes.append(size)
                live_in[slot] = set()
            storage_of[out] = slot
            live_in[slot].add(out)
    for t in planned:
        if t not in storage_of:
            storage_of[t] = storage_of[root(t)] if root(t) in storage_of else _new_slot(
                sizes, live_in, need[root(t)])
    naive = sum(_aligned(nbytes[t]) for t in planned if t not in owner)
    return MemoryPlan(storage_of, sizes, naive)


def _new_slot(sizes: list[int], live_in: dict[int, set[int]], size: int) -> int:
    sizes.append(size)
    live_in[len(sizes) - 1] = set()
    return len(sizes) - 1
