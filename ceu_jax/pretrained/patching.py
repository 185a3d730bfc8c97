"""Scoring, greedy decoding and the fast causal-tail audit of the pretrained LM.

* `answer_loglik` / `engine_loglik_fn`: gold log-likelihood log p(y* | prompt)
  [B] of left-padded prompt+answer batches (`tokenizer.encode_batch`), teacher
  forcing, summed over answer tokens (SPEC §1). `engine_loglik_fn` is the
  engine's ``loglik_fn(variables, inputs)`` for the inputs pytree of
  `engine_inputs`; the read ports are `read_port_sites` (`layers_{i}/attn:read`).
* `fast_patch_audit`: the engine's interchange intervention (SPEC §1) at every
  layer's read port for a whole `engine.Probes` set at once, restricted to the
  last `n_tail` reader positions (the probes' `positions`), recomputing only
  those positions from layer ℓ on. In a causal decoder a patch at positions
  ≥ t0 leaves every earlier position unchanged in every layer, so the tail
  queries attend to the corrupted run's cached keys/values at positions < t0
  and to recomputed ones in the tail. All probes run together through a few
  `lax.scan`s over groups of layers: a probe joins at the start of its layer's
  group and carries the corrupted residual until its layer, so about
  (1 + 1/groups) · L² · K / 2 tail-layer passes replace L · K full forwards.
  Returns an `engine.Profile` (one `engine.AuditResult` per layer, scores from
  `engine.from_logliks`).
* `reference_audit`: the same numbers through the generic engine
  (`engine.record` on D+, `engine.patch` on D−, one full forward per layer and
  probe): the independent reference the fast path is tested against.

Shape legend: B batch, T sequence length (the model reads T_in = T − 1
positions), n = n_tail (last reader positions recomputed, t0 = T_in − n), E
width, H heads (the site's port axis P), K KV heads, Dh head dim, V
vocabulary, L layers, Q probes (the engine's K axis), R probes in flight
(L · Q), N span length (≤ T_in).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax import engine
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
  logp = jax.nn.log_softmax(M.as_f32(logits), axis=-1)
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


def read_port_sites(config: SmolLMConfig) -> list[engine.Site]:
  """The engine sites of every read port, in layer order (`layers_{i}/attn:read`)."""
  return [engine.Site(f'layers_{i}/attn', 'read') for i in range(config.n_layers)]


def engine_inputs(batch) -> dict:
  """The inputs pytree of `engine_loglik_fn` from an `EncodedBatch` (numpy)."""
  return {'tokens': batch.tokens, 'valid': batch.valid, 'answer_mask': batch.answer_mask}


def answer_positions(answer_mask: jax.Array) -> jax.Array:
  """[B, T_in] reader positions whose logits score an answer token (answer_mask [B, T]).

  Input position j predicts token j + 1; use it as the probes' `positions`.
  """
  return answer_mask[:, 1:]


@functools.partial(jax.jit, static_argnames=('config',))
def greedy_next_token(variables, config, tokens, valid):
  logits = SmolLM(config).apply(variables, tokens, valid, n_logits=1)
  return jnp.argmax(logits[:, -1], axis=-1)


def greedy_generate(variables: dict, config: SmolLMConfig, prompt_ids: list[int],
                    n_new: int, width: Optional[int] = None) -> list[int]:
  """Greedy continuation (n_new ids) of one prompt; one compile for all steps.

  The prompt sits right-aligned in a fixed buffer of `width` tokens (default
  len(prompt) + n_new; left pads masked), which shifts left by one token per step.
  Prompts of many lengths given one `width` share one compiled forward.
  """
  t = len(prompt_ids) + n_new if width is None else width
  if t < len(prompt_ids) + n_new:
    raise ValueError(f'width={width} must be >= len(prompt_ids) + n_new = '
                     f'{len(prompt_ids) + n_new}')
  if t > config.max_len:
    raise ValueError(f'{t} tokens exceed the maximum length {config.max_len}')
  tokens = np.zeros((1, t), np.int32)
  valid = np.zeros((1, t), bool)
  tokens[0, t - len(prompt_ids):], valid[0, t - len(prompt_ids):] = prompt_ids, True
  out = []
  for _ in range(n_new):
    nxt = int(greedy_next_token(variables, config, tokens, valid)[0])
    out.append(nxt)
    tokens = np.concatenate([tokens[:, 1:], [[nxt]]], axis=1)
    valid = np.concatenate([valid[:, 1:], [[True]]], axis=1)
  return out


# ----------------------------------------------------------------------------
# Fast causal patching.
# ----------------------------------------------------------------------------


def tail_spans(cache: dict, span_masks: jax.Array, n: int) -> jax.Array:
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

  q [R, B, n, H, Dh]; k_pre/v_pre [B, t0, K, Dh] (shared by all probes, never
  broadcast); k/v [R, B, n, K, Dh]; mask [B, n, t0 + n]. Same softmax as
  `model.attention_weights` over the concatenated keys; returns [R, B, n, H, Dh].
  """
  p, b, n, h, dh = q.shape
  kv = k.shape[-2]
  t0 = k_pre.shape[1]
  qg = M.as_f32(q.reshape(p, b, n, kv, h // kv, dh))
  s_pre = jnp.einsum('pbqkgd,bskd->pbkgqs', qg, k_pre.astype(qg.dtype))
  s_new = jnp.einsum('pbqkgd,pbskd->pbkgqs', qg, k.astype(qg.dtype))
  s = jnp.concatenate([s_pre, s_new], axis=-1) * (dh ** -0.5)
  m = mask[None, :, None, None]  # [1, B, 1, 1, n, T]
  a = jax.nn.softmax(jnp.where(m, s, M.NEG_INF), axis=-1) * m
  out = (jnp.einsum('pbkgqs,bskd->pbqkgd', a[..., :t0], v_pre.astype(a.dtype))
         + jnp.einsum('pbkgqs,pbskd->pbqkgd', a[..., t0:], v.astype(a.dtype)))
  return out.reshape(p, b, n, h, dh)


def layer_tail(p: dict, config: SmolLMConfig, x: jax.Array, k_pre: jax.Array,
                v_pre: jax.Array, positions: jax.Array, mask: jax.Array,
                delta: jax.Array) -> jax.Array:
  """One decoder layer on the tail only: x [R, B, n, E] -> [R, B, n, E].

  k_pre/v_pre [B, t0, K, Dh]: cached keys/values of the unpatched prefix;
  positions [B, n]; mask [B, n, T]; delta [R, B, n, H, Dh] added to the read.
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


def _patched_hidden(variables: dict, config: SmolLMConfig, clean: dict, corrupt: dict,
                    span_masks: jax.Array, patch_mask: jax.Array, n_tail: int,
                    groups: int) -> jax.Array:
  """Final-norm hidden states [L, Q, B, n, E] of every (layer, probe) intervention.

  clean/corrupt: caches of `SmolLM(..., return_cache=True)` on token-aligned
  inputs with the same `valid`. Probe (ℓ, q) is the corrupted run with the
  port of layer ℓ at the last n positions set to h + m·(Π_S h_clean − Π_S h),
  S = span_masks[q] [B, N], m = patch_mask[q] [B, n, H] (the probe's positions
  × ports; bool masks select, float masks interpolate, as in `engine.patch`).
  groups: number of layer groups (static; more groups waste less work,
  compile more).
  """
  c = config
  params = variables['params']
  t = corrupt['valid'].shape[-1]
  t0 = t - n_tail
  delta = tail_spans(clean, span_masks, n_tail) - tail_spans(corrupt, span_masks, n_tail)
  delta = delta * patch_mask[None, ..., None].astype(delta.dtype)  # [L, Q, B, n, H, Dh]
  positions = corrupt['positions'][:, t0:]
  mask = M.causal_mask(corrupt['valid'])[:, t0:]
  n_span = span_masks.shape[0]
  n_probe = c.n_layers * n_span
  entry = np.repeat(np.arange(c.n_layers), n_span)  # [R] layer ℓ of each probe
  delta = delta.reshape((n_probe,) + delta.shape[2:])  # [R, B, n, H, Dh]
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
      return layer_tail(p, c, x, k_pre, v_pre, positions, mask, d), None

    x, _ = jax.lax.scan(body, x, jax.tree.map(lambda a: a[lo:hi], xs_all))
  x = M.rms_norm(x, params['final_norm']['scale'], c.norm_eps)
  return x.reshape((c.n_layers, n_span) + x.shape[1:])




_INPUT_KEYS = ('tokens', 'valid', 'answer_mask')


def _concrete(x) -> Optional[np.ndarray]:
  """x as numpy, or None while it is being traced (checks then happen at trace)."""
  return None if isinstance(x, jax.core.Tracer) else np.asarray(x)


def _check_audit_args(config: SmolLMConfig, clean: dict, corrupt: dict,
                      probes: engine.Probes, n_tail: int) -> None:
  """Raises ValueError naming the field before anything is compiled."""
  for name, inp in (('clean', clean), ('corrupt', corrupt)):
    if not isinstance(inp, dict) or set(inp) != set(_INPUT_KEYS):
      raise ValueError(f'`{name}` must be a dict with keys {_INPUT_KEYS} (see '
                       f'`engine_inputs`), got {type(inp).__name__} '
                       f'{sorted(inp) if isinstance(inp, dict) else ""}')
    for k in _INPUT_KEYS:
      if np.ndim(inp[k]) != 2 or np.shape(inp[k]) != np.shape(clean['tokens']):
        raise ValueError(f'`{name}[{k!r}]` has shape {np.shape(inp[k])}; every input must '
                         f'be [B, T] = {np.shape(clean["tokens"])}')
  b, t = np.shape(clean['tokens'])
  t_in = t - 1
  if not 1 <= n_tail <= t_in:
    raise ValueError(f'n_tail={n_tail} must be in [1, {t_in}] (the model reads T - 1 = '
                     f'{t_in} positions)')
  for k in ('valid', 'answer_mask'):
    a, m = _concrete(clean[k]), _concrete(corrupt[k])
    if a is not None and m is not None and not (a == m).all():
      raise ValueError(f'clean[{k!r}] and corrupt[{k!r}] differ: D+ and D− must be '
                       'token-aligned')
  am = _concrete(clean['answer_mask'])
  if am is not None and am[:, :t - n_tail].any():
    raise ValueError(f'answer tokens lie before the last n_tail={n_tail} positions; pass '
                     'n_tail >= the longest answer (`EncodedBatch.n_tail`)')
  probes.validate()
  if probes.span is not None and (probes.span.shape[1] != b or probes.span.shape[2] > t_in):
    raise ValueError(f'probe field `span` has shape {tuple(probes.span.shape)}; expected '
                     f'[Q, B={b}, N <= {t_in}] over the reader positions')
  if probes.ports is not None and (probes.ports.shape[-1] != config.n_heads or (
      probes.ports.ndim == 3 and probes.ports.shape[1] != b)):
    raise ValueError(f'probe field `ports` has shape {tuple(probes.ports.shape)}; expected '
                     f'[Q, H={config.n_heads}] or [Q, B={b}, H]')
  pos = probes.positions
  if pos is None:
    if n_tail < t_in:
      raise ValueError('probe field `positions` is required: the fast path patches only '
                       f'the last n_tail={n_tail} of {t_in} reader positions (e.g. '
                       '`answer_positions(answer_mask)` per probe)')
    return
  if pos.shape[-1] != t_in or (pos.ndim == 3 and pos.shape[1] != b):
    raise ValueError(f'probe field `positions` has shape {tuple(pos.shape)}; expected '
                     f'[Q, T_in={t_in}] or [Q, B={b}, T_in]')
  p = _concrete(pos)
  if p is not None and (p[..., :t_in - n_tail] != 0).any():
    raise ValueError(f'probe field `positions` selects reader positions before the last '
                     f'n_tail={n_tail}; the fast path recomputes only those (raise n_tail)')


@functools.partial(jax.jit, static_argnames=('config', 'n_tail', 'chunk', 'groups'))
def _fast_audit(variables: dict, config: SmolLMConfig, clean: dict, corrupt: dict,
                probes: engine.Probes, eps: jax.Array, n_tail: int, chunk: int,
                groups: int) -> engine.Profile:
  model = SmolLM(config)
  tokens_p, tokens_m = clean['tokens'], corrupt['tokens']
  b, t = tokens_p.shape
  t_in = t - 1
  valid_in = clean['valid'][:, :-1]
  answer_mask = clean['answer_mask']
  n_q = probes.num
  span = (jnp.ones((n_q, b, t_in), bool) if probes.span is None
          else probes.span)  # [Q, B, N]; Π_S with S = all is h exactly
  lead = lambda m: m if m.ndim == 3 else m[:, None]  # [Q, X] -> [Q, 1, X]
  pos = (jnp.ones((n_q, b, n_tail), bool) if probes.positions is None
         else jnp.broadcast_to(lead(probes.positions)[..., t_in - n_tail:], (n_q, b, n_tail)))
  ports = (jnp.ones((n_q, b, config.n_heads), bool) if probes.ports is None
           else jnp.broadcast_to(lead(probes.ports), (n_q, b, config.n_heads)))
  if pos.dtype == jnp.bool_ and ports.dtype == jnp.bool_:
    patch_mask = pos[..., None] & ports[:, :, None]  # [Q, B, n, H]
  else:  # soft masks interpolate, as in engine.patch
    ft = jnp.result_type(pos.dtype, ports.dtype, jnp.float32)
    patch_mask = pos[..., None].astype(ft) * ports[:, :, None].astype(ft)
  lc, cache_p = model.apply(variables, tokens_p[:, :-1], valid_in, n_logits=n_tail,
                            return_cache=True)
  lr, cache_m = model.apply(variables, tokens_m[:, :-1], valid_in, n_logits=n_tail,
                            return_cache=True)
  hid = _patched_hidden(variables, config, cache_p, cache_m, span, patch_mask, n_tail,
                        groups)  # [L, Q, B, n, E]
  emb = variables['params']['embed']['embedding']
  score = lambda h: tail_loglik(M.unembed(h, emb), tokens_m, answer_mask)  # [Q, B]
  l_int = jax.lax.map(score, hid, batch_size=chunk)  # [L, Q, B]
  l_plus = tail_loglik(lc, tokens_p, answer_mask)
  l_minus = tail_loglik(lr, tokens_m, answer_mask)
  names = probes.names or tuple(f'probe_{i}' for i in range(n_q))
  sites = [str(s) for s in read_port_sites(config)]
  return engine.Profile(
      tuple(engine.from_logliks(l_plus, l_minus, l_int[i], eps, names, s)
            for i, s in enumerate(sites)), tuple(sites))


def fast_patch_audit(variables: dict, config: SmolLMConfig, *, clean: dict, corrupt: dict,
                     probes: engine.Probes, n_tail: int, eps: float = engine.scores.DEFAULT_EPS,
                     chunk: int = 5, groups: int = 5) -> engine.Profile:
  """The engine's audit at every read port for every probe, in one compiled call.

  clean / corrupt: D+ / D− inputs `{'tokens', 'valid', 'answer_mask'}` [B, T]
  (`engine_inputs` of token-aligned `encode_batch` rows: same `valid` and
  answer positions, left-padded, answer at the end), the same pytrees as
  `engine_loglik_fn(config, n_tail)` takes. probes: an `engine.Probes` set
  over the site `layers_ℓ/attn:read` (h [B, T_in, H, Dh]): `span` [Q, B, N]
  (N ≤ T_in; absent: the whole port), `ports` [Q, H] or [Q, B, H] (heads),
  `positions` [Q, T_in] or [Q, B, T_in], which must be zero before the last
  n_tail positions (e.g. `answer_positions`); absent only when n_tail = T_in.
  n_tail ≥ the longest answer (`EncodedBatch.n_tail`). chunk: layers scored per
  step of the final `lax.map`; groups: layer groups of the tail recomputation.

  Returns an `engine.Profile` with one `engine.AuditResult` per layer (sites
  `read_port_sites(config)`, probes by `probes.names`), the same numbers as
  `reference_audit` (tested to 1e-5).
  """
  _check_audit_args(config, clean, corrupt, probes, n_tail)
  return _fast_audit(variables, config, clean, corrupt, probes, jnp.asarray(eps),
                     n_tail=n_tail, chunk=chunk, groups=groups)


# ----------------------------------------------------------------------------
# Reference: the generic engine, one full forward per (layer, probe).
# ----------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(0,))
def _plain_loglik(loglik_fn, variables, inputs):
  return loglik_fn(variables, inputs)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _record_all(loglik_fn, sites: tuple, variables, inputs, span):
  return engine.record(loglik_fn, variables, inputs, list(sites), span_mask=span)[1]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _patch_one(loglik_fn, site, variables, inputs, value, span, ports, positions):
  return engine.patch(loglik_fn, variables, inputs, site, value, span_mask=span,
                      port_mask=ports, position_mask=positions)


def reference_audit(variables: dict, config: SmolLMConfig, *, clean: dict, corrupt: dict,
                    probes: engine.Probes, n_tail: int, layers: Optional[list[int]] = None,
                    eps: float = engine.scores.DEFAULT_EPS) -> engine.Profile:
  """`fast_patch_audit` through `engine.record` / `engine.patch` (same arguments).

  Per probe q: one run of D+ recording Π_S h (h without a span) at every
  selected port, then per layer one full patched run of D− (`engine.patch`
  with the probe's span, ports and positions). Slow and independent of the
  fast path: the reference it is tested against. `layers`: a subset (default
  all); the returned profile holds those sites only.
  """
  _check_audit_args(config, clean, corrupt, probes, n_tail)
  variables, clean, corrupt = jax.device_put((variables, clean, corrupt))  # once, not per call
  loglik_fn = engine_loglik_fn(config, n_tail)
  sites = read_port_sites(config)
  sites = tuple(sites if layers is None else [sites[i] for i in layers])
  l_plus = _plain_loglik(loglik_fn, variables, clean)
  l_minus = _plain_loglik(loglik_fn, variables, corrupt)
  field = lambda f, q: None if getattr(probes, f) is None else getattr(probes, f)[q]
  l_int = [[None] * probes.num for _ in sites]
  for q in range(probes.num):
    rec = _record_all(loglik_fn, sites, variables, clean, field('span', q))
    for i, site in enumerate(sites):
      l_int[i][q] = _patch_one(loglik_fn, site, variables, corrupt, rec[site], field('span', q),
                               field('ports', q), field('positions', q))
  names = probes.names or tuple(f'probe_{i}' for i in range(probes.num))
  return engine.Profile(
      tuple(engine.from_logliks(l_plus, l_minus, jnp.stack(l_int[i]), eps, names, str(s))
            for i, s in enumerate(sites)), tuple(str(s) for s in sites))
