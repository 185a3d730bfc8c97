"""Markdown tables of an answer-presence summary (the dict `ceu_jax.audits.answer_presence.job` writes).

Every table reads only the JSON-able summary, so W/report.md can be redrawn
from W/summary.json. Aggregates are dicts {value, ci_low, ci_high, n}.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.metrics.resampling import Aggregate, fmt_ci

KEY_EFFECTS = (('remove', '1→1'), ('placebo', '1→1'), ('insert_prepend', '0→0'),
               ('insert_mid', '0→0'))  # the headline (edit, bucket) pairs


def fmt(d: Optional[Mapping]) -> str:
  return ap.fmt(Aggregate.from_dict(d))


def _mean(d: Optional[Mapping]) -> str:
  return fmt_ci(d, 2)


def effect(cell: Mapping, edit: str, bucket: str) -> Optional[dict]:
  for e in cell['effects']:
    if e['edit'] == edit and e['bucket'] == bucket:
      return e
  return None


def buckets_table(baselines: Mapping, companion_name: str) -> str:
  """Records kept and skipped, and bucket counts (present rule; companion rule) per baseline."""
  lines = ['| baseline | kept | skipped | 0→0 | 0→1 | 1→1 | 1→0 | ' + companion_name
           + ' (0→0 / 0→1 / 1→1 / 1→0) |', '|---|---:|---|---:|---:|---:|---:|---|']
  for b, x in baselines.items():
    if b == 'B1':
      continue
    c = x['buckets']
    comp = ' / '.join(str(x['buckets_companion'][k]) for k in ap.BUCKETS)
    lines.append(f"| {b} | {x['n_kept']} | {dict(x['skipped']) or '—'} | "
                 + ' | '.join(str(c[k]) for k in ap.BUCKETS) + f' | {comp} |')
  return '\n'.join(lines)


def baseline_table(readers: Mapping, baselines: Sequence[str], what: str = 'F1',
                   skipped: Optional[Mapping] = None) -> str:
  """Mean score (95% CI) (n) per reader and baseline (the rewriter gain the audit
  explains); `skipped`: the records a baseline could not score (e.g. an emptied
  compile), counted beside its mean so that means over different n are seen as such."""
  lines = ['| reader | ' + ' | '.join(baselines) + ' |', '|---|' + '---|' * len(baselines)]
  for name, r in readers.items():
    cells = []
    for b in baselines:
      d = r['baseline_f1'].get(b)
      skip = sum((skipped or {}).get(b, {}).get('skipped', {}).values())
      cells.append(_mean(d) + (f" (n={d['n']}" + (f'; {skip} skipped' if skip else '') + ')'
                                if d else ''))
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def causal_table(readers: Mapping) -> str:
  """Table-1 style: Δremove and Δplacebo on Δcausal's own pairs (1→1 items with both
  edits; over all 1→1 rows of each edit in summaries written before those were kept)
  and Δcausal with its paired CI."""
  ll = any(c.get('delta_causal_ll') for r in readers.values() for c in r['cells'].values())
  lines = ['| reader | baseline | n_pair | Δremove (1→1 pairs) | Δplacebo (1→1 pairs) | '
           'Δcausal [95% CI] |' + (' Δcausal log-lik [95% CI] |' if ll else ''),
           '|---|---|---:|---|---|---|' + ('---|' if ll else '')]
  for name, r in readers.items():
    for b, cell in r['cells'].items():
      parts = cell.get('causal_parts')
      if parts:
        rem, pla = parts['remove'], parts['placebo']
      else:
        rem, pla = (x and x['delta'] for x in (effect(cell, 'remove', '1→1'),
                                               effect(cell, 'placebo', '1→1')))
      lines.append(f"| {name} | {b} | {cell['delta_causal']['n']} | "
                   f"{fmt(rem)} | {fmt(pla)} | "
                   f"**{fmt(cell['delta_causal'])}** |"
                   + (f" {fmt(cell.get('delta_causal_ll'))} |" if ll else ''))
  return '\n'.join(lines)


def insert_table(readers: Mapping) -> str:
  """insert_prepend / insert_mid Δ on 0→0 (the headline) and on 1→0."""
  lines = ['| reader | baseline | bucket | n | insert_prepend Δ | insert_mid Δ | mid appended |',
           '|---|---|---|---:|---|---|---:|']
  for name, r in readers.items():
    for b, cell in r['cells'].items():
      for bk in ('0→0', '1→0'):
        pre, mid = effect(cell, 'insert_prepend', bk), effect(cell, 'insert_mid', bk)
        n = (pre or mid or {'n': 0})['n']
        lines.append(f"| {name} | {b} | {bk} | {n} | {fmt(pre and pre['delta'])} | "
                     f"{fmt(mid and mid['delta'])} | {cell['appended_insert_mid'].get(bk, 0)} |")
  return '\n'.join(lines)


def loglik_table(readers: Mapping) -> str:
  """The continuous companion: mean Δ gold log-likelihood per edit and bucket."""
  lines = ['| reader | baseline | ' + ' | '.join(f'{e} {b}' for e, b in KEY_EFFECTS) + ' |',
           '|---|---|' + '---|' * len(KEY_EFFECTS)]
  for name, r in readers.items():
    for b, cell in r['cells'].items():
      vals = []
      for e, bk in KEY_EFFECTS:
        x = effect(cell, e, bk)
        vals.append(fmt(x and x.get('dll')))
      lines.append(f'| {name} | {b} | ' + ' | '.join(vals) + ' |')
  return '\n'.join(lines)


def panel_table(panel: Mapping) -> str:
  """One reader's sentinel panel and its verdicts."""
  lines = ['| condition | n | F1 | Δ (vs) [95% CI] |', '|---|---:|---:|---|']
  for x in panel['rows']:
    delta = '—' if x['delta'] is None else f"{fmt(x['delta'])} (vs {x['vs']})"
    lines.append(f"| {x['condition']} | {x['f1']['n']} | {x['f1']['value']:.2f} | {delta} |")
  v = panel['verdicts']
  lines += ['', f"E = {v['E']:+.2f}; " + ', '.join(
      f"d[{s}] = {fmt(a)} {'pass' if v['passed'][s] else 'fail'}" for s, a in v['d'].items())
      + f"; C2b d = {fmt(v['c2b_d'])}", '', f"**{v['text']}**"]
  if panel.get('no_placebo'):
    lines += ['', f"{panel['no_placebo']} record(s) without room for a placebo span left out."]
  return '\n'.join(lines)


def cell_table(cell: Mapping) -> str:
  """Every (edit, bucket) of one (reader, baseline) cell."""
  ll = any('dll' in e for e in cell['effects'])
  lines = ['| edit | bucket | n | F1 (orig) | F1 (edited) | Δ [95% CI] |'
           + (' Δ log-lik [95% CI] |' if ll else ''), '|---|---|---:|---:|---:|---|'
           + ('---|' if ll else '')]
  for e in cell['effects']:
    lines.append(f"| {e['edit']} | {e['bucket']} | {e['n']} | {e['f1_orig']['value']:.2f} | "
                 f"{e['f1']['value']:.2f} | {fmt(e['delta'])} |"
                 + (f" {fmt(e.get('dll'))} |" if ll else ''))
  return '\n'.join(lines)


# ---------------------------------------------------------------- atr_separate (separate.py)
def separation_rewriter_table(readers: Mapping) -> str:
  """Surfaced records: F1 of B2 / Bev / Bval and their paired differences."""
  lines = ['| reader | n surfaced | F1 B2 | F1 Bev (evidence line) | F1 Bval (bare value) | '
           'Bev − B2 | Bval − B2 | **Bev − Bval** |', '|---|---:|---|---|---|---|---|---|']
  for name, s in readers.items():
    x = s['surfaced']
    lines.append(f"| {name} | {s['n_surfaced']} | " + ' | '.join(
        _mean(x[k]) for k in ('B2', 'Bev', 'Bval')) + ' | ' + ' | '.join(
        fmt(x[k]) for k in ('Bev − B2', 'Bval − B2')) + f" | **{fmt(x['Bev − Bval'])}** |")
  return '\n'.join(lines)


def separation_edit_table(readers: Mapping) -> str:
  """Compiles holding the evidence line: Δ of unbind, its placebo and remove (VALUE only)."""
  lines = ['| reader | n | F1 (compile) | Δunbind | Δplacebo | Δremove (VALUE) | '
           '**unbind − placebo** | remove − placebo |', '|---|---:|---|---|---|---|---|---|']
  for name, s in readers.items():
    e = s['edits']
    if not s['n_edits']:
      lines.append(f'| {name} | 0 |' + ' — |' * 6)
      continue
    lines.append(f"| {name} | {s['n_edits']} | {_mean(e['orig'])} | " + ' | '.join(
        fmt(e[k]) for k in ('Δunbind', 'Δunbind_placebo', 'Δremove')) +
        f" | **{fmt(e['unbind − placebo'])}** | {fmt(e['remove − placebo'])} |")
  return '\n'.join(lines)


def span_panel_table(readers: Mapping) -> str:
  """The one-token sentinels at the gold span only, each against [MASK] (= remove)."""
  names = ('[REMOVED]', 'word', 'symbol')
  lines = ['| reader | F1 [MASK] | ' + ' | '.join(f'd[{s}]' for s in names) + ' |',
           '|---|---|' + '---|' * len(names)]
  for name, s in readers.items():
    if not s['n_edits']:
      continue
    lines.append(f"| {name} | {_mean(s['edits']['remove'])} | "
                 + ' | '.join(fmt(s['span_panel'][k]) for k in names) + ' |')
  return '\n'.join(lines)
