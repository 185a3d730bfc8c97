"""CEU distribution summaries, supported-answer rate and the audit summary (SPEC §5).

Degenerate examples (gap L+ − L− < ε, SPEC §1) have no CEU: they are excluded
from every CEU statistic and counted separately, and they count as *not
supported* in the supported-answer rate (its denominator is all examples).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ceu_jax.engine import scores
from ceu_jax.metrics import resampling as bs

DEFAULT_TAUS = (0.25, 0.5, 0.75)
DEFAULT_EPS = 1e-3
CEU_QUANTILES = {"q10": 0.10, "q25": 0.25}


def _tau_key(tau: float) -> str:
  return f"{float(tau):g}"


def stabilised_ceu(l_int: np.ndarray, l_minus: np.ndarray, l_plus: np.ndarray,
                   eps: float = DEFAULT_EPS) -> tuple[np.ndarray, np.ndarray]:
  """(CEU with NaN where degenerate, degenerate) of per-example log-likelihoods, by the
  engine's formula (`ceu_jax.engine.scores`: the project's one CEU definition, SPEC §1),
  for rows that carry L_int but no ceu column."""
  ceu = np.asarray(scores.ceu(l_int, l_plus, l_minus, eps), np.float64)
  degenerate = np.asarray(scores.degenerate(l_plus, l_minus, eps))
  return np.where(degenerate, np.nan, ceu), degenerate


def _check_ceu(ceu: np.ndarray, degenerate: np.ndarray) -> None:
  bad = ~np.isfinite(ceu) & ~degenerate
  if bad.any():
    raise ValueError(f"{int(bad.sum())} non-degenerate examples have a "
                     "non-finite CEU; flag them as degenerate instead")


def ceu_stats(ceu: np.ndarray, **boot) -> dict[str, dict]:
  """{mean, median, q10, q25} of CEU values [n] (already filtered), as records."""
  out = {"mean": bs.mean_ci(ceu, **boot), "median": bs.quantile_ci(ceu, 0.5,
                                                                   **boot)}
  out.update({k: bs.quantile_ci(ceu, q, **boot)
              for k, q in CEU_QUANTILES.items()})
  return {k: v.to_dict() for k, v in out.items()}


def ceu_distribution(ceu: np.ndarray, degenerate: np.ndarray,
                     correct: np.ndarray | None = None, **boot) -> dict:
  """CEU statistics overall and conditioned on correctness, degenerate excluded.

  Returns {"all": stats, "correct": stats, "incorrect": stats,
  "n_degenerate": {"all", "correct", "incorrect"}} where stats is `ceu_stats`;
  the correctness keys appear only when `correct` is given.
  """
  ceu = np.asarray(ceu, dtype=np.float64)
  degenerate = np.asarray(degenerate, dtype=bool)
  _check_ceu(ceu, degenerate)
  groups = {"all": np.ones_like(degenerate)}
  if correct is not None:
    correct = np.asarray(correct, dtype=bool)
    groups.update(correct=correct, incorrect=~correct)
  out = {name: ceu_stats(ceu[mask & ~degenerate], **boot)
         for name, mask in groups.items()}
  out["n_degenerate"] = {name: int((mask & degenerate).sum())
                         for name, mask in groups.items()}
  return out


def ceu_fixed_denominator(ceu: np.ndarray, degenerate: np.ndarray, **boot) -> dict:
  """Mean CEU over every example given, degenerate gaps counted as 0 (SPEC §5a): unlike
  the §1 mean, a change of the degenerate share cannot move it unseen."""
  ceu = np.asarray(ceu, dtype=np.float64)
  degenerate = np.asarray(degenerate, bool)
  _check_ceu(ceu, degenerate)
  return bs.mean_ci(np.where(degenerate, 0.0, ceu), **boot).to_dict()


def delta_stats(delta: np.ndarray, **boot) -> dict[str, dict]:
  """{mean, median} of a log-likelihood difference (ΔL, Δev, Δdis) [n]."""
  return {"mean": bs.mean_ci(delta, **boot).to_dict(),
          "median": bs.quantile_ci(delta, 0.5, **boot).to_dict()}


def supported(correct: np.ndarray, ceu_ev: np.ndarray, degenerate: np.ndarray,
              tau: float) -> np.ndarray:
  """Per-example supported flag [n]: correct AND not degenerate AND CEU_ev ≥ τ."""
  ceu_ev = np.asarray(ceu_ev, dtype=np.float64)
  degenerate = np.asarray(degenerate, dtype=bool)
  _check_ceu(ceu_ev, degenerate)
  with np.errstate(invalid="ignore"):
    above = np.where(degenerate, False, ceu_ev >= tau)
  return np.asarray(correct, dtype=bool) & above


def supported_answer_rate(correct: np.ndarray, ceu_ev: np.ndarray,
                          degenerate: np.ndarray,
                          taus: Sequence[float] = DEFAULT_TAUS,
                          **boot) -> dict[str, dict]:
  """Share of all examples that are supported, per τ (keys like "0.5").

  The denominator is every example; degenerate ones count as not supported.
  """
  return {_tau_key(t): bs.mean_ci(supported(correct, ceu_ev, degenerate, t),
                                  **boot).to_dict() for t in taus}


def delta_causal(delta_remove: np.ndarray, delta_placebo: np.ndarray,
                 **boot) -> bs.Aggregate:
  """Δcausal = mean Δremove − mean Δplacebo, paired bootstrap CI (SPEC §8); the one
  definition (the answer-presence audit pairs its rows by item, then calls this)."""
  return bs.paired_difference_ci(delta_remove, delta_placebo, "mean", **boot)
