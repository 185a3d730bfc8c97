"""Plots for the three theorem-style results of SPEC §7.

Figures are built with `matplotlib.figure.Figure` (the Agg canvas; no pyplot
state, no display needed) and written as PNG and PDF atomically: each file is
rendered to a temporary file in the target directory and moved into place with
os.replace, so a reader never sees a half-written figure.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ceu_jax.metrics.resampling import fmt_ci
from ceu_jax import plotting
from ceu_jax.plotting import FORMATS, save_figure  # noqa: F401  (re-exported)
from ceu_jax.theory.identifiability import T1Result, t1_error_curve
from ceu_jax.theory.lower_bound import ModelPoint
from ceu_jax.theory.upper_bound import T3Report


def _log_norm(vmin, vmax):
  from matplotlib.colors import LogNorm  # pylint: disable=g-import-not-at-top  (plotting.figure)
  return LogNorm(vmin, vmax)

def _finite(*arrays: np.ndarray) -> np.ndarray:
  """Mask of positions where every array is finite."""
  return np.all([np.isfinite(a) for a in arrays], axis=0)


# --------------------------------------------------------------- T1


def _t1_arrays(results: Sequence[T1Result]) -> dict[str, np.ndarray]:
  cat = lambda name: np.concatenate(
      [np.ravel(getattr(r, name)) for r in results
       if getattr(r, name) is not None] or [np.array([])])
  return {k: cat(k) for k in ("r_loglik", "r_logit", "diff", "perturbation",
                               "remainder_bound")}


def plot_t1(
    results: Sequence[T1Result] | T1Result,
    stem: str,
    title: str = "T1 identifiability: log-likelihood vs logit restoration",
) -> list[str]:
  """Left: R_ll against R_logit; right: |R_ll − R_logit| vs perturbation size.

  The right panel shows every example, the binned median and a 10–90%
  quantile band; when logit vectors were given, also the median curvature
  bound on the second-order remainder.
  """
  results = [results] if isinstance(results, T1Result) else list(results)
  d = _t1_arrays(results)
  ok = _finite(d["r_loglik"], d["r_logit"], d["perturbation"])
  ok &= d["perturbation"] > 0
  fig = plotting.figure(figsize=(12, 4.8), layout="constrained")
  ax_a, ax_b = fig.subplots(1, 2)
  _t1_scatter(ax_a, d, ok, fig)
  _t1_error(ax_b, d, ok)
  fig.suptitle(f"{title} (n={int(ok.sum())} examples)")
  return save_figure(fig, stem)


def _t1_scatter(ax, d, ok, fig) -> None:
  pert = d["perturbation"][ok]
  sc = ax.scatter(d["r_logit"][ok], d["r_loglik"][ok], c=pert, s=8,
                  cmap="viridis", norm=_log_norm(pert.min(), pert.max()),
                  label="examples")
  lims = [min(d["r_logit"][ok].min(), d["r_loglik"][ok].min()),
          max(d["r_logit"][ok].max(), d["r_loglik"][ok].max())]
  ax.plot(lims, lims, "k--", lw=1, label="identity R_ll = R_logit")
  ax.set_xlabel("R_logit: restoration in gold-logit space (fraction)")
  ax.set_ylabel("R_ll: restoration in log-likelihood space (fraction)")
  ax.set_title("restoration fractions per example")
  ax.legend(loc="upper left")
  fig.colorbar(sc, ax=ax, label="logit perturbation max|z+ − z−| (nats)")


def _t1_error(ax, d, ok) -> None:
  pert, err = d["perturbation"][ok], np.abs(d["diff"][ok])
  ax.scatter(pert, np.maximum(err, 1e-16), s=6, alpha=0.3, color="0.5",
             label="examples")
  curve = t1_error_curve(pert, err, n_bins=12)
  ax.fill_between(curve["centre"], np.maximum(curve["q10"], 1e-16), curve["q90"],
                  alpha=0.25, color="C0", label="10–90% band")
  ax.plot(curve["centre"], curve["median"], "o-", color="C0", label="median")
  bound = d["remainder_bound"]
  if bound.size == ok.size and np.any(np.isfinite(bound[ok])):
    bcurve = t1_error_curve(pert[np.isfinite(bound[ok])],
                            bound[ok][np.isfinite(bound[ok])], n_bins=12)
    ax.plot(bcurve["centre"], bcurve["median"], "--", color="C3",
            label="curvature bound on remainder (median)")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("logit perturbation max|z+ − z−| (nats)")
  ax.set_ylabel("|R_ll − R_logit| (fraction)")
  ax.set_title("T1 discrepancy vs perturbation size")
  ax.legend(loc="upper left")


# --------------------------------------------------------------- T2


def plot_t2(
    points: Sequence[ModelPoint],
    stem: str,
    summary: Mapping | None = None,
    title: str = "T2 lower bound: worst-case accuracy drop vs 1 − mean CEU",
) -> list[str]:
  """Each model with 95% CIs on both axes; optional fitted slope with CI band."""
  fig = plotting.figure(figsize=(6.5, 5), layout="constrained")
  ax = fig.subplots()
  for i, p in enumerate(points):
    (x, x_lo, x_hi), (y, y_lo, y_hi) = p.one_minus_ceu.floats(), p.drop.floats()
    ax.errorbar(x, 100 * y,
                xerr=[[x - x_lo], [x_hi - x]],
                yerr=[[100 * (y - y_lo)], [100 * (y_hi - y)]],
                fmt="o", capsize=3, color=f"C{i % 10}",
                label=f"{p.name} (n={p.drop.n})")
  if summary is not None and np.isfinite(summary.get("slope", np.nan)):
    _t2_slope(ax, summary, points)
  ax.axhline(0, color="0.6", lw=0.8)
  ax.set_xlim(0, 1)
  ax.set_xlabel("1 − mean CEU_ev on supported examples (fraction)")
  ax.set_ylabel("worst-case accuracy drop (percentage points)")
  ax.set_title(title)
  ax.legend(loc="upper left", fontsize="small")
  return save_figure(fig, stem)


def _t2_slope(ax, summary: Mapping, points: Sequence[ModelPoint]) -> None:
  xs = np.linspace(0, 1, 50)
  ax.plot(xs, 100 * summary["slope"] * xs, "k--", lw=1,
          label=f"fit drop = k(1 − CEU), k={summary['slope']:.2f}")
  if np.isfinite(summary.get("slope_lo", np.nan)):
    ax.fill_between(xs, 100 * summary["slope_lo"] * xs,
                    100 * summary["slope_hi"] * xs, color="k", alpha=0.1,
                    label="95% CI of k (bootstrap over models)")


# --------------------------------------------------------------- T3


def plot_t3(
    reports: T3Report | Mapping[str, T3Report],
    stem: str,
    title: str = "T3 upper bound: unsupported-answer rate vs retriever miss rate",
) -> list[str]:
  """Empirical rate (95% CI band) against the bound η + (1−η)e^{−cαγ}.

  A mapping label -> report draws one pair of curves per label (e.g. one
  per distractor rate δ, using γ(δ)). The estimates of α, γ and c are stated in
  the legend, and every violation is marked.
  """
  reports = {"": reports} if isinstance(reports, T3Report) else dict(reports)
  fig = plotting.figure(figsize=(11, 5.5), layout="constrained")
  ax = fig.subplots()
  for i, (label, rep) in enumerate(reports.items()):
    t3_curves(ax, rep, label, f"C{i % 10}")
  ax.set_xlabel("retriever miss probability η (fraction)")
  ax.set_ylabel("Pr[unsupported output] (fraction)")
  ax.set_ylim(0, 1.05)
  ax.set_title(title)
  ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small",
            title=_c_note(reports))
  return save_figure(fig, stem)


def _c_note(reports: Mapping[str, T3Report]) -> str:
  """Legend title stating how ĉ was estimated."""
  notes = sorted({rep.c.note.split(";")[0] for rep in reports.values()} - {""})
  return "ĉ fitted on a held-out split" + (f" ({', '.join(notes)})" if notes
                                           else "")


def t3_curves(ax, rep: T3Report, label: str, color: str) -> None:
  """One report's rate (with its CI band) and bound (with its band) on `ax`."""
  prefix = f"{label}: " if label else ""
  rate, lo, hi = np.array([r.floats() for r in rep.rates]).T
  ax.fill_between(rep.etas, lo, hi, color=color, alpha=0.2,
                  label=f"{prefix}empirical 95% CI")
  ax.plot(rep.etas, rate, "o-", color=color, label=f"{prefix}empirical rate")
  ax.fill_between(rep.etas, np.minimum(rep.bound_lo, 1.0),
                  np.minimum(rep.bound_hi, 1.0), color=color, alpha=0.08,
                  hatch="//", label=f"{prefix}bound band (param. CIs)")
  est = (f"α={rep.alpha.floats()[0]:.2f}, γ={rep.gamma.floats()[0]:.2f}, "
         f"ĉ={fmt_ci(rep.c, 2, missing='nan')}")
  ax.plot(rep.etas, np.minimum(rep.bound, 1.0), "--", color=color,
          label=f"{prefix}bound ({est})")
  # Red x: a significant violation (the rate's whole CI above the bound, what the T3
  # verdict counts); open red circle: the point estimate above the bound, CI across it.
  for significant, marker, kind in ((True, "x", "significant violations"),
                                    (False, "o", "above the bound within CI")):
    vs = [v for v in rep.violations if v.significant == significant]
    if vs:
      ax.plot([v.eta for v in vs], [v.rate for v in vs], marker, color="red", ms=10,
              mew=2, mfc="none", label=f"{prefix}{kind} ({len(vs)})")
