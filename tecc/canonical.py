"""Canonical JSON: one spelling of a value, so that equal values give equal strings
(workload keys, config keys, digests) on every machine. It imports nothing of TVM
or torch, so records, the runtime and the compiler all use it."""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> str:
    """`value` as compact JSON with sorted keys."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
