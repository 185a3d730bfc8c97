"""Small statistics helpers shared by the theory modules (pure numpy).

Every aggregate carries a bootstrap 95% CI and the number of examples behind it
(SPEC §5). Resampling uses a fixed seed so results are reproducible.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ceu_jax.metrics import resampling

DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 0


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A point estimate with a percentile-bootstrap CI.

  Attributes:
    value: the point estimate on the full sample.
    lo, hi: CI endpoints (NaN when the sample is too small to resample).
    n: number of examples used.
    n_excluded: number of examples dropped (degenerate, masked out, ...).
    level: CI level, e.g. 0.95.
    note: free text (e.g. why an estimate is infinite).
  """
  value: float
  lo: float
  hi: float
  n: int
  n_excluded: int = 0
  level: float = 0.95
  note: str = ""

  def contains(self, x: float) -> bool:
    """True if x lies inside [lo, hi]."""
    return bool(self.lo <= x <= self.hi)

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


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


def bootstrap_ci(
    samples: np.ndarray | tuple[np.ndarray, ...],
    statistic: Callable[..., float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    level: float = 0.95,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float, float]:
  """Percentile bootstrap of statistic over examples (paired across arrays).

  Args:
    samples: one array [n] or a tuple of arrays sharing the example axis 0;
      the same resampled indices are applied to every array (paired bootstrap).
    statistic: maps the (resampled) arrays to a float.
    n_resamples: number of bootstrap resamples.
    level: two-sided CI level.
    seed: RNG seed.

  Returns:
    (value, lo, hi). lo and hi are NaN when n < 2; non-finite resample values
    are ignored when taking quantiles.
  """
  arrays = samples if isinstance(samples, tuple) else (samples,)
  n = len(arrays[0])
  value = float(statistic(*arrays))
  if n < 2:
    return value, float("nan"), float("nan")
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, n, size=(n_resamples, n))
  draws = np.array([statistic(*(a[i] for a in arrays)) for i in idx], dtype=float)
  draws = draws[np.isfinite(draws)]
  if draws.size == 0:
    return value, float("nan"), float("nan")
  tail = (1.0 - level) / 2.0
  lo, hi = np.quantile(draws, [tail, 1.0 - tail])
  return value, float(lo), float(hi)


def mean_estimate(
    x,
    mask=None,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    level: float = 0.95,
    seed: int = DEFAULT_SEED,
) -> Estimate:
  """Mean of x over mask, with a percentile-bootstrap CI.

  Non-finite entries of x are excluded and counted in n_excluded together with
  masked-out entries.
  """
  x = as_float_array(x).reshape(-1)
  keep = as_bool_array(mask, x.size).reshape(-1) & np.isfinite(x)
  sel = x[keep]
  if sel.size == 0:
    return Estimate(float("nan"), float("nan"), float("nan"), 0, int(x.size),
                    level, note="no examples")
  vectorised = _bootstrap_mean(sel, n_resamples, level, seed)
  return Estimate(float(sel.mean()), vectorised[0], vectorised[1],
                  int(sel.size), int(x.size - sel.size), level)


def _bootstrap_mean(
    x: np.ndarray, n_resamples: int, level: float, seed: int
) -> tuple[float, float]:
  """Percentile bootstrap CI of the mean (shared with ceu_jax.metrics); NaN when n < 2."""
  if x.size < 2:
    return float("nan"), float("nan")
  agg = resampling.mean_ci(x, num_resamples=n_resamples, seed=seed, level=level)
  return float(agg.ci_low), float(agg.ci_high)


def rate_estimate(
    events,
    mask=None,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    level: float = 0.95,
    seed: int = DEFAULT_SEED,
) -> Estimate:
  """Share of True events over mask, with a percentile-bootstrap CI."""
  return mean_estimate(as_bool_array(events).astype(np.float64), mask,
                       n_resamples=n_resamples, level=level, seed=seed)
