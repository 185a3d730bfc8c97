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
  follows [stratum]  the same per stratum, where the rows carry one (World B with
               memorised problems: memorised / fresh items).
  separates    (a *following* reader beside its *shortcut* counterpart, e.g.
               smollm2_following / smollm2_shortcut) issue #35's check of the audit itself:
               the following reader's follow rate exceeds the shortcut reader's on the same
               items, overall and per stratum; paired (an item's rows of both readers
               resampled together), supported if the CI of the difference lies above 0.
  probe separates  (World B, the §8.4 probe `smollm2_probe` of both readers) the shortcut
               reader's answer depends more on the problem with the trace held fixed: ΔL
               (shortcut) − ΔL(following) paired by item, supported if its CI lies above 0.
  probe agrees  the mechanistic and the behavioural separation reach the same verdict
               (both separate, or neither does).
Every behavioural claim counts only regenerations that parse, as the tables do. Where the
readers had a competence check (World B's fine-tunes), a claim naming a reader that is not
competent on the claim's problems is untested (`COMPETENCE_RULE`, `unless_competent`).
"""
from __future__ import annotations

import csv
import json
import os
import re
from typing import Mapping, Sequence

import numpy as np

from ceu_jax import claims
from ceu_jax.audits.traces.audit import IDENTITY
from ceu_jax.audits.traces.summary import item_sums, ratio_of_sums
from ceu_jax.metrics.resampling import Aggregate, bootstrap, fmt_ci, unpaired_bootstrap

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


SEPARATION_RULE = ("one run, two readers on the same items: supported if the 95% CI of the "
                   "difference of follow rates (each item's rows of both readers resampled "
                   "together) lies above 0, opposite if below, else not supported; untested "
                   "when no item has a scored edit of both readers")


def _follow_rows(rows: Sequence[dict], stratum: str | None = None) -> list[dict]:
  """The rows behind a cell's follow rate: applied edits whose regeneration parses and
  whose implied answer is known (optionally one stratum's)."""
  return [x for x in rows if x['tau'] not in ('parse_failure', IDENTITY)
          and x.get('applied', True) and x['regen_parsed'] and x['follows'] is not None
          and (stratum is None or x.get('stratum') == stratum)]


def follow_difference(a: Sequence[dict], b: Sequence[dict], *, seed: int,
                      stratum: str | None = None) -> Aggregate | None:
  """follow(a) − follow(b) over the items both readers have scored edits on, paired by
  item; None when there is none."""
  def per_item(rows):
    out: dict = {}
    for x in _follow_rows(rows, stratum):
      s, n = out.get(str(x['id']), (0.0, 0))
      out[str(x['id'])] = (s + float(x['follows']), n + 1)
    return out
  pa, pb = per_item(a), per_item(b)
  shared = [k for k in pa if k in pb]
  if not shared:
    return None
  arr = lambda p, j: np.asarray([p[k][j] for k in shared], np.float64)  # noqa: E731
  return bootstrap(lambda sa, ca, sb, cb: ratio_of_sums(sa, ca) - ratio_of_sums(sb, cb),
                   arr(pa, 0), arr(pa, 1), arr(pb, 0), arr(pb, 1), seed=seed)


def reader_pairs(readers: Sequence[str]) -> list[tuple[str, str]]:
  """(following, shortcut) reader pairs, e.g. (smollm2_following, smollm2_shortcut)."""
  return [(a, a[:-len('following')] + 'shortcut') for a in readers
          if a.endswith('following') and a[:-len('following')] + 'shortcut' in readers]


def separation_claims(readers: Sequence[str],
                      rows: Mapping[str, Sequence[dict]], *, seed: int) -> list[claims.Claim]:
  """`separates` for every following reader with a shortcut counterpart (module doc)."""
  out = []
  for a, b in reader_pairs(readers):
    strata = [None] + sorted({x['stratum'] for r in (a, b) for x in rows[r] if x.get('stratum')})
    for st in strata:
      tag = f' [{st}]' if st else ''
      name = f'{a} vs {b}{tag}: separates'
      statement = (f'the audit tells the following reader from the shortcut one{tag}: '
                   'follow rate higher for the following reader on the same items')
      agg = follow_difference(rows[a], rows[b], seed=seed, stratum=st)
      if agg is None:
        out.append(claims.Claim(name, statement, claims.UNTESTED,
                                'no item with a scored edit of both readers', SEPARATION_RULE))
        continue
      d = claims.Difference('follow difference', (claims.SeedDifference('run', agg),))
      verdict = claims.direction(d, +1)
      out.append(claims.Claim(name, statement, verdict,
                              f'follow({a}) − follow({b}) {fmt_ci(agg, 3, signed=True)} '
                              f'({agg.n} items) → {verdict}', SEPARATION_RULE))
  return out


def probe_claims(readers: Sequence[str], probes: Mapping[str, Mapping],
                 behavioural: Sequence[claims.Claim], *, seed: int) -> list[claims.Claim]:
  """`probe separates` and `probe agrees` (`layer_probe.pair_claims`) per following /
  shortcut pair and stratum, from the probe summaries' per-item ΔL."""
  from ceu_jax.audits import layer_probe
  out, by_name = [], {c.name: c for c in behavioural}
  for a, b in reader_pairs(readers):
    if a not in probes or b not in probes:
      continue
    st_of = {**probes[b].get('stratum_by_item', {}), **probes[a].get('stratum_by_item', {})}
    for st in [None] + sorted({s for s in st_of.values() if s}):
      tag = f' [{st}]' if st else ''
      out += layer_probe.pair_claims(
          f'{a} vs {b}{tag}', probes[b], probes[a], by_name.get(f'{a} vs {b}{tag}: separates'),
          seed=seed, stratum=st, names=(b, a),
          statement=('the §8.4 probe tells the shortcut reader from the following one' + tag +
                     ': with the trace held fixed, moving the problem\'s start moves the '
                     'shortcut reader\'s answer more (ΔL larger on the same items)'))
  return out


def reader_claims(reader: str, summary: Mapping, rows: Sequence[dict], *,
                  seed: int) -> list[claims.Claim]:
  """follows, and math_more_causal when the reader was audited on both domains."""
  out = [claims.of_run(f'{reader}: follows', 'the regenerated answer is the edited trace\'s '
                       'implied answer on most edits (follow rate > 0.5)',
                       summary['all']['follow'], +1, against=FOLLOW_MAJORITY,
                       label='follow rate')]
  for st, cell in sorted(summary.get('by_stratum', {}).items()):
    out.append(claims.of_run(f'{reader}: follows [{st}]', 'the regenerated answer is the '
                             f'edited trace\'s implied answer on most edits of {st} items',
                             cell['follow'], +1, against=FOLLOW_MAJORITY, label='follow rate'))
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
  """Every reader's claims (`reader_claims`), in the summary's reader order, then the
  following / shortcut separations (`separation_claims`)."""
  return ([c for r, s in readers.items() for c in reader_claims(r, s, rows[r], seed=seed)]
          + separation_claims(list(readers), rows, seed=seed))


def decide(readers: Mapping[str, Mapping], rows: Mapping[str, Sequence[dict]],
           probes: Mapping[str, Mapping] | None, competence: Mapping[str, Mapping] | None, *,
           seed: int) -> list[claims.Claim]:
  """The job's claims from its per-reader summaries and rows, World B's §8.4 probes (None:
  no probe claims) and competence checks (a claim naming a reader not competent on its
  problems is untested). The job, the recorded-run tests and `over_seeds` call it."""
  found = run_claims(readers, rows, seed=seed)
  if probes:
    found += probe_claims(list(readers), probes, found, seed=seed)
  if competence:
    found = unless_competent(found, competence)
  return found


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
          violation=float(r['violation']) if r['violation'] else None,
          follows=_flag(r.get('follows', '')), stratum=r.get('stratum') or None))
  return out


def claims_of_workdir(workdir: str) -> list[claims.Claim]:
  """The claims of a finished run from its summary.json and rows.csv."""
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  rows = read_rows(os.path.join(workdir, 'rows.csv'))
  readers = {r: summary['readers'][r] for r in rows}   # the job's order (rows.csv's)
  return run_claims(readers, rows, seed=int(summary['config']['bootstrap_seed']))


COMPETENCE_RULE = ("a claim is decided only when every reader it names is competent on the "
                   "problems it is about: a claim on the memorised stratum needs the reader's "
                   "accuracy and parse rate on the memorised problems at the thresholds, every "
                   "other claim (all items, fresh) needs them on held-out problems; else untested")


def competent_on(comp: Mapping, stratum: str | None) -> tuple[bool, str]:
  """(competent, why not) of one reader's competence check for claims on `stratum`
  (COMPETENCE_RULE): the memorised problems' numbers for 'memorised' (where the check
  measured them), the held-out problems' otherwise; `why not` names only the thresholds
  the reader failed, with its numbers."""
  where, c = 'held-out', comp
  if stratum == 'memorised' and 'memorised' in comp:
    where, c = 'memorised', comp['memorised']
  ok = (c['accuracy'] >= comp['min_accuracy'] and c['parse_rate'] >= comp['min_parse_rate']
        if where == 'memorised' else bool(comp['competent']))
  if ok:
    return True, ''
  failed = claims.failed_thresholds(c, comp, (('accuracy', 'accuracy', 'min_accuracy'),
                                             ('parse rate', 'parse_rate', 'min_parse_rate')),
                                    prefix=f'{where} ')
  return False, '; '.join(failed) or f"{where}: not competent"


def unless_competent(found: Sequence[claims.Claim], competence: Mapping[str, Mapping]
                     ) -> list[claims.Claim]:
  """The claims with those of a reader that is not competent on the claim's problems made
  untested (COMPETENCE_RULE): a reader that did not learn the task is reported as such,
  never audited as if it had."""
  out = []
  for c in found:
    tag = re.search(r' \[(\w+)\]', c.name)   # 'a vs b [st]: …' or 'a: follows [st]'
    stratum = tag.group(1) if tag else None
    names = [x.split(' [')[0].strip() for x in c.name.split(':', 1)[0].split(' vs ')]
    for r in names:
      if r not in competence:
        continue
      ok, why = competent_on(competence[r], stratum)
      if not ok:
        c = claims.Claim(c.name, c.statement, claims.UNTESTED,
                         f"{r} not competent ({why}); its rows: {c.numbers}", c.rule)
        break
    out.append(c)
  return out
