"""Figures of the answer-presence audit: Δ per edit and bucket with CIs; the sentinel panel.

Both read the JSON-able `readers` section of W/summary.json (written by
`ceu_jax.audits.answer_presence.job`), so a report can be redrawn from it alone, and save PNG +
PDF atomically. One panel (subplot) per reader.
"""
from __future__ import annotations

from typing import Mapping


from ceu_jax import plotting
from ceu_jax.audits.answer_presence import report

GROUPS = report.KEY_EFFECTS + (('Δcausal', '1→1'),)


def _bar(ax, x, agg, color, width, label=None):
  if not agg or agg.get('value') is None:
    return
  v = agg['value']
  ax.bar(x, v, width=width, color=color, label=label)
  if agg.get('ci_low') is not None:
    ax.errorbar(x, v, yerr=[[v - agg['ci_low']], [agg['ci_high'] - v]], color='k', capsize=2,
                lw=0.8)


def effects_figure(readers: Mapping, stem: str) -> list[str]:
  """Mean Δ F1 (95% CI) per headline (edit, bucket) and Δcausal; bars = baselines."""
  names = list(readers)
  fig = plotting.figure(figsize=(4.2 * len(names), 3.4))
  axes = [fig.add_subplot(1, len(names), k + 1) for k in range(len(names))]
  for ax, name in zip(axes, names):
    cells = readers[name]['cells']
    nb = max(len(cells), 1)
    w = 0.8 / nb
    for j, (b, cell) in enumerate(cells.items()):
      for g, (e, bk) in enumerate(GROUPS):
        if e == 'Δcausal':
          a = cell['delta_causal']
        else:
          x = report.effect(cell, e, bk)
          a = x and x['delta']
        _bar(ax, g - 0.4 + w * (j + 0.5), a, f'C{j}', w, label=b if g == 0 else None)
    ax.axhline(0, color='0.5', lw=0.8)
    ax.set_xticks(range(len(GROUPS)), [f'{e}\n{bk}' for e, bk in GROUPS], fontsize=7,
                  rotation=30, ha='right')
    ax.set_title(name, fontsize=9)
    ax.set_ylabel('Δ token F1 × 100 (95% CI)')
    if cells:
      ax.legend(fontsize=7)
  fig.suptitle('Answer-presence edits of the compiled context', fontsize=10)
  fig.tight_layout(rect=(0, 0, 1, 0.94))   # no panel's labels over its neighbour's
  return plotting.save_figure(fig, stem)


def panel_figure(readers: Mapping, stem: str) -> list[str]:
  """Mean F1 (95% CI) per panel condition, one subplot per reader, verdicts in the titles."""
  names = [n for n in readers if readers[n].get('panel')]
  fig = plotting.figure(figsize=(4.2 * max(len(names), 1), 3.4))
  for k, name in enumerate(names):
    ax = fig.add_subplot(1, len(names), k + 1)
    rows = readers[name]['panel']['rows']
    for j, row in enumerate(rows):
      _bar(ax, j, row['f1'], 'C2' if row['condition'] in ('B1', 'B2', 'PLACEBO') else 'C3', 0.8)
    ax.set_xticks(range(len(rows)), [r['condition'] for r in rows], fontsize=7, rotation=30,
                  ha='right')
    ax.set_ylabel('token F1 × 100 (95% CI)')
    ax.set_title(f"{name}: {readers[name]['panel']['verdicts']['text']}", fontsize=8)
  fig.tight_layout()
  return plotting.save_figure(fig, stem)
