"""Figures of the answer-presence audit: Δ per edit and bucket with CIs; the sentinel panel.

Both read the JSON-able summary dicts written by `ceu_jax.audits.job` (so a
report can be redrawn from W/summary.json alone) and save PNG + PDF atomically.
"""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure

from ceu_jax import plotting


def _err(agg: dict) -> tuple[float, list[float]]:
  v = agg['value']
  return v, [v - agg['ci_low'], agg['ci_high'] - v]


def effects_figure(effects: Sequence[dict], stem: str) -> list[str]:
  """Bar chart of mean Δ F1 (95% CI) per (edit, bucket); identity rows are left out."""
  xs = [e for e in effects if e['edit'] != 'identity' and e['delta']['value'] is not None]
  fig = Figure(figsize=(max(4.0, 0.7 * len(xs) + 1.5), 3.2))
  ax = fig.add_subplot()
  for k, e in enumerate(xs):
    v, err = _err(e['delta'])
    ax.bar(k, v, color='C0' if e['edit'] in ('remove', 'placebo') else 'C1')
    ax.errorbar(k, v, yerr=[[err[0]], [err[1]]], color='k', capsize=3)
  ax.axhline(0, color='0.5', lw=0.8)
  ax.set_xticks(range(len(xs)), [f"{e['edit']}\n{e['bucket']} (n={e['n']})" for e in xs],
                fontsize=7, rotation=45, ha='right')
  ax.set_ylabel('Δ token F1 × 100 (95% CI)')
  ax.set_title('Answer-presence edits')
  return plotting.save_figure(fig, stem)


def panel_figure(panel: Sequence[dict], verdict_text: str, stem: str) -> list[str]:
  """Mean F1 (95% CI) per panel condition, with the C2a/C2b verdicts in the title."""
  fig = Figure(figsize=(5.5, 3.2))
  ax = fig.add_subplot()
  for k, row in enumerate(panel):
    v, err = _err(row['f1'])
    ax.bar(k, v, color='C2' if row['condition'] in ('B1', 'B2', 'PLACEBO') else 'C3')
    ax.errorbar(k, v, yerr=[[err[0]], [err[1]]], color='k', capsize=3)
  ax.set_xticks(range(len(panel)), [r['condition'] for r in panel], fontsize=7, rotation=30,
                ha='right')
  ax.set_ylabel('token F1 × 100 (95% CI)')
  ax.set_title(f'Sentinel panel: {verdict_text}', fontsize=9)
  return plotting.save_figure(fig, stem)
