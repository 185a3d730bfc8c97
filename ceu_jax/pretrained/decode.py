"""Fast greedy decoding and batched scoring for SmolLM2 (preallocated key/value cache).

Everything here is a pure function of the parameters stacked per layer
(`stack_params`), so the 30 layers run as one `lax.scan` (one compiled layer
body) and nothing goes through linen. The reference is the uncached
`patching.greedy_generate` (full forward per token); the tests check token
equality against it.

Keys and values a batch attends to:

    shared prefix [L, C, K, Dh]      computed once (`prefix_cache`), stored once, seen by every row
    row cache     [L, B, S, K, Dh]   S = P + N slots: the prompt (P, left-padded), then the N fed tokens

RoPE positions come from the valid tokens only (as `model.positions_from_valid`
does): the shared prefix has positions 0..C-1, the j-th real prompt token of a
row C + j, and its t-th generated token C + len + t, whatever the padding.
Attention masks pads and slots not yet written; one softmax spans the three key
sets (prefix, row cache, new tokens), so the split changes nothing but speed.

Compilation: `prefill` once per (B, C, P, N), `decode_chunk` once per
(B, C, S, chunk), `prefix_cache` once per C. The host driver (`Decoder`) pads
batches to a few batch sizes and lengths to buckets, so calls with other prompts
of similar lengths reuse the compiled programs.

Shape legend: B batch, C shared-prefix length, P prompt bucket, N fed-token
slots, S = P + N row-cache slots, T tokens fed in one call, n answer tail,
L layers, E width, Hq query heads, K KV heads, G = Hq / K, Dh head dim,
V vocabulary.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ceu_jax.pretrained import model as M
from ceu_jax.pretrained.model import SmolLMConfig
from ceu_jax.pretrained.tokenizer import PAD_ID

STOP_TOKEN, STOP_STRING, LENGTH = 'stop_token', 'stop_string', 'length'


def stack_params(variables: dict, config: SmolLMConfig) -> dict:
  """{'layers': per-layer params stacked on a leading [L] axis, 'embed' [V, E], 'norm' [E]}."""
  p = variables['params']
  layers = [p[f'layers_{i}'] for i in range(config.n_layers)]
  return {'layers': jax.tree.map(lambda *a: jnp.stack(a), *layers),
          'embed': jnp.asarray(p['embed']['embedding']),
          'norm': jnp.asarray(p['final_norm']['scale'])}


# ----------------------------------------------------------------------------
# Pure, jitted pieces.
# ----------------------------------------------------------------------------


def _attend(q, pre_k, pre_v, ctx_k, ctx_v, ctx_mask, k, v, self_mask):
  """Attention of q [B,T,Hq,Dh] over three key sets at once (one softmax, as in
  `model.attention_weights`): the shared prefix pre_k/pre_v [C,K,Dh] (visible to
  every row, stored once), the row cache ctx_k/ctx_v [B,S,K,Dh] where ctx_mask
  [B,S], and the T new keys k/v [B,T,K,Dh] where self_mask [B,T,T]. Returns [B,T,Hq,Dh]."""
  b, t, hq, dh = q.shape
  kv = k.shape[-2]
  c, s_len = pre_k.shape[0], ctx_k.shape[1]
  qg = M.as_f32(q.reshape(b, t, kv, hq // kv, dh))
  s_pre = jnp.einsum('btkgd,ckd->bkgtc', qg, pre_k.astype(qg.dtype))
  s_ctx = jnp.einsum('btkgd,bskd->bkgts', qg, ctx_k.astype(qg.dtype))
  s_new = jnp.einsum('btkgd,bskd->bkgts', qg, k.astype(qg.dtype))
  s = jnp.concatenate([s_pre, s_ctx, s_new], axis=-1) * (dh ** -0.5)
  m = jnp.concatenate([jnp.ones((b, t, c), bool),
                       jnp.broadcast_to(ctx_mask[:, None, :], (b, t, s_len)), self_mask],
                      axis=-1)[:, None, None]  # [B, 1, 1, T, C + S + T]
  a = jax.nn.softmax(jnp.where(m, s, M.NEG_INF), axis=-1) * m
  out = (jnp.einsum('bkgtc,ckd->btkgd', a[..., :c], pre_v.astype(a.dtype))
         + jnp.einsum('bkgts,bskd->btkgd', a[..., c:c + s_len], ctx_v.astype(a.dtype))
         + jnp.einsum('bkgts,bskd->btkgd', a[..., c + s_len:], v.astype(a.dtype)))
  return out.reshape(b, t, hq, dh)


def _layer(p: dict, c: SmolLMConfig, x, positions, pre_k, pre_v, ctx_k, ctx_v, ctx_mask,
           self_mask):
  """One decoder layer on the T new tokens x [B,T,E]; returns (x', k [B,T,K,Dh], v)."""
  pa = p['attn']
  b, t, _ = x.shape
  xn = M.rms_norm(x, p['attn_norm']['scale'], c.norm_eps)
  q = (xn @ pa['q_proj']['kernel']).reshape(b, t, c.n_heads, c.head_dim)
  k = (xn @ pa['k_proj']['kernel']).reshape(b, t, c.n_kv_heads, c.head_dim)
  v = (xn @ pa['v_proj']['kernel']).reshape(b, t, c.n_kv_heads, c.head_dim)
  q = M.apply_rope(q, positions, c.rope_base)
  k = M.apply_rope(k, positions, c.rope_base)
  h = _attend(q, pre_k, pre_v, ctx_k, ctx_v, ctx_mask, k, v, self_mask)
  x = x + h.reshape(b, t, -1) @ pa['o_proj']['kernel']
  pm = p['mlp']
  xn = M.rms_norm(x, p['mlp_norm']['scale'], c.norm_eps)
  x = x + M.swiglu(xn, pm['gate_proj']['kernel'], pm['up_proj']['kernel'],
                   pm['down_proj']['kernel'])
  return x, k, v


def empty_cache(config: SmolLMConfig, batch: Optional[int] = None):
  """A zero-length prefix [L, 0, K, Dh] (batch None) or row cache [L, B, 0, K, Dh]."""
  lead = (config.n_layers,) if batch is None else (config.n_layers, batch)
  return jnp.zeros(lead + (0, config.n_kv_heads, config.head_dim), config.dtype)


def forward(params: dict, config: SmolLMConfig, tokens, positions, valid, pre_k, pre_v,
            ctx_k, ctx_v, ctx_mask, n_logits: int = 1):
  """Run T new tokens [B,T] (RoPE `positions` [B,T], `valid` [B,T]) after cached ones.

  pre_k/pre_v [L,C,K,Dh]: a shared prefix every row attends to; ctx_k/ctx_v
  [L,B,S,K,Dh]: per-row cached keys/values, visible where ctx_mask [B,S] (C and
  S may be 0). Returns (logits [B, n_logits, V] of the last n_logits new
  positions, k [L,B,T,K,Dh], v [L,B,T,K,Dh]).
  """
  t = tokens.shape[1]
  self_mask = M.causal_mask(valid)
  x = params['embed'][tokens].astype(config.dtype)

  def body(x, xs):
    p, pk, pv, ck, cv = xs
    x, k, v = _layer(p, config, x, positions, pk, pv, ck, cv, ctx_mask, self_mask)
    return x, (k, v)

  x, (k, v) = jax.lax.scan(body, x, (params['layers'], pre_k, pre_v, ctx_k, ctx_v))
  x = M.rms_norm(x[:, t - n_logits:], params['norm'], config.norm_eps)
  return M.unembed(x, params['embed']), k, v


@struct.dataclass
class DecodeState:
  """Everything a decode step reads and writes (one batch; the shared prefix is separate)."""
  k: jax.Array  # [L, B, S, K, Dh] cached rotated keys (S = P + N row slots)
  v: jax.Array  # [L, B, S, K, Dh] cached values
  filled: jax.Array  # [B, S] bool: slot holds a real token
  token: jax.Array  # [B] int32: last generated token (fed at the next step)
  pos: jax.Array  # [B] int32: its RoPE position
  slot: jax.Array  # [] int32: the row slot it is written to


@functools.partial(jax.jit, static_argnames=('config',))
def prefix_cache(params: dict, config: SmolLMConfig, tokens: jax.Array):
  """Keys/values [L, C, K, Dh] of a shared prefix tokens [1, C] (positions 0..C-1)."""
  c = tokens.shape[1]
  e0, e1 = empty_cache(config), empty_cache(config, 1)
  _, k, v = forward(params, config, tokens, jnp.arange(c)[None], jnp.ones((1, c), bool),
                    e0, e0, e1, e1, jnp.zeros((1, 0), bool))
  return k[:, 0], v[:, 0]


@functools.partial(jax.jit, static_argnames=('config', 'n_slots', 'with_logits'))
def prefill(params: dict, config: SmolLMConfig, prefix_k: jax.Array, prefix_v: jax.Array,
            tokens: jax.Array, valid: jax.Array, n_slots: int, with_logits: bool = False):
  """Prompts tokens/valid [B, P] (left-padded) after a shared prefix [L, C, K, Dh].

  Returns (DecodeState with S = P + n_slots row slots, first greedy token [B]),
  plus the last position's logits [B, V] when with_logits.
  """
  c = prefix_k.shape[1]
  b, p = tokens.shape
  e = empty_cache(config, b)
  positions = c + M.positions_from_valid(valid)
  logits, k, v = forward(params, config, tokens, positions, valid, prefix_k, prefix_v, e, e,
                         jnp.zeros((b, 0), bool))
  pad = jnp.zeros(k.shape[:2] + (n_slots,) + k.shape[3:], k.dtype)
  first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
  state = DecodeState(
      k=jnp.concatenate([k, pad], axis=2), v=jnp.concatenate([v, pad], axis=2),
      filled=jnp.concatenate([valid.astype(bool), jnp.zeros((b, n_slots), bool)], axis=1),
      token=first, pos=(c + valid.sum(-1)).astype(jnp.int32), slot=jnp.asarray(p, jnp.int32))
  return (state, first, logits[:, -1]) if with_logits else (state, first)


@functools.partial(jax.jit, static_argnames=('config', 'n_steps', 'with_logits'),
                   donate_argnames=('state',))
def decode_chunk(params: dict, config: SmolLMConfig, prefix_k: jax.Array,
                 prefix_v: jax.Array, state: DecodeState, n_steps: int,
                 with_logits: bool = False):
  """n_steps greedy steps: feed `state.token`, write its k/v, take the argmax.

  prefix_k/prefix_v [L, C, K, Dh]: the shared prefix the batch was prefilled
  after. Returns (new state, generated tokens [B, n_steps]), plus the logits
  [B, n_steps, V] of every step when with_logits. The caller guarantees
  state.slot + n_steps <= S (the cache never wraps).
  """
  b = state.token.shape[0]

  def step(st: DecodeState, _):
    logits, k, v = forward(params, config, st.token[:, None], st.pos[:, None],
                           jnp.ones((b, 1), bool), prefix_k, prefix_v, st.k, st.v, st.filled)
    at = (0, 0, st.slot, 0, 0)
    nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    st = st.replace(k=jax.lax.dynamic_update_slice(st.k, k.astype(st.k.dtype), at),
                    v=jax.lax.dynamic_update_slice(st.v, v.astype(st.v.dtype), at),
                    filled=st.filled.at[:, st.slot].set(True), token=nxt,
                    pos=st.pos + 1, slot=st.slot + 1)
    return st, ((nxt, logits[:, -1]) if with_logits else nxt)

  state, out = jax.lax.scan(step, state, None, length=n_steps)
  if with_logits:
    return state, out[0].T, jnp.swapaxes(out[1], 0, 1)
  return state, out.T


@functools.partial(jax.jit, static_argnames=('config', 'n_tail'))
def tail_loglik(params: dict, config: SmolLMConfig, tokens: jax.Array, valid: jax.Array,
                answer_mask: jax.Array, n_tail: int) -> jax.Array:
  """Σ log p(answer tokens | prompt) [B] of left-padded rows tokens/valid/answer_mask [B, T].

  The model reads tokens[:, :-1]; its last n_tail logits predict tokens[:, T-n_tail:],
  counted where answer_mask is True (the answer must lie in the last n_tail positions).
  """
  b, t = tokens.shape
  e0, e1 = empty_cache(config), empty_cache(config, b)
  vin = valid[:, :-1]
  logits, _, _ = forward(params, config, tokens[:, :-1], M.positions_from_valid(vin), vin,
                         e0, e0, e1, e1, jnp.zeros((b, 0), bool), n_logits=n_tail)
  logp = jax.nn.log_softmax(M.as_f32(logits), axis=-1)
  tgt = tokens[:, t - n_tail:]
  tok = jnp.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
  return jnp.where(answer_mask[:, t - n_tail:], tok, 0.0).sum(-1)


# ----------------------------------------------------------------------------
# Host driver: buckets, batches, stop conditions, shared-prefix reuse.
# ----------------------------------------------------------------------------


def bucket(n: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= n (a multiple of the largest bucket beyond it)."""
  for b in buckets:
    if n <= b:
      return b
  top = buckets[-1]
  return -(-n // top) * top


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """Static shapes and policies of the decoder (each distinct shape compiles once)."""
  batch_size: int = 16  # rows per compiled call (smaller calls use the next power of 2)
  prompt_buckets: tuple[int, ...] = (32, 64, 128, 192, 256, 384, 512, 1024, 2048)  # P
  new_buckets: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)  # N (fed-token slots)
  chunk: int = 8  # decode steps per compiled call (stop conditions are checked between)
  shared_prefix: bool = True  # compute the longest common token prefix of a batch once
  min_shared_prefix: int = 32  # ... when it has at least this many tokens
  prefix_quantum: int = 32  # shared-prefix length rounded down to a multiple of this
  prefix_cache_size: int = 4  # shared prefixes kept (keys/values) across calls
  answer_buckets: tuple[int, ...] = (4, 8, 16, 32, 64)  # n_tail of `loglik`

  def __post_init__(self):
    for name in ('batch_size', 'chunk', 'min_shared_prefix', 'prefix_quantum'):
      if getattr(self, name) < 1:
        raise ValueError(f'DecodeSettings.{name} must be >= 1, got {getattr(self, name)}')
    for name in ('prompt_buckets', 'new_buckets', 'answer_buckets'):
      b = getattr(self, name)
      if not b or list(b) != sorted(set(b)) or b[0] < 1:
        raise ValueError(f'DecodeSettings.{name} must be increasing positive ints, got {b}')


@dataclasses.dataclass(frozen=True)
class RawGeneration:
  """One row's greedy continuation (token level)."""
  tokens: tuple[int, ...]  # generated ids, through the token that stopped it
  stop_reason: str  # 'stop_token' | 'stop_string' | 'length'
  stop: Optional[object]  # the stop token id or stop string that fired (None: length)
  text_end: Optional[int]  # stop_string: where the stop string starts in decode(tokens)


def _batch_rows(n: int, settings: DecodeSettings) -> int:
  """Rows of a compiled call for n prompts: n rounded up to a power of 2, <= batch_size."""
  return min(settings.batch_size, 1 << max(n - 1, 0).bit_length())


def common_prefix_len(rows: Sequence[Sequence[int]]) -> int:
  """Length of the longest token prefix shared by every row."""
  first = rows[0]
  n = min(len(r) for r in rows)
  for r in rows[1:]:
    i = 0
    while i < n and r[i] == first[i]:
      i += 1
    n = i
  return n


def _first_stop_string(text: str, stops: Sequence[str]) -> Optional[tuple[int, str]]:
  hits = [(text.find(s), s) for s in stops if s and s in text]
  return min(hits) if hits else None


class Decoder:
  """Batched cached greedy decoding and scoring of token-id prompts (no formatting).

  `decode_text(ids) -> str` is only used for stop strings.
  """

  def __init__(self, variables: dict, config: SmolLMConfig,
               decode_text: Optional[Callable[[Sequence[int]], str]] = None,
               settings: DecodeSettings = DecodeSettings()):
    self.config = config
    self.params = stack_params(variables, config)
    self.decode_text = decode_text
    self.settings = settings
    self._prefixes: collections.OrderedDict = collections.OrderedDict()

  # -- shared prefix --------------------------------------------------------
  def prefix_kv(self, ids: Sequence[int]):
    """Keys/values [L, C, K, Dh] of a shared prefix, memoised (LRU) by its ids."""
    key = tuple(int(i) for i in ids)
    if key in self._prefixes:
      self._prefixes.move_to_end(key)
      return self._prefixes[key]
    if not key:
      kv = (empty_cache(self.config), empty_cache(self.config))
    else:
      kv = prefix_cache(self.params, self.config, np.asarray([key], np.int32))
    self._prefixes[key] = kv
    while len(self._prefixes) > self.settings.prefix_cache_size:
      self._prefixes.popitem(last=False)
    return kv

  def _shared_len(self, rows: Sequence[Sequence[int]], shared_prefix: Optional[bool]) -> int:
    s = self.settings
    use = s.shared_prefix if shared_prefix is None else shared_prefix
    if not use or len(rows) < 2:
      return 0
    # Keep at least one token per row after the prefix (its logits start decoding).
    n = min(common_prefix_len(rows), min(len(r) for r in rows) - 1)
    n = (n // s.prefix_quantum) * s.prefix_quantum
    return n if n >= s.min_shared_prefix else 0

  # -- generation -----------------------------------------------------------
  def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               stop_tokens: Sequence[int] = (), stop_strings: Sequence[str] = (),
               shared_prefix: Optional[bool] = None) -> list[RawGeneration]:
    """Greedy continuations of token-id prompts (validated by the caller).

    Rows are grouped by length into batches of `settings.batch_size`; each batch
    decodes in chunks until every row has stopped (stop token, stop string or
    `max_new_tokens`). shared_prefix overrides `settings.shared_prefix`.
    """
    if stop_strings and self.decode_text is None:
      raise ValueError('stop strings need a decode_text function')
    out: list[Optional[RawGeneration]] = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    bs = self.settings.batch_size
    for lo in range(0, len(order), bs):
      idx = order[lo:lo + bs]
      for i, g in zip(idx, self._generate_batch([prompts[i] for i in idx], max_new_tokens,
                                                frozenset(stop_tokens), tuple(stop_strings),
                                                shared_prefix)):
        out[i] = g
    return out  # type: ignore[return-value]

  def _generate_batch(self, rows, max_new, stop_tokens, stop_strings, shared_prefix):
    s = self.settings
    n_real = len(rows)
    b = _batch_rows(n_real, s)
    c_len = self._shared_len(rows, shared_prefix)
    pk, pv = self.prefix_kv(rows[0][:c_len])
    suffix = [list(r[c_len:]) for r in rows]
    p = bucket(max(len(r) for r in suffix), s.prompt_buckets)
    n_fed = -(-(max_new - 1) // s.chunk) * s.chunk
    n_slots = bucket(n_fed, s.new_buckets) if n_fed else 0
    tokens = np.full((b, p), PAD_ID, np.int32)
    valid = np.zeros((b, p), bool)
    for i in range(b):
      r = suffix[min(i, n_real - 1)]  # extra rows repeat the last one (discarded)
      tokens[i, p - len(r):], valid[i, p - len(r):] = r, True
    state, first = prefill(self.params, self.config, pk, pv, tokens, valid, n_slots)
    gen: list[list[int]] = [[] for _ in range(n_real)]
    done: list[Optional[RawGeneration]] = [None] * n_real

    def take(new: np.ndarray) -> None:
      for i in range(n_real):
        if done[i] is not None:
          continue
        for t in new[i].tolist():
          gen[i].append(t)
          if t in stop_tokens:
            done[i] = RawGeneration(tuple(gen[i]), STOP_TOKEN, t, None)
            break
          hit = stop_strings and _first_stop_string(self.decode_text(gen[i]), stop_strings)
          if hit:
            done[i] = RawGeneration(tuple(gen[i]), STOP_STRING, hit[1], hit[0])
            break
          if len(gen[i]) >= max_new:
            done[i] = RawGeneration(tuple(gen[i]), LENGTH, None, None)
            break

    take(np.asarray(first)[:, None])
    fed = 0
    while any(d is None for d in done):
      if fed + s.chunk > n_slots:
        raise AssertionError(f'cache overflow: {fed} + {s.chunk} > {n_slots} slots')
      state, new = decode_chunk(self.params, self.config, pk, pv, state, s.chunk)
      fed += s.chunk
      take(np.asarray(new))
    return done

  # -- scoring ----------------------------------------------------------------
  def loglik(self, prompts: Sequence[Sequence[int]],
             answers: Sequence[Sequence[int]]) -> np.ndarray:
    """Σ log p(answer | prompt) [n] (float64) of token-id pairs, teacher forcing."""
    s = self.settings
    out = np.zeros(len(prompts), np.float64)
    rows = [list(p) + list(a) for p, a in zip(prompts, answers)]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for lo in range(0, len(order), s.batch_size):
      idx = order[lo:lo + s.batch_size]
      b = _batch_rows(len(idx), s)
      t = bucket(max(len(rows[i]) for i in idx), s.prompt_buckets) + 1
      n_tail = min(bucket(max(max(len(answers[i]) for i in idx), 1), s.answer_buckets), t - 1)
      tokens = np.full((b, t), PAD_ID, np.int32)
      valid = np.zeros((b, t), bool)
      amask = np.zeros((b, t), bool)
      for j in range(b):
        i = idx[min(j, len(idx) - 1)]
        r, na = rows[i], len(answers[i])
        tokens[j, t - len(r):], valid[j, t - len(r):] = r, True
        amask[j, t - na:] = na > 0
      ll = np.asarray(tail_loglik(self.params, self.config, tokens, valid, amask, n_tail))
      out[idx] = ll[:len(idx)]
    return out
