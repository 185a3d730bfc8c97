"""Small statistics helpers shared by the theory modules (pure numpy).

Every estimate is a `ceu_jax.metrics.resampling.Aggregate` (the project's one
aggregate type) from its one bootstrap, in the lenient mode (`strict=False`):
a value may be infinite, and below two examples there is no CI. Resampling
uses a fixed seed so results are reproducible.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ceu_jax.metrics import resampling
from ceu_jax.metrics.resampling import DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED, Aggregate


def as_float_array(x) -> np.ndarray:
  """Converts numpy / jax / list input to a float64 numpy array."""
  return np.asarray(x, dtype=np.float64)


def as_bool_array(x, n: int | None = None) -> np.ndarray:
  """Converts a mask to bool; None means all True (needs n)."""
  if x is None:
    if n is None:
      raise ValueError("n is required when the mask is None")
    return np.ones(n, dtype=bool)
  return np.asarray(x, dtype=bool)


def mean_estimate(
    x,
    mask=None,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> Aggregate:
  """Mean of x over mask, with a percentile-bootstrap CI (none below 2 examples).

  Non-finite entries of x are excluded and counted in n_excluded together with
  masked-out entries.
  """
  x = as_float_array(x).reshape(-1)
  keep = as_bool_array(mask, x.size).reshape(-1) & np.isfinite(x)
  sel = x[keep]
  est = resampling.mean_ci(sel, num_resamples=n_resamples, seed=seed, level=level,
                           strict=False)
  return dataclasses.replace(est, n_excluded=int(x.size - sel.size),
                             note="" if sel.size else "no examples")


def rate_estimate(
    events,
    mask=None,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> Aggregate:
  """Share of True events over mask, with a percentile-bootstrap CI."""
  return mean_estimate(as_bool_array(events).astype(np.float64), mask,
                       n_resamples=n_resamples, level=level, seed=seed)


def _spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Spearman rank correlation of each row pair of [R, n] arrays (NaN when constant)."""
  from scipy import stats as sps  # pylint: disable=import-outside-toplevel
  rx, ry = sps.rankdata(x, axis=-1), sps.rankdata(y, axis=-1)
  rx, ry = rx - rx.mean(-1, keepdims=True), ry - ry.mean(-1, keepdims=True)
  den = np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(den > 0, (rx * ry).sum(-1) / den, np.nan)


def spearman_estimate(
    x,
    y,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> Aggregate:
  """Spearman correlation of paired (x, y) over their finite pairs, with a
  percentile-bootstrap CI (pairs resampled jointly); non-finite pairs are counted
  in n_excluded."""
  x, y = as_float_array(x).reshape(-1), as_float_array(y).reshape(-1)
  keep = np.isfinite(x) & np.isfinite(y)
  est = resampling.bootstrap(_spearman_rows, x[keep], y[keep], num_resamples=n_resamples,
                             seed=seed, level=level, strict=False)
  return dataclasses.replace(est, n_excluded=int((~keep).sum()))
