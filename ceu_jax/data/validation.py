"""Field checks shared by every task config: errors name the field and its range."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

import numpy as np

T = TypeVar("T")


def check_unit(name: str, value: Any) -> None:
  """`data.<name>` must be a number in [0, 1]."""
  if (not isinstance(value, (int, float, np.floating)) or isinstance(value, bool)
      or not 0.0 <= value <= 1.0):
    raise ValueError(f"data.{name} must be in [0, 1], got {value!r}")


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
  """`data.<name>` must be an integer in [lo, hi] (or >= lo)."""
  if (not isinstance(value, (int, np.integer)) or isinstance(value, bool)
      or value < lo or (hi is not None and value > hi)):
    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    raise ValueError(f"data.{name} must be an integer {rng}, got {value!r}")


def from_mapping(cls: type[T], cfg: Mapping[str, Any]) -> T:
  """Build a frozen task-config dataclass from a config's data section
  (`task` is ignored); unknown fields are errors naming them."""
  items = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
  items.pop("task", None)
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(items) - known)
  if unknown:
    raise ValueError(f"data: unknown field(s) {unknown}; known fields: {sorted(known)}")
  return cls(**items)
