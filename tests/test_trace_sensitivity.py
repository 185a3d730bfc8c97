"""Trace-sensitivity audit (SPEC §8.2, issue #17): oracle readers, invariants, bad input.

Acceptance 1 (oracles), 2 (invariants) and 5 (bad input) on World A's chain
domain, whose ground truth is exact.
"""
import numpy as np
import pytest

from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import chain_world as tw
from ceu_jax.audits.traces import summary as tsum
from ceu_jax.readers import base

CFG = tw.ChainConfig()
DOMAIN = tw.ChainDomain(CFG)


@pytest.fixture(scope='module')
def items():
  return tw.make_items(CFG, 60, seed=3)


class Recording(base.Reader):
  """Wraps a reader and records every forced prefix it is given (by call id)."""

  def __init__(self, inner):
    self.inner, self.forced = inner, {}

  def _generate(self, prompts, forced, budget, stops, ids):
    if forced is not None:
      self.forced.update(zip(ids, forced))
    return self.inner._generate(prompts, forced, budget, stops, ids)

  def _loglik(self, prompts, answers, ids):
    raise NotImplementedError


class Scripted(base.Reader):
  """Outputs fixed tokens: `plain(item)` for generation, `cont(item, forced)` after a prefix."""

  def __init__(self, items, plain, cont):
    self.items = {DOMAIN.prompt(x): x for x in items}
    self.plain, self.cont = plain, cont

  def _generate(self, prompts, forced, budget, stops, ids):
    out = []
    for j, (p, i) in enumerate(zip(prompts, ids)):
      x = self.items[p]
      toks = tuple(self.plain(x) if forced is None else self.cont(x, tuple(forced[j])))[:budget]
      hit = [n for n, t in enumerate(toks) if t in stops[1]]
      if hit:
        out.append(base.Generation(i, '', toks[:hit[0] + 1], base.STOP_TOKEN, toks[hit[0]]))
      else:
        out.append(base.Generation(i, '', toks, base.END))
    return out

  def _loglik(self, prompts, answers, ids):
    raise NotImplementedError


def _edits(rows):
  return [r for r in rows if r['tau'] not in (ts.IDENTITY, 'parse_failure') and r['applied']]


# ------------------------------------------------------------ acceptance 1: oracles
def test_following_oracle_phi_one_rho_zero(items):
  rows = ts.run_traces(tw.following_oracle(DOMAIN, items), DOMAIN, items)
  e = _edits(rows)
  assert e and all(r['phi'] == 1.0 and r['violation'] == 0.0 for r in e)
  s = tsum.summarize(rows)
  assert s['all']['phi']['value'] == 1.0 and s['all']['rho']['value'] == 0.0
  assert {r['tau'] for r in e} == {ts.FACT_REVERSAL, ts.PREMISE_NEGATION, ts.CAUSAL_INVERSION}


def test_ignoring_oracle_phi_zero_rho_one(items):
  rows = ts.run_traces(tw.ignoring_oracle(DOMAIN, items), DOMAIN, items)
  s = tsum.summarize(rows)
  assert s['all']['phi']['value'] == 0.0 and s['all']['rho']['value'] == 1.0
  assert s['all']['n'] == len(_edits(rows)) > 100
  for c in s['by_tau'].values():
    assert c['phi']['value'] == 0.0 and c['rho']['value'] == 1.0


def test_mixture_oracle_gives_its_share():
  share, seed = 0.3, 5
  its = tw.make_items(CFG, 400, seed=11)
  rows = ts.run_traces(tw.mixture_oracle(DOMAIN, its, share, seed), DOMAIN, its,
                       taus=(ts.FACT_REVERSAL,))
  s = tsum.summarize(rows)
  # reference: a Python loop over rows with the per-item draw recomputed
  ref = np.mean([float(tw.mixture_follows(r['id'], share, seed)) for r in _edits(rows)])
  assert abs(s['all']['phi']['value'] - ref) < 1e-12
  assert abs(s['all']['rho']['value'] - (1 - ref)) < 1e-12
  assert s['all']['phi']['ci_low'] <= share <= s['all']['phi']['ci_high']
  assert s['all']['rho']['ci_low'] <= 1 - share <= s['all']['rho']['ci_high']
  assert 0 < s['all']['phi']['ci_low'] and s['all']['phi']['ci_high'] < 1


def test_mixture_share_must_be_a_probability(items):
  with pytest.raises(ValueError, match='share'):
    tw.mixture_oracle(DOMAIN, items, 1.5)


# ------------------------------------------------------------ acceptance 2: invariants
def test_identity_phi_zero_and_never_a_violation(items):
  rows = ts.run_traces(tw.ignoring_oracle(DOMAIN, items), DOMAIN, items)
  ident = [r for r in rows if r['tau'] == ts.IDENTITY]
  assert len(ident) == sum(x.hops - 1 for x in items)  # every step of every trace
  assert all(r['phi'] == 0.0 and r['strength'] == 0.0 and r['violation'] == 0.0 for r in ident)
  rows = ts.run_traces(tw.following_oracle(DOMAIN, items), DOMAIN, items, taus=(ts.IDENTITY,))
  assert all(r['phi'] == 0.0 for r in rows)


def test_regeneration_starts_at_k_plus_1_with_the_prefix_kept(items):
  rec = Recording(tw.following_oracle(DOMAIN, items))
  rows = [r for r in ts.run_traces(rec, DOMAIN, items) if r['applied']]
  by_id = {x.id: x for x in items}
  assert len(rec.forced) == len(rows)
  for r in rows:
    forced = tuple(rec.forced[(r['id'], r['k'], r['tau'])])
    x, k = by_id[r['id']], r['k']
    original = x.target  # the oracle's own trace is the gold one
    block = 2 if r['tau'] == ts.CAUSAL_INVERSION else 1
    assert forced[:k - 1] == original[:k - 1]  # kept prefix, token for token
    assert len(forced) == k - 1 + block  # regeneration starts right after the block
    assert tuple(r['forced']) == forced
    full = forced + tuple(r['continuation'])
    assert DOMAIN.parse(full).steps[:k - 1] == original[:k - 1]
    if r['tau'] == ts.CAUSAL_INVERSION:
      assert forced[k - 1:] == (original[k], original[k - 1])


def test_forced_prefix_is_cut_from_the_raw_output():
  tr = ts.ParsedTrace(raw=(10, 11, 12, 99), steps=(10, 11, 12), starts=(0, 1, 2), answer=(99,))
  assert ts.forced_prefix(DOMAIN, tr, 2, (55,)) == (10, 55)
  assert ts.forced_prefix(DOMAIN, tr, 1, (55, 56)) == (55, 56)


def test_strength_at_or_below_lambda_is_never_a_violation(items):
  # a domain whose interventions all have strength exactly λ (and one below): S = 1
  # everywhere (the ignoring oracle), yet no row may count as a violation
  class Weak(tw.ChainDomain):
    def edit(self, item, trace, k, tau):
      e = super().edit(item, trace, k, tau)
      return e if isinstance(e, ts.Undefined) else ts.Edit(e.block, ts.LAMBDA if k == 1 else 0.2)

  d = Weak(CFG)
  rows = ts.run_traces(tw.ignoring_oracle(d, items), d, items)
  e = _edits(rows)
  assert e and all(r['S'] == 1.0 and r['violation'] == 0.0 for r in e)
  assert tsum.summarize(rows)['all']['rho']['value'] == 0.0
  rows = ts.run_traces(tw.ignoring_oracle(d, items), d, items, lam=0.1)
  assert tsum.summarize(rows)['all']['rho']['value'] == 1.0


def test_unknown_strength_is_reported_separately(items):
  class Unknown(tw.ChainDomain):
    def edit(self, item, trace, k, tau):
      e = super().edit(item, trace, k, tau)
      if not isinstance(e, ts.Undefined) and tau == ts.PREMISE_NEGATION:
        return ts.Edit(e.block, None)
      return e

  d = Unknown(CFG)
  rows = ts.run_traces(tw.ignoring_oracle(d, items), d, items)
  s = tsum.summarize(rows)
  pn = s['by_tau'][ts.PREMISE_NEGATION]
  assert pn['rho']['n'] == 0 and pn['n_unknown_strength'] == pn['n'] > 0
  assert pn['same_unknown']['value'] == 1.0
  assert pn['strength_unknown'] == {ts.NO_RECOMPUTATION: pn['n']}
  assert s['by_tau'][ts.FACT_REVERSAL]['rho']['value'] == 1.0


# ------------------------------------------------------------ acceptance 5: bad input
def test_unparseable_outputs_are_counted_never_dropped(items):
  v = CFG.vocab
  bad = {x.id for x in items[::3]}

  def plain(x):  # every third item answers without a trace
    return (x.value,) if x.id in bad else x.target + (v.tok('[EOS]'),)

  def cont(x, forced):  # regenerations of item 1 lose their answer
    return (v.tok('NOTE'),) if x.id == items[1].id else x.target[len(forced):]

  rows = ts.run_traces(Scripted(items, plain, cont), DOMAIN, items)
  s = tsum.summarize(rows)
  assert s['n_parse_failure'] == len(bad)
  assert s['parse_failure_rate'] == pytest.approx(len(bad) / len(items))
  assert {r['id'] for r in rows if r['tau'] == 'parse_failure'} == bad
  assert not any(r['id'] in bad for r in rows if r['tau'] != 'parse_failure')
  lost = [r for r in rows if r['id'] == items[1].id and r['applied']]
  assert lost and all(not r['regen_parsed'] and r['S'] is None and r['phi'] is None
                      and r['violation'] is None and r['follows'] is None for r in lost)
  assert s['identity']['regen_parse_failure'] > 0


def test_bad_step_indices_name_the_item_and_positions_beyond_a_trace_are_counted(items):
  x = next(i for i in items if i.hops == 2)  # one step
  for k in (0, 1.0, True):   # caller bugs: raised, naming the item
    with pytest.raises(ts.StepIndexError, match=x.id):
      ts.run_traces(tw.following_oracle(DOMAIN, [x]), DOMAIN, [x], positions=(k,))
  # k = 2 > n = 1: the reader's trace is shorter (SPEC §8.2: undefined, counted by reason)
  rows = ts.run_traces(tw.following_oracle(DOMAIN, [x]), DOMAIN, [x], positions=(2,))
  assert rows and all(r['applied'] is False and r['undefined'] == 'beyond_trace'
                      and r['k'] == 2 for r in rows)
  assert {r['tau'] for r in rows} == {ts.IDENTITY} | set(DOMAIN.taus)
  tr = DOMAIN.parse(x.target)
  for k in (0, 2, 1.0):
    with pytest.raises(ts.StepIndexError, match=x.id):
      ts.intervene(DOMAIN, x, tr, k, ts.FACT_REVERSAL)


def test_bad_arguments_are_named(items):
  r = tw.following_oracle(DOMAIN, items)
  with pytest.raises(ValueError, match='taus'):
    ts.run_traces(r, DOMAIN, items, taus=('flip',))
  with pytest.raises(ValueError, match='tau_sim'):
    ts.run_traces(r, DOMAIN, items, tau_sim=2.0)
  with pytest.raises(ValueError, match='lam'):
    ts.run_traces(r, DOMAIN, items, lam=-1)
  with pytest.raises(ValueError, match='positions'):
    ts.run_traces(r, DOMAIN, items, positions=(1, 1))
  assert ts.run_traces(r, DOMAIN, []) == []


def test_breakdowns_and_table(items):
  rows = ts.run_traces(tw.mixture_oracle(DOMAIN, items, 0.5), DOMAIN, items)
  s = tsum.summarize(rows)
  e = _edits(rows)
  for key in ts.BREAKDOWNS:
    assert sum(c['n'] for c in s[f'by_{key}'].values()) == len(e)
  for L, c in s['by_trace_len'].items():  # reference: a loop over rows
    xs = [r['phi'] for r in e if str(r['trace_len']) == L]
    assert c['phi']['value'] == pytest.approx(np.mean(xs), abs=1e-12)
  assert set(s['by_trace_len']) == {'1', '2', '3'}
  t = tsum.table(s)
  assert 'fact_reversal' in t and 'identity' in t and 'logic_flip' not in t


def test_ci_resamples_items_not_rows():
  # reference: a Python loop over 1000 resamples of items with the same index draws
  its = tw.make_items(CFG, 50, seed=2)
  rows = ts.run_traces(tw.mixture_oracle(DOMAIN, its, 0.5, 1), DOMAIN, its)
  e = _edits(rows)
  c = tsum.cell(e, seed=7)
  ids = list(dict.fromkeys(r['id'] for r in e))
  s = np.array([sum(r['phi'] for r in e if r['id'] == i) for i in ids])
  n = np.array([sum(1 for r in e if r['id'] == i) for i in ids])
  rng = np.random.default_rng(7)
  idx = rng.integers(0, len(ids), size=(1000, len(ids)))
  stats = np.array([s[row].sum() / n[row].sum() for row in idx])
  lo, hi = np.quantile(stats, [0.025, 0.975])
  assert c['phi']['value'] == pytest.approx(np.mean([r['phi'] for r in e]), abs=1e-12)
  assert (c['phi']['ci_low'], c['phi']['ci_high']) == pytest.approx((lo, hi), abs=1e-12)
  assert c['phi']['n'] == len(e) and c['phi']['n_items'] == len(ids)
