"""Figures written atomically as PNG and PDF (no pyplot state, no display needed).

matplotlib is imported on the first figure, not with the modules that draw one: an
entry point that stops at a bad config, or a job that never plots, starts without it
(0.27 s of `matplotlib.figure` per process on a 2-core host, 2026-11-30).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from ceu_jax import io

if TYPE_CHECKING:
  from matplotlib.figure import Figure

FORMATS = ("png", "pdf")


def figure(**kwargs: Any) -> "Figure":
  """`matplotlib.figure.Figure(**kwargs)` (the Agg canvas; matplotlib imported here)."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top,redefined-outer-name
  return Figure(**kwargs)


def save_figure(fig: Figure, stem: str, formats: Sequence[str] = FORMATS) -> list[str]:
  """Write stem.png and stem.pdf (an extension on stem is dropped), each atomically.

  Saved with bbox_inches='tight' (and a small pad), so titles, legends and labels
  that reach past the figure's edge are kept, never clipped.
  """
  base, ext = os.path.splitext(stem)
  base = base if ext.lstrip(".") in FORMATS else stem
  paths = [f"{base}.{fmt}" for fmt in formats]
  for path, fmt in zip(paths, formats):
    io.write_atomic(path, lambda f, fmt=fmt: fig.savefig(
        f, format=fmt, dpi=150, bbox_inches="tight", pad_inches=0.1))
  return paths
