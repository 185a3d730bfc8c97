"""Figures of `experiments.bounds` that combine trained and synthetic results.

T1: trained-model scatter and error curve next to the exact two-channel curve.
T3: the rate-vs-bound curves per δ (drawn by `plots.t3_curves`) next to γ(δ).
T2 uses `plots.plot_t2` unchanged.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ceu_jax.metrics.resampling import Aggregate
from ceu_jax import plotting
from ceu_jax.plotting import save_figure
from ceu_jax.theory import plots
from ceu_jax.theory.identifiability import T1Result, t1_error_curve
from ceu_jax.theory.upper_bound import T3Report


def _ok(r: T1Result) -> np.ndarray:
  return (np.isfinite(r.r_loglik) & np.isfinite(r.r_logit)
          & np.isfinite(r.perturbation) & (r.perturbation > 0))


def plot_t1_bounds(
    trained: Mapping[str, T1Result],
    synthetic: Mapping[str, Sequence[tuple[float, T1Result]]],
    stem: str,
    corruption: str,
) -> list[str]:
  """Three panels: R_ll vs R_logit (trained), |diff| vs perturbation (trained),
  max |diff| vs perturbation on the exact two-channel model."""
  fig = plotting.figure(figsize=(16, 5), layout="constrained")
  ax_a, ax_b, ax_c = fig.subplots(1, 3)
  for i, (name, r) in enumerate(trained.items()):
    ok, color = _ok(r), f"C{i % 10}"
    ax_a.scatter(r.r_logit[ok], r.r_loglik[ok], s=8, alpha=0.5, color=color,
                 label=f"{name} (n={int(ok.sum())}, {r.n_degenerate} degenerate excluded)")
    if ok.sum() >= 2:
      curve = t1_error_curve(r.perturbation[ok], r.diff[ok], n_bins=8)
      ax_b.scatter(r.perturbation[ok], np.maximum(np.abs(r.diff[ok]), 1e-16), s=5,
                   alpha=0.2, color=color)
      ax_b.fill_between(curve["centre"], np.maximum(curve["q10"], 1e-16), curve["q90"],
                        color=color, alpha=0.15)
      ax_b.plot(curve["centre"], curve["median"], "o-", color=color,
                label=f"{name}: binned median (10–90% band)")
  lims = _view(trained)
  ax_a.plot(lims, lims, "k--", lw=1, label="identity")
  ax_a.set_xlim(lims)
  ax_a.set_ylim(lims)
  ax_a.set_xlabel("R_logit: evidence-span restoration of the gold logit (fraction)")
  ax_a.set_ylabel("R_ll: restoration of log p(y*) (fraction)")
  ax_a.set_title(f"trained models, D− = {corruption}, S = E(D+) (view: 2–98% quantiles)")
  ax_a.legend(fontsize="small")
  ax_b.set_xscale("log")
  ax_b.set_yscale("log")
  ax_b.set_xlabel("logit perturbation max|z+ − z−| (nats)")
  ax_b.set_ylabel("|R_ll − R_logit| (fraction)")
  ax_b.set_title("trained models: discrepancy vs perturbation")
  ax_b.legend(fontsize="small")
  _t1_synthetic(ax_c, synthetic)
  fig.suptitle("T1 identifiability: restoration in log-likelihood vs logit space")
  return save_figure(fig, stem)


def _view(trained: Mapping[str, T1Result]) -> tuple[float, float]:
  """Axis range of the scatter: [-0.5, 1.5] widened to the 2–98% quantiles
  (restoration fractions of near-degenerate gaps can be huge; they stay in the
  error panel and the JSON, only the scatter's view is bounded)."""
  vals = np.concatenate([np.concatenate([r.r_logit[_ok(r)], r.r_loglik[_ok(r)]])
                         for r in trained.values()] or [np.zeros(1)])
  if vals.size == 0:
    return -0.5, 1.5
  lo, hi = np.quantile(vals, [0.02, 0.98])
  return float(min(lo, -0.5)), float(max(hi, 1.5))


def _t1_synthetic(ax, synthetic: Mapping[str, Sequence[tuple[float, T1Result]]]) -> None:
  for i, (label, sweep) in enumerate(synthetic.items()):
    s = np.array([x for x, _ in sweep])
    mx = np.array([np.nanmax(np.abs(r.diff)) for _, r in sweep])
    med = np.array([np.nanmedian(np.abs(r.diff)) for _, r in sweep])
    ax.plot(s, np.maximum(mx, 1e-16), "o-", color=f"C{i}", label=f"{label}: max")
    ax.plot(s, np.maximum(med, 1e-16), "s--", color=f"C{i}", alpha=0.6,
            label=f"{label}: median")
  ax.axhline(1e-3, color="0.5", lw=0.8, ls=":", label="1e-3")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("gold-logit gap s = ℓ+ − ℓ− (nats)")
  ax.set_ylabel("|R_ll − R_logit| over examples (fraction)")
  ax.set_title("exact two-channel model ℓ = ℓ_par + ⟨w, h_f⟩ + b")
  ax.legend(fontsize="small")


def plot_t3_bounds(
    reports: Mapping[str, T3Report],
    gammas: Mapping[float, Aggregate],
    alphas: Mapping[float, Aggregate],
    stem: str,
    title: str,
    caption: str,
) -> list[str]:
  """Left: empirical unsupported rate and bound vs η per δ; right: γ(δ), α(δ)."""
  fig = plotting.figure(figsize=(16, 8), layout="constrained")
  ax, ax_g = fig.subplots(1, 2, width_ratios=[2.2, 1])
  for i, (label, rep) in enumerate(reports.items()):
    plots.t3_curves(ax, rep, label, f"C{i % 10}")
  ax.set_xlabel("retriever miss probability η (fraction)")
  ax.set_ylabel("Pr[unsupported output] (fraction)")
  ax.set_ylim(0, 1.05)
  ax.set_title(title)
  # Below the axes: rates reach 0.97 on weak models and 0.0 on accurate ones, so any
  # corner inside the axes hides points of some run.
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, fontsize="x-small")
  _gamma_panel(ax_g, gammas, alphas)
  fig.text(0.01, 0.005, caption, fontsize="small", wrap=True, va="bottom")
  fig.get_layout_engine().set(rect=(0, 0.07, 1, 0.93))
  return save_figure(fig, stem)


def _gamma_panel(ax, gammas: Mapping[float, Aggregate], alphas: Mapping[float, Aggregate]):
  d = np.array(sorted(gammas))
  g = [gammas[x] for x in d]
  ax.errorbar(d, [e.floats()[0] for e in g], yerr=_err(g), fmt="o-", capsize=3, color="C0",
              label="γ(δ): mean swap margin (nats)")
  ax.set_xlabel("test-time distractor rate δ (fraction)")
  ax.set_ylabel("γ(δ) (nats of logit margin)", color="C0")
  ax2 = ax.twinx()
  a = [alphas[x] for x in d]
  ax2.errorbar(d, [e.floats()[0] for e in a], yerr=_err(a), fmt="s--", capsize=3, color="C1",
               label="α(δ): mean CEU_ev (for reference)")
  ax2.set_ylabel("α(δ) (fraction)", color="C1")
  ax2.set_ylim(0, 1.05)
  ax.set_title("γ(δ) with 95% CIs")
  lines = ax.get_legend_handles_labels()
  lines2 = ax2.get_legend_handles_labels()
  ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize="small", loc="best")


def _err(es: Sequence[Aggregate]) -> np.ndarray:
  v, lo, hi = np.array([e.floats() for e in es]).reshape(-1, 3).T
  return np.array([np.where(np.isfinite(lo), np.maximum(v - lo, 0), 0),
                   np.where(np.isfinite(hi), np.maximum(hi - v, 0), 0)])
