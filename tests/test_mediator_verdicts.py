"""The mediator audit's claims by rule (`ceu_jax.audits.mediator.verdicts`) on hand-made
rows whose verdicts are known, and the unpaired CI they use against a Python loop."""
import numpy as np
import pytest

from ceu_jax.audits.mediator import audit as md
from ceu_jax.audits.mediator import verdicts
from ceu_jax.metrics import resampling


def test_unpaired_ci_equals_a_python_loop():
  rng = np.random.default_rng(0)
  a, b = rng.random(37), rng.random(23) + 0.2
  got = resampling.unpaired_difference_ci(a, b, num_resamples=500, seed=7)
  ra, rb = np.random.default_rng(7), np.random.default_rng(8)
  diffs = []
  ia, ib = ra.integers(0, a.size, size=(500, a.size)), rb.integers(0, b.size, size=(500, b.size))
  for i in range(500):
    diffs.append(np.mean([a[j] for j in ia[i]]) - np.mean([b[j] for j in ib[i]]))
  lo, hi = np.quantile(diffs, [0.025, 0.975])
  assert got.value == pytest.approx(a.mean() - b.mean(), abs=1e-12)
  assert (got.ci_low, got.ci_high, got.n) == (pytest.approx(lo, abs=1e-12),
                                              pytest.approx(hi, abs=1e-12), 60)
  assert resampling.unpaired_difference_ci(a, np.array([])) is resampling.EMPTY


def _rows(kinds, star, consistent=None, strong=None, ids=None):
  n = len(kinds)
  ids = ids or [f'x{i}' for i in range(n)]
  consistent = consistent if consistent is not None else [1] * n
  strong = strong if strong is not None else [c and s for c, s in zip(consistent, star)]
  return [dict(id=i, kind=k, consistent_star=s, consistent=c, strong=t)
          for i, k, s, c, t in zip(ids, kinds, star, consistent, strong)]


@pytest.mark.parametrize('cnf,cor,verdict', [
    (1.0, 0.0, 'supported'), (0.0, 1.0, 'opposite'), (0.5, 0.5, 'not supported')])
def test_asymmetry_each_way(cnf, cor, verdict):
  n = 40
  star = [1 if i < cnf * n else 0 for i in range(n)] + [1 if i < cor * n else 0 for i in range(n)]
  rows = _rows([md.CNF] * n + [md.COR] * n, star)
  agg = verdicts.asymmetry(rows, seed=0, min_cell=10)
  assert agg.value == pytest.approx(cnf - cor)
  claim = verdicts._unpaired_claim('s: asymmetry', '', agg, +1, 'CNF − COR')
  assert claim.verdict == verdict and claim.rule == verdicts.UNPAIRED_RULE


def test_asymmetry_untested_below_min_cell():
  rows = _rows([md.CNF] * 9 + [md.COR] * 30, [1] * 39)
  assert verdicts.asymmetry(rows, seed=0, min_cell=10) is None
  assert verdicts.asymmetry(rows, seed=0, min_cell=9) is not None
  claim = verdicts._unpaired_claim('s: asymmetry', '', None, +1, 'CNF − COR')
  assert claim.verdict == 'untested'


def test_separation_pairs_only_shared_items_and_skips():
  """Shortcut: gap 1 on x0..x19; faithful: gap 0. A skipped row and items only one
  setting audited are left out, so the paired difference is 1 on 20 items."""
  short = _rows([md.COR] * 20 + [md.SKIP], [0] * 21, strong=[0] * 21,
                ids=[f'x{i}' for i in range(21)])
  faith = _rows([md.COR] * 25, [1] * 25, ids=[f'x{i}' for i in range(25)])
  c = verdicts.separation_claim('fam', short, faith, seed=0)
  assert c.verdict == 'supported' and 'n=20' in c.numbers and '+1.000' in c.numbers
  same = verdicts.separation_claim('fam', faith, faith, seed=0)
  assert same.verdict == 'not supported'
  assert verdicts.separation_claim('fam', faith, short, seed=0).verdict == 'opposite'


def test_contrasts_pair_each_familys_shortcut_with_its_faithful_reader():
  readers = ('attention/faithful', 'attention/shortcut', 'attention/plain', 'ssm/shortcut',
             'ssm/faithful', 'memory_port/shortcut')    # memory_port: no faithful reader
  assert verdicts.contrasts(readers, (False, True)) == [
      ('attention/shortcut vs faithful', 'attention/shortcut', 'attention/faithful'),
      ('attention/shortcut vs faithful +tool', 'attention/shortcut +tool',
       'attention/faithful +tool'),
      ('ssm/shortcut vs faithful', 'ssm/shortcut', 'ssm/faithful'),
      ('ssm/shortcut vs faithful +tool', 'ssm/shortcut +tool', 'ssm/faithful +tool')]
  assert verdicts.contrasts(('attention/faithful', 'attention/plain'), (False,)) == []
  assert verdicts.contrasts(('follower', 'gold_computer', 'constant'), (True,)) == [
      ('gold_computer vs follower +tool', 'gold_computer +tool', 'follower +tool')]


def test_gap_claims_need_a_reader_that_follows_its_own_mediator():
  """F_ID < 0.5 (World B's SmolLM2: no decision parses) makes the gap and the tool claims
  untested, whatever Δ says; at F_ID ≥ 0.5 the rule decides."""
  agg = lambda v, lo, hi: dict(value=v, ci_low=lo, ci_high=hi, n=20)  # noqa: E731
  for f_id, want in ((0.0, 'untested'), (0.49, 'untested'), (0.5, 'not supported')):
    s = dict(delta=agg(0.0, 0.0, 0.0), F_ID=agg(f_id, f_id, f_id),
             delta_own=agg(0.0, 0.0, 0.0), F_ID_own=agg(f_id, f_id, f_id))
    got = {c.name: c.verdict for c in verdicts.setting_claims('s', s, [], seed=0, min_cell=1)}
    assert got['s: gap'] == want
    assert got['s: tool closes the gap'] == ('untested' if want == 'untested' else 'supported')


def test_claims_of_a_reader_that_is_not_competent_are_untested_naming_what_failed():
  from ceu_jax import claims
  ok = dict(competent=True, checklist_accuracy=0.9, min_accuracy=0.5, decision_parse_rate=1.0,
            min_parse_rate=0.8, line_accuracy=0.97, line_constant=0.5)
  weak = dict(ok, competent=False, checklist_accuracy=0.125, line_accuracy=0.49)
  both = dict(weak, decision_parse_rate=0.25)
  comp = {'a': ok, 'b': weak, 'c': both}
  found = [claims.Claim(f'{s}: gap', 'x', claims.SUPPORTED, 'Δ +0.1') for s in 'abc']
  found.append(claims.Claim('b vs a: separates', 'y', claims.NOT_SUPPORTED, 'diff +0.0'))
  out = {c.name: c for c in verdicts.unless_competent(found, comp, [('b vs a', 'b', 'a')])}
  assert out['a: gap'] == found[0]                        # competent: unchanged
  assert out['b: gap'].verdict == claims.UNTESTED
  assert out['b: gap'].numbers == ('b not competent (checklist accuracy 0.125 < 0.5; lines '
                                   'right 0.490, a constant answer 0.500); its rows: Δ +0.1')
  assert 'decision parse rate 0.250 < 0.8' in out['c: gap'].numbers
  assert 'parse rate' not in out['b: gap'].numbers       # only what failed is named
  assert out['b vs a: separates'].verdict == claims.UNTESTED
  assert out['b vs a: separates'].numbers.startswith('b not competent')
