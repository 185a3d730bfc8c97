"""The trace audit's headline claims, decided by rule (`ceu_jax.claims`; SPEC §8.2, seed
002), from one run's rows. Printed in report.md and kept in summary.json's `claims`.

Per reader:
  follows      the regenerated answer is the edited trace's implied answer on most
               edits: follow rate's 95% CI (items resampled) above 0.5 (`claims.of_run`).
               A reader that answers from its trace follows (→ 1); one that ignores it
               keeps its answer (→ 0, opposite); φ alone cannot tell following from an
               arbitrary change (issue #32).
  math_more_causal  (readers audited on both the arithmetic and the factual domain) 002's
               finding: arithmetic traces are more causal than knowledge traces, i.e. a
               lower violation density, ρ(arithmetic) < ρ(factual). Different items, so
               unpaired: each domain's items resampled on their own, the statistic the
               tables' ρ (violations over rows of known Strength, rows of one item
               together); supported if the CI of the difference lies below 0.
Every claim counts only regenerations that parse, as the tables do.
"""
from __future__ import annotations

import csv
import json
import os
from typing import Mapping, Sequence

from ceu_jax import claims
from ceu_jax.audits.traces.audit import IDENTITY
from ceu_jax.audits.traces.summary import item_sums, ratio_of_sums
from ceu_jax.metrics.resampling import Aggregate, fmt_ci, unpaired_bootstrap

FOLLOW_MAJORITY = 0.5
DOMAINS = ('arithmetic', 'factual')   # 002's math vs knowledge traces
UNPAIRED_RULE = ("one run, two disjoint item sets: supported if the 95% CI of the difference "
                 "(each set's items resampled on their own) lies below 0, opposite if above, "
                 "else not supported; untested when a domain has no scored edit")


def _known_edits(rows: Sequence[dict], domain: str) -> list[dict]:
  """The rows behind a cell's ρ (`summary.cell`): applied edits (not the identity) whose
  regeneration parses and whose Strength is known."""
  return [x for x in rows if x['tau'] not in ('parse_failure', IDENTITY)
          and x.get('applied', True) and x['domain'] == domain and x['regen_parsed']
          and x['violation'] is not None]


def rho_difference(rows: Sequence[dict], *, seed: int) -> Aggregate | None:
  """ρ(arithmetic) − ρ(factual) with its unpaired CI; None when a domain has no row."""
  a, b = (_known_edits(rows, d) for d in DOMAINS)
  if not a or not b:
    return None
  violation = lambda x: x['violation']  # noqa: E731
  return unpaired_bootstrap(ratio_of_sums, item_sums(a, violation), item_sums(b, violation),
                            seed=seed)


def reader_claims(reader: str, summary: Mapping, rows: Sequence[dict], *,
                  seed: int) -> list[claims.Claim]:
  """follows, and math_more_causal when the reader was audited on both domains."""
  out = [claims.of_run(f'{reader}: follows', 'the regenerated answer is the edited trace\'s '
                       'implied answer on most edits (follow rate > 0.5)',
                       summary['all']['follow'], +1, against=FOLLOW_MAJORITY,
                       label='follow rate')]
  if all(d in summary.get('by_domain', {}) for d in DOMAINS):
    name = f'{reader}: math more causal'
    statement = ('arithmetic traces are more causal than factual ones: '
                 'ρ(arithmetic) < ρ(factual) (002)')
    agg = rho_difference(rows, seed=seed)
    if agg is None:
      out.append(claims.Claim(name, statement, claims.UNTESTED,
                              'a domain has no scored edit', UNPAIRED_RULE))
    else:
      d = claims.Difference('ρ(arithmetic) − ρ(factual)', (claims.SeedDifference('run', agg),))
      verdict = claims.direction(d, -1)
      out.append(claims.Claim(name, statement, verdict,
                              f'ρ(arithmetic) − ρ(factual) {fmt_ci(agg, 3, signed=True)} '
                              f'({agg.n} items) → {verdict}', UNPAIRED_RULE))
  return out


def run_claims(readers: Mapping[str, Mapping], rows: Mapping[str, Sequence[dict]], *,
               seed: int) -> list[claims.Claim]:
  """Every reader's claims (`reader_claims`), in the summary's reader order."""
  return [c for r, s in readers.items() for c in reader_claims(r, s, rows[r], seed=seed)]


def _flag(s: str) -> bool | None:
  return {'True': True, 'False': False}.get(s)


def read_rows(path: str) -> dict[str, list[dict]]:
  """A run's rows.csv back to the fields the claims read, by reader (runs written before
  the job printed its claims can be judged by the same rule: `claims_of_workdir`)."""
  out: dict[str, list[dict]] = {}
  with open(path, newline='') as f:
    for r in csv.DictReader(f):
      out.setdefault(r['reader'], []).append(dict(
          id=r['id'], domain=r['domain'], tau=r['tau'], applied=_flag(r['applied']) is not False,
          regen_parsed=bool(_flag(r['regen_parsed'])),
          violation=float(r['violation']) if r['violation'] else None))
  return out


def claims_of_workdir(workdir: str) -> list[claims.Claim]:
  """The claims of a finished run from its summary.json and rows.csv."""
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  rows = read_rows(os.path.join(workdir, 'rows.csv'))
  readers = {r: summary['readers'][r] for r in rows}   # the job's order (rows.csv's)
  return run_claims(readers, rows, seed=int(summary['config']['bootstrap_seed']))


def unless_competent(found: Sequence[claims.Claim], competence: Mapping[str, Mapping]
                     ) -> list[claims.Claim]:
  """The claims with those of a reader whose competence check failed made untested: a
  reader that did not learn the task is reported as such, never audited as if it had."""
  out = []
  for c in found:
    reader = c.name.split(':', 1)[0]
    comp = competence.get(reader)
    if comp is not None and not comp['competent']:
      c = claims.Claim(c.name, c.statement, claims.UNTESTED,
                       f"reader not competent (held-out accuracy {comp['accuracy']:.3f} < "
                       f"{comp['min_accuracy']} or parse rate {comp['parse_rate']:.3f} < "
                       f"{comp['min_parse_rate']}); its rows: {c.numbers}", c.rule)
    out.append(c)
  return out
