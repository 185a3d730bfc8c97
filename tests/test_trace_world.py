"""World A of the trace audit: generator invariants and the trace-following function."""
import pytest

from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import chain_world as tw

CFG = tw.ChainConfig()
DOMAIN = tw.ChainDomain(CFG)
ITEMS = tw.make_items(CFG, 200, seed=1)


def _lines(item):
  c = item.context
  return [c[i:i + tw.LINE_LEN] for i in range(0, len(c), tw.LINE_LEN)]


def _bindings_from_context(item):
  """Reference: the (id, key) -> object table read back off the context tokens."""
  v = CFG.vocab
  out = {}
  for ln in _lines(item):
    assert ln[0] == v.tok('ID') and ln[2] == v.tok('KEY') and ln[6] == v.tok('.')
    assert ln[4] in (v.tok('IS'), v.tok('VALUE'))
    assert (ln[1], ln[3]) not in out, 'an (id, key) pair is bound twice'
    out[(ln[1], ln[3])] = ln[5]
  return out


def _walk(item, start, keys):
  """Reference follower: a plain loop over the context table."""
  table = _bindings_from_context(item)
  cur = start
  for k in keys:
    if (cur, k) not in table:
      return None
    cur = table[(cur, k)]
  return cur


def test_shapes_and_hops():
  assert {x.hops for x in ITEMS} == set(tw.HOPS)
  for x in ITEMS:
    assert len(x.query) == CFG.query_len and len(x.context) == CFG.context_len
    assert len(x.target) == x.hops and len(x.target) + 1 <= CFG.answer_len
    assert len(set(x.keys)) == x.hops


def test_context_table_and_gold_chain():
  for x in ITEMS:
    assert _bindings_from_context(x) == x.bindings
    assert _walk(x, x.chain[0], x.keys) == x.value
    assert tw.follow(x, x.chain[1:]) == x.value == tw.follow(x, [])
    assert tw.resolve(x, []) == x.target


def test_every_fact_reversal_changes_the_implied_answer():
  n = 0
  for x in ITEMS:
    tr = DOMAIN.parse(x.target)
    for k in range(1, x.hops):
      e, forced = ts.intervene(DOMAIN, x, tr, k, ts.FACT_REVERSAL)
      ref = _walk(x, forced[-1], x.keys[k:])  # resolvable through the hard negatives
      assert ref is not None and ref != x.value
      assert e.implied_after == ref and e.implied_before == x.value and e.strength == 1.0
      n += 1
  assert n > 300


def test_premise_negation_binds_nowhere_and_causal_inversion_needs_three_hops():
  v = CFG.vocab
  for x in ITEMS:
    tr = DOMAIN.parse(x.target)
    context = set(x.context)
    for k in range(1, x.hops):
      e, _ = ts.intervene(DOMAIN, x, tr, k, ts.PREMISE_NEGATION)
      assert e.block[0] not in context and e.implied_after is None and e.strength == 1.0
      ci = ts.intervene(DOMAIN, x, tr, k, ts.CAUSAL_INVERSION)
      if x.hops < 3 or k == x.hops - 1:
        assert ci == ts.LAST_STEP
      else:
        assert ci[0].block == (x.chain[k + 1], x.chain[k]) and ci[0].strength == 1.0
      assert ts.intervene(DOMAIN, x, tr, k, ts.LOGIC_FLIP) == ts.Undefined('not_in_domain')
    assert v.tok('?') not in x.target


def test_items_are_seeded_and_order_independent():
  again = tw.make_item(CFG, 1, 17)
  assert again == ITEMS[17]
  assert tw.make_item(CFG, 2, 17) != ITEMS[17]


def test_parse():
  v = CFG.vocab
  x = ITEMS[0]
  eos = v.tok('[EOS]')
  assert DOMAIN.parse(x.target).steps == x.chain[1:]
  assert DOMAIN.parse(x.target[:-1]) is None  # no answer
  assert DOMAIN.parse((x.value,)) is None  # no step
  assert DOMAIN.parse(x.target + (eos,)) is None  # raw() strips the stop token first
  assert DOMAIN.parse(x.chain[1:] + (v.tok('?'),)).answer == (v.tok('?'),)


def test_bad_config_is_named():
  with pytest.raises(ValueError, match='hops'):
    tw.ChainConfig(hops=(5,))
  with pytest.raises(ValueError, match='n_lines'):
    tw.ChainConfig(n_lines=8)
  with pytest.raises(ValueError, match='n_ids'):
    tw.ChainConfig(n_ids=16)
  with pytest.raises(ValueError, match='n_items'):
    tw.make_items(CFG, 0)
