"""Figures written atomically as PNG and PDF (no pyplot state, no display needed)."""
from __future__ import annotations

import os
from typing import Sequence

from matplotlib.figure import Figure

from ceu_jax import io

FORMATS = ("png", "pdf")


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
