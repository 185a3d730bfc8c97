"""Aggregates with percentile-bootstrap confidence intervals (SPEC §5, §8).

Every aggregate the project reports is an `Aggregate`: the statistic on the
full sample, a percentile-bootstrap CI (default 95%, 1000 resamples, fixed
seed) and the number of examples behind it. Resampling draws example indices
with replacement; several aligned arrays are resampled with the same indices
(paired), which is what a difference of two conditions on the same examples
needs (e.g. Δcausal = Δremove − Δplacebo of the answer-presence audit).

An empty sample gives `Aggregate(None, None, None, 0)`: absent, never 0 or NaN.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 0
DEFAULT_LEVEL = 0.95
# Upper bound on resample-chunk size (resamples × examples) held in memory.
_CHUNK_ELEMENTS = 1 << 22

# A vectorised statistic maps arrays of shape [R, n, ...] to [R].
VectorStatistic = Callable[..., np.ndarray]


@dataclasses.dataclass(frozen=True)
class Aggregate:
  """One reported number: value, bootstrap CI bounds and sample size n.

  `n_excluded` (examples left out: masked, degenerate, non-finite) and `note`
  (e.g. why a value is infinite) are what the theory's estimators add; both are
  written by `to_dict` only when set. An absent value or endpoint is None.
  """
  value: float | None
  ci_low: float | None
  ci_high: float | None
  n: int
  n_excluded: int = 0
  note: str = ""

  def to_dict(self) -> dict:
    """JSON-able dict {value, ci_low, ci_high, n} (+ n_excluded, note when set)."""
    d = dataclasses.asdict(self)
    for key in ("n_excluded", "note"):
      if not d[key]:
        del d[key]
    return d

  @classmethod
  def from_dict(cls, d: Mapping | None) -> "Aggregate":
    """The inverse of `to_dict`; None or {} gives `EMPTY`. Reads the theory's files
    written before the one type (bounds.json: 'lo', 'hi', 'level') too."""
    if not d:
      return EMPTY
    return cls(d.get("value"), d.get("ci_low", d.get("lo")), d.get("ci_high", d.get("hi")),
               int(d.get("n") or 0), int(d.get("n_excluded") or 0), str(d.get("note") or ""))

  def floats(self) -> tuple[float, float, float]:
    """(value, ci_low, ci_high) with NaN for an absent one: for arithmetic and plots."""
    return tuple(np.nan if x is None else float(x)
                 for x in (self.value, self.ci_low, self.ci_high))

  def contains(self, x: float) -> bool:
    """Whether x lies in the closed CI [ci_low, ci_high] (False when n == 0)."""
    if self.ci_low is None or self.ci_high is None:
      return False
    return self.ci_low <= x <= self.ci_high


EMPTY = Aggregate(None, None, None, 0)


def fmt_ci(a: "Aggregate | Mapping | None", digits: int = 3, *, signed: bool = False,
           with_n: bool = False, missing: str = "—", style: str = "f",
           scale: float = 1.0) -> str:
  """The one way a reported number is printed: 'value [ci_low, ci_high]' (+ ' (n=..)').

  `a`: an Aggregate or its dict; `digits` after the point (style 'f') or significant
  (style 'g', the bounds report's: an exact −0 prints '0'); `signed`: '+0.12';
  `scale` multiplies value and endpoints (100: percentage points); `missing` for an
  absent or NaN value (no examples). A value without a CI prints alone; ±inf prints 'inf'.
  """
  if a is None:
    return missing
  if isinstance(a, Mapping):
    a = Aggregate.from_dict(a)
  n_txt = f" (n={a.n})" if with_n else ""
  if a.value is None or np.isnan(a.value):
    return missing + n_txt
  spec = f"{'+' if signed else ''}.{digits}{style}"
  zero = 0.0 if style == "g" else -0.0     # x + 0.0 turns −0.0 into 0.0; x + −0.0 keeps x
  f = lambda x: format(scale * x + zero, spec)
  ci = ("" if a.ci_low is None or a.ci_high is None
        else f" [{f(a.ci_low)}, {f(a.ci_high)}]")
  return f(a.value) + ci + n_txt


def _resample_chunks(n: int, num_resamples: int, seed: int):
  """Yields index matrices [r, n] (r ≤ num_resamples), deterministic in seed."""
  rng = np.random.default_rng(seed)
  chunk = max(1, min(num_resamples, _CHUNK_ELEMENTS // max(n, 1)))
  done = 0
  while done < num_resamples:
    r = min(chunk, num_resamples - done)
    yield rng.integers(0, n, size=(r, n))
    done += r


def _check_samples(samples: tuple[np.ndarray, ...]) -> int:
  if not samples:
    raise ValueError("at least one sample array is required")
  n = len(samples[0])
  for s in samples:
    if len(s) != n:
      raise ValueError(f"aligned samples must share length; got "
                       f"{[len(s) for s in samples]}")
  return n


def _finite(x: float) -> float | None:
  x = float(x)
  if not np.isfinite(x):
    raise ValueError(f"statistic is not finite ({x}); refusing to report it")
  return x


def _number(x: float) -> float | None:
  """A lenient bootstrap's number: NaN -> None (absent), ±inf kept."""
  x = float(x)
  return None if np.isnan(x) else x


def bootstrap(statistic: VectorStatistic, *samples: np.ndarray,
              num_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
              level: float = DEFAULT_LEVEL, method: str = "linear",
              strict: bool = True) -> Aggregate:
  """Percentile-bootstrap CI of a vectorised statistic of aligned samples.

  Args:
    statistic: maps arrays with a leading resample axis, [R, n, ...] each, to
      values [R]. The point estimate is `statistic(*(s[None] ...))[0]`.
    *samples: aligned per-example arrays [n, ...], resampled with shared
      indices (paired).
    num_resamples: number of bootstrap resamples R.
    seed: seed of the index generator (numpy default_rng).
    level: CI coverage, e.g. 0.95 -> the 2.5th and 97.5th percentiles.
    method: `np.quantile`'s method for the endpoints (the theory's ĉ uses
      'inverted_cdf': its resamples may be +inf).
    strict: True (every reported aggregate): the statistic and both endpoints
      must be finite, else ValueError. False (the theory's estimators): the
      point value may be ±inf (NaN reads None), NaN resample values are left out
      of the quantiles, and there is no CI (None) below 2 examples or when no
      resample value is left.

  Returns:
    Aggregate(value, ci_low, ci_high, n); `EMPTY` when n == 0.
  """
  samples = tuple(np.asarray(s) for s in samples)
  n = _check_samples(samples)
  if n == 0:
    return EMPTY
  number = _finite if strict else _number
  value = number(np.asarray(statistic(*(s[None] for s in samples)))[0])
  if not strict and n < 2:
    return Aggregate(value, None, None, n)
  stats = [np.asarray(statistic(*(s[idx] for s in samples)), dtype=np.float64)
           for idx in _resample_chunks(n, num_resamples, seed)]
  stats = np.concatenate(stats)
  if not strict:
    stats = stats[~np.isnan(stats)]
    if stats.size == 0:
      return Aggregate(value, None, None, n)
  alpha = (1.0 - level) / 2.0
  low, high = np.quantile(stats, [alpha, 1.0 - alpha], method=method)
  return Aggregate(value, number(low), number(high), n)


def bootstrap_scalar(statistic: Callable[..., float], *samples: np.ndarray,
                     **kwargs) -> Aggregate:
  """`bootstrap` for a plain statistic of [n, ...] arrays (looped, slower)."""

  def vectorised(*resampled):
    return np.array([statistic(*row) for row in zip(*resampled)])

  return bootstrap(vectorised, *samples, **kwargs)


def _mean(x: np.ndarray) -> np.ndarray:
  return x.mean(axis=1)


def _quantile(q: float) -> VectorStatistic:
  return lambda x: np.quantile(x, q, axis=1)


def mean_ci(values: np.ndarray, **kwargs) -> Aggregate:
  """Mean of [n] values with its bootstrap CI."""
  return bootstrap(_mean, _as_float_1d(values), **kwargs)


def quantile_ci(values: np.ndarray, q: float, **kwargs) -> Aggregate:
  """q-quantile (linear interpolation) of [n] values with its bootstrap CI."""
  return bootstrap(_quantile(q), _as_float_1d(values), **kwargs)


def paired_difference_ci(a: np.ndarray, b: np.ndarray,
                         statistic: str | float = "mean",
                         **kwargs) -> Aggregate:
  """stat(a) − stat(b) over paired examples, resampled jointly.

  Used for Δcausal = Δremove − Δplacebo (SPEC §8): a[i] and b[i] are the two
  per-example effects on the same example i. `statistic` is "mean", "median"
  or a quantile level in [0, 1].
  """
  stat = _named_statistic(statistic)
  return bootstrap(lambda x, y: stat(x) - stat(y), _as_float_1d(a),
                   _as_float_1d(b), **kwargs)


def stratified_paired_mean(strata: Sequence[tuple[np.ndarray, np.ndarray, float]], *,
                           num_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                           level: float = DEFAULT_LEVEL) -> Aggregate:
  """Σ_s w_s · mean_i (a_si − b_si) over independent item sets s, with its CI.

  `strata`: (a [n_s], b [n_s], w_s) per set; a[i] and b[i] are two cells' values on item
  i of set s (a difference of differences, e.g. H3's change of a paired EM difference
  from the clean test set to the shifted ones, when each test condition draws its own
  items). Each set's items are resampled on their own (stratified: set s draws with
  seed + s) and an item's two values jointly (paired); the percentile CI is over the
  resampled weighted sums. n = items over all sets. EMPTY without sets; every set must
  hold at least one item."""
  sets = [(_as_float_1d(a), _as_float_1d(b), float(w)) for a, b, w in strata]
  if not sets:
    return EMPTY
  for k, (a, b, _) in enumerate(sets):
    if len(a) != len(b) or len(a) == 0:
      raise ValueError(f"set {k}: {len(a)} and {len(b)} values; a set needs equal, "
                       "non-zero lengths")
  total = np.zeros(num_resamples)
  for k, (a, b, w) in enumerate(sets):
    d = a - b
    total += w * np.concatenate([d[idx].mean(axis=1) for idx in
                                 _resample_chunks(len(d), num_resamples, seed + k)])
  alpha = (1.0 - level) / 2.0
  low, high = np.quantile(total, [alpha, 1.0 - alpha])
  value = sum(w * float(np.mean(a - b)) for a, b, w in sets)
  return Aggregate(_finite(value), _finite(low), _finite(high), sum(len(a) for a, _, _ in sets))


def _named_statistic(statistic: str | float) -> VectorStatistic:
  if statistic == "mean":
    return _mean
  if statistic == "median":
    return _quantile(0.5)
  if isinstance(statistic, (int, float)) and 0.0 <= statistic <= 1.0:
    return _quantile(float(statistic))
  raise ValueError(f"unknown statistic {statistic!r}")


def _as_float_1d(values: np.ndarray) -> np.ndarray:
  values = np.asarray(values, dtype=np.float64)
  if values.ndim != 1:
    raise ValueError(f"expected a 1-D array, got shape {values.shape}")
  return values


def unpaired_bootstrap(statistic: VectorStatistic, a: tuple, b: tuple, *,
                       num_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                       level: float = DEFAULT_LEVEL) -> Aggregate:
  """statistic(*a) − statistic(*b) of two independent samples (different items, e.g. the
  COR and CNF cells of an audit, or two domains' items): a's aligned arrays resampled
  with `seed`, b's with `seed` + 1, each on its own; percentile CI of the resampled
  differences; n = len(a) + len(b) (items). EMPTY if either is empty. `statistic` maps
  arrays [R, n] to [R], as in `bootstrap`."""
  a = tuple(np.asarray(x, np.float64) for x in a)
  b = tuple(np.asarray(x, np.float64) for x in b)
  na, nb = _check_samples(a), _check_samples(b)
  if na == 0 or nb == 0:
    return EMPTY
  def resampled(xs, n, s):
    return np.concatenate([np.asarray(statistic(*(x[idx] for x in xs)), np.float64)
                           for idx in _resample_chunks(n, num_resamples, s)])
  diffs = resampled(a, na, seed) - resampled(b, nb, seed + 1)
  alpha = (1.0 - level) / 2.0
  low, high = np.quantile(diffs, [alpha, 1.0 - alpha])
  value = (np.asarray(statistic(*(x[None] for x in a)))[0]
           - np.asarray(statistic(*(x[None] for x in b)))[0])
  return Aggregate(_finite(value), _finite(low), _finite(high), na + nb)


def unpaired_difference_ci(a: np.ndarray, b: np.ndarray, **kwargs) -> Aggregate:
  """mean(a) − mean(b) of two independent samples (`unpaired_bootstrap`)."""
  return unpaired_bootstrap(_mean, (_as_float_1d(a),), (_as_float_1d(b),), **kwargs)
