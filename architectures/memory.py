"""Memory-port family: each passage is written into its own slot(s); the reader reads r ports.

Shape legend (einsum letters):
  b batch, n context positions, t reader positions, e embed, d slot width (= h * k),
  m passages, s slots per passage, p ports (= m * s), h heads, k head width.

Write (method `write`): a passage-wise encoder (self-attention restricted to
each passage plus the query tokens, as in Fusion-in-Decoder) encodes the tokens; query-aware multi-head attention pooling
writes passage m into slot (m, s), one softmax per head over the passage:
  pooled[m,s,h] = Σ_{n∈m} α[m,s,h,n] W_v^h e_n,  slot = pooled + MLP(pooled).
Read port (site `reader/block_{i}/retrieval`, method `read`), per head:
  h_f[b, t, p, h, :] = a[b, t, h, p] · W_o^{v,h} slot_p
  a = softmax_p(<q_{t,h}, W_k^h slot_p> / sqrt(k) + relevance_{p,h}), relevance the
  log-partition of passage p's pooling scores for head h (so a · α is, per head, a
  softmax over all retrieved tokens, as in cross-attention); h_f is returned as
  [b, t, p, d] with the heads concatenated.
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
  """Passage-wise self-attention encoder that also sees the query (as in Fusion-in-Decoder).

  The encoder runs over [query; context] with a mask under which a context token
  attends to its own passage and to the query tokens, and a query token only to
  the query, so no information crosses passages: passage m's encoding depends
  on (query, passage m) alone.
  """
  spec: ArchSpec  # static sizes

  @nn.compact
  def __call__(self, embed: layers.Embed, query, context, passage_ids) -> dict:
    s = self.spec
    n, nq = context.shape[1], query.shape[1]
    pos = layers.sinusoid_positions(n + nq, s.embed_dim).astype(s.compute_dtype)
    x = embed(context) + pos[None, :n]
    x = layers.LocalMixer(s.mixer_width, s.compute_dtype, name="local_mixer")(x, passage_ids)
    q_summary = layers.masked_mean(embed(query), query != 0)
    x = layers.QueryFilm(s.compute_dtype, name="query_film")(x, q_summary)
    xq = embed(query) + pos[None, n:]
    mask = self.passage_mask(query, context, passage_ids)
    x = jnp.concatenate([xq.astype(x.dtype), x], axis=1)                # [b, q+n, e]
    for i in range(s.enc_layers):
      x = layers.TransformerBlock(s.reader_heads, s.embed_dim // s.reader_heads,
                                  s.enc_mlp_dim, s.compute_dtype, name=f"block_{i}")(x, mask)
    x = layers.RMSNorm(s.compute_dtype, name="norm_out")(x[:, nq:])
    return {"encoded": layers.constrain(x, ("batch", "ctx", "embed")),
            "query_summary": q_summary, "passage_ids": passage_ids, "ctx_mask": context != 0}

  @staticmethod
  def passage_mask(query, context, passage_ids) -> jax.Array:
    """[b, 1, q+n, q+n]: context -> own passage and query; query -> query (PAD never)."""
    nq = query.shape[1]
    same = passage_ids[:, :, None] == passage_ids[:, None, :]              # [b,n,n]
    q_ok, c_ok = query != 0, context != 0
    ctx_rows = jnp.concatenate([jnp.broadcast_to(q_ok[:, None, :], same.shape[:2] + (nq,)),
                                same & c_ok[:, None, :]], axis=2)        # [b,n,q+n]
    q_rows = jnp.concatenate([jnp.broadcast_to(q_ok[:, None, :], q_ok.shape + (nq,)),
                              jnp.zeros(q_ok.shape + (context.shape[1],), bool)], axis=2)
    return jnp.concatenate([q_rows, ctx_rows], axis=1)[:, None]


class MemoryPortRetrieval(nn.Module):
  """Query-aware multi-head slot writer + reader over r = m * s memory ports."""
  spec: ArchSpec  # static sizes
  span_decomposition = "approximate"  # span restriction passes the slot MLP

  def setup(self):
    s = self.spec
    d, f32 = s.mem_dim, jnp.float32
    self.pool_norm = layers.RMSNorm(f32, name="pool_query_norm")  # q̄ has RMS ~ sqrt(E)
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

  def _heads(self, x: jax.Array) -> jax.Array:
    """[..., d] -> [..., h, k]."""
    h = self.spec.mem_heads
    return x.reshape(*x.shape[:-1], h, x.shape[-1] // h)

  def pooling(self, memory: dict) -> tuple[jax.Array, jax.Array]:
    """Pooling weights α [b, m, s, h, n] (softmax over passage m) and log-partitions [b, m, s, h]."""
    e = memory["encoded"].astype(jnp.float32)
    q_summary = self.pool_norm(memory["query_summary"])
    q = self._heads(self.pool_q(q_summary)[:, None, :] + self.slot_query[None])
    k = self._heads(self.pool_k(e))                                       # [b,n,h,k]
    logits = jnp.einsum("bshk,bnhk->bshn", q, k) / np.sqrt(k.shape[-1])
    in_passage = (memory["passage_ids"][:, None, :]
                  == jnp.arange(self.spec.num_passages)[None, :, None])  # [b,m,n]
    ok = (in_passage & memory["ctx_mask"][:, None, :])[:, :, None, None, :]
    logits = jnp.where(ok, logits[:, None], layers.NEG_INF)              # [b,m,s,h,n]
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jax.nn.softmax(logits, axis=-1) * ok, lse

  def write(self, memory: dict, span_mask: jax.Array | None = None) -> jax.Array:
    """Slots [b, p, d]; with span_mask, slots re-encoded from the S part of pooling."""
    return self._slots(memory, self.pooling(memory)[0], span_mask)

  def _slots(self, memory: dict, alpha: jax.Array, span_mask: jax.Array | None) -> jax.Array:
    """Slots [b, p, d] from pooling weights α [b, m, s, h, n] (restricted to S if given)."""
    v = self._heads(self.pool_v(memory["encoded"].astype(jnp.float32)))  # [b,n,h,k]
    present = jnp.ones(alpha.shape[:3], jnp.float32)
    if span_mask is not None:
      alpha = alpha * span_mask.astype(jnp.float32)[:, None, None, None, :]
      present = (alpha.sum((-2, -1)) > 0).astype(jnp.float32)
    pooled = jnp.einsum("bmshn,bnhk->bmshk", alpha, v)
    pooled = pooled.reshape(*pooled.shape[:3], -1)                        # [b,m,s,d]
    slots = (pooled + self.slot_mlp(pooled)) * present[..., None]
    b, m, s, d = slots.shape
    return slots.reshape(b, m * s, d)

  def read(self, x: jax.Array, memory: dict, span_mask: jax.Array | None = None) -> jax.Array:
    """h_f [b, t, p, d]: per-port read values weighted by the run's per-head port attention."""
    enc = memory["encoded"]
    layers.check_span_mask(span_mask, enc.shape[0], enc.shape[1])
    alpha, relevance = self.pooling(memory)                               # relevance [b,m,s,h]
    slots = self._slots(memory, alpha, None)
    b, m, s, h = relevance.shape
    q = self._heads(self.read_q(x.astype(jnp.float32)))                  # [b,t,h,k]
    k = self._heads(self.read_k(slots))                                   # [b,p,h,k]
    logits = jnp.einsum("bthk,bphk->bthp", q, k) / np.sqrt(q.shape[-1])
    logits = logits + relevance.reshape(b, m * s, h).transpose(0, 2, 1)[:, None]
    a = jax.nn.softmax(logits, axis=-1)                                   # [b,t,h,p]
    if span_mask is not None:
      slots = self._slots(memory, alpha, span_mask)
    v = self._heads(self.read_v(slots))                                   # [b,p,h,k]
    out = jnp.einsum("bthp,bphk->btphk", a, v)
    out = out.reshape(*out.shape[:3], -1)                                 # [b,t,p,d]
    return layers.constrain(out.astype(self.spec.compute_dtype),
                            ("batch", "length", "ports", "kv"))

  def __call__(self, x: jax.Array, memory: dict) -> jax.Array:
    return self.out_proj(jnp.sum(self.read(x, memory), axis=2))
