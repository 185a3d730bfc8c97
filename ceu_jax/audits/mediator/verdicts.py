"""The mediator audit's headline claims, decided by rule (`ceu_jax.claims`; SPEC §8.3,
seed 003), from the audit rows of one run. Printed in report.md and kept in
summary.json's `claims`.

Per setting (reader, tool):
  gap          003 §5: F_Strong is below F_ID (Δ > 0): the 95% paired CI of Δ above 0
               (`claims.of_run`). A faithful reader has Δ = 0 (not supported); a
               reader whose decision bypasses its mediator has Δ > 0.
  asymmetry    003 §5, Fig. 3: CNF consistency above COR (easier to disrupt than to
               correct). COR and CNF are different items, so the difference is unpaired:
               each cell resampled on its own (`unpaired_difference_ci`); supported if
               its 95% CI lies above 0, opposite if below. Untested when a cell has fewer
               than `min_cell` items (the audit reports it absent).
  tool_closes  003 §6.1: with the tool reading the reader's own M̂ the gap nearly closes:
               Δ_own's CI lies below 0.03 (003's residual), tool settings only.
Between readers (the audit's purpose, issue #18): for every pair (shortcut, faithful)
of the same family and tool, `separates`: Δ(shortcut) > Δ(faithful), paired on the
items both settings audited (d_i = 1[consistent] − 1[strong] per reader).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ceu_jax import claims
from ceu_jax.audits.mediator import audit as md
from ceu_jax.metrics.resampling import Aggregate, fmt_ci, unpaired_difference_ci

TOOL_RESIDUAL = 0.03   # 003 §6.1: residual Δ with the tool ≤ 0.03
UNPAIRED_RULE = ("one run, two disjoint item sets: supported if the 95% CI of the difference "
                 "(each set resampled on its own) lies above 0, opposite if below, else not "
                 "supported; untested when a cell is absent")


def _gap(rows: Sequence[dict]) -> dict:
  """{id: 1[consistent] − 1[strong]} over the audited rows."""
  return {r['id']: float(r['consistent']) - float(r['strong']) for r in rows
          if r['kind'] != md.SKIP}


def asymmetry(rows: Sequence[dict], *, seed: int, min_cell: int) -> Aggregate | None:
  """CNF − COR consistency (unpaired CI), None when a cell has < min_cell rows."""
  cells = {k: np.array([float(r['consistent_star']) for r in rows if r['kind'] == k])
           for k in (md.CNF, md.COR)}
  if min(len(v) for v in cells.values()) < min_cell:
    return None
  return unpaired_difference_ci(cells[md.CNF], cells[md.COR], seed=seed)


def _unpaired_claim(name: str, statement: str, agg: Aggregate | None, sign: int,
                    label: str) -> claims.Claim:
  if agg is None:
    return claims.Claim(name, statement, claims.UNTESTED, f'{label}: a cell is absent',
                        UNPAIRED_RULE)
  d = claims.Difference(label, (claims.SeedDifference('run', agg),))
  verdict = claims.direction(d, sign)
  return claims.Claim(name, statement, verdict,
                      f'{label} {fmt_ci(agg, 3, signed=True)} n={agg.n} → {verdict}',
                      UNPAIRED_RULE)


def setting_claims(setting: str, summary: Mapping, rows: Sequence[dict], *, seed: int,
                   min_cell: int) -> list[claims.Claim]:
  """gap, asymmetry and (tool settings) tool_closes of one setting (module doc)."""
  out = [claims.of_run(f'{setting}: gap', 'F_Strong below F_ID (Δ > 0; 003 §5)',
                       summary['delta'], +1, label='Δ'),
         _unpaired_claim(f'{setting}: asymmetry',
                         'CNF consistency above COR (003 §5: easier to disrupt than to correct)',
                         asymmetry(rows, seed=seed, min_cell=min_cell), +1, 'CNF − COR')]
  own = summary.get('delta_own')
  if own is not None and Aggregate.from_dict(own).value is not None:
    out.append(claims.of_run(f'{setting}: tool closes the gap',
                             f'the tool on the reader\'s own M̂ leaves Δ_own < {TOOL_RESIDUAL:g} '
                             '(003 §6.1)', own, -1, against=TOOL_RESIDUAL, label='Δ_own'))
  return out


def separation_claim(label: str, shortcut: Sequence[dict], faithful: Sequence[dict], *,
                     seed: int) -> claims.Claim:
  """Δ(shortcut) > Δ(faithful), paired on the items both audited."""
  a, b = _gap(shortcut), _gap(faithful)
  ids = [i for i in a if i in b]
  d = claims.paired('Δ(shortcut) − Δ(faithful)',
                    [('run', np.array([a[i] for i in ids]), np.array([b[i] for i in ids]))],
                    seed=seed)
  return claims.combine(f'{label}: separates', 'the audit tells the shortcut reader from the '
                        'faithful one: Δ(shortcut) > Δ(faithful), paired on shared items',
                        [('Δ(shortcut) − Δ(faithful)', d, +1)])


def run_claims(settings: Mapping[str, Mapping], rows: Mapping[str, Sequence[dict]],
               contrasts: Sequence[tuple[str, str, str]], *, seed: int,
               min_cell: int) -> list[claims.Claim]:
  """Every setting's claims, then each contrast (label, shortcut setting, faithful setting)
  whose two settings both ran."""
  out = []
  for name, s in settings.items():
    out += setting_claims(name, s, rows[name], seed=seed, min_cell=min_cell)
  for label, short, faith in contrasts:
    if short in rows and faith in rows:
      out.append(separation_claim(label, rows[short], rows[faith], seed=seed))
  return out
