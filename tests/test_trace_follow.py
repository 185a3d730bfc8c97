"""The trace audit's follow rate, parse failures and undefined interventions (issue #32,
SPEC §8.2), on World A's chain domain whose ground truth is exact.

* follow rate: a following oracle 1, an ignoring oracle 0 wherever the edit moves the
  implied answer, a seeded mixture its share (against a loop over rows), CI = `mean_ci`;
* parse failures: a reader whose regenerations fail to parse on a seeded half of the
  items leaves φ, ρ and the follow rate of the other half unchanged (every Aggregate
  equal) and reports the failure rate exactly; the former convention only in its columns;
* undefined interventions: counted by reason, in the summary and the table.
"""
import numpy as np
import pytest

from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import chain_world as tw
from ceu_jax.audits.traces import summary as tsum
from ceu_jax.metrics.resampling import mean_ci
from ceu_jax.readers import base

CFG = tw.ChainConfig()
DOMAIN = tw.ChainDomain(CFG)


@pytest.fixture(scope='module')
def items():
  return tw.make_items(CFG, 80, seed=4)


def _edits(rows):
  return [r for r in rows if r['tau'] not in (ts.IDENTITY, 'parse_failure') and r['applied']]


def test_following_oracle_follows_ignoring_oracle_does_not(items):
  rows = ts.run_traces(tw.following_oracle(DOMAIN, items), DOMAIN, items)
  e = _edits(rows)
  assert e and all(r['follows'] is True for r in e)
  s = tsum.summarize(rows)
  assert s['all']['follow']['value'] == 1.0 and s['all']['follow']['n'] == len(e)
  for c in s['by_tau'].values():
    assert c['follow']['value'] == 1.0
  # premise negation: the implied answer is '?' (unresolvable) and the oracle answers it
  pn = [r for r in e if r['tau'] == ts.PREMISE_NEGATION]
  assert pn and all(r['answer_after'] == [DOMAIN.unknown] for r in pn)

  rows = ts.run_traces(tw.ignoring_oracle(DOMAIN, items), DOMAIN, items)
  e = _edits(rows)
  moved = [r for r in e if r['strong']]
  assert len(moved) == len(e)  # every World A edit moves the implied answer
  assert all(r['follows'] is False for r in moved)
  s = tsum.summarize(rows)
  assert s['all']['follow']['value'] == 0.0 and s['all']['follow_strong']['value'] == 0.0
  assert s['all']['follow_strong']['n'] == len(moved)


def test_an_edit_that_keeps_the_implied_answer_is_followed_by_staying(items):
  # a domain whose FactReversal swaps in the original step (Strength 0): the ignoring oracle
  # keeps its answer, which is what the edited trace implies — it follows, by staying
  class Keep(tw.ChainDomain):
    def edit(self, item, trace, k, tau):
      e = super().edit(item, trace, k, tau)
      if tau != ts.FACT_REVERSAL or isinstance(e, ts.Undefined):
        return e
      return ts.Edit((trace.steps[k - 1],), 0.0, e.implied_before, e.implied_before)

  d = Keep(CFG)
  rows = ts.run_traces(tw.ignoring_oracle(d, items), d, items, taus=(ts.FACT_REVERSAL,))
  s = tsum.summarize(rows)
  assert s['all']['follow']['value'] == 1.0 and s['all']['follow_strong']['n'] == 0
  assert s['all']['rho']['value'] == 0.0


def test_mixture_follow_rate_against_a_loop(items):
  share, seed = 0.4, 3
  rows = ts.run_traces(tw.mixture_oracle(DOMAIN, items, share, seed), DOMAIN, items)
  e = _edits(rows)
  ref = np.mean([float(tw.mixture_follows(r['id'], share, seed)) for r in e])
  s = tsum.summarize(rows)
  assert s['all']['follow']['value'] == pytest.approx(ref, abs=1e-12)
  for d, ts_ in s['domain_tau_len'].items():  # every domain × τ × trace length cell
    for t, ls in ts_.items():
      for L, c in ls.items():
        xs = [r for r in e if r['domain'] == d and r['tau'] == t and str(r['trace_len']) == L]
        assert c['follow']['n'] == len(xs) > 0
        assert c['follow']['value'] == pytest.approx(
            np.mean([float(tw.mixture_follows(r['id'], share, seed)) for r in xs]), abs=1e-12)
  assert sum(c['n'] for ts_ in s['domain_tau_len'].values() for ls in ts_.values()
             for c in ls.values()) == len(e)
  assert '| chain | fact_reversal | 1 |' in tsum.tau_length_table(s)
  assert 0.0 < ref < 1.0
  assert s['all']['follow']['ci_low'] < ref < s['all']['follow']['ci_high']


def test_follow_ci_is_mean_ci_when_every_item_has_one_row(items):
  rows = ts.run_traces(tw.mixture_oracle(DOMAIN, items, 0.5, 1), DOMAIN, items,
                       taus=(ts.FACT_REVERSAL,), positions=(1,))
  e = _edits(rows)
  assert len({r['id'] for r in e}) == len(e) == len(items)
  c = tsum.cell(e, seed=42)
  ref = mean_ci(np.asarray([float(r['follows']) for r in e]), seed=42, num_resamples=1000)
  assert (c['follow']['value'], c['follow']['ci_low'], c['follow']['ci_high']) == (
      ref.value, ref.ci_low, ref.ci_high)
  assert c['follow']['ci_low'] < c['follow']['ci_high']


class HalfUnparsed(base.Reader):
  """Wraps a reader; on a seeded half of the items every regeneration loses its answer."""

  def __init__(self, inner, bad_ids):
    self.inner, self.bad = inner, set(bad_ids)

  def _generate(self, prompts, forced, budget, stops, ids):
    out = self.inner._generate(prompts, forced, budget, stops, ids)
    if forced is None:
      return out
    note = CFG.vocab.tok('NOTE')
    return [base.Generation(g.id, '', (note,), base.END) if g.id[0] in self.bad else g
            for g in out]

  def _loglik(self, prompts, answers, ids):
    raise NotImplementedError


def test_unparsed_regenerations_leave_the_other_half_unchanged(items):
  rng = np.random.default_rng(32)
  bad = {x.id for x, u in zip(items, rng.random(len(items))) if u < 0.5}
  good_items = [x for x in items if x.id not in bad]
  assert 0 < len(bad) < len(items)
  inner = tw.mixture_oracle(DOMAIN, items, 0.5, 7)  # φ, ρ, follow all strictly inside (0, 1)
  rows = ts.run_traces(HalfUnparsed(inner, bad), DOMAIN, items)
  ref_rows = ts.run_traces(inner, DOMAIN, good_items)
  s, ref = tsum.summarize(rows), tsum.summarize(ref_rows)
  for key in ('phi', 'rho', 'follow', 'follow_strong'):
    assert s['all'][key] == ref['all'][key]  # value, CI, n, n_items: all equal
    for t in s['by_tau']:
      assert s['by_tau'][t][key] == ref['by_tau'][t][key]
  assert 0 < ref['all']['phi']['value'] < 1 and 0 < ref['all']['follow']['value'] < 1
  e = _edits(rows)
  n_bad = sum(r['id'] in bad for r in e)
  assert s['all']['n_regen_unparsed'] == n_bad > 0
  assert s['all']['regen_parse_failure'] == n_bad / len(e)
  # the former convention, only in its labelled columns: unparsed = changed, never a violation
  old_phi = np.mean([1.0 if r['id'] in bad else r['phi'] for r in e])
  old_rho = np.mean([0.0 if r['id'] in bad else r['violation'] for r in e])
  assert s['all']['phi_unparsed_as_changed']['value'] == pytest.approx(old_phi, abs=1e-12)
  assert s['all']['rho_unparsed_as_changed']['value'] == pytest.approx(old_rho, abs=1e-12)
  assert s['all']['phi']['value'] != pytest.approx(old_phi)
  t = tsum.table(s)
  c = s['domain_tau']['chain'][ts.FACT_REVERSAL]
  assert c['n_regen_unparsed'] > 0 and f"{c['regen_parse_failure']:.3f} ({c['n_regen_unparsed']})" in t
  assert 'φ / ρ if unparsed = changed' in t


def test_undefined_interventions_are_counted_by_reason(items):
  rows = ts.run_traces(tw.following_oracle(DOMAIN, items), DOMAIN, items)
  und = [r for r in rows if r.get('applied') is False]
  n_last = sum(1 for x in items)  # CausalInversion at every trace's last step
  assert len(und) == n_last and all(r['undefined'] == 'last_step' for r in und)
  assert not any(r['tau'] == ts.LOGIC_FLIP for r in rows)  # not defined in World A: not run
  s = tsum.summarize(rows)
  assert s['undefined'] == {'chain': {ts.CAUSAL_INVERSION: {'last_step': n_last}}}
  assert f'last_step {n_last}' in tsum.table(s)

  class Picky(tw.ChainDomain):  # an item-level reason on a third of the items
    def edit(self, item, trace, k, tau):
      if tau == ts.FACT_REVERSAL and item.id in odd:
        return ts.Undefined('no_alternative')
      return super().edit(item, trace, k, tau)

  odd = {x.id for x in items[::3]}
  d = Picky(CFG)
  rows = ts.run_traces(tw.following_oracle(d, items), d, items, taus=(ts.FACT_REVERSAL,))
  s = tsum.summarize(rows)
  n_odd = sum(x.hops - 1 for x in items if x.id in odd)
  assert s['undefined'] == {'chain': {ts.FACT_REVERSAL: {'no_alternative': n_odd}}}
  assert s['all']['n'] == sum(x.hops - 1 for x in items) - n_odd
  assert ts.intervene(d, items[0], DOMAIN.parse(items[0].target), 1, ts.LOGIC_FLIP) == (
      ts.Undefined('not_in_domain'))


def test_identity_rows_say_whether_the_output_is_identical(items):
  rows = ts.run_traces(tw.following_oracle(DOMAIN, items), DOMAIN, items, taus=(ts.IDENTITY,))
  assert rows and all(r['identical'] is True for r in rows)

  class Drift(base.Reader):  # regenerates the trace, then the value of the first alternative
    def _generate(self, prompts, forced, budget, stops, ids):
      out = tw.following_oracle(DOMAIN, items)._generate(prompts, forced, budget, stops, ids)
      if forced is None:
        return out
      by_prompt = {DOMAIN.prompt(x): x for x in items}
      eos = DOMAIN.eos
      res = []
      for p, g in zip(prompts, out):
        toks = g.tokens[:-2] + (by_prompt[p].value + 1 if by_prompt[p].value + 1 <
                                 CFG.vocab.size else by_prompt[p].value - 1, eos)
        res.append(base.Generation(g.id, '', toks, base.STOP_TOKEN, eos))
      return res

    def _loglik(self, prompts, answers, ids):
      raise NotImplementedError

  rows = ts.run_traces(Drift(), DOMAIN, items, taus=(ts.IDENTITY,))
  s = tsum.summarize(rows)
  assert s['identity']['n_identical'] == 0 and s['identity']['phi']['value'] == 1.0
