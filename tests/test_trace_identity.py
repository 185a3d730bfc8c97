"""Identity φ = 0 exactly on SmolLM2 (issue #32, SPEC §8.2): forcing the reader's own step k
and regenerating greedily reproduces its output byte for byte.

The 0.002 of the earlier 150-item run came from 3 of its 581 identity regenerations, all of
outputs the token budget had cut mid-answer (e.g. "Answer: 22 September"): scored as
answers, and regenerated with a fresh budget that let them run on ("… 1939 -- 20 October
2016"). An output cut by the budget is now a parse failure (`cut_by_budget`), original or
regenerated. The kept prefix goes back to the reader as its own tokens
(`Reader.prefix_tokens`), never re-tokenised from its text (12 of 150 factual outputs were
not the canonical tokenisation of their own text).
"""
import pytest

from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import chain_world as tw
from ceu_jax.audits.traces import summary as tsum
from ceu_jax.audits.traces import text as tt
from ceu_jax.audits.traces.arithmetic import ArithmeticDomain, make_arith_item
from ceu_jax.readers import base

pytest.importorskip('tokenizers')
pytest.importorskip('gguf')


class Recording(base.Reader):
  """Wraps a reader; records the forced prefixes it is given (by call id)."""

  def __init__(self, inner):
    self.inner, self.forced = inner, {}

  def prefix_tokens(self, generation, n_chars):
    return self.inner.prefix_tokens(generation, n_chars)

  def _generate(self, prompts, forced, budget, stops, ids):
    if forced is not None:
      self.forced.update(zip(ids, forced))
    return self.inner._generate(prompts, forced, budget, stops, ids)

  def _loglik(self, prompts, answers, ids):
    raise NotImplementedError


def test_prefix_tokens_and_mixed_forced_prefixes():
  from ceu_jax.readers import SmolLM2Reader
  reader = SmolLM2Reader.from_pretrained(n_layers=2)
  prompt = 'Question: Tom has 5 apples. How many apples does Tom have?\nStep 1:'
  g, = reader.generate([prompt], max_new_tokens=12)
  toks = list(g.tokens)
  assert reader.decode(toks) == g.text and len(toks) == 12
  for j in range(len(toks) + 1):  # every token boundary: the first cut with that text
    n = len(reader.decode(toks[:j]))
    got = reader.prefix_tokens(g, n)
    assert reader.decode(got) == g.text[:n] and len(got) <= j
  lengths = {len(reader.decode(toks[:j])) for j in range(len(toks) + 1)}
  inside = [n for n in range(len(g.text)) if n not in lengths]
  for n in inside:  # no token boundary there
    assert reader.prefix_tokens(g, n) is None
  assert reader.prefix_tokens(g, -1) is None and reader.prefix_tokens(g, len(g.text) + 1) is None
  mixed = toks[:3] + [' and 7 more', '\n']
  ids = toks[:3] + reader.tokenizer.encode(' and 7 more').ids + reader.tokenizer.encode('\n').ids
  assert reader._ids(mixed) == ids
  a, = reader.continue_from([prompt], [mixed], max_new_tokens=4)
  b, = reader.continue_from([prompt], [ids], max_new_tokens=4)
  assert a.tokens == b.tokens


def test_an_output_cut_by_the_budget_is_a_parse_failure():
  dom = ArithmeticDomain([make_arith_item(99, 0)])
  items = [make_arith_item(0, i) for i in range(6)]

  class Cut(tw.TraceOracle):  # item 0's output is cut; every regeneration of item 1 too
    def _generate(self, prompts, forced, budget, stops, ids):
      out = super()._generate(prompts, forced, budget, stops, ids)
      first = ids[0] if forced is None else None
      return [base.Generation(g.id, g.text, g.tokens, base.LENGTH, None)
              if (forced is None and g.id == first) or (forced is not None and g.id[0] == items[1].id)
              else g for g in out]

  rows = ts.run_traces(Cut(dom, items, lambda x: True), dom, items)
  s = tsum.summarize(rows)
  assert s['n_parse_failure'] == 1 and s['parse_failure_reasons'] == {'cut_by_budget': 1}
  lost = [r for r in rows if r['id'] == items[1].id and r['applied']]
  assert lost and all(r['regen_failure'] == 'cut_by_budget' and r['phi'] is None for r in lost)
  assert s['identity']['regen_failure'] == {'cut_by_budget': sum(
      r['tau'] == ts.IDENTITY for r in lost)}


def _identity_rows(reader, world, positions=None):
  rows = []
  for name, dom in world.domains.items():
    rows += ts.run_traces(reader, dom, world.items[name], taus=(ts.IDENTITY,),
                          positions=positions)
  return rows


def test_smollm2_identity_regenerates_byte_identical_outputs():
  """The whole model (30 layers): 2 arithmetic items at every step and 1 factual item;
  each identity regeneration is the original output, byte for byte, and the reader was
  given its own tokens through step k."""
  from configs import trace_sensitivity as cfgs
  from ceu_jax.audits.traces.smollm2_world import SmolLM2World
  c = cfgs.get_config('tiny,world=smollm2,n_items=2')
  w = SmolLM2World(c)
  w.items['factual'] = w.items['factual'][:1]
  reader = Recording(w.reader('smollm2'))
  rows = _identity_rows(reader, w)
  ident = [r for r in rows if r['tau'] == ts.IDENTITY]
  assert len(ident) >= 5 and {r['domain'] for r in ident} == {'arithmetic', 'factual'}
  for r in ident:
    assert r['identical'] is True, (r['id'], r['k'], r['forced'], r['continuation'])
    assert r['regen_parsed'] and r['phi'] == 0.0 and r['answer_after'] == r['answer']
    given = reader.forced[(r['id'], r['k'], ts.IDENTITY)]
    assert isinstance(given, list) and all(isinstance(t, int) for t in given)  # own tokens
    assert reader.inner.decode(given) == r['forced'][len(tt.TextDomain.primer):]
  s = tsum.summarize(rows)
  assert s['identity']['phi']['value'] == 0.0 and s['identity']['n_identical'] == len(ident)
