"""The chained-ATR training task (ceu_jax.data.chain, data.task = 'atr_chain') and its §8.4 probe inputs."""
import jax
import numpy as np
import pytest

from ceu_jax.audits.traces import probe as trace_probe
from ceu_jax.audits.traces import chain_world as tw
from ceu_jax.data import chain, tasks
from ceu_jax.data.types import LineKind
from configs import trace_sensitivity as tsc

CFG = chain.ChainConfig.from_config(tsc.data_section())  # the audited world (prior share 0.5)


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def _table(context, vocab):
  """Reference: the (id, key) -> object table read back off context tokens."""
  out = {}
  for p in range(0, len(context), chain.LINE_LEN):
    ln = context[p:p + chain.LINE_LEN]
    assert ln[0] == vocab.tok('ID') and ln[2] == vocab.tok('KEY') and ln[6] == vocab.tok('.')
    out[(ln[1], ln[3])] = ln[5]
  return out


def _walk(table, start, keys):
  cur = start
  for k in keys:
    cur = table.get((cur, k))
    if cur is None:
      return None
  return cur


def test_registered_and_shapes():
  spec = tasks.get('atr_chain')
  cfg = spec.config_cls.from_config(tsc.data_section())
  b = spec.generate_batch(cfg, 3, 5, 16, 'train')
  assert b.query.shape == (16, cfg.query_len) and b.context.shape == (16, cfg.context_len)
  assert b.answer.shape == (16, cfg.answer_len) == (16, 2 * (max(cfg.hops) + 1))
  assert b.line_kind.shape == (16, cfg.n_lines)
  again = spec.generate_batch(cfg, 3, 5, 16, 'train')
  assert (np.asarray(again.context) == np.asarray(b.context)).all()
  other = spec.generate_batch(cfg, 3, 5, 16, 'test')
  assert not (np.asarray(other.context) == np.asarray(b.context)).all()
  # memory-port layout: passage j holds positions [j N/P, (j+1) N/P)
  plen = cfg.context_len // cfg.num_passages
  assert (np.asarray(b.passage_ids)[0] == np.arange(cfg.context_len) // plen).all()


def test_answer_is_trace_value_eos_and_masks_mark_the_gold_chain():
  v = CFG.vocab
  items = chain.make_items(CFG, 64, seed=4)
  b = chain.to_batch(CFG, items, np.arange(64))
  ans, ctx = np.asarray(b.answer), np.asarray(b.context)
  ev, val = np.asarray(b.evidence_mask), np.asarray(b.value_mask)
  for i, x in enumerate(items):
    h = x.hops
    assert tuple(ans[i, :h + 1]) == x.chain[1:] + (x.value, v.tok('[EOS]'))
    assert (ans[i, h + 1:] == v.pad).all()
    assert ev[i].sum() == h * chain.LINE_LEN  # the h lines of the gold chain
    table = _table(list(ctx[i]), v)
    lines = {tuple(ctx[i, p:p + 7]) for p in range(0, CFG.context_len, 7) if ev[i, p]}
    want = {(v.tok('ID'), x.chain[j], v.tok('KEY'), x.keys[j], v.tok('IS'), x.chain[j + 1], v.tok('.'))
            for j in range(h - 1)}
    want.add((v.tok('ID'), x.chain[-1], v.tok('KEY'), x.keys[-1], v.tok('VALUE'), x.value, v.tok('.')))
    assert lines == want
    assert val[i].sum() == 1 and ctx[i][val[i]][0] == x.value
    assert _walk(table, x.chain[0], x.keys) == x.value


def test_value_swap_changes_only_the_terminal_value():
  b = chain.generate_batch(CFG, 0, 0, 32, 'eval')
  m = chain.corrupt(CFG, b, 'value_swap', jax.random.PRNGKey(1))
  diff = np.asarray(m.context) != np.asarray(b.context)
  assert (diff == np.asarray(b.value_mask)).all() and diff.sum() == 32
  assert (np.asarray(m.answer) == np.asarray(b.answer)).all()
  with pytest.raises(ValueError, match='corruption'):
    chain.corrupt(CFG, b, 'removal', jax.random.PRNGKey(1))


def test_prior_fixes_the_value_of_its_pairs_and_keeps_edits_resolvable():
  v = CFG.vocab
  fixed, table = chain.prior_table(CFG)
  items = chain.make_items(CFG, 400, seed=9)
  share = np.mean([x.prior for x in items])
  assert 0.4 < share < 0.6
  dom = tw.ChainDomain(CFG)
  for x in items:
    a, k = x.chain[0] - v.id_base, x.keys[-1] - v.key_base
    assert x.prior == bool(fixed[a, k])
    if x.prior:
      assert x.value == v.value_base + table[a, k]
    assert dom.group(x) == ('chain_prior' if x.prior else 'chain')
    tr = dom.parse(x.target)
    for k in range(1, x.hops):  # every FactReversal still changes the implied answer
      e = dom.edit(x, tr, k, 'fact_reversal')
      assert e.implied_after is not None and e.implied_after != x.value and e.strength == 1.0
  # no prior: the audit stream of the plain world is unchanged by the prior machinery
  plain = chain.ChainConfig.from_config(tsc.data_section(0.0))
  assert not any(x.prior for x in chain.make_items(plain, 50))


def test_rebind_first_hop_changes_the_gold_trace_not_the_forced_one():
  v = CFG.vocab
  for x in chain.make_items(CFG, 100, seed=2):
    new = trace_probe.rebind_first_hop(x)
    assert sum(a != b for a, b in zip(new, x.context)) == 1
    table = _table(list(new), v)
    assert _walk(table, x.chain[0], x.keys) != x.value            # gold path now elsewhere
    assert _walk(table, x.chain[1], x.keys[1:]) == x.value        # the forced trace still gives v


def test_bad_config_is_named():
  with pytest.raises(ValueError, match='num_passages'):
    chain.ChainConfig(num_passages=3)
  with pytest.raises(ValueError, match='prior_share'):
    chain.ChainConfig(prior_share=1.5)
  with pytest.raises(ValueError, match='answer_slots'):
    chain.ChainConfig(answer_slots=3)
  with pytest.raises(ValueError, match='unknown field'):
    chain.ChainConfig.from_config(dict(tsc.data_section(), n_hops=3))


def test_answer_probe_on_a_bypass_model_marks_the_answer_position():
  """With the bypass channel the reader's sequence is [context; query; answer]: the probe's
  position mask must still sit on the value slot (an untrained model: shapes and ΔL only)."""
  import architectures
  from ceu_jax.retrieval_adapter import loglik_fn_for
  cfg = chain.ChainConfig.from_config(tsc.data_section())
  tc = tsc.train_config('attention', 'bypass', True)
  model = architectures.build_model(tc.model, vocab_size=cfg.vocab.size,
                                    context_len=cfg.context_len, num_passages=cfg.num_passages,
                                    query_len=cfg.query_len, answer_len=cfg.answer_len)
  assert model.spec.reader_len == cfg.context_len + cfg.query_len + cfg.answer_len
  items = [x for x in chain.make_items(cfg, 12, seed=5) if x.hops == 2][:3]
  plus = trace_probe._inputs(cfg, items, [x.context for x in items])
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), *(np.asarray(a) for a in (
      plus.query, plus.context, plus.passage_ids, plus.answer)))    # one program, not op by op
  out = trace_probe.answer_probe(model, variables, architectures.read_port_site(tc.model), cfg,
                                 items, eps=1e-9)
  want = trace_probe._inputs(cfg, items, [trace_probe.rebind_first_hop(x) for x in items])
  slot = jax.jit(trace_probe.position_probe.slot_loglik_fn(model, [1]))
  ref = np.asarray(slot(variables, plus)) - np.asarray(slot(variables, want))
  np.testing.assert_allclose(out['by_hops']['2']['delta_L']['value'], ref.mean(), rtol=1e-5,
                             atol=1e-6)
