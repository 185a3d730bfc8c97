"""The retrieval models as they were before issue #14 item 5 (commit 7bfd4fd), frozen.

A test reference only (tests/test_architectures_shared.py): each family's own
context encoder (embedding, LocalMixer, QueryFilm and encoder blocks written out
per family), a plain dict as the memory passed from encoder to port, and each
port's `read` doing its own span-mask check and activation constraint. The
refactored models (one `ContextPrologue`, `ContextMemory`, `ReadPort`) must give
the same logits, read-port values and parameter tree.

The building blocks the refactor did not touch are imported from the live code:
`architectures.layers` (Embed, LocalMixer, QueryFilm, TransformerBlock, ...),
the SSM recurrence (`ssm.MambaBlock`, `ssm.SelectiveGates`, `ssm.slot_contributions`)
and the passage blocking (`memory.to_blocks`).

Shape legend (einsum letters): b batch, q query length, n context length,
t reader positions, e embed, h heads, k per-head features, m passages,
l positions per passage, s slots per passage, p ports, d slot width, c channels.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from architectures import layers
from architectures import memory as memory_lib
from architectures import ssm as ssm_lib
from architectures.spec import BOS_ID, ArchSpec


def check_span_mask(span_mask, batch: int, ctx_len: int) -> None:
  if span_mask is None:
    return
  if tuple(span_mask.shape) != (batch, ctx_len):
    raise ValueError(f"span_mask must have shape [B, N] = {(batch, ctx_len)} "
                     f"(batch, context length), got {tuple(span_mask.shape)}")


# attention ---------------------------------------------------------------------

class AttentionEncoder(nn.Module):
  spec: ArchSpec

  @nn.compact
  def __call__(self, embed, query, context, passage_ids) -> dict:
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
  spec: ArchSpec
  span_decomposition = "exact"

  def setup(self):
    s = self.spec
    hk = (s.read_heads, s.read_head_dim)
    dt = s.compute_dtype
    self.q_proj = layers.dense(hk, ("embed", "heads", "kv"), "query", dt)
    self.k_proj = layers.dense(hk, ("embed", "heads", "kv"), "key", dt)
    self.v_proj = layers.dense(hk, ("embed", "heads", "kv"), "value", dt)
    self.out_proj = layers.dense(s.embed_dim, ("heads", "kv", "embed"), "out", dt,
                                 axis=(-2, -1))

  def read(self, x, memory: dict, span_mask=None):
    enc = memory["encoded"]
    check_span_mask(span_mask, enc.shape[0], enc.shape[1])
    q = self.q_proj(x)
    k = self.k_proj(enc)
    a = layers.attention_weights(q, k, memory["ctx_mask"][:, None, None, :])
    a = a.astype(self.spec.compute_dtype)
    v = self.v_proj(enc)
    if span_mask is not None:
      a = a * span_mask.astype(a.dtype)[:, None, None, :]
    h = jnp.einsum("bhtn,bnhk->bthk", a, v)
    return layers.constrain(h, ("batch", "length", "ports", "kv"))

  def __call__(self, x, memory: dict):
    return self.out_proj(self.read(x, memory))


# memory_port ---------------------------------------------------------------------

class PassageEncoder(nn.Module):
  spec: ArchSpec

  @nn.compact
  def __call__(self, embed, query, context, passage_ids) -> dict:
    s = self.spec
    (b, n), nq, m = context.shape, query.shape[1], s.num_passages
    pos = layers.sinusoid_positions(n + nq, s.embed_dim).astype(s.compute_dtype)
    x = embed(context) + pos[None, :n]
    x = layers.LocalMixer(s.mixer_width, s.compute_dtype, name="local_mixer")(x, passage_ids)
    q_summary = layers.masked_mean(embed(query), query != 0)
    x = layers.QueryFilm(s.compute_dtype, name="query_film")(x, q_summary)
    xq = (embed(query) + pos[None, n:]).astype(x.dtype)
    blocks = memory_lib.to_blocks(x, m)
    e, l = blocks.shape[-1], blocks.shape[2]
    xq = jnp.broadcast_to(xq[:, None], (b, m, nq, e))
    x = jnp.concatenate([xq, blocks], axis=2).reshape(b * m, nq + l, e)
    mask = self.block_mask(query, context, passage_ids, m)
    for i in range(s.enc_layers):
      x = layers.TransformerBlock(s.reader_heads, s.embed_dim // s.reader_heads,
                                  s.enc_mlp_dim, s.compute_dtype, name=f"block_{i}")(x, mask)
    x = x.reshape(b, m, nq + l, e)[:, :, nq:].reshape(b, n, e)
    x = layers.RMSNorm(s.compute_dtype, name="norm_out")(x)
    return {"encoded": layers.constrain(x, ("batch", "ctx", "embed")),
            "query_summary": q_summary, "passage_ids": passage_ids, "ctx_mask": context != 0}

  @staticmethod
  def block_mask(query, context, passage_ids, num_passages: int):
    b, nq = query.shape
    pid = memory_lib.to_blocks(passage_ids, num_passages)
    c_ok = memory_lib.to_blocks(context != 0, num_passages)
    m, l = pid.shape[1:]
    q_ok = jnp.broadcast_to((query != 0)[:, None, None, :], (b, m, l, nq))
    ctx_rows = jnp.concatenate(
        [q_ok, (pid[..., :, None] == pid[..., None, :]) & c_ok[..., None, :]], axis=3)
    q_rows = jnp.concatenate([jnp.broadcast_to((query != 0)[:, None, None, :], (b, m, nq, nq)),
                              jnp.zeros((b, m, nq, l), bool)], axis=3)
    return jnp.concatenate([q_rows, ctx_rows], axis=2).reshape(b * m, 1, nq + l, nq + l)


class MemoryPortRetrieval(nn.Module):
  spec: ArchSpec
  span_decomposition = "approximate"

  def setup(self):
    s = self.spec
    d, f32 = s.mem_dim, jnp.float32
    self.pool_norm = layers.RMSNorm(f32, name="pool_query_norm")
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

  def _heads(self, x):
    h = self.spec.mem_heads
    return x.reshape(*x.shape[:-1], h, x.shape[-1] // h)

  def pooling(self, memory: dict):
    m = self.spec.num_passages
    e = memory_lib.to_blocks(memory["encoded"].astype(jnp.float32), m)
    q_summary = self.pool_norm(memory["query_summary"])
    q = self._heads(self.pool_q(q_summary)[:, None, :] + self.slot_query[None])
    k = self._heads(self.pool_k(e))
    logits = jnp.einsum("bshk,bmlhk->bmshl", q, k) / np.sqrt(k.shape[-1])
    ok = ((memory_lib.to_blocks(memory["passage_ids"], m) == jnp.arange(m)[None, :, None])
          & memory_lib.to_blocks(memory["ctx_mask"], m))[:, :, None, None, :]
    logits = jnp.where(ok, logits, layers.NEG_INF)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jax.nn.softmax(logits, axis=-1) * ok, lse

  def write(self, memory: dict, span_mask=None):
    return self._slots(memory, self.pooling(memory)[0], span_mask)

  def _slots(self, memory: dict, alpha, span_mask):
    m = self.spec.num_passages
    v = self._heads(self.pool_v(memory_lib.to_blocks(memory["encoded"].astype(jnp.float32), m)))
    present = jnp.ones(alpha.shape[:3], jnp.float32)
    if span_mask is not None:
      alpha = alpha * memory_lib.to_blocks(span_mask.astype(jnp.float32), m)[:, :, None, None, :]
      present = (alpha.sum((-2, -1)) > 0).astype(jnp.float32)
    pooled = jnp.einsum("bmshl,bmlhk->bmshk", alpha, v)
    pooled = pooled.reshape(*pooled.shape[:3], -1)
    slots = (pooled + self.slot_mlp(pooled)) * present[..., None]
    b, m, s, d = slots.shape
    return slots.reshape(b, m * s, d)

  def read(self, x, memory: dict, span_mask=None):
    enc = memory["encoded"]
    check_span_mask(span_mask, enc.shape[0], enc.shape[1])
    alpha, relevance = self.pooling(memory)
    slots = self._slots(memory, alpha, None)
    b, m, s, h = relevance.shape
    q = self._heads(self.read_q(x.astype(jnp.float32)))
    k = self._heads(self.read_k(slots))
    logits = jnp.einsum("bthk,bphk->bthp", q, k) / np.sqrt(q.shape[-1])
    logits = logits + relevance.reshape(b, m * s, h).transpose(0, 2, 1)[:, None]
    a = jax.nn.softmax(logits, axis=-1)
    if span_mask is not None:
      slots = self._slots(memory, alpha, span_mask)
    v = self._heads(self.read_v(slots))
    out = jnp.einsum("bthp,bphk->btphk", a, v)
    out = out.reshape(*out.shape[:3], -1)
    return layers.constrain(out.astype(self.spec.compute_dtype),
                            ("batch", "length", "ports", "kv"))

  def __call__(self, x, memory: dict):
    return self.out_proj(jnp.sum(self.read(x, memory), axis=2))


# ssm -------------------------------------------------------------------------------

class SSMEncoder(nn.Module):
  spec: ArchSpec

  @nn.compact
  def __call__(self, embed, query, context, passage_ids) -> dict:
    s = self.spec
    seg = self.param("segment", layers.logical(nn.initializers.normal(0.02), (None, "embed")),
                     (2, s.embed_dim))
    x = jnp.concatenate([embed(query) + seg[0], embed(context) + seg[1]], axis=1)
    x = x.astype(jnp.float32)
    x = layers.LocalMixer(s.mixer_width, jnp.float32, name="local_mixer")(x)
    for i in range(s.enc_layers):
      x = ssm_lib.MambaBlock(s, name=f"block_{i}")(x)
    x = layers.RMSNorm(jnp.float32, name="norm_out")(x)
    q_len = query.shape[1]
    return {"encoded": layers.constrain(x[:, q_len:], ("batch", "ctx", "embed")),
            "query_summary": layers.masked_mean(x[:, :q_len], query != 0),
            "passage_ids": passage_ids, "ctx_mask": context != 0}


class SSMRetrieval(nn.Module):
  spec: ArchSpec
  span_decomposition = "exact"

  def setup(self):
    s = self.spec
    self.film = layers.dense(s.embed_dim, ("embed", None), "query_film", jnp.float32,
                             kernel_init=nn.initializers.zeros, use_bias=False)
    self.x_proj = layers.dense(s.ssm_inner, ("embed", "mlp"), "x_proj", jnp.float32)
    self.sel_proj = layers.dense(s.ssm_inner, ("embed", "mlp"), "sel_proj", jnp.float32)
    self.gates = ssm_lib.SelectiveGates(s.ssm_inner, s.ssm_state, name="gates")
    self.c_proj = layers.dense(s.ssm_state, ("embed", "state"), "c_proj", jnp.float32)
    self.out_proj = layers.dense(s.embed_dim, ("mlp", "embed"), "out", s.compute_dtype)

  def read(self, x, memory: dict, span_mask=None):
    enc = memory["encoded"]
    check_span_mask(span_mask, enc.shape[0], enc.shape[1])
    s = self.spec
    u = enc.astype(jnp.float32)
    film = 1.0 + self.film(memory["query_summary"])
    sel = nn.silu(self.sel_proj(u * film[:, None, :]))
    # The one change to the frozen model since the refactor (48619b3): PAD tokens put
    # nothing into the read port's slots (x_j = 0 there, gates kept; SPEC §1 on padded
    # contexts), as `architectures.ssm.SSMRetrieval.read_gates` does.
    x_in = self.x_proj(u) * memory["ctx_mask"][..., None].astype(jnp.float32)
    a, bx = self.gates(sel, x_in).expand()   # SelectiveGates returns factors now
    if s.ssm_reset_at_passages:
      a = a * (1.0 - ssm_lib.passage_starts(memory["passage_ids"]))[..., None, None]
    states = ssm_lib.slot_contributions(a, bx, memory["passage_ids"], s.num_passages,
                                        s.ssm_reset_at_passages, s.scan_impl).states(span_mask)
    c = self.c_proj(x.astype(jnp.float32))
    h = jnp.einsum("bts,bpcs->btpc", c, states).astype(s.compute_dtype)
    return layers.constrain(h, ("batch", "length", "ports", "kv"))

  def __call__(self, x, memory: dict):
    return self.out_proj(jnp.sum(self.read(x, memory), axis=2))


# the shared reader and the model ------------------------------------------------------

ENCODERS = {"attention": AttentionEncoder, "ssm": SSMEncoder, "memory_port": PassageEncoder}
RETRIEVALS = {"attention": CrossAttentionRetrieval, "ssm": SSMRetrieval,
              "memory_port": MemoryPortRetrieval}


class ReaderBlock(nn.Module):
  spec: ArchSpec
  has_retrieval: bool

  @nn.compact
  def __call__(self, x, memory: dict):
    s, dt = self.spec, self.spec.compute_dtype
    mask = layers.causal_mask(x.shape[1])
    y = layers.RMSNorm(dt, name="norm_attn")(x)
    x = x + layers.MultiHeadAttention(s.reader_heads, s.embed_dim // s.reader_heads, dt,
                                      name="self_attn")(y, y, mask)
    if self.has_retrieval:
      y = layers.RMSNorm(dt, name="norm_retrieval")(x)
      x = x + RETRIEVALS[s.family](s, name="retrieval")(y, memory).astype(dt)
    y = layers.RMSNorm(dt, name="norm_mlp")(x)
    x = x + layers.Mlp(s.reader_mlp_dim, dt, name="mlp")(y)
    return layers.constrain(x, ("batch", "length", "embed"))


class Reader(nn.Module):
  spec: ArchSpec

  @nn.compact
  def __call__(self, embed, query, context, answer, memory: dict):
    s = self.spec
    bos = jnp.full_like(answer[:, :1], BOS_ID)
    tokens = jnp.concatenate([query, bos, answer[:, :-1]], axis=1)
    x = embed(tokens)
    if s.bypass:
      seg = self.param("bypass_segment",
                       layers.logical(nn.initializers.normal(0.02), ("embed",)), (s.embed_dim,))
      x = jnp.concatenate([embed(context) + seg.astype(x.dtype), x], axis=1)
    x = x + layers.sinusoid_positions(x.shape[1], s.embed_dim)[None].astype(x.dtype)
    x = layers.LocalMixer(s.mixer_width, s.compute_dtype, name="local_mixer")(x)
    x = layers.constrain(x, ("batch", "length", "embed"))
    for i in range(s.reader_layers):
      x = ReaderBlock(s, i in s.retrieval_layers, name=f"block_{i}")(x, memory)
    x = layers.RMSNorm(s.compute_dtype, name="norm_out")(x[:, -answer.shape[1]:])
    return layers.constrain(embed.attend(x), ("batch", "length", "vocab"))


class RetrievalModel(nn.Module):
  """The pre-#14 model: build it with the live `make_spec` (same ArchSpec)."""
  spec: ArchSpec

  @nn.compact
  def __call__(self, query, context, passage_ids, answer):
    s = self.spec
    embed = layers.Embed(s.vocab_size, s.embed_dim, s.compute_dtype, name="embed")
    memory = ENCODERS[s.family](s, name="context_encoder")(embed, query, context, passage_ids)
    return Reader(s, name="reader")(embed, query, context, answer, memory)
