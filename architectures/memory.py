"""Memory-port family: each passage is written into its own slot(s); the reader reads r ports.

Shape legend (einsum letters):
  b batch, n context positions, t reader positions, e embed, d slot width,
  m passages, s slots per passage, p ports (= m * s).

Write (method `write`): a passage-wise encoder (self-attention restricted to
each passage) encodes the tokens; query-aware attention pooling writes passage m
into slot (m, s):  pooled[m,s] = Σ_{n∈m} α[m,s,n] W_v e_n,  slot = pooled + MLP(pooled).
Read port (site `reader/block_{i}/retrieval`, method `read`):
  h_f[b, t, p, :] = a[b, t, p] · W_o^v slot_p
  a = softmax_p(<q_t, W_k slot_p> / sqrt(d) + relevance_p), relevance_p the log-partition
  of passage p's pooling scores (so a · α is a softmax over all tokens, as in attention)
Port-restricted patching is exact (ports are separate summands of the output).
Span restriction goes through the slot encoder and is approximate
(`span_decomposition = 'approximate'`): Π_S h_f uses the slots re-encoded from
pooled^S = Σ_{n∈m∩S} α W_v e_n (pooling and read weights of the same run kept),
which is exact for S = all tokens and S = ∅ but not additive over S ∪ S̄
because of the slot MLP.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from architectures import layers
from architectures.spec import ArchSpec


class PassageEncoder(nn.Module):
  """Self-attention encoder restricted to each passage (block-diagonal mask)."""
  spec: ArchSpec  # static sizes

  @nn.compact
  def __call__(self, embed: layers.Embed, query, context, passage_ids) -> dict:
    s = self.spec
    n = context.shape[1]
    x = embed(context) + layers.sinusoid_positions(n, s.embed_dim)[None].astype(s.compute_dtype)
    x = layers.LocalMixer(s.mixer_width, s.compute_dtype, name="local_mixer")(x, passage_ids)
    q_summary = layers.masked_mean(embed(query), query != 0)
    x = layers.QueryFilm(s.compute_dtype, name="query_film")(x, q_summary)
    same = passage_ids[:, :, None] == passage_ids[:, None, :]
    mask = (same & (context != 0)[:, None, :])[:, None]
    for i in range(s.enc_layers):
      x = layers.TransformerBlock(s.reader_heads, s.embed_dim // s.reader_heads,
                                  s.enc_mlp_dim, s.compute_dtype, name=f"block_{i}")(x, mask)
    x = layers.RMSNorm(s.compute_dtype, name="norm_out")(x)
    return {"encoded": layers.constrain(x, ("batch", "ctx", "embed")),
            "query_summary": q_summary, "passage_ids": passage_ids, "ctx_mask": context != 0}


class MemoryPortRetrieval(nn.Module):
  """Query-aware slot writer + reader over r = m * s memory ports."""
  spec: ArchSpec  # static sizes
  span_decomposition = "approximate"  # span restriction passes the slot MLP

  def setup(self):
    s = self.spec
    d, f32 = s.mem_dim, jnp.float32
    self.pool_q = layers.dense(d, ("embed", "kv"), "pool_query", f32)
    self.pool_k = layers.dense(d, ("embed", "kv"), "pool_key", f32)
    self.pool_v = layers.dense(d, ("embed", "kv"), "pool_value", f32)
    self.slot_query = self.param(
        "slot_query", layers.logical(nn.initializers.normal(0.02), ("ports", "kv")),
        (s.mem_slots, d))
    self.slot_mlp = layers.Mlp(d, f32, name="slot_mlp")
    self.read_q = layers.dense(d, ("embed", "kv"), "read_query", f32)
    self.read_k = layers.dense(d, ("kv", None), "read_key", f32)
    self.read_v = layers.dense(d, ("kv", None), "read_value", f32)
    self.out_proj = layers.dense(s.embed_dim, ("kv", "embed"), "out", s.compute_dtype)

  def pooling(self, memory: dict) -> tuple[jax.Array, jax.Array]:
    """Pooling weights α [b, m, s, n] (softmax over passage m) and log-partitions [b, m, s]."""
    e = memory["encoded"].astype(jnp.float32)
    q = self.pool_q(memory["query_summary"])[:, None, :] + self.slot_query[None]  # [b,s,d]
    k = self.pool_k(e)                                                    # [b,n,d]
    logits = jnp.einsum("bsd,bnd->bsn", q, k) / np.sqrt(self.spec.mem_dim)
    in_passage = (memory["passage_ids"][:, None, :]
                  == jnp.arange(self.spec.num_passages)[None, :, None])  # [b,m,n]
    ok = in_passage & memory["ctx_mask"][:, None, :]
    logits = jnp.where(ok[:, :, None, :], logits[:, None], layers.NEG_INF)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jax.nn.softmax(logits, axis=-1) * ok[:, :, None, :], lse

  def write(self, memory: dict, span_mask: jax.Array | None = None) -> jax.Array:
    """Slots [b, p, d]; with span_mask, slots re-encoded from the S part of pooling."""
    alpha, _ = self.pooling(memory)
    v = self.pool_v(memory["encoded"].astype(jnp.float32))
    present = jnp.ones(alpha.shape[:3], jnp.float32)
    if span_mask is not None:
      alpha = alpha * span_mask.astype(jnp.float32)[:, None, None, :]
      present = (alpha.sum(-1) > 0).astype(jnp.float32)
    pooled = jnp.einsum("bmsn,bnd->bmsd", alpha, v)
    slots = (pooled + self.slot_mlp(pooled)) * present[..., None]
    b, m, s, d = slots.shape
    return slots.reshape(b, m * s, d)

  def read(self, x: jax.Array, memory: dict, span_mask: jax.Array | None = None) -> jax.Array:
    """h_f [b, t, p, d]: per-port read values weighted by the run's port attention."""
    enc = memory["encoded"]
    layers.check_span_mask(span_mask, enc.shape[0], enc.shape[1])
    slots = self.write(memory)
    _, relevance = self.pooling(memory)                                   # [b,m,s]
    q = self.read_q(x.astype(jnp.float32))                               # [b,t,d]
    logits = jnp.einsum("btd,bpd->btp", q, self.read_k(slots)) / np.sqrt(self.spec.mem_dim)
    logits = logits + relevance.reshape(relevance.shape[0], 1, -1)
    a = jax.nn.softmax(logits, axis=-1)
    if span_mask is not None:
      slots = self.write(memory, span_mask)
    h = a[..., None] * self.read_v(slots)[:, None]                        # [b,t,p,d]
    return layers.constrain(h.astype(self.spec.compute_dtype),
                            ("batch", "length", "ports", "kv"))

  def __call__(self, x: jax.Array, memory: dict) -> jax.Array:
    return self.out_proj(jnp.sum(self.read(x, memory), axis=2))
