"""Edge cases of the trace audit (SPEC §8.2, review 823): the τ_sim boundary, World A's
Strength and regeneration budget, positions beyond a trace, the identity prefix."""
import dataclasses
from fractions import Fraction

import pytest

from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import text as tt
from ceu_jax.readers import base


def _fact_violation(orig: str, alt: str) -> dict:
  """The FactReversal row of one factual item whose reader answers `orig`, then `alt`
  after the edit (Strength 1: the quote now names the swap entity)."""
  item = tt.FactItem('nq:x', 'Who?', orig, f'P {orig}.', orig, 'Zed')

  class R(base.Reader):
    def _generate(self, prompts, forced, budget, stops, ids):
      t = (f' The passage says: "{orig}"\nAnswer: {orig}' if forced is None
           else f'Answer: {alt}')
      return [base.Generation(i, t, (), base.STOP_STRING, '\n\n') for i in ids]

    def _loglik(self, *a):
      raise NotImplementedError

  return ts.run_traces(R(), tt.FactualDomain([]), [item], taus=(ts.FACT_REVERSAL,))[-1]


@pytest.mark.parametrize('orig,alt', [
    ('red green', 'red green blue'),                       # P 2/3, R 1
    ('t1 t2 t3 t4 t5', 't1 t2 t3 t4 u5'),                  # P 4/5, R 4/5
    ('t1 t2 t3 t4 t5 t6 u7 u8', 't1 t2 t3 t4 t5 t6 v7'),   # P 6/7, R 6/8
])
def test_token_f1_of_exactly_four_fifths_is_at_tau_sim(orig, alt):
  # SPEC §8.2 offline: S is exact match and token F1 ≥ τ_sim; F1 = 4/5 = τ_sim in all three,
  # whatever the float rounding of 2PR / (P + R)
  r = _fact_violation(orig, alt)
  assert r['strength'] == 1.0 and r['S'] == 0.8
  assert r['same'] is True and r['violation'] == 1.0
  assert tt.exact_similarity(orig, alt) == Fraction(4, 5)
  assert ts.at_least(Fraction(4, 5), 0.8) and not ts.at_least(Fraction(79, 100), 0.8)


# ---------------------------------------------------------------- World A: Strength
from ceu_jax.audits.traces import chain_world as tw  # noqa: E402

CFG = tw.ChainConfig()
CHAIN = tw.ChainDomain(CFG)


def _three_hop():
  return next(i for i in tw.make_items(CFG, 200, seed=1) if i.hops == 3)


def test_chain_trace_longer_than_its_bridges_has_unknown_strength():
  x = _three_hop()   # 2 bridges; the reader wrote 3 steps
  tr = CHAIN.parse(x.chain[1:] + (x.chain[1],) + (x.value,))
  assert tr.n == 3 and tw.follow(x, tr.steps) is None
  for tau in (ts.FACT_REVERSAL, ts.PREMISE_NEGATION):
    e, _ = ts.intervene(CHAIN, x, tr, 1, tau)
    assert e.strength is None and e.unknown_reason == 'unaligned_step', tau
  # counted by reason in the rows: never a violation
  class Long(base.Reader):
    def _generate(self, prompts, forced, budget, stops, ids):
      toks = (x.chain[1:] + (x.chain[1], x.value, CHAIN.eos) if forced is None
              else (x.value, CHAIN.eos))
      return [base.Generation(i, '', toks, base.STOP_TOKEN, CHAIN.eos) for i in ids]

    def _loglik(self, *a):
      raise NotImplementedError

  rows = [r for r in ts.run_traces(Long(), CHAIN, [x], positions=(1,))
          if r.get('applied') and r['tau'] != ts.IDENTITY]
  assert rows and all(r['strength_unknown'] == 'unaligned_step' and r['violation'] is None
                      and r['implied_trace'] is None
                      for r in rows)


def test_chain_strength_compares_prefixes_of_the_same_extent():
  x = _three_hop()   # the reader's own step 2 is unbound: the whole trace resolves nowhere
  tr = CHAIN.parse((x.chain[1], x.unbound[1], x.value))
  assert tw.follow(x, tr.steps) is None and tw.follow(x, tr.steps[:1]) == x.value
  e, _ = ts.intervene(CHAIN, x, tr, 1, ts.PREMISE_NEGATION)
  # negating step 1 moves the kept prefix's implied answer from v to unresolvable
  assert e.implied_before == x.value and e.implied_after is None and e.strength == 1.0


# ---------------------------------------------------------------- World A: regeneration budget
class _Extra(base.Reader):
  """Gold traces; after an edit of the 2-hop item `x`, `n_extra` bridge-like ids then the
  value; after any other edit, a trace-following continuation. Honours budget and [EOS]."""

  def __init__(self, x, items, n_extra=2):
    self.x, self.items = x, {CHAIN.prompt(i): i for i in items}
    self.n_extra, self.budgets = n_extra, {}

  def _generate(self, prompts, forced, budget, stops, ids):
    out = []
    for j, (p, i) in enumerate(zip(prompts, ids)):
      item = self.items[p]
      if forced is None:
        toks = item.target + (CHAIN.eos,)
      elif item is self.x:
        toks = (item.chain[1],) * self.n_extra + (item.value, CHAIN.eos)
      else:
        toks = CHAIN.complete(item, list(forced[j]))
      if forced is not None:
        self.budgets[i] = budget
      out.append(tw.TraceOracle._generation(self, i, toks, budget, stops))
    return out

  def _loglik(self, *a):
    raise NotImplementedError


def test_a_regeneration_budget_is_its_own_not_its_chunk_mates():
  items = tw.make_items(CFG, 60, seed=3)
  x = next(i for i in items if i.hops == 2)
  y = next(i for i in items if i.hops == 4)
  alone_reader, mixed_reader = _Extra(x, [x]), _Extra(x, [x, y])
  alone = ts.run_traces(alone_reader, CHAIN, [x], taus=(ts.FACT_REVERSAL,), positions=(1,))
  mixed = ts.run_traces(mixed_reader, CHAIN, [x, y], taus=(ts.FACT_REVERSAL,), positions=(1,))
  assert [r for r in mixed if r['id'] == x.id] == alone
  key = (x.id, 1, ts.FACT_REVERSAL)
  # the original's budget (the longest chain's 3 bridges, the value, [EOS]), not the
  # original's remaining length (2: the value, [EOS]) nor a chunk-mate's
  assert CHAIN.max_new_tokens == 5
  assert alone_reader.budgets[key] == mixed_reader.budgets[key] == 5
  # SPEC §8.2: the number of regenerated steps may change; two extra steps fit and are scored
  r, = alone
  assert r['regen_parsed'] is True and r['regen_failure'] is None
  assert r['answer_after'] == [x.value] and r['S'] == 1.0 and r['violation'] == 1
  assert all(r['regen_parsed'] for r in mixed if r['id'] == y.id)


def test_a_regeneration_past_its_budget_is_cut_and_never_scored():
  items = tw.make_items(CFG, 60, seed=3)
  x = next(i for i in items if i.hops == 2)
  reader = _Extra(x, [x], n_extra=5)           # 5 ids, the value, [EOS]: 7 tokens > 5
  r, = ts.run_traces(reader, CHAIN, [x], taus=(ts.FACT_REVERSAL,), positions=(1,))
  assert r['regen_parsed'] is False and r['regen_failure'] == 'cut_by_budget'  # not 'no_answer'
  assert r['S'] is None and r['violation'] is None


def test_a_regeneration_budget_is_capped_by_the_answer_slots_left():
  tight = tw.ChainDomain(dataclasses.replace(CFG, answer_slots=CFG.target_len))
  trace = ts.ParsedTrace(steps=(1, 2, 3), answer=4, raw=(1, 2, 3, 4), starts=(0, 1, 2))
  assert tight.budget(trace, 3, (9,)) == CFG.target_len - 3   # 5 slots, 3 forced
  assert CHAIN.budget(trace, 3, (9,)) == CHAIN.max_new_tokens  # 10 slots: room for 5


def test_gold_targets_fit_the_chain_budgets():
  oracle_items = tw.make_items(CFG, 60, seed=3)
  rows = ts.run_traces(tw.following_oracle(CHAIN, oracle_items), CHAIN, oracle_items)
  assert rows and all(r['tau'] != 'parse_failure' for r in rows)
  assert all(r['regen_parsed'] for r in rows if r.get('applied'))


# ---------------------------------------------------------------- positions beyond a trace
def test_positions_beyond_a_trace_are_counted_not_raised():
  from ceu_jax.audits.traces import summary as tsum
  items = tw.make_items(CFG, 40, seed=3)
  short = {x.id for x in items if x.hops == 2}   # one step: k = 2 lies beyond its trace
  assert short and any(x.hops > 2 for x in items)
  rows = ts.run_traces(tw.following_oracle(CHAIN, items), CHAIN, items, positions=(1, 2))
  beyond = [r for r in rows if r.get('undefined') == 'beyond_trace']
  assert {r['id'] for r in beyond} == short and all(r['k'] == 2 for r in beyond)
  assert all(r['applied'] for r in rows if r['id'] in short and r['k'] == 1
             and r['tau'] in (ts.IDENTITY, ts.FACT_REVERSAL))
  s = tsum.summarize(rows)
  for t in CHAIN.taus:
    assert s['undefined']['chain'][t]['beyond_trace'] + s['undefined'].get(
        'chain_prior', {}).get(t, {}).get('beyond_trace', 0) == len(short)
  assert 'beyond_trace' in tsum.table(s)


# ---------------------------------------------------------------- identity: the reader's own bytes
def test_identity_forces_the_readers_own_raw_text_through_step_k():
  from ceu_jax.audits.traces import arithmetic as ar
  dom = ar.ArithmeticDomain([])
  x = ar.ArithItem('t:0', 'q', 5, (('+', 3), ('*', 2)), 1)
  raw = 'Step 1:  5 + 3 = 8 \nStep 2: 8 * 2 = 16  \nAnswer: 16'   # not the canonical rendering
  tr = tt.parse_text(raw)
  _, forced1 = ts.intervene(dom, x, tr, 1, ts.IDENTITY)
  _, forced2 = ts.intervene(dom, x, tr, 2, ts.IDENTITY)
  assert forced1 == 'Step 1:  5 + 3 = 8 \n'
  assert forced2 == 'Step 1:  5 + 3 = 8 \nStep 2: 8 * 2 = 16  \n'

  class Echo(base.Reader):
    """Writes `raw`; after a forced prefix, the rest of `raw` when the prefix is its own
    bytes (a greedy reader given its own output), something else otherwise."""
    def _generate(self, prompts, forced, budget, stops, ids):
      out = []
      for j, i in enumerate(ids):
        pre = dom.primer + ('' if forced is None else ''.join(forced[j]))
        t = raw[len(pre):] if raw.startswith(pre) else ' 1 + 1 = 2\nAnswer: 2'
        out.append(base.Generation(i, t, (), base.END))
      return out

    def _loglik(self, *a):
      raise NotImplementedError

  rows = ts.run_traces(Echo(), dom, [x], taus=(ts.IDENTITY,))
  assert [r['k'] for r in rows] == [1, 2]
  assert all(r['identical'] is True and r['phi'] == 0.0 for r in rows)


# ---------------------------------------------------------------- competence rates carry CIs
def test_competence_rates_carry_bootstrap_cis_and_n():
  import numpy as np
  from configs import smollm2_traces
  from ceu_jax.audits.traces import arithmetic as ar
  from ceu_jax.audits.traces import competence as comp
  from ceu_jax.audits.traces.job import competence_table
  from ceu_jax.metrics.resampling import mean_ci
  cfg = smollm2_traces.get_config('tiny')
  items = [ar.make_arith_item(7, i) for i in range(12)]
  dom = ar.ArithmeticDomain([ar.make_arith_item(99, 0)])
  follows = {x.id: i % 3 != 0 for i, x in enumerate(items)}   # 8 of 12 follow their trace
  out = comp.measure(tw.TraceOracle(dom, items, lambda x: follows[x.id]), cfg, dom, items)
  k = out['corrupted']
  assert out['cis']['accuracy'] == mean_ci(np.ones(12), seed=42).to_dict()
  assert out['cis']['accuracy']['n'] == 12 and k['cis']['follow']['n'] == k['n_parsed'] > 0
  assert k['cis']['follow']['value'] == pytest.approx(k['follow'])
  assert k['cis']['follow']['ci_low'] < k['follow'] < k['cis']['follow']['ci_high']
  out.update(min_accuracy=0.5, min_parse_rate=0.5, competent=True)
  row = competence_table({'r': out}).splitlines()[2]
  assert '1.000 [1.000, 1.000] (n=12) (≥ 0.5)' in row
  f = k['cis']['follow']
  assert f"{f['value']:.3f} [{f['ci_low']:.3f}, {f['ci_high']:.3f}] (n={f['n']})" in row
  assert 'n=' in comp.fmt_competence('r', out)
  # a check computed before CIs were kept prints its point values, marked
  old = {key: v for key, v in out.items() if key != 'cis'}
  assert '1.000 (no CI) (≥ 0.5)' in competence_table({'r': old})
