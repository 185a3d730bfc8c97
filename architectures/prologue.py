"""The context prologue shared by the attention and memory_port context encoders.

Shape legend (einsum letters):
  b batch, q query length, n context positions, e embed,
  r encoder sequences, u positions per encoder sequence.

`ContextPrologue` (module `context_encoder`) turns (query, context) into the
`ContextMemory` the read port reads:
  1. embedding   x_n = e(c_n) + pos_n (sinusoidal, the shared token table e);
  2. local mixer depthwise causal conv over the context (within a passage if the
                 layout says so): every token sees its line's preceding tokens;
  3. query conditioning (QueryFilm) x ⊙ (1 + W q̄), q̄ the mean query embedding;
  4. encoder blocks: pre-norm self-attention + MLP over the sequences the
                 layout arranges — one [b, n, e] sequence (attention) or one
                 [query; passage] block per passage, [b m, q + l, e]
                 (memory_port) — then a final RMSNorm.
A family differs only in its `ContextLayout` (attention.FlatContext,
memory.PassageBlocks). The ssm family's encoder is a selective scan over
[query; context] (architectures/ssm.py): it shares the memory structure, not
this prologue.
Parameter names (checkpoints): context_encoder/{local_mixer, query_film,
block_{i}, norm_out}.
"""
from __future__ import annotations

from typing import Protocol

import flax.linen as nn
import jax

from architectures import layers
from architectures.port import ContextMemory
from architectures.spec import ArchSpec

CTX_AXES: tuple[str, ...] = ("batch", "ctx", "embed")


class ContextLayout(Protocol):
  """How the prologue arranges the context into the encoder blocks' sequences."""
  passage_local_mixer: bool  # the local mixer's taps stay inside a passage

  @classmethod
  def of_spec(cls, spec: ArchSpec) -> "ContextLayout":
    """The layout of a model's static sizes."""

  def pack(self, x: jax.Array, embed: layers.Embed, query: jax.Array, context: jax.Array,
           passage_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sequences [r, u, e], attention mask [r, 1, 1|u, u]) from the context x [b, n, e]."""

  def unpack(self, seqs: jax.Array, query: jax.Array, context: jax.Array) -> jax.Array:
    """The context positions' encodings [b, n, e] from the sequences [r, u, e]."""


class ContextPrologue(nn.Module):
  """Embedding, local mixer, query conditioning and encoder blocks (see the module doc)."""
  spec: ArchSpec           # static sizes
  layout: ContextLayout    # how the context is arranged for the encoder blocks

  @nn.compact
  def __call__(self, embed: layers.Embed, query: jax.Array, context: jax.Array,
               passage_ids: jax.Array) -> ContextMemory:
    s, dt = self.spec, self.spec.compute_dtype
    n = context.shape[1]
    x = embed(context) + layers.sinusoid_positions(n, s.embed_dim)[None].astype(dt)
    x = layers.constrain(x, CTX_AXES)
    segments = passage_ids if self.layout.passage_local_mixer else None
    x = layers.LocalMixer(s.mixer_width, dt, name="local_mixer")(x, segments)
    q_summary = layers.masked_mean(embed(query), query != 0)              # [b,e]
    x = layers.QueryFilm(dt, name="query_film")(x, q_summary)
    seqs, mask = self.layout.pack(x, embed, query, context, passage_ids)  # [r,u,e]
    for i in range(s.enc_layers):
      seqs = layers.TransformerBlock(s.reader_heads, s.embed_dim // s.reader_heads,
                                     s.enc_mlp_dim, dt, name=f"block_{i}")(seqs, mask)
    x = self.layout.unpack(seqs, query, context)                          # [b,n,e]
    x = layers.RMSNorm(dt, name="norm_out")(x)
    return ContextMemory(encoded=layers.constrain(x, CTX_AXES), query_summary=q_summary,
                         passage_ids=passage_ids, ctx_mask=context != 0)
