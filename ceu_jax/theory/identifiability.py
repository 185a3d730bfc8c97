"""T1 (identifiability): restoration in log-likelihood space vs logit space.

SPEC §7 / paper 000, "Theorem 1". For one example with clean (D+), corrupted
(D−) and intervened (D− with h_f patched from D+) runs:

  logit space:   R_logit = (ℓ_int − ℓ−) / (ℓ+ − ℓ−),  ℓ = gold logit
                 (summed over answer tokens for a multi-token answer);
  loglik space:  R_ll    = (L_int − L−) / (L+ − L−),  L = log p(y* | ...)
                 (summed per-token log-softmax, SPEC §1).

Both are the *unclipped* restoration fractions (the idealised Attrib_f): the
clip in CEU would hide exactly the discrepancy T1 is about.

Exact decomposition used here (all in nats). Write L(z) = Σ_t z_{t,y_t} −
lse(z_t) and Δ = z+ − z−, Δ_int = z_int − z− (logit vectors, per token t).
A second-order Taylor expansion around z− gives

  L+ − L−     = a     + E,      a     = Σ_t (e_{y_t} − p−_t) · Δ_t,
  L_int − L−  = a_int + E_int,  a_int = Σ_t (e_{y_t} − p−_t) · Δ_int,t,

with p−_t = softmax(z−_t) and |E| ≤ ¼ Σ_t ||Δ_t||², because the Hessian of
log-sum-exp, diag(p) − p pᵀ, has spectral norm ≤ ½. Hence

  R_ll − R_logit = (R_lin − R_logit) + (R_ll − R_lin),   R_lin = a_int / a,

  * calibration term  R_lin − R_logit: first-order effect of the non-gold
    logits moving (it is exactly 0 when only the gold logits move, or when the
    intervened shift is proportional to the full shift);
  * remainder         R_ll − R_lin, bounded by
        |R_ll − R_lin| ≤ (¼ Σ||Δ_int,t||² + |R_lin| ¼ Σ||Δ_t||²)
                         / (|a| − ¼ Σ||Δ_t||²)
    which vanishes as the logit perturbation shrinks (O(||Δ||) relative).

So R_ll → R_logit as the perturbation shrinks whenever the other logits stay
put (the paper's "other logits remain within a bounded interval" condition);
otherwise the difference converges to the calibration term.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ceu_jax.theory.stats import as_float_array

DEFAULT_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class T1Result:
  """Per-example T1 quantities ([B] arrays; NaN where degenerate).

  Attributes:
    r_loglik: restoration fraction in log-likelihood space.
    r_logit: restoration fraction in gold-logit space.
    diff: r_loglik − r_logit.
    perturbation: logit perturbation size in nats: max_{t,v} |z+ − z−| when
      full logit vectors are given, else |ℓ+ − ℓ−| (gold logit gap).
    degenerate: |ℓ+ − ℓ−| < eps or |L+ − L−| < eps (fractions undefined).
    r_linear: first-order (linearised) log-likelihood fraction a_int / a.
    calibration: r_linear − r_logit (first-order non-gold-logit effect).
    remainder: r_loglik − r_linear (second-order, vanishes with perturbation).
    remainder_bound: the curvature bound on |remainder| (inf if vacuous).
  The last four are None when only gold scalars were given.
  """
  r_loglik: np.ndarray
  r_logit: np.ndarray
  diff: np.ndarray
  perturbation: np.ndarray
  degenerate: np.ndarray
  r_linear: np.ndarray | None = None
  calibration: np.ndarray | None = None
  remainder: np.ndarray | None = None
  remainder_bound: np.ndarray | None = None

  @property
  def n_degenerate(self) -> int:
    return int(self.degenerate.sum())


def restoration_fraction(
    clean, corrupt, intervened, eps: float = DEFAULT_EPS
) -> tuple[np.ndarray, np.ndarray]:
  """Unclipped restoration (x_int − x−) / (x+ − x−) and its degenerate flag.

  Returns:
    (fraction, degenerate): fraction is NaN where |x+ − x−| < eps, and those
    examples are flagged in the boolean `degenerate` array (never silent).
  """
  clean, corrupt, intervened = (as_float_array(x) for x in
                                (clean, corrupt, intervened))
  gap = clean - corrupt
  degenerate = np.abs(gap) < eps
  safe = np.where(degenerate, 1.0, gap)
  frac = np.where(degenerate, np.nan, (intervened - corrupt) / safe)
  return frac, degenerate


def t1_from_scalars(
    logit_clean, logit_corrupt, logit_int,
    ll_clean, ll_corrupt, ll_int,
    eps: float = DEFAULT_EPS,
) -> T1Result:
  """T1 from gold logits ℓ and gold log-likelihoods L of the three runs ([B])."""
  r_logit, deg_logit = restoration_fraction(logit_clean, logit_corrupt,
                                            logit_int, eps)
  r_ll, deg_ll = restoration_fraction(ll_clean, ll_corrupt, ll_int, eps)
  degenerate = deg_logit | deg_ll
  r_logit = np.where(degenerate, np.nan, r_logit)
  r_ll = np.where(degenerate, np.nan, r_ll)
  pert = np.abs(as_float_array(logit_clean) - as_float_array(logit_corrupt))
  return T1Result(r_ll, r_logit, r_ll - r_logit, pert, degenerate)


def _log_softmax(z: np.ndarray) -> np.ndarray:
  m = z.max(axis=-1, keepdims=True)
  return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def _as_tokens(z, gold) -> tuple[np.ndarray, np.ndarray]:
  """Promotes [B, V] / [B] inputs to [B, A, V] / [B, A]."""
  z = as_float_array(z)
  gold = np.asarray(gold, dtype=np.int64)
  if z.ndim == 2:
    z, gold = z[:, None, :], gold.reshape(-1, 1)
  if z.ndim != 3 or gold.shape != z.shape[:2]:
    raise ValueError(f"logits {z.shape} and gold {gold.shape} do not match")
  return z, gold


def _gold(z: np.ndarray, gold: np.ndarray) -> np.ndarray:
  """Sum over answer tokens of the gold entries of z [B, A, V] -> [B]."""
  return np.take_along_axis(z, gold[..., None], axis=-1)[..., 0].sum(axis=-1)


def gold_logit(z, gold) -> np.ndarray:
  """Gold logit ℓ(y* | ...) [B], summed over answer tokens."""
  return _gold(*_as_tokens(z, gold))


def gold_loglik(z, gold) -> np.ndarray:
  """Gold log-likelihood L [B] (float64 numpy twin of ceu_jax.likelihood)."""
  z, gold = _as_tokens(z, gold)
  return _gold(_log_softmax(z), gold)


def _linearisation(z_corrupt, delta, gold) -> tuple[np.ndarray, np.ndarray]:
  """First-order term a = Σ_t (e_y − p−_t)·Δ_t and curvature bound ¼Σ||Δ_t||²."""
  p = np.exp(_log_softmax(z_corrupt))
  a = _gold(delta, gold) - (p * delta).sum(axis=(-1, -2))
  return a, 0.25 * (delta ** 2).sum(axis=(-1, -2))


def t1_from_logits(
    z_clean, z_corrupt, z_int, gold, eps: float = DEFAULT_EPS
) -> T1Result:
  """T1 from full logit vectors [B, V] (or [B, A, V]) of the three runs.

  Args:
    z_clean, z_corrupt, z_int: logits of the clean, corrupted and intervened
      runs; [B, V] for single-token answers, [B, A, V] under teacher forcing.
    gold: gold class indices [B] (or [B, A]).
    eps: gaps below eps (in nats) are degenerate.

  Returns:
    T1Result with the decomposition diff = calibration + remainder.
  """
  zc, g = _as_tokens(z_clean, gold)
  zm, _ = _as_tokens(z_corrupt, gold)
  zi, _ = _as_tokens(z_int, gold)
  base = t1_from_scalars(_gold(zc, g), _gold(zm, g), _gold(zi, g),
                         gold_loglik(zc, g), gold_loglik(zm, g),
                         gold_loglik(zi, g), eps)
  a, q = _linearisation(zm, zc - zm, g)
  a_int, q_int = _linearisation(zm, zi - zm, g)
  r_lin, _ = restoration_fraction(a, np.zeros_like(a), a_int, eps)
  r_lin = np.where(base.degenerate, np.nan, r_lin)
  denom = np.abs(a) - q
  with np.errstate(divide="ignore", invalid="ignore"):
    bound = np.where(denom > 0, (q_int + np.abs(r_lin) * q) / denom, np.inf)
  pert = np.abs(zc - zm).max(axis=(-1, -2))
  return dataclasses.replace(
      base, perturbation=pert, r_linear=r_lin,
      calibration=r_lin - base.r_logit, remainder=base.r_loglik - r_lin,
      remainder_bound=bound)


def t1_error_curve(
    perturbations, diffs, n_bins: int = 10
) -> dict[str, np.ndarray]:
  """Summarises |diff| against perturbation size in log-spaced bins.

  Returns a dict of [n_bins'] arrays: `centre` (geometric bin centre, nats),
  `median`, `q10`, `q90`, `max` of |diff|, and `n` per bin (empty bins dropped).
  Degenerate (NaN) examples are ignored.
  """
  pert = as_float_array(perturbations).reshape(-1)
  err = np.abs(as_float_array(diffs).reshape(-1))
  ok = np.isfinite(pert) & np.isfinite(err) & (pert > 0)
  pert, err = pert[ok], err[ok]
  edges = np.geomspace(pert.min(), pert.max() * (1 + 1e-9), n_bins + 1)
  which = np.clip(np.digitize(pert, edges) - 1, 0, n_bins - 1)
  rows = [(np.sqrt(edges[i] * edges[i + 1]), err[which == i])
          for i in range(n_bins) if np.any(which == i)]
  return {
      "centre": np.array([c for c, _ in rows]),
      "median": np.array([np.median(e) for _, e in rows]),
      "q10": np.array([np.quantile(e, 0.1) for _, e in rows]),
      "q90": np.array([np.quantile(e, 0.9) for _, e in rows]),
      "max": np.array([e.max() for _, e in rows]),
      "n": np.array([e.size for _, e in rows]),
  }
