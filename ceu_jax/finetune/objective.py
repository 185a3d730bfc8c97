"""The CER objective (SPEC §4) on SmolLM2 at one read port, with the causal-tail path.

Per row (the terms and their conditioning are those of `ceu_jax.train.losses`):
  ℓ = −L+ + λ_ev [α·gap − Δ_ev]_+ / max(gap, γ₀) + λ_dis [Δ_dis]_+ / max(gap, γ₀)
      (+ β ℓ_swap),   Δ = L_int − L−,  gap = L+ − L−,
on rows with gap ≥ ε; the batch loss is the mean over rows.

L_int is the engine's interchange intervention (SPEC §1) at the read port
`layers_{ℓ}/attn:read`, span S of each probe (ev = the swapped answer mention,
dis = a distractor mention of the same token count, control = a random span),
patched at the answer positions only (the input positions whose logits score
y*). Two exact ways to compute it, selected by `path`:
  tail  — the causal-tail path of the SmolLM2 audit (`patching`): the patch
          touches only the last n positions, so every earlier position equals
          the corrupted run's; only those n positions are recomputed from layer
          ℓ on, attending to the corrupted run's cached keys/values. One
          forward of D+ and one of D− (with caches) plus Q·n·(L − ℓ) tail rows.
  full  — the generic engine (`engine.record` on D+, `engine.patch` on D−):
          one full forward per probe. The independent reference (values and
          gradients agree to 1e-5, tests/test_smollm2_cer.py).
Gradients flow through both (into the adapters, or all params when full
fine-tuning).

Batch (dict of arrays, leading axis B; `cer_task.batch_arrays` builds it):
  tokens_p, tokens_m [B, T] int32   D+ / D− prompt + answer, left-padded
  valid, answer_mask [B, T] bool    shared by D+ and D− (token-aligned)
  span_ev, span_dis, span_control [B, T_in] bool   probe spans over input positions
  has_dis, has_control [B] bool     the row has a valid span for that probe
  has_ev [B] bool (optional)        the row holds the evidence (a prior-world row
                                    without it has D− = D+, no spans, no CER term)

Shape legend: B batch, T row length (the model reads T_in = T − 1 positions),
n = n_tail (answer positions, t0 = T_in − n), Q probes, E width, H heads,
Dh head dim, V vocabulary, L layers.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax import engine
from ceu_jax.engine import scores as engine_scores
from ceu_jax.pretrained import lora as lora_lib
from ceu_jax.pretrained import model as M
from ceu_jax.pretrained import patching
from ceu_jax.pretrained.model import SmolLM, SmolLMConfig
from ceu_jax.train.losses import LossConfig

PROBES = engine.SPAN_PROBES  # the engine's probe names, in the order k = 1, 2, 3 adds them
PATHS = ('tail', 'full')
BATCH_KEYS = ('tokens_p', 'tokens_m', 'valid', 'answer_mask', *(f'span_{n}' for n in PROBES),
              *(f'has_{n}' for n in PROBES[1:]))


def check_batch(batch: dict, ids: Optional[list] = None) -> None:
  """ValueError naming the item when a D+/D− pair is not token-aligned.

  Host-side (numpy), before anything compiles: both rows must share `valid`
  and `answer_mask`, differ only inside the evidence span, and the spans must
  lie on valid prompt positions.
  """
  missing = [k for k in BATCH_KEYS if k not in batch]
  if missing:
    raise ValueError(f'batch is missing {missing} (keys {BATCH_KEYS})')
  tp, tm = np.asarray(batch['tokens_p']), np.asarray(batch['tokens_m'])
  if tp.shape != tm.shape or tp.ndim != 2:
    raise ValueError(f'tokens_p {tp.shape} and tokens_m {tm.shape} must both be [B, T]')
  b, t = tp.shape
  ids = list(ids) if ids is not None else [f'row {i}' for i in range(b)]
  valid, ans = np.asarray(batch['valid']), np.asarray(batch['answer_mask'])
  ev = np.asarray(batch['span_ev'])
  has_ev = np.asarray(batch.get('has_ev', np.ones(tp.shape[0], bool)))
  for name in ('valid', 'answer_mask'):
    if np.shape(batch[name]) != (b, t):
      raise ValueError(f'batch[{name!r}] has shape {np.shape(batch[name])}, expected {(b, t)}')
  for name in ('span_ev', 'span_dis', 'span_control'):
    if np.shape(batch[name]) != (b, t - 1):
      raise ValueError(f'batch[{name!r}] has shape {np.shape(batch[name])}, expected '
                       f'[B, T_in] = {(b, t - 1)}')
  for i in range(b):
    differ = tp[i] != tm[i]
    if not has_ev[i]:   # no evidence: D− = D+ and no probe span
      if differ.any() or any(np.asarray(batch[f'span_{n}'][i]).any() for n in PROBES):
        raise ValueError(f'item {ids[i]}: a row without evidence (has_ev False) must have '
                         'D− = D+ and no probe span')
      continue
    outside = np.append(differ[:-1] & ~ev[i], differ[-1])
    if outside.any():
      raise ValueError(f'item {ids[i]}: D+ and D− are not token-aligned (they differ at '
                       f'token positions {np.flatnonzero(outside)[:8].tolist()} outside the '
                       'evidence span); the corrupted row must keep every token outside the '
                       'swapped mention')
    if not ev[i].any() or (ev[i] & ~(valid[i] & ~ans[i])[:-1]).any():
      raise ValueError(f'item {ids[i]}: the evidence span is empty or leaves the prompt')
    n_pad = int((~valid[i]).sum())
    if not ans[i].any() or not valid[i, n_pad:].all():
      raise ValueError(f'item {ids[i]}: no answer tokens, or the row is not left-padded')


def probe_spans(batch: dict, k: int) -> jax.Array:
  """[Q = k, B, T_in] spans of the first k probes (`PROBES`)."""
  return jnp.stack([batch[f'span_{n}'] for n in PROBES[:k]])


def _answer_positions(answer_mask: jax.Array, n_tail: int) -> jax.Array:
  """[B, n] answer positions among the last n input positions."""
  return patching.answer_positions(answer_mask)[:, -n_tail:]


def tail_intervened_logliks(params: dict, config: SmolLMConfig, layer: int,
                            clean: dict, corrupt: dict, tokens_m: jax.Array,
                            answer_mask: jax.Array, spans: jax.Array, n_tail: int,
                            freeze_clean: bool = False) -> jax.Array:
  """L_int [Q, B] by the causal-tail path at the port of `layer` (module doc).

  clean/corrupt: `SmolLM(..., return_cache=True)` caches of D+ / D− inputs
  (T_in positions, same `valid`); spans [Q, B, N <= T_in].
  """
  t = corrupt['valid'].shape[-1]
  t0 = t - n_tail
  one = lambda c: {'q': c['q'][layer:layer + 1], 'k': c['k'][layer:layer + 1],
                   'v': c['v'][layer:layer + 1], 'valid': c['valid']}
  h_p = patching.tail_spans(one(clean), spans, n_tail)[0]  # [Q, B, n, H, Dh]
  if freeze_clean:
    h_p = jax.lax.stop_gradient(h_p)
  h_m = patching.tail_spans(one(corrupt), spans, n_tail)[0]
  pos = _answer_positions(answer_mask, n_tail)  # [B, n]
  delta = (h_p - h_m) * pos[None, :, :, None, None].astype(h_p.dtype)
  positions = corrupt['positions'][:, t0:]
  mask = M.causal_mask(corrupt['valid'])[:, t0:]  # [B, n, T]
  x = jnp.broadcast_to(corrupt['x'][layer][:, t0:], (spans.shape[0],) +
                       corrupt['x'].shape[1:2] + (n_tail, config.width))
  for i in range(layer, config.n_layers):
    d = delta if i == layer else jnp.zeros_like(delta)
    x = patching.layer_tail(params[f'layers_{i}'], config, x, corrupt['k'][i][:, :t0],
                             corrupt['v'][i][:, :t0], positions, mask, d)
  x = M.rms_norm(x, params['final_norm']['scale'], config.norm_eps)
  logits = M.unembed(x, params['embed']['embedding'])  # [Q, B, n, V]
  return patching.tail_loglik(logits, tokens_m, answer_mask)


def full_intervened_logliks(params: dict, config: SmolLMConfig, layer: int,
                            clean_in: dict, corrupt_in: dict, spans: jax.Array,
                            n_tail: int, freeze_clean: bool = False) -> jax.Array:
  """L_int [Q, B] through the generic engine: one full patched forward per probe."""
  loglik_fn = patching.engine_loglik_fn(config, n_tail)
  site = engine.Site(f'layers_{layer}/attn', 'read')
  variables = {'params': params}
  pos = patching.answer_positions(clean_in['answer_mask'])
  out = []
  for q in range(spans.shape[0]):
    _, rec = engine.record(loglik_fn, variables, clean_in, site, span_mask=spans[q])
    value = jax.lax.stop_gradient(rec[site]) if freeze_clean else rec[site]
    out.append(engine.patch(loglik_fn, variables, corrupt_in, site, value,
                            span_mask=spans[q], position_mask=pos))
  return jnp.stack(out)


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  m = mask.astype(jnp.float32)
  return (x * m).sum() / jnp.maximum(m.sum(), 1.0)


def lm_cer_loss(trainable: Any, base: Optional[dict], batch: dict, *, config: SmolLMConfig,
                lora: lora_lib.LoRAConfig, layer: int, cfg: LossConfig, n_tail: int,
                path: str = 'tail') -> tuple[jax.Array, dict]:
  """(scalar loss, metrics) of one batch; differentiable in `trainable`.

  trainable: adapters (or all params when lora.full); base: the frozen base
  params (None when lora.full). layer: the read port's layer; path: 'tail'
  (fast) or 'full' (engine reference).
  """
  if path not in PATHS:
    raise ValueError(f'path must be one of {PATHS}, got {path!r}')
  params = lora_lib.merged(trainable, base, lora)
  model = SmolLM(config)
  variables = {'params': params}
  tp, tm = batch['tokens_p'], batch['tokens_m']
  valid_in, am = batch['valid'][:, :-1], batch['answer_mask']
  need_cache = cfg.uses_probes and path == 'tail'
  out = model.apply(variables, tp[:, :-1], valid_in, n_logits=n_tail, return_cache=need_cache)
  logits_p, cache_p = out if need_cache else (out, None)
  l_plus = patching.tail_loglik(logits_p, tp, am)  # [B]
  pred = jnp.argmax(logits_p, -1) == tp[:, -n_tail:]
  correct = jnp.all(pred | ~am[:, -n_tail:], axis=-1)
  per_row = -l_plus
  metrics = {'task_nll': -l_plus.mean(), 'train_em': correct.mean()}
  if cfg.uses_corrupt:
    out = model.apply(variables, tm[:, :-1], valid_in, n_logits=n_tail,
                      return_cache=need_cache)
    logits_m, cache_m = out if need_cache else (out, None)
    l_minus = patching.tail_loglik(logits_m, tm, am)
    gap = l_plus - l_minus
    gap_c = jax.lax.stop_gradient(gap)
    has_ev = batch.get('has_ev', jnp.ones_like(gap_c, bool))
    ok = (gap_c >= cfg.eps) & has_ev
    metrics.update(gap=_masked_mean(gap_c, has_ev), cer_valid_frac=ok.mean())
    if cfg.beta_swap > 0:
      swap = -gap if cfg.swap_form == 'contrastive' else jnp.maximum(cfg.gamma - gap, 0.0)
      swap = jnp.where(has_ev, swap, 0.0)
      per_row = per_row + cfg.beta_swap * swap
      metrics['swap'] = swap.mean()
    if cfg.uses_probes:
      frozen = cfg.grad_path == 'numerator'
      spans = probe_spans(batch, cfg.k)
      if path == 'tail':
        l_int = tail_intervened_logliks(params, config, layer, cache_p, cache_m, tm, am,
                                        spans, n_tail, frozen)
      else:
        clean_in = {'tokens': tp, 'valid': batch['valid'], 'answer_mask': am}
        corrupt_in = {'tokens': tm, 'valid': batch['valid'], 'answer_mask': am}
        l_int = full_intervened_logliks(params, config, layer, clean_in, corrupt_in, spans,
                                        n_tail, frozen)
      gap_g = gap_c if frozen else gap
      delta = engine_scores.delta_int(l_int, l_minus)  # [Q, B]
      den = jnp.maximum(gap_g, cfg.gap_floor)
      ceu = engine_scores.ceu(l_int, l_plus, l_minus, cfg.eps)  # [Q, B]
      ev_term = jnp.where(ok, jnp.maximum(cfg.alpha * gap_g - delta[0], 0.0) / den, 0.0)
      per_row = per_row + cfg.lambda_ev * ev_term
      # cer_ev_active: share of the rows with a CER term whose evidence hinge is > 0.
      metrics.update(cer_ev=ev_term.mean(), ceu_ev=_masked_mean(ceu[0], ok),
                     cer_ev_active=_masked_mean(ev_term > 0, ok))
      if cfg.k >= 2:
        dis_ok = ok & batch['has_dis']
        metrics['ceu_dis'] = _masked_mean(ceu[1], dis_ok)
        if cfg.uses_dis:
          dis_term = jnp.where(dis_ok, jnp.maximum(delta[1], 0.0) / den, 0.0)
          per_row = per_row + cfg.lambda_dis * dis_term
          metrics['cer_dis'] = dis_term.mean()
      if cfg.k >= 3:
        metrics['ceu_control'] = _masked_mean(ceu[2], ok & batch['has_control'])
  loss = per_row.mean()
  metrics['loss'] = loss
  return loss, metrics


@functools.partial(jax.jit, static_argnames=('config', 'lora', 'layer', 'cfg', 'n_tail',
                                             'path'))
def loss_and_grad(trainable, base, batch, *, config, lora, layer, cfg, n_tail, path='tail'):
  """Jitted ((loss, metrics), grads) of `lm_cer_loss` (tests and the benchmark)."""
  fn = functools.partial(lm_cer_loss, config=config, lora=lora, layer=layer, cfg=cfg,
                         n_tail=n_tail, path=path)
  return jax.value_and_grad(fn, has_aux=True)(trainable, base, batch)
