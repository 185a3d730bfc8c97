"""The Reader interface on the ATR models (every family) and the oracle readers (issue #15).

ATR readers: greedy decoding over the answer slots and continuation after a
forced answer prefix must equal the teacher-forced forward token for token;
loglik equals `scores.gold_loglik` of that forward. Randomly initialised
models suffice (the checks are identities, not accuracy).

Shape legend: B batch, Q query length, N context length, A answer length, V vocabulary.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

import architectures
from ceu_jax import likelihood as scores
from ceu_jax.readers import (ATRPrompt, ATRReader, ClosedBookOracle, CopyOracle, Generation,
                             PromptTooLongError, Reader, answers_from_batch, prompts_from_batch)

SIZES = dict(vocab_size=60, context_len=32, num_passages=4, query_len=5, answer_len=4)
B = 6


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def _inputs(seed=0, batch=B):
  r = np.random.RandomState(seed)
  q = r.randint(3, SIZES['vocab_size'], (batch, SIZES['query_len'])).astype(np.int32)
  c = r.randint(3, SIZES['vocab_size'], (batch, SIZES['context_len'])).astype(np.int32)
  pid = np.repeat(np.arange(SIZES['num_passages']),
                  SIZES['context_len'] // SIZES['num_passages'])
  pid = np.broadcast_to(pid, c.shape).astype(np.int32)
  a = r.randint(3, SIZES['vocab_size'], (batch, SIZES['answer_len'])).astype(np.int32)
  return q, c, pid, a


class _Batch:  # the fields of a RetrievalBatch a reader reads
  def __init__(self, q, c, pid, a):
    self.query, self.context, self.passage_ids, self.answer = q, c, pid, a


@pytest.fixture(scope='module', params=list(architectures.FAMILIES))
def atr(request):
  model = architectures.build_model(dict(family=request.param, preset='p100k'), **SIZES)
  params = architectures.init_params(model, jax.random.PRNGKey(0))
  # At init the tied embedding dominates (the model copies its previous token); noise
  # on every weight makes the greedy tokens depend on query, context and answer prefix.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  params = jax.tree.unflatten(tree, [x + jax.random.normal(k, x.shape)
                                     for x, k in zip(leaves, keys)])
  q, c, pid, a = _inputs()
  apply = jax.jit(model.apply)
  return ATRReader(model, params, batch_size=4), apply, params, _Batch(q, c, pid, a)


def test_atr_greedy_equals_teacher_forced_argmax(atr):
  reader, apply, params, b = atr
  prompts = prompts_from_batch(b)
  out = reader.generate(prompts, max_new_tokens=SIZES['answer_len'])
  gen = np.asarray([g.tokens for g in out])
  assert gen.shape == (B, SIZES['answer_len']) and all(g.stop_reason == 'length' for g in out)
  assert len(np.unique(gen)) > 4  # not a constant output
  tf = np.asarray(apply(params, b.query, b.context, b.passage_ids, gen)).argmax(-1)
  np.testing.assert_array_equal(tf, gen)
  short = reader.generate(prompts, max_new_tokens=2)
  np.testing.assert_array_equal([g.tokens for g in short], gen[:, :2])


def test_atr_continuation_equals_teacher_forcing(atr):
  reader, apply, params, b = atr
  prompts = prompts_from_batch(b)
  gold = answers_from_batch(b)
  tf_gold = np.asarray(apply(params, b.query, b.context, b.passage_ids, b.answer)).argmax(-1)
  ks = [0, 1, 2, 3, 1, 2]  # forced prefix lengths, mixed in one call
  out = reader.continue_from(prompts, [g[:k] for g, k in zip(gold, ks)], max_new_tokens=1)
  assert [g.tokens[0] for g in out] == [int(tf_gold[i, k]) for i, k in enumerate(ks)]
  # Longer continuations: teacher forcing prefix + continuation reproduces the continuation.
  ks = [0, 1, 2, 2, 1, 0]
  out = reader.continue_from(prompts, [g[:k] for g, k in zip(gold, ks)],
                             max_new_tokens=SIZES['answer_len'] - max(ks))
  assert all(len(o.tokens) == 2 for o in out)
  full = np.zeros_like(b.answer)
  for i, (g, k, o) in enumerate(zip(gold, ks, out)):
    full[i, :k + len(o.tokens)] = tuple(g[:k]) + o.tokens
  tf = np.asarray(apply(params, b.query, b.context, b.passage_ids, full)).argmax(-1)
  for i, (k, o) in enumerate(zip(ks, out)):
    assert tuple(tf[i, k:k + len(o.tokens)].tolist()) == o.tokens


def test_atr_loglik_equals_gold_loglik(atr):
  reader, apply, params, b = atr
  got = reader.loglik(prompts_from_batch(b), answers_from_batch(b))
  want = np.asarray(scores.gold_loglik(apply(params, b.query, b.context, b.passage_ids,
                                             b.answer), b.answer))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # A shorter answer is right-padded with PAD, whose slots do not count.
  short = reader.loglik(prompts_from_batch(b), [g[:2] for g in answers_from_batch(b)])
  a2 = b.answer.copy()
  a2[:, 2:] = 0
  want2 = np.asarray(scores.gold_loglik(apply(params, b.query, b.context, b.passage_ids, a2), a2))
  np.testing.assert_allclose(short, want2, rtol=1e-5, atol=1e-5)


def test_atr_stop_tokens_and_bad_input(atr):
  reader, _, _, b = atr
  prompts = prompts_from_batch(b)
  gen = [g.tokens for g in reader.generate(prompts, max_new_tokens=4)]
  r, j = next((r, j) for r in range(B) for j in range(1, 4) if gen[r][j] not in gen[r][:j])
  stop = gen[r][j]  # row r stops at its (j+1)-th token, j >= 1
  out = reader.generate(prompts, max_new_tokens=4, stop=[stop])
  assert out[r].tokens == gen[r][:j + 1] and out[r].stop_reason == 'stop_token'
  assert out[r].stop == stop and len(out[r].text.split()) == j
  for o, g in zip(out, gen):  # every row: its greedy tokens up to the first stop token
    cut = g[:g.index(stop) + 1] if stop in g else g
    assert o.tokens == cut
  assert reader.generate([], max_new_tokens=1) == []
  assert reader.loglik([], []).shape == (0,)
  with pytest.raises(PromptTooLongError) as e:
    reader.continue_from(prompts[:3], [(5,), (5, 6), ()], max_new_tokens=3, ids=['a', 'b', 'c'])
  assert e.value.ids == ['b']
  with pytest.raises(PromptTooLongError, match="'x'"):
    reader.generate([ATRPrompt(prompts[0].query, prompts[0].context + (3,),
                               prompts[0].passage_ids + (3,))], max_new_tokens=1, ids=['x'])
  with pytest.raises(ValueError, match="shorter"):
    reader.generate([ATRPrompt(prompts[0].query[:2], prompts[0].context,
                               prompts[0].passage_ids)], max_new_tokens=1)
  with pytest.raises(ValueError, match='token ids only'):
    reader.generate(prompts, max_new_tokens=1, stop=['\n'])
  with pytest.raises(ValueError, match='ids must be unique'):
    reader.generate(prompts[:2], max_new_tokens=1, ids=[1, 1])


# ----------------------------------------------------------------------------
# Oracles.
# ----------------------------------------------------------------------------


def _prompt(context, question):
  from ceu_jax.pretrained.tokenizer import format_prompt  # pure string helper
  return format_prompt(context, question)


def test_copy_oracle_answers_only_from_its_context():
  golds = {'a': ['Paris', 'City of Light'], 'b': ['Rome']}
  oracle = CopyOracle(golds)
  assert isinstance(oracle, Reader)
  ctx = 'The Eiffel Tower stands in the city of light, that is in PARIS.'
  prompts = [_prompt(ctx, 'Where is the Eiffel Tower?'),
             _prompt('The Colosseum is in [MASK].', 'Where is the Colosseum? Rome?')]
  out = oracle.generate(prompts, max_new_tokens=8, ids=['a', 'b'])
  assert [o.text for o in out] == ['City of Light', '']  # earliest mention; the question
  assert out[0].stop_reason == 'end' and out[0].id == 'a'  # ... is not its context
  # The same golds for every item (a list).
  out = CopyOracle(['Rome', 'Paris']).generate(prompts, max_new_tokens=8)
  assert [o.text for o in out] == ['Paris', '']
  ll = oracle.loglik(prompts, ['city of light', 'Rome'], ids=['a', 'b'])
  np.testing.assert_array_equal(ll, [0.0, oracle.miss_loglik])
  cont = oracle.continue_from(prompts[:1], ['City of'], max_new_tokens=4, ids=['a'])
  assert cont[0].text == ' Light'
  assert oracle.generate(prompts[:1], max_new_tokens=2, ids=['a'])[0] == Generation(
      'a', 'City of', (), 'length')
  with pytest.raises(KeyError, match="'zz'"):
    oracle.generate(prompts[:1], max_new_tokens=2, ids=['zz'])


def test_copy_oracle_on_token_prompts():
  q, c, pid, a = _inputs(batch=2)
  c[0, 10:12] = (7, 8)  # the gold of row 0 sits in its context
  c[1][(c[1] == 7)] = 9  # row 1's context lacks token 7 altogether
  prompts = prompts_from_batch(_Batch(q, c, pid, a))
  out = CopyOracle([(7, 8)]).generate(prompts, max_new_tokens=4)
  assert out[0].tokens == (7, 8) and out[1].tokens == ()


def test_closed_book_oracle_ignores_its_context():
  oracle = ClosedBookOracle({'Where is the Eiffel Tower?': 'Paris'})
  prompts = [_prompt(ctx, 'Where is the Eiffel Tower') for ctx in
             ('It is in Paris.', 'It is in Lyon.', '')] + [_prompt('x', 'Who?')]
  out = oracle.generate(prompts, max_new_tokens=4)
  assert [o.text for o in out] == ['Paris', 'Paris', 'Paris', '']
  assert oracle.generate(prompts[:1], max_new_tokens=4, stop=['ri'])[0].text == 'Pa'
  tokens = ClosedBookOracle({(1, 2, 3): (4, 5)})
  p = ATRPrompt((1, 2, 3), (9,) * 4, (0,) * 4)
  assert tokens.generate([p], max_new_tokens=3, stop=[5])[0] == Generation(
      0, '4', (4, 5), 'stop_token', 5)
