"""Figures of the mediator audit (SPEC §8.3), from the `settings` section of W/summary.json.

* `cor_cnf_figure`: post-intervention consistency within COR (x) against within
  CNF (y), one point per setting with both cells (95% CI bars; n COR / CNF in the
  legend), the diagonal; filled markers without the tool, open with it; the settings
  without a point (a cell under min_cell) are named under the plot.
* `fid_figure`: F_ID and F_Strong (95% CI) per setting, with and without the tool.
PNG + PDF, written atomically.
"""
from __future__ import annotations

from typing import Mapping


from ceu_jax import plotting


def _err(a):
  v = a['value']
  return [[v - a['ci_low']], [a['ci_high'] - v]]


def cor_cnf_figure(settings: Mapping, stem: str) -> list[str]:
  fig = plotting.figure(figsize=(4.6, 4.2))
  ax = fig.add_subplot(1, 1, 1)
  ax.plot([0, 1], [0, 1], color='0.6', lw=0.8, ls='--')
  readers = sorted({s['reader'] for s in settings.values()})
  absent = []
  for name, s in settings.items():
    x, y = s['cons_COR'], s['cons_CNF']
    n = f"n {s.get('n_COR', '?')} / {s.get('n_CNF', '?')}"
    if x['value'] is None or y['value'] is None:
      absent.append(f'{name} ({n})')
      continue
    c = f'C{readers.index(s["reader"]) % 10}'
    ax.errorbar(x['value'], y['value'], xerr=_err(x), yerr=_err(y), fmt='o', color=c,
                mfc='none' if s['tool'] else c, capsize=2, lw=0.8,
                label=f'{name} ({n})')
  if absent:   # a cell under the job's min_cell has no point: say so, never drop it silently
    ax.text(1.02, 0.02, 'no point (a COR / CNF cell\nunder min_cell):\n' + '\n'.join(absent),
            transform=ax.transAxes, fontsize=6, va='bottom', ha='left')
  ax.set_xlim(-0.03, 1.03)
  ax.set_ylim(-0.03, 1.03)
  ax.set_xlabel('COR consistency 1[C(M*) = Ŷ*]')
  ax.set_ylabel('CNF consistency 1[C(M*) = Ŷ*]')
  ax.set_title('Post-intervention consistency (open: with tool)', fontsize=9)
  if len(absent) < len(settings):   # no empty legend box when no setting has a point
    ax.legend(fontsize=6, loc='center left', bbox_to_anchor=(1.02, 0.5))
  return plotting.save_figure(fig, stem)


def fid_figure(settings: Mapping, stem: str) -> list[str]:
  names = list(settings)
  fig = plotting.figure(figsize=(max(4.0, 0.55 * len(names) + 1.5), 3.4))
  ax = fig.add_subplot(1, 1, 1)
  for k, name in enumerate(names):
    for j, (key, color) in enumerate((('F_ID', 'C0'), ('F_Strong', 'C3'))):
      a = settings[name][key]
      if a['value'] is None:
        continue
      ax.bar(k - 0.2 + 0.4 * j, a['value'], width=0.4, color=color,
             hatch='//' if settings[name]['tool'] else None,
             label=key if k == 0 else None)
      ax.errorbar(k - 0.2 + 0.4 * j, a['value'], yerr=_err(a), color='k', capsize=2, lw=0.8)
  ax.set_xticks(range(len(names)), names, fontsize=7, rotation=35, ha='right')
  ax.set_ylim(0, 1.05)
  ax.set_ylabel('rate (95% CI)')
  ax.set_title('F_ID vs F_Strong per setting (hatched: with tool)', fontsize=9)
  ax.legend(fontsize=7)
  return plotting.save_figure(fig, stem)
