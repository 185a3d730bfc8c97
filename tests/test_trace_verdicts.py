"""The trace audit's claims by rule (`ceu_jax.audits.traces.verdicts`): oracle readers
through the job, and 002's domain comparison on hand-made rows each way."""
import dataclasses

import numpy as np
import pytest

from ceu_jax.audits.traces import job as trace_job
from ceu_jax.audits.traces import verdicts
from ceu_jax.audits.traces.audit import IDENTITY
from configs import trace_sensitivity as cfgs


def test_oracles_follow_ignore_and_mix(tmp_path):
  s = trace_job.run_trace_sensitivity(cfgs.get_config('tiny'), str(tmp_path / 'w'),
                                      log=lambda m: None)
  v = {c['name']: c['verdict'] for c in s['claims']}
  assert v == {'following: follows': 'supported', 'ignoring: follows': 'opposite',
               'mixture: follows': 'not supported'}   # chain world: one domain, no ρ claim
  assert '## Headline, decided by rule' in open(tmp_path / 'w' / 'report.md').read()
  # A finished run judged again from its files (rows.csv, summary.json): the same claims.
  again = verdicts.claims_of_workdir(str(tmp_path / 'w'))
  assert [dataclasses.asdict(c) for c in again] == s['claims']


def _rows(domain, violations_per_item, tau='ParaphraseStep'):
  """Applied, parsed edits with known Strength; items 'domain:i' with the given violations."""
  return [dict(id=f'{domain}:{i}', domain=domain, tau=tau, applied=True, regen_parsed=True,
               violation=v) for i, vs in enumerate(violations_per_item) for v in vs]


def _summary(rows):
  return {'all': {'follow': dict(value=0.9, ci_low=0.8, ci_high=1.0, n=len(rows))},
          'by_domain': {d: {} for d in {x['domain'] for x in rows}}}


@pytest.mark.parametrize('arith,fact,verdict', [
    (0, 1, 'supported'), (1, 0, 'opposite'), (None, None, 'not supported')])
def test_math_more_causal_each_way(arith, fact, verdict):
  rng = np.random.default_rng(0)
  if arith is None:   # both domains half violations: no difference
    a = [[1, 0]] * 20
    f = [[0, 1]] * 20
  else:
    a, f = [[arith] * 3] * 20, [[fact] * 2] * 25
  rows = _rows('arithmetic', a) + _rows('factual', f)
  rng.shuffle(rows)
  claims = verdicts.reader_claims('r', _summary(rows), rows, seed=0)
  math = [c for c in claims if c.name == 'r: math more causal']
  assert len(math) == 1 and math[0].verdict == verdict and math[0].rule == verdicts.UNPAIRED_RULE


def test_rho_difference_is_the_tables_ratio_and_drops_unscored_rows():
  """ρ per domain = violations over rows of known Strength (rows of an item together);
  the identity, unparsed regenerations, undefined edits and unknown Strength are out."""
  a = _rows('arithmetic', [[1, 0, 0], [0]])                         # ρ = 1/4
  f = _rows('factual', [[1, 1], [1, 0, 0, 0]])                      # ρ = 3/6
  noise = [dict(a[0], tau=IDENTITY, violation=1), dict(a[0], regen_parsed=False, violation=1),
           dict(a[0], applied=False, violation=1), dict(a[0], violation=None),
           dict(a[0], tau='parse_failure', violation=1)]
  agg = verdicts.rho_difference(a + f + noise, seed=0)
  assert agg.value == pytest.approx(1 / 4 - 3 / 6, abs=1e-12) and agg.n == 4
  assert verdicts.rho_difference(a, seed=0) is None
  c = verdicts.reader_claims('r', _summary(a + f), a, seed=0)
  assert [x.verdict for x in c if x.name == 'r: math more causal'] == ['untested']


def _follow_rows(follows_per_item, stratum, prefix='arithmetic'):
  """Applied, parsed edits with a known implied answer: items 'prefix:i' with the given
  follows (1 / 0) per edit, tagged with a stratum."""
  return [dict(id=f'{prefix}:{i}', domain='arithmetic', tau='LogicFlip', applied=True,
               regen_parsed=True, violation=None, follows=bool(v), stratum=stratum)
          for i, vs in enumerate(follows_per_item) for v in vs]


def test_follow_difference_is_paired_by_item_and_drops_unscored_rows():
  """follow(a) − follow(b) = (Σ follows / n edits) of each reader over the shared items:
  a follows 5 of 6 edits, b 1 of 4 -> 5/6 − 1/4; an item only one reader has is out."""
  a = _follow_rows([[1, 1, 1], [1, 1, 0]], 'memorised')
  b = _follow_rows([[0, 0], [1, 0], [1, 1]], 'memorised')   # item 2: b only
  noise = [dict(a[0], follows=None), dict(a[0], regen_parsed=False, follows=False),
           dict(a[0], tau=IDENTITY, follows=False), dict(a[0], applied=False, follows=False)]
  agg = verdicts.follow_difference(a + noise, b, seed=0)
  assert agg.value == pytest.approx(5 / 6 - 1 / 4, abs=1e-12) and agg.n == 2
  assert verdicts.follow_difference(a, b, seed=0, stratum='fresh') is None


def test_separation_and_per_stratum_claims_known_exactly():
  """A following reader that follows every edit and a shortcut reader that follows its
  trace on fresh items but never on memorised ones: separated on memorised items (and
  overall), not on fresh ones; per-stratum follows claims; a non-competent reader makes
  every claim naming it untested, with its name."""
  from ceu_jax.audits.traces import summary as tsum
  mem = [[1, 1]] * 12
  fol = _follow_rows(mem, 'memorised') + _follow_rows([[1, 1]] * 12, 'fresh', 'f')
  sho = (_follow_rows([[0, 0]] * 12, 'memorised')
         + _follow_rows([[1, 1]] * 12, 'fresh', 'f'))
  for x in fol + sho:
    x.update(phi=1.0, strength=1.0, strong=True, same=False, violation=0.0, k=1, trace_len=2)
  readers = {r: tsum.summarize(rows, seed=0) for r, rows in
             (('smollm2_following', fol), ('smollm2_shortcut', sho))}
  assert set(readers['smollm2_shortcut']['by_stratum']) == {'fresh', 'memorised'}
  assert readers['smollm2_shortcut']['by_stratum']['memorised']['follow']['value'] == 0.0
  found = verdicts.run_claims(readers, {'smollm2_following': fol, 'smollm2_shortcut': sho},
                              seed=0)
  v = {c.name: c.verdict for c in found}
  assert v['smollm2_shortcut: follows [memorised]'] == 'opposite'
  assert v['smollm2_shortcut: follows [fresh]'] == 'supported'
  assert v['smollm2_following: follows [memorised]'] == 'supported'
  pair = 'smollm2_following vs smollm2_shortcut'
  assert v[f'{pair} [memorised]: separates'] == 'supported'
  assert v[f'{pair}: separates'] == 'supported'   # 1 − 1/2 over all 24 items
  assert v[f'{pair} [fresh]: separates'] == 'not supported'   # difference exactly 0
  rule = {c.name: c.rule for c in found}[f'{pair}: separates']
  assert rule == verdicts.SEPARATION_RULE
  comp = {'smollm2_following': dict(competent=True), 'smollm2_shortcut': dict(
      competent=False, accuracy=0.3, min_accuracy=0.5, parse_rate=1.0, min_parse_rate=0.8)}
  judged = {c.name: c for c in verdicts.unless_competent(found, comp)}
  assert judged[f'{pair} [memorised]: separates'].verdict == 'untested'
  assert judged[f'{pair} [memorised]: separates'].numbers.startswith(
      'smollm2_shortcut not competent (held-out accuracy 0.300 < 0.5); its rows: ')
  assert judged['smollm2_following: follows [memorised]'].verdict == 'supported'
  # competent on the memorised problems only: its claims on them are decided, the rest not
  comp['smollm2_shortcut']['memorised'] = dict(accuracy=0.9, parse_rate=1.0)
  judged = {c.name: c for c in verdicts.unless_competent(found, comp)}
  assert judged[f'{pair} [memorised]: separates'].verdict == 'supported'
  assert judged['smollm2_shortcut: follows [memorised]'].verdict == 'opposite'
  for name in (f'{pair}: separates', f'{pair} [fresh]: separates',
               'smollm2_shortcut: follows [fresh]'):
    assert judged[name].verdict == 'untested', name
    assert 'smollm2_shortcut not competent (held-out accuracy 0.300' in judged[name].numbers
  comp['smollm2_shortcut']['memorised']['parse_rate'] = 0.5
  judged = {c.name: c for c in verdicts.unless_competent(found, comp)}
  assert judged[f'{pair} [memorised]: separates'].numbers.startswith(
      'smollm2_shortcut not competent (memorised parse rate 0.500 < 0.8)')
  comp['smollm2_shortcut']['memorised']['accuracy'] = 0.25
  judged = {c.name: c for c in verdicts.unless_competent(found, comp)}
  assert judged[f'{pair} [memorised]: separates'].numbers.startswith(
      'smollm2_shortcut not competent (memorised accuracy 0.250 < 0.5; memorised parse rate '
      '0.500 < 0.8)')
