"""T3 (upper bound on unsupported answering under retriever misses).

SPEC §7 / paper 000, "Theorem 3":

  Pr[unsupported output] ≤ η + (1 − η) exp(−c α γ),

  η  retriever miss probability Pr[e ∉ D];
  α  = E[CEU_ev | evidence present];
  γ  = expected evidence-swap margin: how much an evidence swap D+ → D− lowers
       the gold preference (paper: "evidence swaps reduce the retrieval-mediated
       gold logit by at least a margin γ"). ℓ_par does not depend on D, so this
       is the drop of the gold score itself; with test distractors at rate δ,
       γ → γ(δ);
  c  the constant of the logit-to-error calibration
       Pr[error | margin m] ≈ exp(−c m), fitted on a held-out split.

Units: γ and the calibration margins must be on the same scale (nats of
logit, or nats of log-likelihood); c then has units 1/nat and c·α·γ is
dimensionless. Estimators (all with percentile-bootstrap 95% CIs):

  α̂ = mean of CEU_ev over evidence-present, non-degenerate examples;
  γ̂ = mean of m+ − m− over evidence-present examples, where m is the chosen
       margin (default: the gold-vs-best-alternative logit margin, see
       `logit_margin`; or the gold log-likelihood, giving L+ − L−);
  ĉ = argmax_c Σ_i e_i log p_i + (1 − e_i) log(1 − p_i), p_i = exp(−c m_i),
       over held-out examples with margin m_i > 0 and error indicator e_i
       (maximum likelihood; the log-likelihood is concave in c, so the root of
       the score equation is unique). A conservative alternative, "envelope",
       is the largest c whose curve exp(−c m) stays above the empirical error
       rate of every margin bin (so the calibration inequality holds there).

Violations of the bound are listed for every η where they occur. Note that
the bound plugs the *mean* advantage α γ into the calibration curve; by
convexity E[exp(−c m_i)] ≥ exp(−c E[m_i]), so a per-example calibration does
not by itself imply the bound, and genuine violations can occur: they are
reported, not hidden.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize

from ceu_jax.metrics import resampling
from ceu_jax.metrics.resampling import (DEFAULT_LEVEL, DEFAULT_RESAMPLES, DEFAULT_SEED,
                                        Aggregate, fmt_ci)
from ceu_jax.theory.stats import as_bool_array, as_float_array, mean_estimate, rate_estimate


def t3_bound(eta, alpha, gamma, c):
  """η + (1 − η) exp(−c α γ), broadcast over the inputs (not clipped).

  c = inf (no held-out errors) with α γ = 0 is read as exponent 0.
  """
  eta = as_float_array(eta)
  ag = as_float_array(alpha) * as_float_array(gamma)
  with np.errstate(invalid="ignore"):
    expo = np.where(ag == 0, 0.0, as_float_array(c) * ag)
  return eta + (1.0 - eta) * np.exp(-expo)


def t3_bound_band(
    eta, alpha: Aggregate, gamma: Aggregate, c: Aggregate
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(bound, lower, upper) at each η from the point estimates and their CIs.

  The bound decreases in α, γ and c when all are ≥ 0, so the upper (most
  conservative) curve uses the lower CI endpoints and vice versa. Endpoints
  below 0 are floored at 0. This combines separately estimated CIs and is
  therefore conservative, not a joint 95% band.
  """
  (a, a_lo, a_hi), (g, g_lo, g_hi), (k, k_lo, k_hi) = (e.floats() for e in (alpha, gamma, c))
  lo_args = [max(x, 0.0) for x in (a_lo, g_lo, k_lo)]
  hi_args = [max(x, 0.0) for x in (a_hi, g_hi, k_hi)]
  point = t3_bound(eta, a, g, k)
  return point, t3_bound(eta, *hi_args), t3_bound(eta, *lo_args)


# --------------------------------------------------------------- α and γ


def estimate_alpha(
    ceu_ev, evidence_present=None, degenerate=None, **boot
) -> Aggregate:
  """α̂ = mean CEU_ev over evidence-present examples, with a bootstrap CI.

  Degenerate examples (gap L+ − L− < ε) are excluded and counted in
  n_excluded (together with evidence-absent ones).
  """
  ceu = as_float_array(ceu_ev).reshape(-1)
  keep = as_bool_array(evidence_present, ceu.size).reshape(-1)
  if degenerate is not None:
    keep = keep & ~as_bool_array(degenerate).reshape(-1)
  return mean_estimate(ceu, keep, **boot)


def logit_margin(z, gold) -> np.ndarray:
  """Gold-vs-best-alternative logit margin [B] in nats.

  z is [B, V] (or [B, A, V] with gold [B, A]); for a multi-token answer the
  margin is the minimum over answer tokens (the sequence is decoded wrong under
  teacher-forced greedy decoding iff some token margin is negative).
  """
  z = as_float_array(z)
  gold = np.asarray(gold, dtype=np.int64)
  if z.ndim == 2:
    z, gold = z[:, None, :], gold.reshape(-1, 1)
  g = np.take_along_axis(z, gold[..., None], axis=-1)[..., 0]
  others = z.copy()
  np.put_along_axis(others, gold[..., None], -np.inf, axis=-1)
  return (g - others.max(axis=-1)).min(axis=-1)


def swap_margin(score_clean, score_swap) -> np.ndarray:
  """Per-example evidence-swap margin m+ − m− (same units as the scores)."""
  return as_float_array(score_clean) - as_float_array(score_swap)


def estimate_gamma(
    score_clean, score_swap, evidence_present=None, **boot
) -> Aggregate:
  """γ̂ = mean evidence-swap margin over evidence-present examples.

  Args:
    score_clean: gold score on D+ per example (e.g. `logit_margin` of the
      clean logits, or L+).
    score_swap: the same score on D− = evidence swap of D+.
    evidence_present: mask of examples whose D+ holds the evidence.
  """
  m = swap_margin(score_clean, score_swap).reshape(-1)
  return mean_estimate(m, evidence_present, **boot)


def gamma_by_delta(
    score_clean, score_swap, deltas, evidence_present=None, **boot
) -> dict[float, Aggregate]:
  """γ(δ): the swap-margin estimate separately for each distractor rate δ."""
  m = swap_margin(score_clean, score_swap).reshape(-1)
  deltas = as_float_array(deltas).reshape(-1)
  keep = as_bool_array(evidence_present, m.size).reshape(-1)
  return {float(d): mean_estimate(m, keep & (deltas == d), **boot)
          for d in np.unique(deltas)}


def evidence_advantage(ceu_ev, swap_margins) -> np.ndarray:
  """Per-example evidence-attributable advantage CEU_ev,i · (m+_i − m−_i).

  Its mean is the per-example analogue of α γ; a natural margin for the
  held-out calibration of c.
  """
  return as_float_array(ceu_ev) * as_float_array(swap_margins)


# --------------------------------------------------------------- c


def _score(c: float, m: np.ndarray, e: np.ndarray) -> float:
  """d/dc of the Bernoulli log-likelihood with p = exp(−c m)."""
  return float(-(e * m).sum() + ((1 - e) * m / np.expm1(c * m)).sum())


def fit_c_mle(margins, errors) -> float:
  """ĉ by maximum likelihood (margins > 0 only; see module docstring).

  Returns inf when no held-out example is an error, 0 when all are.
  """
  m, e = as_float_array(margins), as_float_array(errors)
  if m.size == 0:
    return float("nan")
  if not np.any(e == 0):
    return 0.0
  if not np.any(e == 1):
    return float("inf")
  lo, hi = 1e-9 / m.max(), 1.0 / m.mean()
  while _score(hi, m, e) > 0:
    hi *= 4.0
  if _score(lo, m, e) < 0:
    return lo
  return float(optimize.brentq(_score, lo, hi, args=(m, e), xtol=1e-12))


def fit_c_envelope(margins, errors, n_bins: int = 10) -> float:
  """Largest c with exp(−c m̄_b) ≥ empirical error rate of every margin bin b.

  Bins are quantiles of the margin; m̄_b is the bin's smallest margin (so the
  inequality holds for every margin in the bin). Bins without errors impose
  no constraint; returns inf if no bin has an error.
  """
  m, e = as_float_array(margins), as_float_array(errors)
  edges = np.quantile(m, np.linspace(0, 1, n_bins + 1))
  which = np.clip(np.searchsorted(edges, m, side="right") - 1, 0, n_bins - 1)
  c = float("inf")
  for b in np.unique(which):
    rate, m_lo = e[which == b].mean(), m[which == b].min()
    if rate > 0:
      c = min(c, float(-np.log(rate) / m_lo))
  return c


def estimate_c(
    margins,
    errors,
    *,
    method: str = "mle",
    n_resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> Aggregate:
  """ĉ on a held-out split, with a percentile-bootstrap CI.

  Args:
    margins: per-example margins m_i (same units as γ).
    errors: per-example error / unsupported-output indicators.
    method: "mle" (maximum likelihood) or "envelope" (conservative).

  Examples with m_i ≤ 0 (where the model predicts certain error) are
  excluded and counted in n_excluded.
  """
  m = as_float_array(margins).reshape(-1)
  e = as_bool_array(errors).reshape(-1).astype(np.float64)
  keep = np.isfinite(m) & (m > 0)
  m, e = m[keep], e[keep]
  fit = {"mle": fit_c_mle, "envelope": fit_c_envelope}[method]
  est = resampling.bootstrap_scalar(fit, m, e, num_resamples=n_resamples, seed=seed,
                                    level=level, method="inverted_cdf", strict=False)
  unbounded = est.value is not None and np.isinf(est.value)
  note = f"method={method}" + ("; no errors: c unbounded" if unbounded else "")
  return dataclasses.replace(est, n_excluded=int((~keep).sum()), note=note)


# --------------------------------------------------------------- rates


def unsupported(correct, ceu_ev, evidence_present, tau: float = 0.5):
  """Unsupported output: NOT (evidence present AND correct AND CEU_ev ≥ τ).

  The complement of SPEC §5's supported-answer indicator, restricted to
  examples whose retrieved set holds the evidence (a miss makes every output
  unsupported by the retrieved context).
  """
  ok = (as_bool_array(correct) & as_bool_array(evidence_present)
        & (as_float_array(ceu_ev) >= tau))
  return ~ok


def rate_by_eta(unsupported_flags, **boot) -> list[Aggregate]:
  """Empirical unsupported-answer rate per η, one flag array per η level."""
  return [rate_estimate(f, **boot) for f in unsupported_flags]


@dataclasses.dataclass(frozen=True)
class Violation:
  """An η where the empirical unsupported rate exceeds the bound."""
  eta: float
  rate: float
  rate_lo: float
  rate_hi: float
  bound: float
  excess: float        # rate − bound (> 0)
  significant: bool    # rate_lo > bound: the CI lies entirely above the bound
  n: int


def bound_violations(
    etas, rates: list[Aggregate], bounds
) -> list[Violation]:
  """Every η whose empirical rate (point estimate) exceeds the bound.

  Nothing is filtered: a violation is listed whether or not it is
  significant; `significant` says whether the whole CI lies above the bound.
  """
  out = []
  for eta, r, b in zip(as_float_array(etas), rates, as_float_array(bounds)):
    value, lo, hi = r.floats()
    if value > b:
      out.append(Violation(float(eta), value, lo, hi, float(b), float(value - b),
                           bool(lo > b), r.n))
  return out


@dataclasses.dataclass(frozen=True)
class T3Report:
  """Everything the T3 plot and its caption need."""
  etas: np.ndarray
  rates: list[Aggregate]
  alpha: Aggregate
  gamma: Aggregate
  c: Aggregate
  bound: np.ndarray
  bound_lo: np.ndarray
  bound_hi: np.ndarray
  violations: list[Violation]

  def summary(self) -> str:
    """One paragraph stating the estimates and the violations."""
    est = lambda name, e: f"{name}={fmt_ci(e, style='g', with_n=True, missing='n/a')}"
    viol = ("no violations" if not self.violations else
            "violations at η=" + ", ".join(
                f"{v.eta:g} (+{v.excess:.3g}{', significant' if v.significant else ''})"
                for v in self.violations))
    return "; ".join([est("α", self.alpha), est("γ", self.gamma),
                      est("c", self.c) + f" {self.c.note}", viol])


def t3_report(
    etas, rates: list[Aggregate], alpha: Aggregate, gamma: Aggregate, c: Aggregate
) -> T3Report:
  """Bound, its band and the violations for the given estimates."""
  etas = as_float_array(etas)
  point, lo, hi = t3_bound_band(etas, alpha, gamma, c)
  return T3Report(etas, list(rates), alpha, gamma, c, point, lo, hi,
                  bound_violations(etas, rates, point))


def t3_reports_by_delta(
    etas,
    rates_by_delta: dict[float, list[Aggregate]],
    alpha: Aggregate,
    gammas: dict[float, Aggregate],
    c: Aggregate,
) -> dict[str, T3Report]:
  """One report per distractor rate δ, using γ(δ) (label "δ=<value>")."""
  return {f"δ={d:g}": t3_report(etas, rates_by_delta[d], alpha, gammas[d], c)
          for d in sorted(rates_by_delta)}
