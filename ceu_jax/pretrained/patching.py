"""Scoring, greedy decoding and (fast) causal patching for the pretrained LM.

Three layers of machinery:

* `answer_loglik`: gold log-likelihood log p(y* | prompt) [B] of left-padded
  prompt+answer batches (`tokenizer.encode_batch`), teacher forcing, summed
  over answer tokens (SPEC §1).
* `record_ports` / `patched_run`: the reference interchange intervention via
  `nn.intercept_methods` on the read ports `layers_{i}/attn.read`: a full
  forward of the corrupted input in which the port of layer ℓ at the last
  `n_patch` positions is replaced by h − Π_S h + Π_S h_clean (S = all: the
  whole site). One compiled program serves every layer (ℓ is traced).
* `fast_patch_audit`: the same intervention for every layer ℓ and every span
  kind at once, recomputing only the last `n_tail` positions from layer ℓ on.
  In a causal decoder a patch at positions ≥ t0 leaves every earlier position
  unchanged in every layer, so the tail queries attend to the corrupted run's
  cached keys/values at positions < t0 and to recomputed ones in the tail.
  All probes run together through a few `lax.scan`s over groups of layers:
  a probe joins at the start of its layer's group and carries the corrupted
  residual until its layer, so about (1 + 1/groups) · L² · S / 2 tail-layer
  passes replace L · S full forwards.

Shape legend: B batch, T sequence length, n = n_tail / n_patch (last positions
recomputed / patched, t0 = T − n), E width, H heads, K KV heads, Dh head dim,
V vocabulary, L layers, S span kinds (probe kinds), P probes in flight.
"""
from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax.pretrained import model as M
from ceu_jax.pretrained.model import SmolLM, SmolLMConfig

# ----------------------------------------------------------------------------
# Scoring.
# ----------------------------------------------------------------------------


def tail_loglik(logits: jax.Array, tokens: jax.Array,
                answer_mask: jax.Array) -> jax.Array:
  """Σ log p(answer tokens) [...] from logits [..., B, n, V].

  The logits are those of the last n positions of the model *input*
  tokens[:, :-1] (the final answer token predicts nothing, so it is never
  fed), i.e. they predict tokens[:, T-n:]; tokens counted where answer_mask
  [B, T] is True (all answer tokens must lie in the last n positions).
  """
  n, t = logits.shape[-2], tokens.shape[-1]
  tgt = tokens[:, t - n:]
  logp = jax.nn.log_softmax(M._f32(logits), axis=-1)
  tok = jnp.take_along_axis(logp, jnp.broadcast_to(tgt[..., None], logp.shape[:-1] + (1,)),
                            axis=-1)[..., 0]
  return jnp.where(answer_mask[:, t - n:], tok, 0.0).sum(-1)


@functools.partial(jax.jit, static_argnames=('config', 'n_logits'))
def forward_logits(variables: dict, config: SmolLMConfig, tokens: jax.Array,
                   valid: Optional[jax.Array] = None,
                   n_logits: Optional[int] = None) -> jax.Array:
  """Jitted logits [B, n_logits or T, V] of tokens [B, T] (valid [B, T] or None)."""
  return SmolLM(config).apply(variables, tokens, valid, n_logits=n_logits)


@functools.partial(jax.jit, static_argnames=('config', 'n_tail'))
def answer_loglik(variables: dict, config: SmolLMConfig, tokens: jax.Array,
                  valid: jax.Array, answer_mask: jax.Array, n_tail: int) -> jax.Array:
  """Gold log-likelihood [B] of the answer tokens given the prompt.

  tokens/valid/answer_mask [B, T] from `encode_batch` (left-padded, answer at
  the end); n_tail = `EncodedBatch.n_tail` (max answer length). The model reads
  tokens[:, :-1] and forms only the last n_tail logits.
  """
  logits = SmolLM(config).apply(variables, tokens[:, :-1], valid[:, :-1], n_logits=n_tail)
  return tail_loglik(logits, tokens, answer_mask)


@functools.lru_cache(maxsize=None)
def engine_loglik_fn(config: SmolLMConfig, n_tail: int):
  """`loglik_fn(variables, inputs) -> [B]` for the generic engine (`ceu_jax.engine`).

  inputs = {'tokens', 'valid', 'answer_mask'} [B, T] (an `EncodedBatch`'s
  fields). Cached, so the engine sees one function object per (config,
  n_tail) and compiles once. Sites: `layers_{i}/attn` (method `read`) with h
  [B, T - 1, H, Dh]; span masks are over the T − 1 input positions.
  """
  def loglik_fn(variables, inputs):
    tokens = inputs['tokens']
    logits = SmolLM(config).apply(variables, tokens[:, :-1], inputs['valid'][:, :-1],
                                  n_logits=n_tail)
    return tail_loglik(logits, tokens, inputs['answer_mask'])
  return loglik_fn


@functools.partial(jax.jit, static_argnames=('config',))
def _next_token(variables, config, tokens, valid):
  logits = SmolLM(config).apply(variables, tokens, valid, n_logits=1)
  return jnp.argmax(logits[:, -1], axis=-1)


def greedy_generate(variables: dict, config: SmolLMConfig, prompt_ids: list[int],
                    n_new: int) -> list[int]:
  """Greedy continuation (n_new ids) of one prompt; one compile for all steps.

  The prompt sits right-aligned in a fixed buffer of len(prompt) + n_new
  tokens (left pads masked), which shifts left by one token per step.
  """
  t = len(prompt_ids) + n_new
  if t > config.max_len:
    raise ValueError(f'{t} tokens exceed the maximum length {config.max_len}')
  tokens = np.zeros((1, t), np.int32)
  valid = np.zeros((1, t), bool)
  tokens[0, n_new:], valid[0, n_new:] = prompt_ids, True
  out = []
  for _ in range(n_new):
    nxt = int(_next_token(variables, config, tokens, valid)[0])
    out.append(nxt)
    tokens = np.concatenate([tokens[:, 1:], [[nxt]]], axis=1)
    valid = np.concatenate([valid[:, 1:], [[True]]], axis=1)
  return out


# ----------------------------------------------------------------------------
# Reference patching through nn.intercept_methods.
# ----------------------------------------------------------------------------


def _is_port(context) -> bool:
  return isinstance(context.module, M.Attention) and context.method_name == 'read'


@functools.partial(jax.jit, static_argnames=('config', 'n_patch'))
def record_ports(variables: dict, config: SmolLMConfig, tokens: jax.Array,
                 valid: jax.Array, span_mask: Optional[jax.Array], n_patch: int) -> jax.Array:
  """Π_S h (h if span_mask is None) at the last n_patch positions, every layer.

  Returns [L, B, n, H, Dh], recorded by intercepting the read ports.
  """
  rec = {}

  def interceptor(next_fun, args, kwargs, context):
    h = next_fun(*args, **kwargs)
    if _is_port(context):
      hs = h if span_mask is None else next_fun(*args, **{**kwargs, 'span_mask': span_mask})
      rec[M.layer_index(context.module.path)] = hs[:, hs.shape[1] - n_patch:]
    return h

  with nn.intercept_methods(interceptor):
    SmolLM(config).apply(variables, tokens, valid, n_logits=1)
  return jnp.stack([rec[i] for i in range(config.n_layers)])


@functools.partial(jax.jit, static_argnames=('config', 'n_patch', 'n_logits'))
def patched_run(variables: dict, config: SmolLMConfig, tokens: jax.Array,
                valid: jax.Array, layer: jax.Array, clean: jax.Array,
                span_mask: Optional[jax.Array], n_patch: int,
                n_logits: Optional[int] = None) -> jax.Array:
  """Full forward on `tokens` [B, T] with the port of layer `layer` patched.

  `tokens`/`valid` are the model input as given (to score an answer batch,
  pass `EncodedBatch.inputs` and score with `tail_loglik`).

  At the last n_patch positions h ← h − Π_S h + clean[layer], where clean
  [L, B, n_patch, H, Dh] = Π_S h of the source run (`record_ports`) and S =
  span_mask [B, N] (None: the whole site). `layer` is a traced int (−1: no
  patch). Returns logits [B, n_logits or T, V].
  """
  def interceptor(next_fun, args, kwargs, context):
    if not _is_port(context):
      return next_fun(*args, **kwargs)
    h = next_fun(*args, **kwargs)
    hs = h if span_mask is None else next_fun(*args, **{**kwargs, 'span_mask': span_mask})
    i = M.layer_index(context.module.path)
    t0 = h.shape[1] - n_patch
    delta = jnp.where(layer == i, clean[i] - hs[:, t0:], 0.0)
    return h.at[:, t0:].add(delta.astype(h.dtype))

  with nn.intercept_methods(interceptor):
    return SmolLM(config).apply(variables, tokens, valid, n_logits=n_logits)


# ----------------------------------------------------------------------------
# Fast causal patching.
# ----------------------------------------------------------------------------


def _tail_spans(cache: dict, span_masks: jax.Array, n: int) -> jax.Array:
  """Π_S h at the last n positions for every layer and span: [L, S, B, n, H, Dh]."""
  valid = cache['valid']
  t = valid.shape[-1]
  mask = M.causal_mask(valid)[:, t - n:]  # [B, n, T]
  a = M.attention_weights(cache['q'][:, :, t - n:], cache['k'], mask)  # [L,B,K,G,n,T]
  per_span = lambda s: M.read_values(a, cache['v'], s)  # [L, B, n, H, Dh]
  return jax.vmap(per_span, out_axes=1)(span_masks)


def _attend_tail(q: jax.Array, k_pre: jax.Array, v_pre: jax.Array, k: jax.Array,
                 v: jax.Array, mask: jax.Array) -> jax.Array:
  """Tail attention over shared prefix keys and per-probe tail keys.

  q [P, B, n, H, Dh]; k_pre/v_pre [B, t0, K, Dh] (shared by all probes, never
  broadcast); k/v [P, B, n, K, Dh]; mask [B, n, t0 + n]. Same softmax as
  `model.attention_weights` over the concatenated keys; returns [P, B, n, H, Dh].
  """
  p, b, n, h, dh = q.shape
  kv = k.shape[-2]
  t0 = k_pre.shape[1]
  qg = M._f32(q.reshape(p, b, n, kv, h // kv, dh))
  s_pre = jnp.einsum('pbqkgd,bskd->pbkgqs', qg, k_pre.astype(qg.dtype))
  s_new = jnp.einsum('pbqkgd,pbskd->pbkgqs', qg, k.astype(qg.dtype))
  s = jnp.concatenate([s_pre, s_new], axis=-1) * (dh ** -0.5)
  m = mask[None, :, None, None]  # [1, B, 1, 1, n, T]
  a = jax.nn.softmax(jnp.where(m, s, M.NEG_INF), axis=-1) * m
  out = (jnp.einsum('pbkgqs,bskd->pbqkgd', a[..., :t0], v_pre.astype(a.dtype))
         + jnp.einsum('pbkgqs,pbskd->pbqkgd', a[..., t0:], v.astype(a.dtype)))
  return out.reshape(p, b, n, h, dh)


def _layer_tail(p: dict, config: SmolLMConfig, x: jax.Array, k_pre: jax.Array,
                v_pre: jax.Array, positions: jax.Array, mask: jax.Array,
                delta: jax.Array) -> jax.Array:
  """One decoder layer on the tail only: x [P, B, n, E] -> [P, B, n, E].

  k_pre/v_pre [B, t0, K, Dh]: cached keys/values of the unpatched prefix;
  positions [B, n]; mask [B, n, T]; delta [P, B, n, H, Dh] added to the read.
  """
  c = config
  pa = p['attn']
  xn = M.rms_norm(x, p['attn_norm']['scale'], c.norm_eps)
  lead = x.shape[:-1]
  q = (xn @ pa['q_proj']['kernel']).reshape(*lead, c.n_heads, c.head_dim)
  k = (xn @ pa['k_proj']['kernel']).reshape(*lead, c.n_kv_heads, c.head_dim)
  v = (xn @ pa['v_proj']['kernel']).reshape(*lead, c.n_kv_heads, c.head_dim)
  q = M.apply_rope(q, positions, c.rope_base)
  k = M.apply_rope(k, positions, c.rope_base)
  h = _attend_tail(q, k_pre, v_pre, k, v, mask) + delta
  x = x + h.reshape(*lead, -1) @ pa['o_proj']['kernel']
  pm = p['mlp']
  xn = M.rms_norm(x, p['mlp_norm']['scale'], c.norm_eps)
  return x + M.swiglu(xn, pm['gate_proj']['kernel'], pm['up_proj']['kernel'],
                      pm['down_proj']['kernel'])


def fast_patch_hidden(variables: dict, config: SmolLMConfig, clean: dict,
                      corrupt: dict, span_masks: jax.Array, n_tail: int,
                      tail_mask: Optional[jax.Array] = None, groups: int = 5) -> jax.Array:
  """Final-norm hidden states [L, S, B, n, E] of every (layer, span) probe.

  clean/corrupt: caches of `SmolLM(..., return_cache=True)` on token-aligned
  inputs with the same `valid`. Probe (ℓ, s) is the corrupted run with the
  port of layer ℓ at the last n positions set to h − Π_S h + Π_S h_clean,
  S = span_masks[s] [B, N] (all True: the whole site). tail_mask [B, n]
  restricts the patch to some of the tail positions (default: all). groups:
  number of layer groups (static; more groups waste less work, compile more).
  """
  c = config
  params = variables['params']
  t = corrupt['valid'].shape[-1]
  t0 = t - n_tail
  delta = _tail_spans(clean, span_masks, n_tail) - _tail_spans(corrupt, span_masks, n_tail)
  if tail_mask is not None:
    delta = delta * tail_mask[:, :, None, None].astype(delta.dtype)
  positions = corrupt['positions'][:, t0:]
  mask = M.causal_mask(corrupt['valid'])[:, t0:]
  n_span = span_masks.shape[0]
  n_probe = c.n_layers * n_span
  entry = np.repeat(np.arange(c.n_layers), n_span)  # [P] layer ℓ of each probe
  delta = delta.reshape((n_probe,) + delta.shape[2:])  # [P, B, n, H, Dh]
  xs_all = (jax.tree.map(lambda *a: jnp.stack(a),
                         *[params[f'layers_{i}'] for i in range(c.n_layers)]),
            corrupt['x'][:, :, t0:], corrupt['k'][:, :, :t0], corrupt['v'][:, :, :t0],
            jnp.arange(c.n_layers))
  bounds = np.linspace(0, c.n_layers, min(groups, c.n_layers) + 1).round().astype(int)
  x = jnp.zeros((0,) + corrupt['x'].shape[1:2] + (n_tail, c.width), corrupt['x'].dtype)
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    # Layers lo..hi-1 form one lax.scan (one compiled body) over the probes that
    # entered before hi; probes entering inside the group carry the corrupted
    # run's residual until their layer. Groups bound the wasted work to about
    # (1 + 1/groups) / 2 of a single scan over every probe and layer.
    ent = jnp.asarray(entry[:hi * n_span])
    dl = delta[:hi * n_span]
    x = jnp.concatenate([x, jnp.zeros((hi * n_span - x.shape[0],) + x.shape[1:], x.dtype)])

    def body(x, xs, ent=ent, dl=dl):
      p, x_corr, k_pre, v_pre, i = xs
      x = jnp.where((ent >= i)[:, None, None, None], x_corr[None], x)
      d = dl * (ent == i)[:, None, None, None, None].astype(dl.dtype)
      return _layer_tail(p, c, x, k_pre, v_pre, positions, mask, d), None

    x, _ = jax.lax.scan(body, x, jax.tree.map(lambda a: a[lo:hi], xs_all))
  x = M.rms_norm(x, params['final_norm']['scale'], c.norm_eps)
  return x.reshape((c.n_layers, n_span) + x.shape[1:])


@functools.partial(jax.jit, static_argnames=('config', 'n_tail', 'chunk', 'groups'))
def fast_patch_audit(variables: dict, config: SmolLMConfig, clean_tokens: jax.Array,
                     corrupt_tokens: jax.Array, valid: jax.Array, answer_mask: jax.Array,
                     span_masks: jax.Array, n_tail: int,
                     tail_mask: Optional[jax.Array] = None, chunk: int = 5,
                     groups: int = 5) -> dict:
  """Every-layer × every-span interchange audit in one compiled call.

  clean_tokens/corrupt_tokens [B, T] token-aligned (same `valid`, left-padded,
  answer at the end, as from `encode_batch`); answer_mask [B, T]; span_masks
  [S, B, N] bool over source positions (N <= T; an all-True row is the
  full-site patch); n_tail ≥ max answer length (`EncodedBatch.n_tail`). The
  model reads tokens[:, :-1]; the patched positions are its last n_tail ones,
  those whose logits score the answer; tail_mask [B, n_tail] restricts them.
  Returns {'L_plus' [B], 'L_minus' [B], 'L_int' [L, S, B]} gold
  log-likelihoods (SPEC §1).
  """
  model = SmolLM(config)
  t_in = clean_tokens.shape[1] - 1
  valid_in = valid[:, :-1]
  span_masks = span_masks[..., :t_in]
  lc, clean = model.apply(variables, clean_tokens[:, :-1], valid_in, n_logits=n_tail,
                          return_cache=True)
  lr, corrupt = model.apply(variables, corrupt_tokens[:, :-1], valid_in, n_logits=n_tail,
                            return_cache=True)
  hid = fast_patch_hidden(variables, config, clean, corrupt, span_masks, n_tail, tail_mask,
                          groups)
  emb = variables['params']['embed']['embedding']
  score = lambda h: tail_loglik(h @ emb.T, corrupt_tokens, answer_mask)  # [S, B]
  l_int = jax.lax.map(score, hid, batch_size=chunk)
  return {'L_plus': tail_loglik(lc, clean_tokens, answer_mask),
          'L_minus': tail_loglik(lr, corrupt_tokens, answer_mask), 'L_int': l_int}
