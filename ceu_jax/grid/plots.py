"""Grid plots (PNG + PDF under W/plots/; SPEC §6): metrics against each test shift,
the EM-vs-supported Pareto plot, the CEU gain per forward against k, and CEU_ev
histograms of correct answers. Every plot has labelled axes with units, a legend and
a title naming what was swept; one that would show a single x value or no data
raises `Skipped` (the report says why). Rows follow ceu_jax.grid.aggregate's schema.
"""
from __future__ import annotations

import collections
import csv
import os
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from ceu_jax import plotting
from ceu_jax.grid import aggregate
from ceu_jax.grid.aggregate import number

if TYPE_CHECKING:
  from matplotlib.figure import Figure

FAMILY = "model.family"
REG = "cer.regularizer"
UNITS = {"em": "exact match (fraction)", "ceu_ev": "CEU_ev (fraction restored)",
         "ceu_dis": "CEU_dis (fraction restored)", "supported_0.5": "supported-answer rate (τ=0.5)"}
XLABEL = {"delta_test": "test distractor rate δ (share of lines)",
          "n_test": "test context length n (tokens)",
          "eta_test": "test miss rate η (share of examples)"}


def _group(rows: Iterable[dict], key: Callable[[dict], tuple]) -> dict:
  out = collections.defaultdict(list)
  for r in rows:
    out[key(r)].append(r)
  return dict(sorted(out.items(), key=lambda kv: str(kv[0])))


def series_label(r: dict, varying: Sequence[str] = ()) -> str:
  """'family / regulariser[, λ=…][, other swept field=value …]' of a row's setting."""
  extra = f", λ={r.get('cer.lambda_ev')}" if r.get(REG, "none") != "none" else ""
  skip = {FAMILY, REG, "cer.lambda_ev"}
  more = "".join(f", {k.split('.')[-1]}={r.get(k)}" for k in varying if k not in skip)
  return f"{r.get(FAMILY)} / {r.get(REG, 'none')}{extra}{more}"


def _shift_rows(rows, x: str) -> list[dict]:
  """Rows of the clean condition and of the conditions that shift only `x`."""
  prefix = {"delta_test": "delta=", "n_test": "n=", "eta_test": "eta="}[x]
  return [r for r in rows if r.get("condition") == "clean"
          or str(r.get("condition", "")).startswith(prefix)]


def _finish(fig: Figure, ax, xlabel: str, ylabel: str, title: str, stem: str) -> list[str]:
  """Label, grid and legend one-panel figures, then write them (PNG + PDF)."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return plotting.save_figure(fig, stem)


class Skipped(Exception):
  """A plot was not drawn; the message says why (goes into report.md)."""


def _distinct(values) -> list[float]:
  return sorted({v for v in (number(x) for x in values) if np.isfinite(v)})


LINESTYLES = ("-", "--", ":", "-.")


def series_styles(rows: Sequence[dict], label: Callable[[dict], str]) -> dict[str, dict]:
  """label -> matplotlib style: colour by architecture, marker and line style by the
  rest of the setting (regulariser, swept fields), so a series is told apart by two cues."""
  families = sorted({str(r.get(FAMILY)) for r in rows})
  rests = sorted({label(r).split(" / ", 1)[-1] for r in rows})
  out = {}
  for r in rows:
    i = rests.index(label(r).split(" / ", 1)[-1])
    out[label(r)] = dict(color=f"C{families.index(str(r.get(FAMILY))) % 10}",
                         marker=MARKERS[i % len(MARKERS)], ls=LINESTYLES[i % len(LINESTYLES)])
  return out


def plot_vs(rows: Sequence[dict], x: str, metrics=("em", "ceu_ev"), stem: str = "",
            label: Callable[[dict], str] = series_label, band: str = "95% CI") -> list[str]:
  """Metric vs a test-time knob, one line per setting, bands from <m>_lo/<m>_hi (`band`
  says what they are: the seed spread for seeds.by_setting rows); colour = architecture,
  marker and line style = the rest of the setting; one legend below the panels, outside
  the axes. Raises Skipped when the grid tests a single value of the knob."""
  rows = _shift_rows(rows, x)
  xs_all = _distinct(r.get(x) for r in rows if np.isfinite(number(r.get(metrics[0]))))
  if len(xs_all) < 2:
    raise Skipped(f"{XLABEL[x].split(' (')[0]} takes {len(xs_all)} value(s) "
                  f"{[float(v) for v in xs_all]} in this grid: nothing to plot against")
  styles = series_styles(rows, label)
  groups = _group(rows, lambda r: (label(r),))
  legend_rows = -(-len(groups) // 3)
  fig = plotting.figure(figsize=(5.2 * len(metrics), 4.0 + 0.22 * legend_rows))
  axes = fig.subplots(1, len(metrics), squeeze=False)[0]
  handles = {}
  for ax, metric in zip(axes, metrics):
    for (name,), series in groups.items():
      pts = sorted((number(r.get(x)), number(r.get(metric)), number(r.get(f"{metric}_lo")),
                    number(r.get(f"{metric}_hi"))) for r in series)
      pts = [p for p in pts if np.isfinite(p[0]) and np.isfinite(p[1])]
      if not pts:
        continue
      xs, ys, lo, hi = map(np.asarray, zip(*pts))
      st = styles[name]
      line, = ax.plot(xs, ys, marker=st["marker"], ls=st["ls"], color=st["color"], ms=5,
                      label=name)
      ax.fill_between(xs, lo, hi, color=st["color"], alpha=0.10)
      handles.setdefault(name, line)
    ax.set_xlabel(XLABEL[x])
    ax.set_ylabel(UNITS.get(metric, metric))
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{metric} vs {x.replace('_test', '')} (sweep of {XLABEL[x].split(' (')[0]})"
                 f"\nbands: {band}", fontsize=9)
    ax.grid(alpha=0.3)
  fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=7,
             frameon=False)
  fig.tight_layout(rect=(0, 0.06 * legend_rows / (1 + 0.06 * legend_rows) + 0.02, 1, 1))
  return plotting.save_figure(fig, stem)


def plot_pareto(rows: Sequence[dict], stem: str, label: Callable[[dict], str] = series_label,
                bars: str = "95% CI", frontier_by: Sequence[str] = ()) -> list[str]:
  """Clean EM vs supported-answer rate per setting, error bars, the frontier per family
  (and per value of each `frontier_by` field: settings of other data or models)."""
  fig, ax = pareto_figure(rows, label, frontier_by)
  per = "architecture" + "".join(f" × {f.split('.')[-1]}" for f in frontier_by)
  ax.set_title("Accuracy vs supported answers (clean test condition)\n"
               f"error bars: {bars}; line: Pareto frontier per {per}", fontsize=9)
  ax.set_xlabel("clean exact match (fraction)")
  ax.set_ylabel("supported-answer rate at τ=0.5 (fraction)")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  return plotting.save_figure(fig, stem)


MARKERS = "osD^vP*Xh<>p"


def pareto_figure(rows: Sequence[dict], label: Callable[[dict], str] = series_label,
                  frontier_by: Sequence[str] = ()):
  """(figure, axes) of the Pareto plot: one point with x/y error bars (<m>_lo/_hi) per
  setting, colour by architecture, marker by the rest of the setting, a frontier through
  the means per architecture and value of every `frontier_by` field (SPEC §6: the
  frontier is over (λ, α); settings of other η, δ, n score other test sets and are not
  points of one frontier). Settings are named in a legend outside the axes, never by
  text on the points, so no two labels can overlap."""
  clean = [r for r in rows if r.get("condition") == "clean"]
  finite = [r for r in clean if np.isfinite(number(r.get("em")))
            and np.isfinite(number(r.get("supported_0.5")))]
  if len(finite) < 2:
    raise Skipped(f"{len(finite)} cell(s) with clean EM and supported-answer rate: no "
                  "frontier to draw")
  fig = plotting.figure(figsize=(7.8, 4.4))
  ax = fig.subplots()
  families = sorted({str(r.get(FAMILY)) for r in finite})
  colors = {f: f"C{i}" for i, f in enumerate(families)}
  rests = sorted({label(r).split(" / ", 1)[-1] for r in finite})
  markers = {t: MARKERS[i % len(MARKERS)] for i, t in enumerate(rests)}
  for r in sorted(finite, key=label):
    x, y = number(r.get("em")), number(r.get("supported_0.5"))
    xerr = [[_err(r, "em", lo=True)], [_err(r, "em", lo=False)]]
    yerr = [[_err(r, "supported_0.5", lo=True)], [_err(r, "supported_0.5", lo=False)]]
    ax.errorbar([x], [y], xerr=xerr, yerr=yerr,
                fmt=markers[label(r).split(" / ", 1)[-1]], color=colors[str(r.get(FAMILY))],
                ms=6, capsize=2, lw=0.8, label=label(r))
  by = tuple(frontier_by)
  for (family, *_), group in _group(finite, lambda r: (str(r.get(FAMILY)),) + tuple(
      str(r.get(f)) for f in by)).items():
    pts = np.asarray([(number(r.get("em")), number(r.get("supported_0.5"))) for r in group])
    front = pareto_front(pts)
    ax.plot(front[:, 0], front[:, 1], color=colors[family], alpha=0.5, lw=1)
  ax.margins(0.08)
  ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
  return fig, ax


def _err(r: dict, m: str, lo: bool) -> float:
  v, b = number(r.get(m)), number(r.get(f"{m}_lo" if lo else f"{m}_hi"))
  return max(0.0, (v - b) if lo else (b - v)) if np.isfinite(b) else 0.0


def pareto_front(points: np.ndarray) -> np.ndarray:
  """Points not dominated in both coordinates (maximise both), sorted by x."""
  keep = [p for p in points
          if not np.any(np.all(points >= p, axis=1) & np.any(points > p, axis=1))]
  return np.asarray(sorted(map(tuple, keep)))


def plot_k_gain(rows: Sequence[dict], stem: str, setting: Sequence[str] = ()) -> list[str]:  # pylint: disable=too-many-locals
  """CEU_ev gain over the baseline of the same setting, per extra forward pass, against k.

  `setting`: the config fields of a setting (seeds.setting_fields); a CER row is paired
  with the baseline row ('none') whose non-`cer.*` fields are the same, and the gains are
  averaged per family and k over the settings that pair. Skipped when fewer than two k
  have CER rows, or when no CER row has a baseline."""
  clean = [r for r in rows if r.get("condition") == "clean"]
  ks = _distinct(r.get("cer.k") for r in clean if r.get(REG, "none") != "none")
  if len(ks) < 2:
    raise Skipped(f"the CER cells use {len(ks)} value(s) of k {[int(k) for k in ks]}: "
                  "no trend in k to plot")
  same = [f for f in setting if not f.startswith("cer.")]
  key = lambda r: tuple(str(r.get(f)) for f in same) + (str(r.get(FAMILY)),)
  base = {key(r): number(r.get("ceu_ev")) for r in clean if r.get(REG, "none") == "none"}
  gains: dict = collections.defaultdict(list)          # (family, k) -> gains per setting
  for r in clean:
    if r.get(REG, "none") != "none" and key(r) in base:
      k = number(r.get("cer.k"))
      gains[(str(r.get(FAMILY)), k)].append((number(r.get("ceu_ev")) - base[key(r)]) / k)
  if not gains:
    raise Skipped("no CER cell has a baseline cell of the same setting to gain over")
  fig = plotting.figure(figsize=(5.5, 4.2))
  ax = fig.subplots()
  for family in sorted({f for f, _ in gains}):
    ks = sorted(k for f, k in gains if f == family)
    ax.plot(ks, [np.nanmean(gains[(family, k)]) for k in ks], marker="o", label=family)
  ax.axhline(0, color="grey", lw=0.8)
  return _finish(fig, ax, "probes per example k (extra forward passes)",
                 "CEU_ev gain over baseline per extra forward (fraction)",
                 "Compute accounting: CEU_ev gain per extra forward vs k", stem)


def plot_ceu_histograms(examples: dict[str, dict], stem: str) -> list[str]:
  """CEU_ev histograms for correct vs incorrect answers, one panel per series."""
  names = sorted(examples)
  if not names:
    raise Skipped("no per-example audit files (cells/<id>/audit/examples.csv)")
  cols = max(1, min(3, len(names)))
  rows_n = max(1, -(-len(names) // cols))
  fig = plotting.figure(figsize=(4.2 * cols, 3.2 * rows_n))
  axes = np.atleast_1d(fig.subplots(rows_n, cols, squeeze=False).ravel())
  bins = np.linspace(0, 1, 21)
  for ax, name in zip(axes, names):
    ex = examples[name]
    ceu, correct = ex["ceu_ev"], ex["correct"]
    ok = np.isfinite(ceu)
    ax.hist(ceu[ok & correct], bins=bins, alpha=0.6, label=f"correct (n={int((ok & correct).sum())})")
    ax.hist(ceu[ok & ~correct], bins=bins, alpha=0.6, label=f"incorrect (n={int((ok & ~correct).sum())})")
    ax.set_title(name, fontsize=8)
    ax.set_xlabel("CEU_ev (fraction restored)")
    ax.set_ylabel("examples (count)")
    ax.legend(fontsize=7)
  for ax in axes[len(names):]:
    ax.axis("off")
  fig.suptitle("CEU_ev on the clean test condition, correct vs incorrect answers")
  fig.tight_layout()
  return plotting.save_figure(fig, stem)


def load_examples(workdir: str, results: Sequence[dict],
                  label: Callable[[dict], str] = series_label) -> dict[str, dict]:
  """Per-example clean-condition audits (cells/<id>/audit/examples.csv) per series."""
  out = {}
  for res in results:
    path = aggregate.examples_path(os.path.join(workdir, "cells", res["cell_id"]))
    if not os.path.exists(path):
      continue
    with open(path, newline="") as f:
      ex = list(csv.DictReader(f))
    seed = f", seed {res['config'].get('seed')}" if "seed" in res["config"] else ""
    out[f"{label(res['config'])}{seed} [{res['cell_id'][:6]}]"] = dict(ceu_ev=np.asarray([number(e.get("ceu_ev")) for e in ex]),
                      correct=np.asarray([e.get("correct") in ("1", "True", "true") for e in ex]))
  return out
