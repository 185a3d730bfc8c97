"""Memory-port family: each passage is written into its own slot(s); the reader reads r ports.

Shape legend (einsum letters):
  b batch, n context positions, t reader positions, e embed, d slot width (= h * k),
  m passages, l positions per passage (= n / m), q query positions,
  s slots per passage, p ports (= m * s), h heads, k head width.

Passage layout: passage j occupies context positions [j l, (j + 1) l) (what
ceu_jax.data's tasks produce; a shorter passage ends in PAD tokens, which are
masked), so the context is a [b, m, l] block of passages.
Encoder: the shared `ContextPrologue` (architectures/prologue.py) with the
`PassageBlocks` layout: a passage-wise encoder (self-attention over the query
tokens and one passage, as in Fusion-in-Decoder) encodes each [query; passage]
block of length q + l on its own ([b m, q + l, e]: cost linear in n at fixed l).
Write (method `write`): query-aware multi-head attention pooling writes passage m
into slot (m, s), one softmax per head over the passage:
  pooled[m,s,h] = Σ_{l} α[m,s,h,l] W_v^h e_{m,l},  slot = pooled + MLP(pooled).
Read port (site `reader/block_{i}/retrieval`, method `read`), per head:
  h_f[b, t, p, h, :] = a[b, t, h, p] · W_o^{v,h} slot_p
  a = softmax_p(<q_{t,h}, W_k^h slot_p> / sqrt(k) + relevance_{p,h}), relevance the
  log-partition of passage p's pooling scores for head h (so a · α is, per head, a
  softmax over all retrieved tokens, as in cross-attention); h_f is returned as
  [b, t, p, d] with the heads concatenated.
Port-restricted patching is exact (ports are separate summands of the output).
Span restriction goes through the slot encoder and is approximate
(`span_decomposition = 'approximate'`): Π_S h_f uses the slots re-encoded from
pooled^S = Σ_{l∈S} α W_v e (pooling and read weights of the same run kept),
which is exact for S = all tokens and S = ∅ but not additive over S ∪ S̄
because of the slot MLP.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from architectures import layers
from architectures.port import ContextMemory, ReadPort
from architectures.spec import ArchSpec


def passage_len(context_len: int, num_passages: int) -> int:
  """l = n / m; ValueError unless the context splits into m equal passage blocks."""
  if num_passages < 1 or context_len % num_passages:
    raise ValueError(f"memory_port needs context_len (= {context_len}) to be a multiple of "
                     f"num_passages (= {num_passages}): passage j occupies positions "
                     f"[j*n/m, (j+1)*n/m)")
  return context_len // num_passages


def check_passage_layout(passage_ids, num_passages: int) -> None:
  """ValueError unless passage_ids [b, n] (concrete) is position // (n / m).

  The encoder cannot check traced values (and init runs on placeholder ids);
  every ceu_jax.data task writes this layout (tests/test_memory_blocked.py).
  Inside a block, attention and pooling are still masked by passage_ids, so
  off-layout ids never mix passages: a token whose id differs from its block's
  index is left out of every slot.
  """
  n = passage_ids.shape[-1]
  l = passage_len(n, num_passages)
  want = np.arange(n) // l
  bad = np.argwhere(np.asarray(passage_ids) != want[None])
  if bad.size:
    i, j = bad[0]
    raise ValueError(f"passage_ids must be position // (context_len / num_passages) = "
                     f"position // {l} (passage j at positions [j*{l}, (j+1)*{l}); shorter "
                     f"passages end in PAD); got passage_ids[{i}, {j}] = "
                     f"{int(np.asarray(passage_ids)[i, j])}, expected {int(want[j])}")


def to_blocks(x: jax.Array, num_passages: int) -> jax.Array:
  """[b, n, ...] -> [b, m, l, ...] (passage j = positions [j l, (j + 1) l))."""
  b, n = x.shape[:2]
  return x.reshape(b, num_passages, passage_len(n, num_passages), *x.shape[2:])


@dataclasses.dataclass(frozen=True)
class PassageBlocks:
  """`ContextLayout` of the memory_port encoder: one [query; passage j] block per passage.

  In the shared `ContextPrologue` (architectures/prologue.py) each block is
  encoded on its own (as in Fusion-in-Decoder): a context token attends to the
  query tokens and its own passage, a query token only to the query, so no
  information crosses passages: passage j's encoding depends on (query,
  passage j) alone. Cost is m (q + l)^2, linear in n at fixed l. The local
  mixer's taps also stay inside a passage.
  """
  num_passages: int                  # m
  passage_local_mixer: bool = True   # the local mixer never crosses a passage boundary

  @classmethod
  def of_spec(cls, spec: ArchSpec) -> "PassageBlocks":
    return cls(spec.num_passages)

  def pack(self, x, embed, query, context, passage_ids):
    """([b m, q + l, e] blocks, mask [b m, 1, q + l, q + l]) from x [b, n, e]."""
    (b, n, e), nq, m = x.shape, query.shape[1], self.num_passages
    pos = layers.sinusoid_positions(n + nq, e)[None, n:].astype(x.dtype)  # after the context
    xq = (embed(query) + pos).astype(x.dtype)                              # [b,q,e]
    blocks = to_blocks(x, m)                                               # [b,m,l,e]
    l = blocks.shape[2]
    xq = jnp.broadcast_to(xq[:, None], (b, m, nq, e))
    seqs = jnp.concatenate([xq, blocks], axis=2).reshape(b * m, nq + l, e)
    return seqs, self.block_mask(query, context, passage_ids, m)

  def unpack(self, seqs, query, context):
    """The context part of every block, [b m, q + l, e] -> [b, n, e]."""
    (b, n), nq = context.shape, query.shape[1]
    e = seqs.shape[-1]
    return seqs.reshape(b, self.num_passages, -1, e)[:, :, nq:].reshape(b, n, e)

  @staticmethod
  def block_mask(query, context, passage_ids, num_passages: int) -> jax.Array:
    """[b m, 1, q+l, q+l]: context -> query and own passage; query -> query (PAD never)."""
    b, nq = query.shape
    pid, c_ok = to_blocks(passage_ids, num_passages), to_blocks(context != 0, num_passages)
    m, l = pid.shape[1:]
    q_ok = jnp.broadcast_to((query != 0)[:, None, None, :], (b, m, l, nq))
    ctx_rows = jnp.concatenate(
        [q_ok, (pid[..., :, None] == pid[..., None, :]) & c_ok[..., None, :]], axis=3)
    q_rows = jnp.concatenate([jnp.broadcast_to((query != 0)[:, None, None, :], (b, m, nq, nq)),
                              jnp.zeros((b, m, nq, l), bool)], axis=3)
    return jnp.concatenate([q_rows, ctx_rows], axis=2).reshape(b * m, 1, nq + l, nq + l)


class MemoryPortRetrieval(ReadPort):
  """Query-aware multi-head slot writer + reader over r = m * s memory ports."""
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

  def pooling(self, memory: ContextMemory) -> tuple[jax.Array, jax.Array]:
    """Pooling weights α [b, m, s, h, l] (softmax over passage m) and log-partitions [b, m, s, h]."""
    m = self.spec.num_passages
    e = to_blocks(memory.encoded.astype(jnp.float32), m)                  # [b,m,l,e]
    q_summary = self.pool_norm(memory.query_summary)
    q = self._heads(self.pool_q(q_summary)[:, None, :] + self.slot_query[None])
    k = self._heads(self.pool_k(e))                                       # [b,m,l,h,k]
    logits = jnp.einsum("bshk,bmlhk->bmshl", q, k) / np.sqrt(k.shape[-1])
    ok = ((to_blocks(memory.passage_ids, m) == jnp.arange(m)[None, :, None])
          & to_blocks(memory.ctx_mask, m))[:, :, None, None, :]           # [b,m,1,1,l]
    logits = jnp.where(ok, logits, layers.NEG_INF)                        # [b,m,s,h,l]
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jax.nn.softmax(logits, axis=-1) * ok, lse

  def write(self, memory: ContextMemory, span_mask: jax.Array | None = None) -> jax.Array:
    """Slots [b, p, d]; with span_mask, slots re-encoded from the S part of pooling."""
    return self._slots(memory, self.pooling(memory)[0], span_mask)

  def _slots(self, memory: ContextMemory, alpha: jax.Array,
             span_mask: jax.Array | None) -> jax.Array:
    """Slots [b, p, d] from pooling weights α [b, m, s, h, l] (restricted to S if given)."""
    m = self.spec.num_passages
    v = self._heads(self.pool_v(to_blocks(memory.encoded.astype(jnp.float32), m)))
    present = jnp.ones(alpha.shape[:3], jnp.float32)                      # v [b,m,l,h,k]
    if span_mask is not None:
      alpha = alpha * to_blocks(span_mask.astype(jnp.float32), m)[:, :, None, None, :]
      present = (alpha.sum((-2, -1)) > 0).astype(jnp.float32)
    pooled = jnp.einsum("bmshl,bmlhk->bmshk", alpha, v)
    pooled = pooled.reshape(*pooled.shape[:3], -1)                        # [b,m,s,d]
    slots = (pooled + self.slot_mlp(pooled)) * present[..., None]
    b, m, s, d = slots.shape
    return slots.reshape(b, m * s, d)

  def port_values(self, x: jax.Array, memory: ContextMemory,
                  span_mask: jax.Array | None) -> jax.Array:
    """h_f [b, t, p, d]: per-port read values weighted by the run's per-head port attention."""
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
    return out.reshape(*out.shape[:3], -1)                                # [b,t,p,d]
