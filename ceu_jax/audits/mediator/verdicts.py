"""The mediator audit's headline claims, decided by rule (`ceu_jax.claims`; SPEC §8.3,
seed 003), from the audit rows of one run. Printed in report.md and kept in
summary.json's `claims`.

Per setting (reader, tool):
  gap          003 §5: F_Strong is below F_ID (Δ > 0): the 95% paired CI of Δ above 0
               (`claims.of_run`). A faithful reader has Δ = 0 (not supported); a
               reader whose decision bypasses its mediator has Δ > 0. Untested when
               F_ID < 0.5: a reader whose decision does not follow even its own M̂ (World
               B's SmolLM2, whose decisions do not parse) has no F_ID to fall from.
  asymmetry    003 §5, Fig. 3: CNF consistency above COR (easier to disrupt than to
               correct). COR and CNF are different items, so the difference is unpaired:
               each cell resampled on its own (`unpaired_difference_ci`); supported if
               its 95% CI lies above 0, opposite if below. Untested when a cell has fewer
               than `min_cell` items (the audit reports it absent).
  tool_closes  003 §6.1: with the tool reading the reader's own M̂ the gap nearly closes:
               Δ_own's CI lies below 0.03 (003's residual), tool settings only; untested
               when F_ID_own < 0.5.
Between readers (the audit's purpose, issue #18): for every pair (shortcut, faithful)
of the same family and tool, `separates`: Δ(shortcut) > Δ(faithful), paired on the
items both settings audited (d_i = 1[consistent] − 1[strong] per reader).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
from typing import Mapping, Sequence

import numpy as np

from ceu_jax import claims
from ceu_jax.audits.mediator import audit as md
from ceu_jax.audits.mediator import worlds
from ceu_jax.metrics.resampling import Aggregate, fmt_ci, unpaired_difference_ci

TOOL_RESIDUAL = 0.03   # 003 §6.1: residual Δ with the tool ≤ 0.03
MIN_F_ID = 0.5         # gap claims need a reader whose decision mostly follows its own M̂
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


def _competent(claim: claims.Claim, f_id, label: str) -> claims.Claim:
  """`claim`, or untested when F_ID < MIN_F_ID: a reader whose decision does not follow
  even its own M̂ (e.g. one whose output does not parse) has no F_ID to fall from."""
  value = Aggregate.from_dict(f_id).value if isinstance(f_id, Mapping) else f_id.value
  if value is not None and value >= MIN_F_ID:
    return claim
  shown = 'absent' if value is None else f'{value:.3f}'
  return dataclasses.replace(claim, verdict=claims.UNTESTED, numbers=(
      f'{claim.numbers}; but {label} {shown} < {MIN_F_ID:g}: the reader\'s decision does not '
      f'follow its own mediator, nothing to fall from → untested'),
      rule=claim.rule + f'; untested when {label} < {MIN_F_ID:g}')


def setting_claims(setting: str, summary: Mapping, rows: Sequence[dict], *, seed: int,
                   min_cell: int) -> list[claims.Claim]:
  """gap, asymmetry and (tool settings) tool_closes of one setting (module doc)."""
  out = [_competent(claims.of_run(f'{setting}: gap', 'F_Strong below F_ID (Δ > 0; 003 §5)',
                                  summary['delta'], +1, label='Δ'), summary['F_ID'], 'F_ID'),
         _unpaired_claim(f'{setting}: asymmetry',
                         'CNF consistency above COR (003 §5: easier to disrupt than to correct)',
                         asymmetry(rows, seed=seed, min_cell=min_cell), +1, 'CNF − COR')]
  own = summary.get('delta_own')
  if own is not None and Aggregate.from_dict(own).value is not None:
    out.append(_competent(claims.of_run(
        f'{setting}: tool closes the gap', f'the tool on the reader\'s own M̂ leaves Δ_own < '
        f'{TOOL_RESIDUAL:g} (003 §6.1)', own, -1, against=TOOL_RESIDUAL, label='Δ_own'),
        summary['F_ID_own'], 'F_ID_own'))
  return out


SEPARATION_METRIC = 'Δ(shortcut) − Δ(faithful)'


def gap_difference(shortcut: Sequence[dict], faithful: Sequence[dict], *,
                   seed: int) -> Aggregate:
  """Δ(shortcut) − Δ(faithful), paired on the items both settings audited (its 95% CI)."""
  a, b = _gap(shortcut), _gap(faithful)
  ids = [i for i in a if i in b]
  return claims.paired(SEPARATION_METRIC, [('run', np.array([a[i] for i in ids]),
                                            np.array([b[i] for i in ids]))],
                       seed=seed).per_seed[0].diff


def separation_claim(label: str, shortcut: Sequence[dict], faithful: Sequence[dict], *,
                     seed: int) -> claims.Claim:
  """Δ(shortcut) > Δ(faithful), paired on the items both audited."""
  d = claims.Difference(SEPARATION_METRIC, (claims.SeedDifference(
      'run', gap_difference(shortcut, faithful, seed=seed)),))
  return claims.combine(f'{label}: separates', 'the audit tells the shortcut reader from the '
                        'faithful one: Δ(shortcut) > Δ(faithful), paired on shared items',
                        [(SEPARATION_METRIC, d, +1)])


# (shortcut reader, faithful reader) pairs by name: a family's two trained regimes, and
# the oracle world's gold computer (its decision bypasses M̂) and follower (Y = C(M̂)).
def _faithful_of(reader: str) -> str | None:
  if reader.endswith('/shortcut'):
    return reader[:-len('shortcut')] + 'faithful'
  return 'follower' if reader == 'gold_computer' else None


def contrasts(readers: Sequence[str], tools: Sequence[bool]) -> list[tuple[str, str, str]]:
  """(label, shortcut setting, faithful setting) for every reader whose faithful
  counterpart was audited too ('<family>/shortcut' vs '<family>/faithful'; the oracle
  world's 'gold_computer' vs 'follower'), each tool."""
  out = []
  for r in readers:
    f = _faithful_of(r)
    if f in readers:
      label = f'{r.rsplit("/", 1)[0]}/shortcut vs faithful' if '/' in r else f'{r} vs {f}'
      out += [(worlds.setting(label, t), worlds.setting(r, t), worlds.setting(f, t))
              for t in tools]
  return out


def run_claims(settings: Mapping[str, Mapping], rows: Mapping[str, Sequence[dict]],
               pairs: Sequence[tuple[str, str, str]], *, seed: int,
               min_cell: int) -> list[claims.Claim]:
  """Every setting's claims, then each pair (label, shortcut setting, faithful setting;
  `contrasts`) whose two settings both ran."""
  out = []
  for name, s in settings.items():
    out += setting_claims(name, s, rows[name], seed=seed, min_cell=min_cell)
  for label, short, faith in pairs:
    if short in rows and faith in rows:
      out.append(separation_claim(label, rows[short], rows[faith], seed=seed))
  return out


def read_rows(path: str) -> dict[str, list[dict]]:
  """A run's rows.csv back to the fields the claims read, by setting (runs written before
  the job printed its claims can be judged by the same rule: `claims_of_workdir`)."""
  flag = lambda s: s in ('1', 'True')  # noqa: E731  (DictWriter wrote 0/1 or False/True)
  out: dict[str, list[dict]] = {}
  with open(path, newline='') as f:
    for r in csv.DictReader(f):
      out.setdefault(r['setting'], []).append(dict(
          id=r['id'], kind=r['kind'], consistent=flag(r['consistent']),
          strong=flag(r['strong']), consistent_star=flag(r['consistent_star'])))
  return out


def claims_of_workdir(workdir: str) -> list[claims.Claim]:
  """The claims of a finished run from its summary.json and rows.csv (the readers'
  contrasts as the job draws them)."""
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  rows = read_rows(os.path.join(workdir, 'rows.csv'))
  st = {k: summary['settings'][k] for k in rows}   # the job's order (rows.csv's)
  readers = list(dict.fromkeys(v['reader'] for v in st.values()))
  tools = list(dict.fromkeys(bool(v['tool']) for v in st.values()))
  c = summary['config']
  return run_claims(st, rows, contrasts(readers, tools),
                    seed=int(c['bootstrap_seed']), min_cell=int(c['min_cell']))


def why_not_competent(k: Mapping) -> str:
  """The competence thresholds a check failed, with its numbers (only those it failed)."""
  why = claims.failed_thresholds(k, k, (
      ('checklist accuracy', 'checklist_accuracy', 'min_accuracy'),
      ('decision parse rate', 'decision_parse_rate', 'min_parse_rate')))
  if 'line_accuracy' in k:
    why.append(f"lines right {k['line_accuracy']:.3f}, a constant answer {k['line_constant']:.3f}")
  return '; '.join(why)


def unless_competent(found: Sequence[claims.Claim], competence: Mapping[str, Mapping],
                     pairs: Sequence[tuple[str, str, str]]) -> list[claims.Claim]:
  """The claims with those naming a setting whose competence check failed made untested
  (World B's fine-tuned readers): a reader that did not learn the task is reported as
  such, never audited as if it had. A claim names its setting ('<setting>: …') or a pair
  ('<label>: separates', `contrasts`)."""
  by_label = {label: (a, b) for label, a, b in pairs}
  out = []
  for c in found:
    head = c.name.rsplit(': ', 1)[0]
    named = by_label.get(head, (head,))
    bad = next((s for s in named if s in competence and not competence[s]['competent']), None)
    if bad is not None:
      c = claims.Claim(c.name, c.statement, claims.UNTESTED,
                       f"{bad} not competent ({why_not_competent(competence[bad])}); its rows: "
                       f"{c.numbers}", c.rule)
    out.append(c)
  return out
