"""Types and attribute values of the tecc IR: tensor and tuple types, the immutable
attribute mapping of a call, and the error a type relation raises. The op registry
(frontend/ops.py) and the expressions (frontend/ir.py) are both built on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Shape = tuple[int, ...]


@dataclass(frozen=True)
class TensorType:
    shape: Shape
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"Tensor[({', '.join(map(str, self.shape))}), {self.dtype}]"


@dataclass(frozen=True)
class TupleType:
    fields: tuple[Type, ...]

    def __str__(self) -> str:
        return f"({', '.join(map(str, self.fields))})"


Type = TensorType | TupleType


class IRTypeError(TypeError):
    """A type relation rejected its arguments (wrong rank, mismatched shapes...)."""


def freeze_attr(value: Any) -> Any:
    """Attributes are stored immutably (lists become tuples) so nodes hash."""
    if isinstance(value, list | tuple):
        return tuple(freeze_attr(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


class Attrs(Mapping):
    """An immutable, ordered mapping of attribute name to value."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items = {k: freeze_attr(v) for k, v in sorted((items or {}).items())}
        self._hash = hash(tuple(self._items.items()))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def with_(self, **updates: Any) -> Attrs:
        return Attrs({**self._items, **updates})

    def __repr__(self) -> str:
        return f"Attrs({self._items!r})"
