"""LoRA on SmolLM2 and the CER objective at one read port (issue #21).

Oracles: zero adapters give the base model's logits; the causal-tail path
equals the engine's full recompute (loss, CEU metrics and gradients) at every
layer; bad input (read-port layer outside the model, D+/D− not token-aligned)
is refused before anything compiles, naming the field or the item.
"""
from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ceu_jax.finetune import objective as C
from ceu_jax.finetune import task as cer_task
from ceu_jax.pretrained import gguf_loader
from ceu_jax.pretrained import lora as L
from ceu_jax.pretrained.model import SmolLM, SmolLMConfig
from ceu_jax.train.losses import LossConfig
from configs import smollm2_cer

_WHY = gguf_loader.is_available()
needs_model = pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')

# The toy-model tests are compile-bound: they compile with most XLA optimisations off
# (the tests on the real SmolLM2 are not, and keep XLA's optimisations).
toy_fast_compile = pytest.mark.usefixtures('fast_compiled')

TOY = SmolLMConfig(vocab_size=61, width=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                   mlp_width=48, max_len=64)


def _base(config=TOY, seed=0):
  init = jax.jit(SmolLM(config).init)  # one program, not op by op
  return init(jax.random.PRNGKey(seed), jnp.ones((1, 8), jnp.int32))['params']


def _nonzero(adapters, seed=3, scale=0.1):
  """Adapters with random B (so the adapted model differs from the base)."""
  leaves, tree = jax.tree_util.tree_flatten_with_path(adapters)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  out = [jax.random.normal(k, x.shape) * scale if p[-1].key == 'b' else x
         for k, (p, x) in zip(keys, leaves)]
  return jax.tree.unflatten(jax.tree.structure(adapters), out)


def _toy_batch(seed=0, b=3, t=14, n_ans=2):
  rng = np.random.default_rng(seed)
  tp = rng.integers(1, TOY.vocab_size, (b, t)).astype(np.int32)
  valid = np.ones((b, t), bool)
  valid[0, :3], tp[0, :3] = False, 0
  am = np.zeros((b, t), bool)
  am[:, -n_ans:] = True
  am[1, -n_ans - 1] = True
  tm = tp.copy()
  ev = np.zeros((b, t - 1), bool)
  ev[:, 5:7] = True
  tm[:, 5:7] = (tp[:, 5:7] % (TOY.vocab_size - 1)) + 1  # a different token, never the pad
  dis = np.zeros_like(ev)
  dis[:, 3] = True
  ctl = np.zeros_like(ev)
  ctl[:, 8:10] = True
  return dict(tokens_p=tp, tokens_m=tm, valid=valid, answer_mask=am, span_ev=ev,
              span_dis=dis, span_control=ctl, has_dis=np.array([True, False, True]),
              has_control=np.ones(b, bool))


# ---------------------------------------------------------------- LoRA


@toy_fast_compile
def test_adapter_shapes_and_zero_init():
  lc = L.LoRAConfig(rank=4, targets=('q_proj', 'down_proj'))
  ad = L.init_adapters(jax.random.PRNGKey(0), TOY, lc)
  assert sorted(ad) == [f'layers_{i}' for i in range(TOY.n_layers)]
  q = ad['layers_0']['attn']['q_proj']
  d = ad['layers_0']['mlp']['down_proj']
  assert q['a'].shape == (TOY.width, 4) and q['b'].shape == (4, TOY.n_heads * TOY.head_dim)
  assert d['a'].shape == (TOY.mlp_width, 4) and d['b'].shape == (4, TOY.width)
  assert all(not np.any(x) for x in (q['b'], d['b']))
  assert L.num_params(ad) == TOY.n_layers * (4 * (32 + 32) + 4 * (48 + 32))


@toy_fast_compile
def test_merge_matches_closed_form():
  lc = L.LoRAConfig(rank=2, alpha=3.0)
  base = _base()
  ad = _nonzero(L.init_adapters(jax.random.PRNGKey(1), TOY, lc))
  p = L.merge(base, ad, lc)
  for i in range(TOY.n_layers):
    for t in L.TARGETS:
      m = L.MODULE_OF[t]
      a = np.asarray(ad[f'layers_{i}'][m][t]['a'], np.float64)
      b = np.asarray(ad[f'layers_{i}'][m][t]['b'], np.float64)
      want = np.asarray(base[f'layers_{i}'][m][t]['kernel'], np.float64) + 1.5 * a @ b
      np.testing.assert_allclose(p[f'layers_{i}'][m][t]['kernel'], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(p['embed']['embedding'], base['embed']['embedding'])


@toy_fast_compile
def test_zero_adapters_reproduce_base_logits_toy():
  lc = L.LoRAConfig(rank=4)
  base = _base()
  ad = _nonzero(L.init_adapters(jax.random.PRNGKey(1), TOY, lc))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, TOY.vocab_size, (2, 9)))
  ref = SmolLM(TOY).apply({'params': base}, tokens)
  moved = SmolLM(TOY).apply({'params': L.merge(base, ad, lc)}, tokens)
  assert float(jnp.abs(moved - ref).max()) > 1e-3  # the adapters do change the model
  out = SmolLM(TOY).apply({'params': L.merge(base, L.zero_adapters(ad), lc)}, tokens)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@needs_model
def test_zero_adapters_reproduce_base_logits_smollm2():
  """Acceptance 1: the whole 30-layer SmolLM2-135M, adapters on every projection."""
  from ceu_jax.pretrained import load_smollm2
  from ceu_jax.pretrained.patching import forward_logits
  mc, variables = load_smollm2()
  lc = L.LoRAConfig(rank=8)
  ad = _nonzero(L.init_adapters(jax.random.PRNGKey(1), mc, lc), scale=0.05)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, mc.vocab_size, (1, 12)))
  ref = forward_logits(variables, mc, tokens)
  moved = forward_logits({'params': L.merge(variables['params'], ad, lc)}, mc, tokens)
  assert float(jnp.abs(moved - ref).max()) > 1e-2
  zero = {'params': L.merge(variables['params'], L.zero_adapters(ad), lc)}
  np.testing.assert_allclose(forward_logits(zero, mc, tokens), ref, rtol=1e-5, atol=1e-5)


def test_full_finetune_trains_every_parameter():
  lc = L.LoRAConfig(full=True)
  base = _base()
  tr = L.init_trainable(jax.random.PRNGKey(0), TOY, lc, base)
  assert jax.tree.structure(tr) == jax.tree.structure(base)
  assert L.merged(tr, None, lc) is tr


# ---------------------------------------------------------------- CER: tail vs full


@toy_fast_compile
@pytest.mark.parametrize('grad_path,layers', [
    ('all', (1,)),
    pytest.param('all', (0, 2), marks=pytest.mark.slow),
    pytest.param('numerator', (0, 1, 2), marks=pytest.mark.slow)])
def test_tail_path_equals_full_recompute_with_gradients(grad_path, layers):
  """Loss, CEU metrics and adapter gradients of the causal-tail path equal the engine's
  full recompute (record on D+, patch on D−) at the port of each layer, to 1e-5
  (the middle layer of 3 by default: the tail runs through the later layers; the slow
  cases complete the grid of layers and grad paths)."""
  lc = L.LoRAConfig(rank=4)
  base = _base()
  ad = _nonzero(L.init_adapters(jax.random.PRNGKey(1), TOY, lc))
  batch = _toy_batch()
  C.check_batch(batch)
  cfg = LossConfig(regularizer='evidence_distractor', k=3, eps=1e-6, gap_floor=1e-3,
                   grad_path=grad_path, beta_swap=0.5)
  for layer in layers:
    kw = dict(config=TOY, lora=lc, layer=layer, cfg=cfg, n_tail=3)
    (lt, mt), gt = C.loss_and_grad(ad, base, batch, path='tail', **kw)
    (lf, mf), gf = C.loss_and_grad(ad, base, batch, path='full', **kw)
    assert abs(float(lt) - float(lf)) <= 1e-5 * max(1.0, abs(float(lf)))
    for k in ('ceu_ev', 'ceu_dis', 'ceu_control', 'cer_ev', 'cer_dis', 'gap'):
      assert abs(float(mt[k]) - float(mf[k])) <= 1e-5, (layer, k, mt[k], mf[k])
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(gf))
    assert scale > 1e-3  # the CER terms do reach the adapters
    diff = max(float(jnp.abs(a - b).max()) for a, b in
               zip(jax.tree.leaves(gt), jax.tree.leaves(gf)))
    assert diff <= 1e-5 * max(1.0, scale), (layer, diff, scale)


@toy_fast_compile
def test_tail_intervened_logliks_equal_engine_per_probe():
  """L_int [Q, B] itself (no loss around it), every layer, against the engine."""
  base = _base()
  batch = _toy_batch(seed=1)
  model = SmolLM(TOY)
  tp, tm, valid, am = (batch[k] for k in ('tokens_p', 'tokens_m', 'valid', 'answer_mask'))
  _, cp = model.apply({'params': base}, tp[:, :-1], valid[:, :-1], n_logits=3,
                      return_cache=True)
  _, cm = model.apply({'params': base}, tm[:, :-1], valid[:, :-1], n_logits=3,
                      return_cache=True)
  spans = C.probe_spans(batch, 3)
  for layer in range(TOY.n_layers):
    tail = C.tail_intervened_logliks(base, TOY, layer, cp, cm, jnp.asarray(tm), am, spans, 3)
    full = C.full_intervened_logliks(
        base, TOY, layer, {'tokens': tp, 'valid': valid, 'answer_mask': am},
        {'tokens': tm, 'valid': valid, 'answer_mask': am}, spans, 3)
    assert tail.shape == (3, 3)
    np.testing.assert_allclose(tail, full, rtol=1e-5, atol=1e-5)


@toy_fast_compile
def test_plain_objective_is_the_answer_nll():
  lc = L.LoRAConfig(rank=2)
  base = _base()
  ad = _nonzero(L.init_adapters(jax.random.PRNGKey(1), TOY, lc))
  batch = _toy_batch()
  loss, m = C.lm_cer_loss(ad, base, batch, config=TOY, lora=lc, layer=0,
                          cfg=LossConfig(regularizer='none'), n_tail=3)
  # Reference: a python loop over rows and answer tokens on full logits.
  logits = SmolLM(TOY).apply({'params': L.merge(base, ad, lc)}, batch['tokens_p'][:, :-1],
                             batch['valid'][:, :-1])
  logp = np.asarray(jax.nn.log_softmax(logits, -1))
  ref = []
  for i in range(3):
    s = 0.0
    for j in range(1, batch['tokens_p'].shape[1]):
      if batch['answer_mask'][i, j]:
        s += float(logp[i, j - 1, batch['tokens_p'][i, j]])
    ref.append(-s)
  np.testing.assert_allclose(float(loss), np.mean(ref), rtol=1e-5)
  assert set(m) == {'task_nll', 'train_em', 'loss'}


# ---------------------------------------------------------------- bad input


def test_misaligned_pair_is_refused_naming_the_item():
  batch = _toy_batch()
  batch['tokens_m'] = batch['tokens_m'].copy()
  batch['tokens_m'][1, 9] = (batch['tokens_m'][1, 9] % 60) + 1
  with pytest.raises(ValueError, match=r'item q-b: D\+ and D− are not token-aligned .* \[9\]'):
    C.check_batch(batch, ['q-a', 'q-b', 'q-c'])
  batch = _toy_batch()
  batch['span_ev'] = np.zeros_like(batch['span_ev'])
  with pytest.raises(ValueError, match='item row 0: D'):
    C.check_batch(batch)


@needs_model
def test_misaligned_pair_from_text_is_refused_before_compiling():
  """A pair whose D− prompt has another token count is refused by the batch builder
  (host side; the training step is never traced)."""
  from ceu_jax.pretrained import load_tokenizer
  tok = load_tokenizer()
  config = smollm2_cer.get_config('tiny')
  pairs, _ = cer_task.build_pairs(tok, config, 'train', limit=2)
  assert len(pairs) == 2
  cer_task.batch_arrays(tok, pairs, config.data.max_len)  # the real pairs pass
  bad = dataclasses.replace(pairs[1], corrupt_prompt=pairs[1].corrupt_prompt.replace(
      'Context:', 'Context: a few more words here'))
  with pytest.raises(ValueError, match=f'item {bad.id}: D\\+ and D− are not token-aligned'):
    cer_task.batch_arrays(tok, [pairs[0], bad], config.data.max_len)


@needs_model
def test_answer_end_is_one_trained_token_after_the_answer():
  """data.answer_end = '\\n' (the configs' default) trains one end token after each answer
  so the reader learns to stop where the evaluation's greedy answer ends: the answer mask
  covers the answer and that token, n_tail covers it, the probe spans keep their prompt
  tokens; '' (a config recorded before the field) trains the answer alone, as before."""
  from ceu_jax.pretrained import load_tokenizer
  from ceu_jax.pretrained.tokenizer import encode
  tok = load_tokenizer()
  config = smollm2_cer.get_config('tiny')
  assert config.data.answer_end == '\n'
  pairs, _ = cer_task.build_pairs(tok, config, 'train', limit=3)
  t = int(config.data.max_len)
  plain = cer_task.batch_arrays(tok, pairs, t)
  ended = cer_task.batch_arrays(tok, pairs, t, end='\n')
  nl = encode(tok, '\n')
  assert len(nl) == 1
  assert plain['tokens_p'].shape == (3, t) and ended['tokens_p'].shape == (3, t + 1)
  for i, p in enumerate(pairs):
    # the same row shifted left by one, then the end token (D+ and D− alike)
    for k in ('tokens_p', 'tokens_m'):
      np.testing.assert_array_equal(ended[k][i, :-1][-p.length:], plain[k][i][-p.length:])
      assert ended[k][i, -1] == nl[0]
    assert ended['answer_mask'][i].sum() == p.answer_tokens + 1 == plain['answer_mask'][i].sum() + 1
    assert ended['answer_mask'][i, -1] and not plain['answer_mask'][i, :-p.answer_tokens].any()
    for n in C.PROBES:   # the spans point at the same tokens
      np.testing.assert_array_equal(ended['tokens_p'][i, :-1][ended[f'span_{n}'][i]],
                                    plain['tokens_p'][i, :-1][plain[f'span_{n}'][i]])
  task = types.SimpleNamespace(config=config)
  assert cer_task.SmolLM2CERTask.n_tail.fget(task) == config.data.max_answer_tokens + 1
  old = smollm2_cer.get_config('tiny')
  with old.unlocked():
    del old.data['answer_end']
  cer_task.validate(old)   # recorded before the field: the answer alone
  assert cer_task.answer_end(old) == ''
  assert cer_task.SmolLM2CERTask.n_tail.fget(types.SimpleNamespace(config=old)) == \
      old.data.max_answer_tokens
  bad = dataclasses.replace(pairs[0], answer=pairs[0].answer + ' x')  # one more token
  with pytest.raises(ValueError, match=f'item {bad.id}: data.answer_end'):
    cer_task.batch_arrays(tok, [bad], t + 4, end='\n')


@needs_model
def test_distractor_injection_at_delta_test():
  """δ = 0 gives the clean prompts; δ = 1 replaces every non-evidence sentence by another
  item's evidence sentence without the gold (the evidence sentence stays); seeded, so
  the same prompts whatever the pair order; a δ outside [0, 1] is refused."""
  from ceu_jax.metrics.text import normalize_answer
  from ceu_jax.pretrained import load_tokenizer
  tok = load_tokenizer()
  config = smollm2_cer.get_config('tiny')
  config.data.eval_split = 'test'
  pairs, _ = cer_task.build_pairs(tok, config, 'test', limit=12)
  clean, n0 = cer_task.injected_prompts(config, pairs, 0.0)
  assert clean == [p.clean_prompt for p in pairs] and n0 == [0] * len(pairs)
  full, n1 = cer_task.injected_prompts(config, pairs, 1.0)
  examples, passages = cer_task._storage()
  by_id = {e['id']: e for e in examples}
  for p, prompt, n in zip(pairs, full, n1):
    rec = by_id[p.id]
    sents = passages[rec['passage_id']]['sentences']
    kept = cer_task._context_indices(rec, passages[rec['passage_id']],
                                     int(config.data.n_distractor_sentences), 0)
    assert n == len(kept) - 1
    evidence = sents[int(rec['sentence_index'])]
    assert evidence in prompt and prompt.endswith(p.clean_prompt[p.clean_prompt.index('\nQuestion'):])
    context = prompt[len('Context: '):prompt.index('\nQuestion')]
    rest = normalize_answer(context.replace(evidence, ' '))
    assert normalize_answer(p.answer) not in rest, (p.id, context)
  assert sum(n1) > 0 and full != clean
  rev, _ = cer_task.injected_prompts(config, pairs[::-1], 1.0)
  assert rev[::-1] == full
  with pytest.raises(ValueError, match=r'eval.delta_test values must be in \[0, 1\]'):
    cer_task.injected_prompts(config, pairs, 1.5)
  config.eval.delta_test = (0.3, 2.0)
  with pytest.raises(ValueError, match=r'eval.delta_test must be a tuple of distractor'):
    cer_task.validate(config)


@pytest.mark.parametrize('layer', [-1, 2, 30])
def test_read_layer_outside_the_model_is_refused(layer):
  config = smollm2_cer.get_config('tiny')  # 2 layers kept
  config.model.read_layer = layer
  with pytest.raises(ValueError, match=r'model.read_layer must be an integer in \[0, 1\]'):
    cer_task.validate(config)


def test_read_layer_outside_the_full_model_is_refused():
  config = smollm2_cer.get_config('cpu')
  config.model.read_layer = 30
  with pytest.raises(ValueError, match=r'model.read_layer must be an integer in \[0, 29\]'):
    cer_task.validate(config)
  with pytest.raises(ValueError, match=r'read_layer must be an integer >= 0 and <= 29'):
    smollm2_cer.get_config('cpu,read_layer=30')
  for bad in (5, 1.5, True, '1'):
    with pytest.raises(ValueError, match='model.read_layer must be an integer in'):
      L.check_layer(bad, TOY)


@pytest.mark.parametrize('field,value,match', [
    ('lora.rank', 0, r'lora.rank must be'),
    ('cer.corruption', 'removal', r"cer.corruption must be 'entity_swap'"),
    ('train.eval_every', 5, r'train.eval_every must be 0'),
    ('data.n_distractor_sentences', 3, r'data.n_distractor_sentences must be one of'),
    ('model.cer_path', 'fast', r'model.cer_path must be one of'),
    ('eval.eps', 0.0, r'eval.eps must be a number > 0'),
])
def test_bad_config_fields_are_named(field, value, match):
  config = smollm2_cer.get_config('tiny')
  sec, key = field.split('.')
  config[sec][key] = value
  with pytest.raises(ValueError, match=match):
    cer_task.validate(config)


def test_configs_validate():
  for v in smollm2_cer.VARIANTS:
    cer_task.validate(smollm2_cer.get_config(v))
  c = smollm2_cer.get_config('cpu,regularizer=none,full=true,steps=20')
  assert (c.cer.regularizer, c.lora.full, c.train.num_steps) == ('none', True, 20)
  cer_task.validate(c)


def test_a_config_recorded_before_eval_eps_evaluates_with_cer_eps():
  """The evaluation's ε is eval.eps (the audit's); a config from before it existed took
  cer.eps and is read with that value (audit_config.upgrade), so its numbers stay."""
  from ceu_jax import audit_config
  config = smollm2_cer.get_config('tiny')
  assert config.eval.eps == config.cer.eps == 1e-3
  with config.unlocked():
    del config.eval['eps']
    config.cer.eps = 2e-3
  with pytest.raises(ValueError, match='eval.eps is missing'):
    cer_task.validate(config)
  upgraded = audit_config.upgrade(config)
  cer_task.validate(upgraded)
  assert upgraded.eval.eps == 2e-3 and 'eps' not in config.eval


def test_state_digest_by_leaf_equals_the_whole_tree_digest():
  """The checkpoint digest, now computed in chunks of leaves (LoRA states have ~1,300
  leaves), equals the whole-tree jit it replaces (old checkpoints still verify); the
  tree spans three chunks."""
  from ceu_jax.train import checkpoint as ckpt
  rng = np.random.default_rng(0)
  tree = {'a': [rng.standard_normal((17, 5)).astype(np.float32) * 1e6 for _ in range(140)],
          'b': rng.integers(0, 2**31 - 1, (7,)).astype(np.int32),
          'c': jnp.asarray(3, jnp.int32), 'd': jnp.ones((4, 3), jnp.bfloat16) * 1.5}
  want = np.asarray(ckpt._tree_digest(tree))
  np.testing.assert_array_equal(ckpt._tree_digest_by_leaf(tree), want)
  assert len(jax.tree.leaves(tree)) > 2 * ckpt.DIGEST_CHUNK
  assert ckpt.state_digest(tree) == f'{int(want[0]):08x}{int(want[1]):08x}-143'
  # both ways to it: numpy on the host (every leaf on this host's CPU: what ran above) and
  # the compiled chunks (accelerators, shards in other processes)
  leaves = jax.tree.leaves(tree)
  np.testing.assert_array_equal(ckpt._host_digest(leaves), want)
  np.testing.assert_array_equal(ckpt._chunked_digest(leaves), want)


@pytest.mark.parametrize('dtype', ['float64', 'float16', 'bfloat16', 'int8', 'int64', 'bool',
                                   'uint8'])
def test_host_digest_equals_the_compiled_one_for_every_dtype(dtype):
  """The numpy digest reads the same bits as the compiled one: float64's two words in
  bitcast's order, 16-bit floats widened, negative and 64-bit integers wrapped."""
  from ceu_jax.train import checkpoint as ckpt
  rng = np.random.default_rng(1)
  with jax.enable_x64(True):
    x = rng.standard_normal((3, 7)) * (1e3 if dtype == 'float16' else 1e5)
    if 'int' in dtype or dtype == 'bool':
      x = rng.integers(-2**40, 2**40, (3, 7))
    if dtype == 'bool':
      x = x > 0
    leaves = [jnp.asarray(x.astype(np.dtype(dtype) if dtype != 'bfloat16' else jnp.bfloat16)),
              jnp.asarray(np.float32(-0.0)), jnp.arange(5)]
    want = np.asarray(ckpt._tree_digest(leaves))
    np.testing.assert_array_equal(ckpt._host_digest(leaves), want)
    np.testing.assert_array_equal(ckpt._tree_digest_by_leaf(leaves), want)


def test_host_digest_gives_numpy_and_python_values_the_dtype_jit_gives_them():
  """Without x64, jit reads a numpy float64 / int64 array and a Python float / int as
  32-bit values: the host digest reads the same bits."""
  from ceu_jax.train import checkpoint as ckpt
  rng = np.random.default_rng(2)
  leaves = [rng.standard_normal((4, 3)), rng.integers(-2**20, 2**20, (5,)), 1.5, 7, True,
            np.float32(2.5)]
  want = np.asarray(ckpt._tree_digest(leaves))
  np.testing.assert_array_equal(ckpt._host_digest(leaves), want)
  np.testing.assert_array_equal(ckpt._tree_digest_by_leaf(leaves), want)
