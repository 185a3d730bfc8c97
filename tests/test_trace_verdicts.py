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
