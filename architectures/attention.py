"""Attention family: self-attention context encoder, cross-attention read port.

Shape legend (einsum letters):
  b batch, t reader positions, n context positions, e embed,
  h read heads (= ports p), k per-head features.

Context encoder: the shared `ContextPrologue` (architectures/prologue.py) over
one sequence of the N context tokens (`FlatContext`), every token attending
to every non-PAD token.
Read port (site `reader/block_{i}/retrieval`, method `read`):
  h_f[b, t, h, :] = sum_n a[b, h, t, n] v[b, n, h, :]      (before the output projection)
  read(..., span_mask=S) = sum_{n in S} a[b, h, t, n] v[b, n, h, :], with the
  attention weights a of the same run, so Π_S h + Π_S̄ h = h exactly.
Memory: the reader attends over N x (h k) keys and values per read layer.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from architectures import layers
from architectures.port import ContextMemory, ReadPort
from architectures.spec import ArchSpec


@dataclasses.dataclass(frozen=True)
class FlatContext:
  """`ContextLayout` of the attention encoder: the context is one sequence [b, n, e]."""
  passage_local_mixer: bool = False  # the local mixer runs across passage boundaries

  @classmethod
  def of_spec(cls, spec: ArchSpec) -> "FlatContext":
    del spec
    return cls()

  def pack(self, x, embed, query, context, passage_ids):
    """(x [b, n, e], key mask [b, 1, 1, n]: every non-PAD context token)."""
    del embed, query, passage_ids
    return x, (context != 0)[:, None, None, :]

  def unpack(self, seqs, query, context):
    del query, context
    return seqs


class CrossAttentionRetrieval(ReadPort):
  """Per-head cross-attention from reader positions to the encoded context."""
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

  def weights(self, x: jax.Array, memory: ContextMemory) -> jax.Array:
    """Attention weights a [b, h, t, n] of reader positions over context tokens."""
    q = self.q_proj(x)
    k = self.k_proj(memory.encoded)
    return layers.attention_weights(q, k, memory.ctx_mask[:, None, None, :])

  def port_values(self, x: jax.Array, memory: ContextMemory,
                  span_mask: jax.Array | None) -> jax.Array:
    """h_f [b, t, h, k]; with span_mask [b, n] the part Σ_{n∈S} a v (exact)."""
    a = self.weights(x, memory).astype(self.spec.compute_dtype)
    v = self.v_proj(memory.encoded)
    if span_mask is not None:
      a = a * span_mask.astype(a.dtype)[:, None, None, :]
    return jnp.einsum("bhtn,bnhk->bthk", a, v)

  def project(self, h: jax.Array) -> jax.Array:
    """out [b, t, e] = Σ_{h,k} h_f[b, t, h, k] W_o[h, k, e]."""
    return self.out_proj(h)
