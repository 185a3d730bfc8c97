"""Elapsed time and ETA for progress lines (training steps, grid cells, audit batches).

  p = Progress(total=3000, done=start)      # `done` units were finished before this run
  ...
  log(f"step {s}/3000 ... ({p.update(s)})")  # 'elapsed 0:01:05, ETA 0:04:10'

The rate is measured over the units finished in this process since the first
`update` (so a resumed run's earlier work and the first unit's compilation do not
skew it); before a rate exists the ETA reads '?'.
"""
from __future__ import annotations

import time
from typing import Callable


def fmt_duration(seconds: float | None) -> str:
  """'0:04:10' (h:mm:ss; days as '1d 2:03:04'); '?' for None or a non-finite value."""
  if seconds is None or not seconds == seconds or seconds in (float("inf"), float("-inf")):
    return "?"
  s = int(round(max(seconds, 0.0)))
  d, s = divmod(s, 86400)
  h, s = divmod(s, 3600)
  m, s = divmod(s, 60)
  return (f"{d}d " if d else "") + f"{h}:{m:02d}:{s:02d}"


class Progress:
  """Elapsed wall time since construction and an ETA for `total` units."""

  def __init__(self, total: int, done: int = 0, clock: Callable[[], float] = time.time):
    self.total = int(total)
    self.clock = clock
    self.start = clock()
    self._first: tuple[float, int] | None = None    # (time, done) at the first update
    self.done = int(done)

  def elapsed(self) -> float:
    return self.clock() - self.start

  def eta(self) -> float | None:
    """Seconds left at the rate since the first update (None: not measurable yet)."""
    if self.done >= self.total:
      return 0.0
    if self._first is None:
      return None
    t0, d0 = self._first
    rate = (self.done - d0) / max(self.clock() - t0, 1e-9)
    return None if rate <= 0 else (self.total - self.done) / rate

  def update(self, done: int) -> str:
    """Record `done` units finished; returns 'elapsed h:mm:ss, ETA h:mm:ss'."""
    self.done = int(done)
    if self._first is None:
      self._first = (self.clock(), self.done)
    return self.line()

  def line(self) -> str:
    return f"elapsed {fmt_duration(self.elapsed())}, ETA {fmt_duration(self.eta())}"
