"""Metrics to `<workdir>/metrics.jsonl` and TensorBoard (tensorboardX), process 0 only.

Each JSON line is {"step": s, "split": "train" | "eval", <name>: float, ...}.
Keys under "perf/" (wall-clock rates) are the only non-deterministic ones.
On resume, `truncate_after(step)` drops lines of steps after the restored
checkpoint so that the file equals that of an uninterrupted run.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import jax
import numpy as np


def _scalar(x: Any) -> float | int | None:
  x = np.asarray(x)
  if x.size != 1:
    return None
  v = x.reshape(()).item()
  if isinstance(v, bool):
    return int(v)
  return v if isinstance(v, int) else float(v)


class MetricWriter:
  def __init__(self, workdir: str, tensorboard: bool = True):
    self.active = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if self.active and tensorboard:
      try:
        from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      except ImportError:   # pragma: no cover
        self._tb = None

  def truncate_after(self, step: int) -> None:
    """Keep only lines with step <= `step` (rewritten atomically)."""
    if not self.active or not os.path.exists(self.path):
      return
    kept = []
    with open(self.path) as f:
      for line in f:
        try:
          if json.loads(line)["step"] <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
        except (ValueError, KeyError):
          continue   # a torn last line from a kill
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(kept)
    os.replace(tmp, self.path)

  def write(self, step: int, split: str, values: Mapping[str, Any]) -> dict:
    row = {"step": int(step), "split": split}
    for k, v in values.items():
      s = _scalar(v)
      if s is not None:
        row[k] = s
    if self.active:
      with open(self.path, "a") as f:
        f.write(json.dumps(row, sort_keys=True, allow_nan=True) + "\n")
        f.flush()
      if self._tb is not None:
        for k, v in row.items():
          if k not in ("step", "split") and isinstance(v, (int, float)) and math.isfinite(v):
            self._tb.add_scalar(f"{split}/{k}", v, step)
    return row

  def flush(self) -> None:
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
