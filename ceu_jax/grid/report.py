"""Grid plots (PNG + PDF under W/plots/) and W/report.md (SPEC §6).

Every plot has labelled axes with units, a legend, and a title naming what was
swept; a plot that would show a single x value or no data is not drawn and the
report says why. report.md opens with what was run (cells, steps, seeds, test
conditions, which test set every number comes from); every CEU mean carries the
number n of non-degenerate examples behind it. Rows follow the schema of
ceu_jax.grid.aggregate.
"""
from __future__ import annotations

import collections
import csv
import os
from typing import Callable, Iterable, Sequence

import numpy as np
from matplotlib.figure import Figure

from ceu_jax import io, plotting

FAMILY = "model.family"
REG = "cer.regularizer"
UNITS = {"em": "exact match (fraction)", "ceu_ev": "CEU_ev (fraction restored)",
         "ceu_dis": "CEU_dis (fraction restored)", "supported_0.5": "supported-answer rate (τ=0.5)"}
XLABEL = {"delta_test": "test distractor rate δ (share of lines)",
          "n_test": "test context length n (tokens)",
          "eta_test": "test miss rate η (share of examples)"}


def _num(v):
  try:
    return float(v)
  except (TypeError, ValueError):
    return np.nan


def _group(rows: Iterable[dict], key: Callable[[dict], tuple]) -> dict:
  out = collections.defaultdict(list)
  for r in rows:
    out[key(r)].append(r)
  return dict(sorted(out.items(), key=lambda kv: str(kv[0])))


def _series_label(r: dict) -> str:
  extra = f", λ={r.get('cer.lambda_ev')}" if r.get(REG, "none") != "none" else ""
  return f"{r.get(FAMILY)} / {r.get(REG, 'none')}{extra}"


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
  return sorted({v for v in (_num(x) for x in values) if np.isfinite(v)})


def plot_vs(rows: Sequence[dict], x: str, metrics=("em", "ceu_ev"), stem: str = "") -> list[str]:
  """Metric vs a test-time knob, one line per (architecture, regulariser), CI bands.
  Raises Skipped when the grid tests a single value of the knob."""
  rows = _shift_rows(rows, x)
  xs_all = _distinct(r.get(x) for r in rows if np.isfinite(_num(r.get(metrics[0]))))
  if len(xs_all) < 2:
    raise Skipped(f"{XLABEL[x].split(' (')[0]} takes {len(xs_all)} value(s) "
                  f"{[float(v) for v in xs_all]} in this grid: nothing to plot against")
  fig = Figure(figsize=(5.2 * len(metrics), 4.0))
  axes = fig.subplots(1, len(metrics), squeeze=False)[0]
  for ax, metric in zip(axes, metrics):
    for label, series in _group(rows, lambda r: (_series_label(r),)).items():
      pts = sorted((_num(r.get(x)), _num(r.get(metric)), _num(r.get(f"{metric}_lo")),
                    _num(r.get(f"{metric}_hi"))) for r in series)
      pts = [p for p in pts if np.isfinite(p[0]) and np.isfinite(p[1])]
      if not pts:
        continue
      xs, ys, lo, hi = map(np.asarray, zip(*pts))
      line, = ax.plot(xs, ys, marker="o", label=label[0])
      ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlabel(XLABEL[x])
    ax.set_ylabel(UNITS.get(metric, metric))
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{metric} vs {x.replace('_test', '')} (sweep of {XLABEL[x].split(' (')[0]})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  return plotting.save_figure(fig, stem)


def plot_pareto(rows: Sequence[dict], stem: str) -> list[str]:
  """Clean EM vs supported-answer rate over (λ, α), with the frontier per family."""
  fig, ax = pareto_figure(rows)
  return _finish(fig, ax, "clean exact match (fraction)",
                 "supported-answer rate at τ=0.5 (fraction)",
                 "Pareto frontier over (λ_ev, α):\naccuracy vs supported answers", stem)


def pareto_figure(rows: Sequence[dict]):
  """(figure, axes) of the Pareto plot, before labels and saving; point labels stay
  inside the axes (they point inwards from the right half)."""
  clean = [r for r in rows if r.get("condition") == "clean"]
  finite = [r for r in clean if np.isfinite(_num(r.get("em")))
            and np.isfinite(_num(r.get("supported_0.5")))]
  if len(finite) < 2:
    raise Skipped(f"{len(finite)} cell(s) with clean EM and supported-answer rate: no "
                  "frontier to draw")
  fig = Figure(figsize=(5.5, 4.2))
  ax = fig.subplots()
  ax.margins(0.12)                        # room for the point labels inside the axes
  for (family,), series in _group(clean, lambda r: (r.get(FAMILY),)).items():
    pts = np.asarray([(_num(r.get("em")), _num(r.get("supported_0.5"))) for r in series])
    pts = pts[np.all(np.isfinite(pts), axis=1)]
    if not len(pts):
      continue
    sc = ax.scatter(pts[:, 0], pts[:, 1], label=f"{family} cells")
    front = pareto_front(pts)
    ax.plot(front[:, 0], front[:, 1], color=sc.get_facecolor()[0], alpha=0.7)
  lo, hi = ax.get_xlim()
  labels: dict[tuple[float, float], list[str]] = {}    # cells at one point share a label
  for r in finite:
    point = (_num(r.get("em")), _num(r.get("supported_0.5")))
    text = f"λ={r.get('cer.lambda_ev')},α={r.get('cer.alpha')}"
    if text not in labels.setdefault(point, []):
      labels[point].append(text)
  for (x, y), texts in labels.items():
    right = x > (lo + hi) / 2
    ax.annotate("\n".join(texts), (x, y), fontsize=6, xytext=(-4 if right else 4, 3),
                textcoords="offset points", ha="right" if right else "left", va="bottom")
  return fig, ax


def pareto_front(points: np.ndarray) -> np.ndarray:
  """Points not dominated in both coordinates (maximise both), sorted by x."""
  keep = [p for p in points
          if not np.any(np.all(points >= p, axis=1) & np.any(points > p, axis=1))]
  return np.asarray(sorted(map(tuple, keep)))


def plot_k_gain(rows: Sequence[dict], stem: str) -> list[str]:
  """CEU_ev gain over the family's baseline, per extra forward pass, against k."""
  clean = [r for r in rows if r.get("condition") == "clean"]
  ks = _distinct(r.get("cer.k") for r in clean if r.get(REG, "none") != "none")
  if len(ks) < 2:
    raise Skipped(f"the CER cells use {len(ks)} value(s) of k {[int(k) for k in ks]}: "
                  "no trend in k to plot")
  fig = Figure(figsize=(5.5, 4.2))
  ax = fig.subplots()
  for (family,), series in _group(clean, lambda r: (r.get(FAMILY),)).items():
    base = [_num(r.get("ceu_ev")) for r in series if r.get(REG, "none") == "none"]
    cer = [r for r in series if r.get(REG, "none") != "none"]
    if not base or not cer:
      continue
    by_k = _group(cer, lambda r: (_num(r.get("cer.k")),))
    ks = sorted(k for (k,) in by_k)
    gains = [np.nanmean([_num(r.get("ceu_ev")) - base[0] for r in by_k[(k,)]]) / k for k in ks]
    ax.plot(ks, gains, marker="o", label=family)
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
  fig = Figure(figsize=(4.2 * cols, 3.2 * rows_n))
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


def load_examples(workdir: str, results: Sequence[dict]) -> dict[str, dict]:
  """Per-example clean-condition audits (cells/<id>/audit/examples.csv) per series."""
  out = {}
  for res in results:
    path = os.path.join(workdir, "cells", res["cell_id"], "audit", "examples.csv")
    if not os.path.exists(path):
      continue
    with open(path, newline="") as f:
      ex = list(csv.DictReader(f))
    label = f"{_series_label(res['config'])} [{res['cell_id'][:6]}]"
    out[label] = dict(ceu_ev=np.asarray([_num(e.get("ceu_ev")) for e in ex]),
                      correct=np.asarray([e.get("correct") in ("1", "True", "true") for e in ex]))
  return out


def _fmt_ci(r: dict, metric: str, with_n: bool = False) -> str:
  v, lo, hi = (_num(r.get(k)) for k in (metric, f"{metric}_lo", f"{metric}_hi"))
  n = _num(r.get(f"{metric}_n"))
  n_txt = f" (n={int(n)})" if with_n and np.isfinite(n) else ""
  if not np.isfinite(v):
    return "–" + n_txt
  ci = f" [{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
  return f"{v:.3f}{ci}{n_txt}"


CEU_METRICS = ("ceu_ev", "ceu_dis", "ceu_control")


def summary_table(rows: Sequence[dict]) -> str:
  """Markdown table, clean condition: per architecture, baseline vs CER cells. Every
  CEU mean shows n, the non-degenerate examples (with evidence, gap ≥ ε) behind it."""
  metrics = ("em", "ceu_ev", "ceu_dis", "supported_0.5")
  head = ("| architecture | regulariser | λ_ev | α | k | examples | "
          + " | ".join(f"{m} (n)" if m in CEU_METRICS else m for m in metrics) + " |")
  lines = [head, "|" + "---|" * (6 + len(metrics))]
  clean = [r for r in rows if r.get("condition") == "clean"]
  for r in sorted(clean, key=lambda r: (str(r.get(FAMILY)), str(r.get(REG)), r["index"])):
    lines.append(f"| {r.get(FAMILY)} | {r.get(REG)} | {r.get('cer.lambda_ev')} | "
                 f"{r.get('cer.alpha')} | {r.get('cer.k')} | {r.get('em_n', '')} | "
                 + " | ".join(_fmt_ci(r, m, with_n=m in CEU_METRICS) for m in metrics) + " |")
  return "\n".join(lines)


def conditions_table(rows: Sequence[dict]) -> str:
  """Markdown table of every test condition (not only clean), per cell."""
  metrics = ("em", "ceu_ev", "ceu_dis", "supported_0.5")
  head = ("| architecture | regulariser | condition | examples | "
          + " | ".join(f"{m} (n)" if m in CEU_METRICS else m for m in metrics) + " |")
  lines = [head, "|" + "---|" * (4 + len(metrics))]
  order = lambda r: (str(r.get(FAMILY)), str(r.get(REG)), r["index"],
                     r.get("condition") != "clean", str(r.get("condition")))
  for r in sorted(rows, key=order):
    lines.append(f"| {r.get(FAMILY)} | {r.get(REG)} | {r.get('condition')} | "
                 f"{r.get('em_n', '')} | "
                 + " | ".join(_fmt_ci(r, m, with_n=m in CEU_METRICS) for m in metrics) + " |")
  return "\n".join(lines)


def _values(results: Sequence[dict], field: str) -> str:
  vals = sorted({str(v) for r in results
                 if (v := r.get("config", {}).get(field)) is not None}, key=str)
  return ", ".join(vals) if vals else "?"


def _conditions(rows: Sequence[dict]) -> list[str]:
  names = []
  for r in sorted(rows, key=lambda r: (r.get("condition") != "clean", str(r.get("condition")))):
    if r.get("condition") not in names:
      names.append(r.get("condition"))
  return names


def what_was_run(rows: Sequence[dict], results: Sequence[dict], config=None) -> list[str]:
  """The report's opening: cells, steps, seeds, training data, test conditions and
  which test set every number comes from."""
  out = ["## What was run", ""]
  out.append(f"- {len(results)} cells: architectures {_values(results, FAMILY)}; "
             f"regularisers {_values(results, REG)} (λ_ev {_values(results, 'cer.lambda_ev')},"
             f" α {_values(results, 'cer.alpha')}, k {_values(results, 'cer.k')}).")
  out.append(f"- Training: {_values(results, 'train.num_steps')} steps at batch "
             f"{_values(results, 'train.batch_size')}, seed {_values(results, 'seed')} "
             f"(one seed per cell); training data δ {_values(results, 'data.delta')}, "
             f"η {_values(results, 'data.eta')}, n {_values(results, 'data.context_len')}, "
             f"ρ {_values(results, 'data.rho')}.")
  runs = [r for r in results if r.get("train_run")]
  partial = [r for r in runs if not r["train_run"].get("completed")]
  if runs:
    steps = sorted({r["train_run"].get("checkpoint_step") for r in runs}, key=str)
    out.append(f"- Checkpoints audited: step {', '.join(map(str, steps))}; "
               + ("every cell's training completed." if not partial else
                  f"**{len(partial)} cells did not complete training**: " + "; ".join(
                      f"{r['cell_id']} ({r['train_run'].get('warning')})" for r in partial)))
  conds = _conditions(rows)
  out.append(f"- Test conditions ({len(conds)}): {', '.join(map(str, conds))} — 'clean' is "
             "the training distribution, each other condition shifts one knob (δ, n or η).")
  if config is not None and "eval" in config:
    e = config.eval
    out.append(
        f"- **Which test set.** Every number in this report comes from THE fixed eval set "
        f"of config.eval (split 'eval', seed eval.seed = {e.seed}, {e.num_examples} examples"
        f", D− = {tuple(e.corruptions)[0]}), regenerated under each condition's knob; the "
        "'clean' condition is the very set each cell's training-time evaluation "
        "(cells/<id>/train/eval_final.json) scores, so their EM and CEU agree for the same "
        "checkpoint.")
  else:
    out.append("- Every number comes from the fixed eval set of config.eval (split 'eval'), "
               "the one the training-time evaluation scores.")
  out.append("- CEU values are means over the non-degenerate examples (evidence present, "
             "gap L+ − L− ≥ ε); n beside each mean counts them. EM and the supported-answer "
             "rate are over all examples ('examples').")
  return out + [""]


def _cell_list(cells: Sequence[dict]) -> list[str]:
  return [f"- cell {c.get('index')} `{c.get('cell_id')}` "
          f"({', '.join(f'{k}={v}' for k, v in c.get('overrides', [])) or 'base'}), "
          f"{c.get('status', '?')}" for c in cells]


def write_report(workdir: str, rows: Sequence[dict], results: Sequence[dict],
                 failures: Sequence[dict], title: str = "CEU experiment grid", *,
                 config=None, other_cells: Sequence[dict] = (),
                 excluded: Sequence[dict] = ()) -> str:
  """W/report.md and W/plots/*. `config`: the grid config (for the test-set
  description); `other_cells`: included cells that are not in the current config
  (flagged); `excluded`: such cells that were left out (listed)."""
  plots_dir = os.path.join(workdir, "plots")
  made, skipped = {}, {}

  def draw(key, fn, *args):
    try:
      made[key] = fn(*args)
    except Skipped as e:
      skipped[key] = str(e)

  if rows:
    for x in ("delta_test", "n_test", "eta_test"):
      draw(x, lambda x=x: plot_vs(rows, x, stem=os.path.join(
          plots_dir, f"em_ceu_vs_{x.split('_')[0]}")))
    draw("pareto", plot_pareto, rows, os.path.join(plots_dir, "pareto_em_supported"))
    draw("k", plot_k_gain, rows, os.path.join(plots_dir, "ceu_gain_per_forward_vs_k"))
  draw("hist", plot_ceu_histograms, load_examples(workdir, results),
       os.path.join(plots_dir, "ceu_ev_hist_correct"))
  parts = [f"# {title}", "",
           f"{len(results)} cells finished, {len(failures)} failed; "
           f"{len(rows)} rows in results.csv (one per cell × test condition).", ""]
  parts += what_was_run(rows, results, config)
  parts += ["## Summary (clean test condition; value [95% bootstrap CI] (n))", "",
            summary_table(rows) if rows else "(no finished cells)", ""]
  if rows:
    parts += ["## Every test condition", "", conditions_table(rows), ""]
  captions = {"delta_test": "EM and CEU_ev vs test distractor rate δ",
              "n_test": "EM and CEU_ev vs test context length n",
              "eta_test": "EM and CEU_ev vs test miss rate η",
              "pareto": "Clean EM vs supported-answer rate over (λ, α)",
              "k": "CEU_ev gain per extra forward pass vs k",
              "hist": "CEU_ev histograms, correct vs incorrect"}
  parts += ["## Plots", ""]
  for key, paths in made.items():
    parts += [f"### {captions[key]}", "", f"![{captions[key]}](plots/{os.path.basename(paths[0])})",
              f"([PDF](plots/{os.path.basename(paths[1])}))", ""]
  if skipped:
    parts += ["Not drawn:", ""] + [f"- {captions[k]}: {why}" for k, why in skipped.items()]
    parts += [""]
  if other_cells:
    parts += ["## Cells not in the current config (included as asked)", ""]
    parts += _cell_list(other_cells) + [""]
  if excluded:
    parts += ["## Cells not in the current config (excluded)", "",
              "Left under cells/ by an earlier version of the grid config; not in "
              "results.csv or above (rerun with --include_other_cells to include them).", ""]
    parts += _cell_list(excluded) + [""]
  if failures:
    parts += ["## Failed cells", ""]
    parts += [f"- cell {f['index']} `{f['cell_id']}`: {f['error']}" for f in failures]
  path = os.path.join(workdir, "report.md")
  io.write_text_atomic(path, "\n".join(parts) + "\n")
  return path
