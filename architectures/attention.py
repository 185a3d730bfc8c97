"""Attention family: self-attention context encoder, cross-attention read port.

Shape legend (einsum letters):
  b batch, t reader positions, n context positions, e embed,
  h read heads (= ports p), k per-head features.

Read port (site `reader/block_{i}/retrieval`, method `read`):
  h_f[b, t, h, :] = sum_n a[b, h, t, n] v[b, n, h, :]      (before the output projection)
  read(..., span_mask=S) = sum_{n in S} a[b, h, t, n] v[b, n, h, :], with the
  attention weights a of the same run, so Π_S h + Π_S̄ h = h exactly.
Memory: the reader attends over N x (h k) keys and values per read layer.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from architectures import layers
from architectures.spec import ArchSpec


class AttentionEncoder(nn.Module):
  """Bidirectional self-attention encoder over the context tokens."""
  spec: ArchSpec  # static sizes

  @nn.compact
  def __call__(self, embed: layers.Embed, query, context, passage_ids) -> dict:
    s = self.spec
    n = context.shape[1]
    x = embed(context) + layers.sinusoid_positions(n, s.embed_dim)[None].astype(s.compute_dtype)
    x = layers.constrain(x, ("batch", "ctx", "embed"))
    x = layers.LocalMixer(s.mixer_width, s.compute_dtype, name="local_mixer")(x)
    q_summary = layers.masked_mean(embed(query), query != 0)
    x = layers.QueryFilm(s.compute_dtype, name="query_film")(x, q_summary)
    ctx_mask = context != 0
    mask = ctx_mask[:, None, None, :]
    for i in range(s.enc_layers):
      x = layers.TransformerBlock(s.reader_heads, s.embed_dim // s.reader_heads,
                                  s.enc_mlp_dim, s.compute_dtype, name=f"block_{i}")(x, mask)
    x = layers.RMSNorm(s.compute_dtype, name="norm_out")(x)
    return {"encoded": x, "ctx_mask": ctx_mask}


class CrossAttentionRetrieval(nn.Module):
  """Per-head cross-attention from reader positions to the encoded context."""
  spec: ArchSpec  # static sizes
  span_decomposition = "exact"  # Π_S h_f is exact (weights of the run kept)

  def setup(self):
    s = self.spec
    hk = (s.read_heads, s.read_head_dim)
    dt = s.compute_dtype
    self.q_proj = layers.dense(hk, ("embed", "heads", "kv"), "query", dt)
    self.k_proj = layers.dense(hk, ("embed", "heads", "kv"), "key", dt)
    self.v_proj = layers.dense(hk, ("embed", "heads", "kv"), "value", dt)
    self.out_proj = layers.dense(s.embed_dim, ("heads", "kv", "embed"), "out", dt,
                                 axis=(-2, -1))

  def weights(self, x: jax.Array, memory: dict) -> jax.Array:
    """Attention weights a [b, h, t, n] of reader positions over context tokens."""
    q = self.q_proj(x)
    k = self.k_proj(memory["encoded"])
    return layers.attention_weights(q, k, memory["ctx_mask"][:, None, None, :])

  def read(self, x: jax.Array, memory: dict, span_mask: jax.Array | None = None) -> jax.Array:
    """h_f [b, t, h, k]; with span_mask [b, n] the part Σ_{n∈S} a v (exact)."""
    enc = memory["encoded"]
    layers.check_span_mask(span_mask, enc.shape[0], enc.shape[1])
    a = self.weights(x, memory).astype(self.spec.compute_dtype)
    v = self.v_proj(enc)
    if span_mask is not None:
      a = a * span_mask.astype(a.dtype)[:, None, None, :]
    h = jnp.einsum("bhtn,bnhk->bthk", a, v)
    return layers.constrain(h, ("batch", "length", "ports", "kv"))

  def __call__(self, x: jax.Array, memory: dict) -> jax.Array:
    return self.out_proj(self.read(x, memory))
