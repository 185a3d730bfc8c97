"""The shared reader and the full retrieval model (one per family).

Shape legend (einsum letters):
  b batch, q query length, n context length, a answer length,
  t reader positions (= [n if bypass] + q + a), e embed, v vocabulary.

`RetrievalModel.apply(variables, query, context, passage_ids, answer)` returns
logits [b, a, v]; logits[:, i] predicts answer[:, i] from the query, the context
and answer[:, :i] (docs/conventions.md §2). Module tree:
  embed                          shared token table (tied output logits)
  context_encoder                ContextPrologue (attention: flat context; memory_port:
                                 [query; passage] blocks) or SSMEncoder (ssm); writes
                                 the ContextMemory every read port reads
  reader/local_mixer             depthwise causal conv (gathers the query's ID and KEY)
  reader/block_{i}/self_attn     causal self-attention over the reader sequence
  reader/block_{i}/retrieval     the read port (a ReadPort, method `read`) at retrieval layers
  reader/block_{i}/mlp
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from architectures import layers
from architectures.attention import CrossAttentionRetrieval, FlatContext
from architectures.memory import MemoryPortRetrieval, PassageBlocks
from architectures.port import ContextMemory, ReadPort
from architectures.prologue import ContextLayout, ContextPrologue
from architectures.spec import BOS_ID, ArchSpec
from architectures.ssm import SSMEncoder, SSMRetrieval

# family -> the ContextLayout of its ContextPrologue (ssm: its own scan encoder).
LAYOUTS: dict[str, type[ContextLayout]] = {"attention": FlatContext, "memory_port": PassageBlocks}
# family -> class of its read port.
RETRIEVALS: dict[str, type[ReadPort]] = {
    "attention": CrossAttentionRetrieval, "ssm": SSMRetrieval,
    "memory_port": MemoryPortRetrieval}


def context_encoder(spec: ArchSpec, name: str) -> nn.Module:
  """The family's context encoder: the shared prologue in the family's layout, or
  the selective-scan encoder (ssm)."""
  if spec.family in LAYOUTS:
    return ContextPrologue(spec, LAYOUTS[spec.family].of_spec(spec), name=name)
  return SSMEncoder(spec, name=name)


class ReaderBlock(nn.Module):
  """Pre-norm causal self-attention, [retrieval read,] MLP."""
  spec: ArchSpec        # static sizes
  has_retrieval: bool   # this layer holds a read port

  @nn.compact
  def __call__(self, x: jax.Array, memory: ContextMemory) -> jax.Array:
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
  """Causal decoder over [context (bypass only); query; answer shifted right]."""
  spec: ArchSpec  # static sizes

  @nn.compact
  def __call__(self, embed: layers.Embed, query, context, answer,
               memory: ContextMemory) -> jax.Array:
    s = self.spec
    bos = jnp.full_like(answer[:, :1], BOS_ID)
    tokens = jnp.concatenate([query, bos, answer[:, :-1]], axis=1)
    x = embed(tokens)
    if s.bypass:  # early fusion: the retrieved tokens also enter the reader's sequence
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
  """Context encoder (per family) + shared reader; see the module docstring."""
  spec: ArchSpec  # static sizes

  def _check_inputs(self, query, context, passage_ids, answer) -> None:
    s = self.spec
    b = query.shape[0]
    want = {"query": ("query_len", s.query_len), "context": ("context_len", s.context_len),
            "passage_ids": ("context_len", s.context_len),
            "answer": ("answer_len", s.answer_len)}
    for (name, (field, size)), arr in zip(want.items(), (query, context, passage_ids, answer)):
      if tuple(arr.shape) != (b, size):
        raise ValueError(f"{name} must have shape [B, {field}] = {(b, size)}, "
                         f"got {tuple(arr.shape)}")

  @nn.compact
  def __call__(self, query, context, passage_ids, answer) -> jax.Array:
    self._check_inputs(query, context, passage_ids, answer)
    s = self.spec
    embed = layers.Embed(s.vocab_size, s.embed_dim, s.compute_dtype, name="embed")
    memory = context_encoder(s, name="context_encoder")(embed, query, context, passage_ids)
    return Reader(s, name="reader")(embed, query, context, answer, memory)
