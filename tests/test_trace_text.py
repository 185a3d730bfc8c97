"""World B of the trace audit: text traces (parse, edits, recomputation) with exact oracles,
and the tiny SmolLM2 run end to end (issue #17)."""
import json
import os

import pytest

from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.audits.traces import job as trace_job
from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import summary as tsum
from ceu_jax.audits.traces import text as tt
from ceu_jax.audits.traces import chain_world as tw
from ceu_jax.audits.traces.smollm2_world import SmolLM2World
from configs import trace_sensitivity as cfgs

ARITH = ar.ArithmeticDomain([ar.make_arith_item(99, i) for i in range(2)])
ITEMS = [ar.make_arith_item(0, i) for i in range(40)]


class Recording(tw.TraceOracle):
  """A following oracle that records the forced prefixes it is given."""

  def __init__(self, domain, items):
    super().__init__(domain, items, lambda item: True)
    self.forced = {}

  def _generate(self, prompts, forced, budget, stops, ids):
    if forced is not None:
      self.forced.update(zip(ids, forced))
    return super()._generate(prompts, forced, budget, stops, ids)


def _reference_answer(start, ops):
  cur = start
  for op, n in ops:
    cur = cur + n if op == '+' else cur - n if op == '-' else cur * n
  return cur


def test_arith_items_and_recomputation():
  assert {len(x.ops) for x in ITEMS} == {2, 3, 4}
  for x in ITEMS:
    assert x.answer == str(_reference_answer(x.start, x.ops))
    assert ar.implied(x, x.steps).answer == int(x.answer)
    tr = tt.parse_text(tt.render(1, x.steps) + f'Answer: {x.answer}')
    assert tr.steps == x.steps and tr.answer == x.answer
    for k in range(1, len(x.steps) + 1):
      e, _ = ts.intervene(ARITH, x, tr, k, ts.FACT_REVERSAL)
      p = ar.parse_step(e.block[0])
      assert p.r == x.results[k - 1] + x.delta
      assert e.implied_after == str(_reference_answer(p.r, x.ops[k:])) != x.answer
      e, _ = ts.intervene(ARITH, x, tr, k, ts.LOGIC_FLIP)
      p2 = ar.parse_step(e.block[0])
      (op2, n2), = p2.ops
      assert op2 == ar.FLIP[x.ops[k - 1][0]] and p2.r == ar.OPS[op2](p2.a, n2)
      ref = ar.implied(x, list(x.steps[:k - 1]) + [e.block[0]])
      if ref.answer is not None:  # a flip onto another operation's operator may be ambiguous
        assert e.implied_after == str(ref.answer)
        assert e.strength == float(e.implied_after != x.answer)
      assert ts.intervene(ARITH, x, tr, k, ts.PREMISE_NEGATION) == ts.Undefined('not_in_domain')


def test_parse_text():
  ok = 'Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14\nAnswer: 14'
  tr = tt.parse_text(ok)
  assert tr.steps == ('3 + 4 = 7', '7 * 2 = 14') and tr.answer == '14'
  assert tr.starts == (0, ok.index('Step 2'))
  assert tt.parse_text('Answer: 14') is None  # no step
  assert tt.parse_text('Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14') is None  # no answer
  assert tt.parse_text('Step 2: 3 + 4 = 7\nAnswer: 7') is None  # numbering must start at 1
  assert tt.parse_text('Step 1: 3 + 4 = 7\nthen more\nAnswer: 7') is None  # stray line


def test_text_oracles_and_byte_identical_prefix():
  rec = Recording(ARITH, ITEMS)
  rows = ts.run_traces(rec, ARITH, ITEMS)
  s = tsum.summarize(rows)
  assert s['identity']['phi']['value'] == 0.0 and s['all']['rho']['value'] == 0.0
  edits = [r for r in rows if r['tau'] != ts.IDENTITY and r['applied']]
  known = [r for r in edits if r['strength'] is not None]
  assert known and all(r['phi'] == r['strength'] for r in known)  # moves iff implied moves
  assert sum(r['strength'] == 1.0 for r in edits if r['tau'] != ts.CAUSAL_INVERSION) > 0.9 * len(
      [r for r in edits if r['tau'] != ts.CAUSAL_INVERSION])
  rows = [r for r in rows if r['applied']]
  by_id = {x.id: x for x in ITEMS}
  for r in rows:
    x, k = by_id[r['id']], r['k']
    original = ARITH.primer + ARITH.complete(x, [])[len(ARITH.primer):]
    kept = original[:original.index(f'Step {k}:')]
    assert r['forced'].startswith(kept)  # the kept prefix, byte for byte
    assert rec.forced[(r['id'], k, r['tau'])] == r['forced'][len(ARITH.primer):]
    nblock = 2 if r['tau'] == ts.CAUSAL_INVERSION else 1
    assert r['forced'].count('Step ') == k - 1 + nblock
    assert r['continuation'].startswith(f'Step {k + nblock}:') or r['continuation'].startswith('Answer:')
  rows = ts.run_traces(tw.ignoring_oracle(ARITH, ITEMS), ARITH, ITEMS)
  s = tsum.summarize(rows)
  assert s['all']['phi']['value'] == 0.0
  known = [r for r in rows if r['tau'] != ts.IDENTITY and r['applied'] and r['strength'] is not None]
  assert s['all']['rho']['value'] == pytest.approx(sum(r['strength'] for r in known) / len(known))


def test_factual_edits():
  shots = tt.select_fact_items(2, seed=1, split='train', max_passage_words=40)
  dom = tt.FactualDomain(shots)
  items = tt.select_fact_items(20, seed=0)
  for x in items:
    assert x.answer.lower() in x.evidence.lower() and x.evidence in x.passage
    assert x.id not in {s.id for s in shots}
  rows = ts.run_traces(tw.following_oracle(dom, items), dom, items)
  fr = [r for r in rows if r['tau'] == ts.FACT_REVERSAL]
  pn = [r for r in rows if r['tau'] == ts.PREMISE_NEGATION]
  assert len(fr) == len(pn) == 20
  assert all(r['strength'] == 1.0 and r['phi'] == 1.0 and r['implied_after'] == r['answer_after']
             and r['follows'] is True for r in fr)
  assert all(r['strength'] is None and r['violation'] is None and r['follows'] is None
             and r['strength_unknown'] == ts.NO_RECOMPUTATION for r in pn)
  assert all('does not say' in r['forced'] for r in pn)
  s = tsum.summarize(rows)
  assert s['by_tau'][ts.PREMISE_NEGATION]['n_unknown_strength'] == 20
  assert tt.negate('Paris is the capital') == 'Paris is not the capital'
  assert tt.negate('Dilip Kumar as Salim') == 'It is not true that dilip Kumar as Salim'


def test_tiny_smollm2(tmp_path):
  pytest.importorskip('tokenizers')
  pytest.importorskip('gguf')
  w = str(tmp_path / 'w')
  c = cfgs.get_config('tiny,world=smollm2')
  s = trace_job.run_trace_sensitivity(c, w, log=lambda m: None)
  r = s['readers']['smollm2']
  assert r['n_items'] == 2 and set(r['parse_failure_by_domain']) == {'arithmetic', 'factual'}
  n_rows = r['all']['n'] + r['identity']['n'] + r['n_parse_failure']
  assert n_rows >= 2
  assert all(k == '1' for k in r['by_k'])
  i = r['identity']  # forcing the reader's own step 1 regenerates its output byte for byte
  assert i['n'] >= 1 and i['n_identical'] == i['n'] and i['phi']['value'] == 0.0
  assert 'follow [95% CI] (n)' in open(os.path.join(w, 'report.md')).read()
  assert json.load(open(os.path.join(w, 'summary.json')))['readers'] == s['readers']
  assert 'no LLM judge' in open(os.path.join(w, 'report.md')).read()


def test_number_similarity_keeps_signs():
  assert ARITH.similarity('43', '-43') == 0.0 and ARITH.similarity('43.', '43') == 1.0
  assert ARITH.similarity('unknown', 'unknown') == 1.0
  assert tt.similarity('The Eiffel tower', 'eiffel tower') == 1.0


def test_smollm2_world_demonstrations_vary_in_length():
  c = cfgs.get_config('full,world=smollm2,n_items=3')
  with c.unlocked():
    c.smollm2.domains = ('arithmetic',)
    c.smollm2.n_shots = 3
  w = SmolLM2World(c)
  assert [len(s.ops) for s in w.domains['arithmetic'].shots] == [2, 3, 4]
  assert len(w.items['arithmetic']) == 3


def test_uneditable_steps_are_counted():
  x = ITEMS[0]
  raw = f'Step 1: I add things\nStep 2: {x.steps[1]}\nAnswer: {x.answer}'
  tr = tt.parse_text(raw)
  assert ts.intervene(ARITH, x, tr, 1, ts.FACT_REVERSAL) == ts.Undefined('step_not_an_equation')
  assert not isinstance(ts.intervene(ARITH, x, tr, 2, ts.FACT_REVERSAL), ts.Undefined)

  class Fixed(tw.TraceOracle):
    def _generate(self, prompts, forced, budget, stops, ids):
      if forced is None:
        return [tw.base.Generation(i, raw[len(ARITH.primer):], (), tw.base.END) for i in ids]
      return super()._generate(prompts, forced, budget, stops, ids)

  rows = ts.run_traces(Fixed(ARITH, [x], lambda item: True), ARITH, [x])
  un = [r for r in rows if r.get('applied') is False]
  assert {(r['k'], r['tau']) for r in un} == {(1, ts.LOGIC_FLIP), (1, ts.FACT_REVERSAL),
                                              (2, ts.CAUSAL_INVERSION)}
  s = tsum.summarize(rows)
  assert s['undefined'] == {'arithmetic': {ts.FACT_REVERSAL: {'step_not_an_equation': 1},
                                           ts.LOGIC_FLIP: {'step_not_an_equation': 1},
                                           ts.CAUSAL_INVERSION: {'last_step': 1}}}
  assert s['all']['n'] == len([r for r in rows if r.get('applied') and r['tau'] != ts.IDENTITY])
  assert 'step_not_an_equation 1' in tsum.table(s)
  # the unparsed step 1 leaves every Strength reaching it unknown, counted by reason
  assert s['all']['strength_unknown'] == {'step_not_an_equation': s['all']['n']}
