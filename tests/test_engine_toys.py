"""Small Flax models for the engine tests (no tests here).

Shape legend (einsum letters):
  B batch, Q query length, N context length, A answer length,
  T = Q + A reader positions, P ports, H head features, D width, V vocab.

`ToyReader` embeds the query+answer (reader positions) and the context, then
runs `layers` blocks; block l has a read port `block_{l}/retrieval` (method
`read`, output [B, T, P, H]) whose class is chosen by `port`:
  'attn'    exact cross-attention read (Π_S h = Σ_{j∈S} a_j v_j),
  'ssm'     exact selective linear recurrence over the context,
  'memory'  one port per passage through a nonlinear slot encoder
            (span_decomposition = 'approximate'),
  'plain'   cross-attention without `span_decomposition` (no span patches).
`run(..., override)` is a hand-written patch path used as the independent
reference: override[l](h, read_S) -> (h', record) with read_S(span) = Π_S h.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def token_logliks(logits: jax.Array, answer: jax.Array) -> jax.Array:
  """log p(y*_i) [B, A] in the logits' dtype (float64 in the gradient test)."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(logp, answer[..., None], axis=-1)[..., 0]


def gold_loglik(logits: jax.Array, answer: jax.Array) -> jax.Array:
  return token_logliks(logits, answer).sum(-1)


V, D, P, H = 13, 16, 2, 4


def _apply_span(x: jax.Array, span_mask: Optional[jax.Array]) -> jax.Array:
  """x [B, N, ...] with tokens outside the span zeroed."""
  if span_mask is None:
    return x
  m = span_mask.astype(x.dtype)
  return x * m.reshape(m.shape + (1,) * (x.ndim - 2))


class AttnPort(nn.Module):
  span_decomposition = "exact"

  def setup(self):
    self.wq = nn.DenseGeneral((P, H), name="wq")
    self.wk = nn.DenseGeneral((P, H), name="wk")
    self.wv = nn.DenseGeneral((P, H), name="wv")

  def weights(self, x, ctx):
    s = jnp.einsum("btph,bnph->btpn", self.wq(x), self.wk(ctx)) / jnp.sqrt(H)
    return jax.nn.softmax(s, axis=-1)

  def read(self, x, ctx, span_mask=None):
    a = self.weights(x, ctx)                                   # [B, T, P, N]
    return jnp.einsum("btpn,bnph->btph", a, _apply_span(self.wv(ctx), span_mask))

  def attention_mass(self, x, ctx):
    return self.weights(x, ctx)


class PlainPort(AttnPort):
  span_decomposition = None


class SSMPort(nn.Module):
  """h_t = g(x_t) ⊙ Σ_j (Π_{k>j} A_k) u_j, A_k = σ(W_a ctx_k), u_j = W_b ctx_j."""
  span_decomposition = "exact"

  def setup(self):
    self.wa = nn.DenseGeneral((P, H), name="wa")
    self.wb = nn.DenseGeneral((P, H), name="wb")
    self.wg = nn.DenseGeneral((P, H), name="wg")

  def read(self, x, ctx, span_mask=None):
    gate = jax.nn.sigmoid(self.wa(ctx))                        # [B, N, P, H]
    u = _apply_span(self.wb(ctx), span_mask)

    def step(s, au):
      a, v = au
      return a * s + v, None

    s0 = jnp.zeros(u.shape[:1] + u.shape[2:], u.dtype)
    state, _ = jax.lax.scan(step, s0, (jnp.moveaxis(gate, 1, 0),
                                       jnp.moveaxis(u, 1, 0)))
    return jnp.einsum("btph,bph->btph", self.wg(x), state)


class MemoryPort(nn.Module):
  """Port p reads passage p's slot: mean of tanh(W ctx) over its tokens."""
  span_decomposition = "approximate"

  def setup(self):
    self.enc = nn.Dense(H, name="enc")
    self.wg = nn.DenseGeneral((P, H), name="wg")

  def read(self, x, ctx, span_mask=None, passage_ids=None):
    n = ctx.shape[1]
    pid = passage_ids if passage_ids is not None else (
        jnp.arange(n)[None] * P // n)
    onehot = jax.nn.one_hot(pid, P, dtype=ctx.dtype)           # [B, N, P]
    if span_mask is not None:
      onehot = onehot * span_mask.astype(ctx.dtype)[..., None]
    slots = jnp.einsum("bnp,bnh->bph", onehot, jnp.tanh(self.enc(ctx)))
    return jnp.einsum("btph,bph->btph", self.wg(x), slots) / n


class PairPort(AttnPort):
  """AttnPort with a `span_pair_method`: h and Π_S h from one set of weights."""
  span_pair_method = "read_both"

  def read_both(self, x, ctx, span_mask=None):
    a, v = self.weights(x, ctx), self.wv(ctx)
    read = lambda s: jnp.einsum("btpn,bnph->btph", a, _apply_span(v, s))
    return read(None), read(span_mask)


class BadPairPort(AttnPort):
  """Names a pair method that returns h alone (the engine must refuse it)."""
  span_pair_method = "read_h"

  def read_h(self, x, ctx, span_mask=None):
    del span_mask
    return jnp.einsum("btpn,bnph->btph", self.weights(x, ctx), self.wv(ctx))


PORTS = {"attn": AttnPort, "ssm": SSMPort, "memory": MemoryPort,
         "plain": PlainPort, "pair": PairPort, "bad_pair": BadPairPort}


class Block(nn.Module):
  port: str

  def setup(self):
    self.pre = nn.Dense(D, name="pre")
    self.retrieval = PORTS[self.port](name="retrieval")
    self.out = nn.Dense(D, name="out")

  def before(self, x):
    return x + jnp.tanh(self.pre(x))

  def after(self, x, h):
    return x + jnp.tanh(self.out(h.reshape(h.shape[:2] + (-1,))))


class ToyReader(nn.Module):
  port: str = "attn"
  layers: int = 2
  prefix_callback: Optional[Callable[[Any], None]] = None

  def setup(self):
    self.embed = nn.Embed(V, D, name="embed")
    self.ctx_enc = nn.Dense(D, name="ctx_enc")
    self.blocks = [Block(self.port, name=f"block_{l}") for l in range(self.layers)]
    self.head = nn.Dense(V, name="head")

  def encode(self, query, context):
    ctx = jnp.tanh(self.ctx_enc(self.embed(context)))
    if self.prefix_callback is not None:
      jax.debug.callback(self.prefix_callback, ctx.sum())
    return ctx

  def run(self, query, context, answer, override=None):
    """logits [B, A, V] and the overrides' records."""
    override = override or {}
    ctx = self.encode(query, context)
    x = self.embed(jnp.concatenate([query, answer], axis=1))   # [B, T, D]
    records = {}
    for l, block in enumerate(self.blocks):
      x = block.before(x)
      h = block.retrieval.read(x, ctx)
      if l in override:
        read_s = lambda s, x=x, b=block: b.retrieval.read(x, ctx, span_mask=s)
        h, records[l] = override[l](h, read_s)
      x = block.after(x, h)
    q, a = query.shape[1], answer.shape[1]
    return self.head(x[:, q - 1:q - 1 + a]), records

  def __call__(self, query, context, answer):
    return self.run(query, context, answer)[0]


def make(port="attn", layers=2, b=3, q=3, n=8, a=2, seed=0, **kw):
  """(model, variables, clean, corrupt, loglik_fn, token_loglik_fn)."""
  model = ToyReader(port=port, layers=layers, **kw)
  rng = np.random.default_rng(seed)
  query, context, answer = (jnp.asarray(rng.integers(1, V, s), jnp.int32)
                            for s in ((b, q), (b, n), (b, a)))
  changed = rng.random((b, n)) < 0.4
  changed[:, [1, n // 2]] = True           # every example is corrupted
  shift = rng.integers(1, V - 1, (b, n))   # a different token where changed
  ctx = np.asarray(context)
  corrupt_ctx = jnp.asarray(
      np.where(changed, 1 + (ctx - 1 + shift) % (V - 1), ctx), jnp.int32)
  # Parameters drawn with numpy from the shapes of `init` (nothing compiled):
  # embeddings N(0, 1), kernels N(0, (2/√fan_in)²), biases N(0, 0.1²).
  shapes = jax.eval_shape(model.init, jax.random.key(0), query, context, answer)
  variables = jax.tree_util.tree_map_with_path(
      lambda path, s: jnp.asarray(_draw(rng, str(path[-1]), s.shape), s.dtype),
      shapes)
  clean = (query, context, answer)
  corrupt = (query, corrupt_ctx, answer)

  def loglik_fn(v, inputs):
    return gold_loglik(model.apply(v, *inputs), inputs[2])

  def token_loglik_fn(v, inputs):
    return token_logliks(model.apply(v, *inputs), inputs[2])

  return model, variables, clean, corrupt, loglik_fn, token_loglik_fn


def _draw(rng: np.random.Generator, name: str, shape) -> np.ndarray:
  if "embedding" in name:
    return rng.normal(size=shape)
  if "bias" in name or len(shape) < 2:
    return 0.1 * rng.normal(size=shape)
  return 2.0 / np.sqrt(shape[0]) * rng.normal(size=shape)


@functools.lru_cache(maxsize=None)
def toy(port="attn", layers=2):
  """`make` cached per process, so that test modules share compilations."""
  return make(port, layers=layers)


@functools.partial(jax.jit, static_argnums=(0, 4))
def reference_logliks(model, variables, clean, corrupt, layer, span=None,
                      ports=None, positions=None):
  """One probe by the hand-written path in `ToyReader.run` (no interceptors,
  no vmap: call it once per probe)."""
  def rec(h, read_s):
    return h, (h if span is None else read_s(span))

  _, records = model.apply(variables, *clean, override={layer: rec},
                           method="run")
  value = records[layer]

  def put(h, read_s):
    full = value if span is None else h - read_s(span) + value
    m = jnp.ones(h.shape[:3], bool)
    if ports is not None:
      m = m & ports.reshape((-1, 1, ports.shape[-1]) if ports.ndim == 2
                            else (1, 1, -1))
    if positions is not None:
      m = m & positions.reshape((-1, positions.shape[-1], 1)
                                if positions.ndim == 2 else (1, -1, 1))
    return jnp.where(m[..., None], full, h), None

  logits, _ = model.apply(variables, *corrupt, override={layer: put},
                          method="run")
  return gold_loglik(logits, corrupt[2])
