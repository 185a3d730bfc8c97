"""Shared building blocks: embeddings, norms, MLPs, multi-head attention.

Shape legend (einsum letters):
  b batch, t query/reader positions, n key/context positions,
  e embed (model width), h heads, k per-head features, f MLP hidden.

Every parameter carries logical axis names (docs/conventions.md §4) through
`nn.with_logical_partitioning`; activations are annotated with
`nn.with_logical_constraint` at block boundaries.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Dtype = Any
NEG_INF = -1e9  # finite mask value: a fully masked row stays finite

default_kernel_init = nn.initializers.lecun_normal()


class LogicalParam(nn.LogicallyPartitioned):
  """A logically partitioned parameter box that is safe under a current mesh.

  flax's DenseGeneral calls its kernel initialiser with a flat 2-d shape and
  reshapes the boxed value afterwards (`unbox()`, then `replace_boxed`); the
  stock box would constrain the flat value with the full-rank names, which
  fails under `jax.set_mesh`. This box applies its constraint only once the
  value has the rank its names describe (the reshaped parameter).
  """

  def unbox(self, apply_constraint: bool = True):
    if jnp.ndim(self.value) != len(self.names):
      return self.value
    return super().unbox(apply_constraint)


def logical(init, axes: Sequence[str | None]):
  """An initializer whose parameter carries logical axis names `axes`."""
  names = tuple(axes)

  def wrapper(*args, **kwargs):
    return LogicalParam(init(*args, **kwargs), names)
  return wrapper


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """Annotate an activation with logical axis names.

  Takes effect under a current mesh (`jax.set_mesh`) with logical axis rules
  (`nn.logical_axis_rules`); a no-op without either.
  """
  return nn.with_logical_constraint(x, tuple(axes))


def sinusoid_positions(length: int, dim: int) -> np.ndarray:
  """Fixed sinusoidal position table [length, dim] (no parameters)."""
  pos = np.arange(length, dtype=np.float32)[:, None]
  i = np.arange(dim // 2, dtype=np.float32)[None, :]
  angle = pos / np.power(10000.0, 2.0 * i / max(dim, 2))
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle[:, : dim - dim // 2])
  return table


def dense(features: int | tuple[int, ...], axes: Sequence[str | None], name: str,
          dtype: Dtype = jnp.float32, use_bias: bool = False,
          kernel_init=default_kernel_init, axis: int | tuple[int, ...] = -1):
  """DenseGeneral with logically named kernel axes (`axes` = in axes + out axes)."""
  feats = features if isinstance(features, tuple) else (features,)
  return nn.DenseGeneral(
      features=feats, axis=axis, use_bias=use_bias, dtype=dtype, name=name,
      kernel_init=logical(kernel_init, axes),
      bias_init=logical(nn.initializers.zeros, axes[-len(feats):]))


class RMSNorm(nn.Module):
  """Root-mean-square norm with a learned scale over the last axis."""
  dtype: Dtype = jnp.float32  # compute dtype of the output

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", logical(nn.initializers.ones, ("embed",)), (x.shape[-1],))
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * scale).astype(self.dtype)


class Embed(nn.Module):
  """Token embedding table [V, E], shared by the context encoder and the reader.

  `attend` gives the tied output logits.
  """
  vocab_size: int  # V
  embed_dim: int   # E
  dtype: Dtype = jnp.float32

  def setup(self):
    self.table = self.param(
        "embedding", logical(nn.initializers.normal(stddev=1.0), ("vocab", "embed")),
        (self.vocab_size, self.embed_dim))

  def __call__(self, tokens: jax.Array) -> jax.Array:
    x = jnp.take(self.table, tokens, axis=0) * np.sqrt(self.embed_dim)
    return x.astype(self.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    """Logits [..., V] of features x [..., E] (tied weights)."""
    return jnp.einsum("...e,ve->...v", x.astype(jnp.float32), self.table) / np.sqrt(
        self.embed_dim)


class Mlp(nn.Module):
  """Position-wise GELU MLP e -> f -> e."""
  hidden_dim: int   # f
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    e = x.shape[-1]
    y = dense(self.hidden_dim, ("embed", "mlp"), "wi", self.dtype)(x)
    y = nn.gelu(y)
    return dense(e, ("mlp", "embed"), "wo", self.dtype)(y)


def attention_weights(q: jax.Array, k: jax.Array, mask: jax.Array | None) -> jax.Array:
  """Softmax weights [b, h, t, n] from q [b,t,h,k] and k [b,n,h,k]; mask [b,1|h,t,n]."""
  logits = jnp.einsum("bthk,bnhk->bhtn", q, k).astype(jnp.float32)
  logits = logits / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = jnp.where(mask, logits, NEG_INF)
  return jax.nn.softmax(logits, axis=-1)


class MultiHeadAttention(nn.Module):
  """Multi-head dot-product attention (self or cross); output [b, t, e]."""
  num_heads: int  # h
  head_dim: int   # k
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_q: jax.Array, x_kv: jax.Array, mask: jax.Array | None) -> jax.Array:
    hk = (self.num_heads, self.head_dim)
    q = dense(hk, ("embed", "heads", "kv"), "query", self.dtype)(x_q)
    k = dense(hk, ("embed", "heads", "kv"), "key", self.dtype)(x_kv)
    v = dense(hk, ("embed", "heads", "kv"), "value", self.dtype)(x_kv)
    a = attention_weights(q, k, mask).astype(self.dtype)
    out = jnp.einsum("bhtn,bnhk->bthk", a, v)
    return dense(x_q.shape[-1], ("heads", "kv", "embed"), "out", self.dtype,
                 axis=(-2, -1))(out)


class TransformerBlock(nn.Module):
  """Pre-norm self-attention + MLP block (used by the context encoders)."""
  num_heads: int  # h
  head_dim: int   # k
  mlp_dim: int    # f
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None) -> jax.Array:
    y = RMSNorm(self.dtype, name="norm_attn")(x)
    x = x + MultiHeadAttention(self.num_heads, self.head_dim, self.dtype, name="attn")(
        y, y, mask)
    y = RMSNorm(self.dtype, name="norm_mlp")(x)
    x = x + Mlp(self.mlp_dim, self.dtype, name="mlp")(y)
    return constrain(x, ("batch", "ctx", "embed"))


class LocalMixer(nn.Module):
  """Residual depthwise causal convolution: x_j + Σ_w k_w ⊙ x_{j-w} (w < width).

  With `segments` [b, l], taps never cross a segment boundary (passage-wise encoders).
  Gives every token its line's preceding tokens (e.g. the value token its ID and KEY).
  """
  width: int = 7  # taps
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, segments: jax.Array | None = None) -> jax.Array:
    e = x.shape[-1]
    taps = self.param("taps", logical(nn.initializers.normal(0.1), (None, "embed")),
                      (self.width, e))
    out = jnp.zeros_like(x)
    for w in range(self.width):
      shifted = jnp.pad(x, ((0, 0), (w, 0), (0, 0)))[:, : x.shape[1]]
      if segments is not None:
        seg = jnp.pad(segments, ((0, 0), (w, 0)), constant_values=-1)[:, : x.shape[1]]
        shifted = shifted * (seg == segments)[..., None].astype(x.dtype)
      out = out + shifted * taps[w].astype(x.dtype)
    return x + out


class QueryFilm(nn.Module):
  """Query-aware encoding: x ⊙ (1 + W q̄), q̄ the mean query embedding (W starts at 0).

  The product lets the encoder's MLP compute match features between a context
  token and the query (e.g. <e(ID_j), e(ID_q)>) before anything is read.
  """
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, query_summary: jax.Array) -> jax.Array:
    film = dense(x.shape[-1], ("embed", None), "film", jnp.float32,
                 kernel_init=nn.initializers.zeros)(query_summary.astype(jnp.float32))
    return (x * (1.0 + film[:, None, :])).astype(self.dtype)


def causal_mask(length: int) -> jax.Array:
  """[1, 1, t, t] lower-triangular mask."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of x [b, l, e] over positions where mask [b, l] is set -> [b, e]."""
  w = mask.astype(jnp.float32)[..., None]
  return (x.astype(jnp.float32) * w).sum(1) / jnp.maximum(w.sum(1), 1.0)
