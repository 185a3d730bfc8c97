"""SmolLM2-style causal decoder in Flax linen with per-layer read ports.

Llama architecture: token embedding (tied with the output head), L decoder
layers (RMSNorm -> grouped-query attention with RoPE -> residual, RMSNorm ->
SwiGLU MLP -> residual), final RMSNorm.

Read ports (stable names, see docs/conventions.md §3): module path
`layers_{i}/attn`, method `read`, for i in 0..L-1. `read(q, k, v, mask,
span_mask=None)` returns the attention output *before* the output projection,
h [B, T, H, Dh] with h_ti = Σ_j a_tij v_j; with `span_mask` S [B, N] (N <= T,
source positions 0..N-1; positions >= N count as outside S) it returns the
exact part Σ_{j∈S} a_tij v_j, computed with the attention weights of the same
run (`span_decomposition = 'exact'`). For a decoder-only LM the "context" is
the prompt itself, so source positions are sequence positions.

Layers are unrolled modules (no nn.scan), so an interceptor tells them apart by
`context.module.path`.

Padding: any pattern is allowed through `valid` [B, T] (False = pad); token
positions for RoPE are cumsum(valid) - 1, and pads are never attended to.
Left padding keeps the answer positions aligned at the end of the batch, which
the fast causal patcher (`patching.py`) relies on.

Shape legend: B batch, T sequence length, E width (576), H query heads (9),
G = H / K queries per KV head, K KV heads (3), Dh head dim (64), F MLP width
(1536), V vocabulary (49,152), N span-mask length (<= T), L layers, `...`
optional leading probe axes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

NEG_INF = -1e30


@dataclasses.dataclass(frozen=True)
class SmolLMConfig:
  """Hyper-parameters of a Llama-style decoder (defaults: SmolLM2-135M)."""
  vocab_size: int = 49152  # V
  width: int = 576  # E
  n_layers: int = 30  # L
  n_heads: int = 9  # H query heads
  n_kv_heads: int = 3  # K key/value heads (GQA)
  head_dim: int = 64  # Dh
  mlp_width: int = 1536  # F
  rope_base: float = 100000.0  # RoPE frequency base
  norm_eps: float = 1e-5  # RMSNorm epsilon
  max_len: int = 8192  # longest supported sequence (training context)
  dtype: Any = jnp.float32  # compute dtype


# ----------------------------------------------------------------------------
# Pure primitives shared by the linen modules and the fast causal patcher.
# ----------------------------------------------------------------------------


def as_f32(x: jax.Array) -> jax.Array:
  """x in at least float32 (float64 stays float64 under jax x64)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis: x / rms(x) * scale."""
  x32 = as_f32(x)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (y * scale).astype(x.dtype)


def unembed(x: jax.Array, table: jax.Array) -> jax.Array:
  """Logits [..., V] = x · tableᵀ of hidden states x [..., D] and the tied embedding table
  [V, D] (V = vocabulary, D = width), computed as table · xᵀ [V, N] and transposed.

  The same product, laid out so that XLA:CPU's dot is fast: for x · tableᵀ with a few rows
  it picks a slow kernel at some row counts when YNNPACK fusions are off (ceu_jax/xla_cpu.py)
  — measured at V = 49,152, D = 576: 86 ms for 4 rows (a decode step of batch 4) against
  15 ms this way, 243 vs 53 ms for 128 rows, 877 vs 539 ms for 1,024, but about equal for
  8–64 rows (a batch-8 or -16 decode step; benchmarks/unembed_bench.py). The
  barrier keeps XLA from folding the transpose back into the slow form. Equal to x · tableᵀ
  up to float reassociation (tests/test_pretrained.py). Other backends get the plain
  product: their matmul libraries take either layout, and the transposed copy would double
  the logits' memory (a training batch's [B, T, V] logits are the largest tensor)."""
  if jax.default_backend() != 'cpu':
    return x @ table.T
  lead = x.shape[:-1]
  logits_t = jax.lax.optimization_barrier(table @ x.reshape(-1, x.shape[-1]).T)
  return logits_t.T.reshape(*lead, table.shape[0])


def positions_from_valid(valid: jax.Array) -> jax.Array:
  """RoPE positions [..., T] int32: index among the valid tokens (pads: 0)."""
  pos = jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1
  return jnp.maximum(pos, 0)


def apply_rope(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
  """Rotary embedding on *interleaved* pairs (2i, 2i+1) of x [..., T, H, Dh].

  The GGUF converter permuted the Q/K projection rows so that llama.cpp's
  interleaved RoPE is equivalent to the HF half-split one; we rotate the
  interleaved pairs too. The result is returned de-interleaved ([evens' | odds']
  along Dh): q.k is invariant under the same permutation of q and k, so the
  attention weights are unchanged and the reshuffle is skipped.
  """
  half = x.shape[-1] // 2
  ft = as_f32(x).dtype
  inv_freq = base ** (-jnp.arange(half, dtype=ft) * 2.0 / x.shape[-1])
  ang = positions.astype(ft)[..., None, None] * inv_freq  # [..., T, 1, Dh/2]
  cos, sin = jnp.cos(ang), jnp.sin(ang)
  x1 = as_f32(x[..., 0::2])
  x2 = as_f32(x[..., 1::2])
  out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
  return out.astype(x.dtype)


def causal_mask(valid: jax.Array) -> jax.Array:
  """Attention mask [B, T, T] bool: key j visible to query i iff j <= i, j valid."""
  t = valid.shape[-1]
  tri = jnp.tril(jnp.ones((t, t), bool))
  return tri[None] & valid[:, None, :].astype(bool)


def attention_weights(q: jax.Array, k: jax.Array, mask: jax.Array) -> jax.Array:
  """Softmax attention weights a [..., B, K, G, Tq, Tk] (grouped-query layout).

  q [..., B, Tq, H, Dh], k [..., B, Tk, K, Dh], mask [..., B, Tq, Tk] bool.
  Query head h uses KV head h // G (Llama's repeat_kv). Fully masked rows
  (queries at pad positions) get all-zero weights.
  """
  *lead, tq, h, dh = q.shape
  kv = k.shape[-2]
  qg = as_f32(q.reshape(*lead, tq, kv, h // kv, dh))
  s = jnp.einsum('...qkgd,...skd->...kgqs', qg, k.astype(qg.dtype))
  s = s * (dh ** -0.5)
  m = mask[..., None, None, :, :]
  a = jax.nn.softmax(jnp.where(m, s, NEG_INF), axis=-1)
  return a * m


def read_values(a: jax.Array, v: jax.Array,
                span_mask: Optional[jax.Array] = None) -> jax.Array:
  """h [..., B, Tq, H, Dh] = Σ_{j ∈ S} a_ij v_j from a [..., B, K, G, Tq, Tk].

  v [..., B, Tk, K, Dh]; span_mask [..., B, N] (N <= Tk, padded with False),
  None for every source position.
  """
  if span_mask is not None:
    s = span_mask.astype(a.dtype)
    tk = a.shape[-1]
    if s.shape[-1] > tk:
      raise ValueError(f'span_mask has {s.shape[-1]} positions > {tk} source positions')
    if s.shape[-1] < tk:
      pad = [(0, 0)] * (s.ndim - 1) + [(0, tk - s.shape[-1])]
      s = jnp.pad(s, pad)
    a = a * s[..., None, None, None, :]
  h = jnp.einsum('...kgqs,...skd->...qkgd', a, v.astype(a.dtype))
  *lead, tq, kv, g, dh = h.shape
  return h.reshape(*lead, tq, kv * g, dh)


def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array,
           w_down: jax.Array) -> jax.Array:
  """SwiGLU MLP: (silu(x W_gate) * x W_up) W_down, kernels [in, out]."""
  return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


# ----------------------------------------------------------------------------
# Linen modules.
# ----------------------------------------------------------------------------


class Attention(nn.Module):
  """Grouped-query self-attention whose read (before o_proj) is a port."""
  config: SmolLMConfig  # model hyper-parameters

  span_decomposition = 'exact'  # read(span_mask=S) + read(span_mask=~S) == read()

  def setup(self):
    c = self.config
    dense = lambda n, name: nn.Dense(n, use_bias=False, dtype=c.dtype, name=name)
    self.q_proj = dense(c.n_heads * c.head_dim, 'q_proj')
    self.k_proj = dense(c.n_kv_heads * c.head_dim, 'k_proj')
    self.v_proj = dense(c.n_kv_heads * c.head_dim, 'v_proj')
    self.o_proj = dense(c.width, 'o_proj')

  def qkv(self, x: jax.Array, positions: jax.Array):
    """Rotated queries [B,T,H,Dh], rotated keys [B,T,K,Dh], values [B,T,K,Dh]."""
    c = self.config
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, c.n_heads, c.head_dim)
    k = self.k_proj(x).reshape(b, t, c.n_kv_heads, c.head_dim)
    v = self.v_proj(x).reshape(b, t, c.n_kv_heads, c.head_dim)
    return (apply_rope(q, positions, c.rope_base),
            apply_rope(k, positions, c.rope_base), v)

  def read(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
           span_mask: Optional[jax.Array] = None) -> jax.Array:
    """Read port: h [B, T, H, Dh] = Σ_{j (∈ S)} a_ij v_j (see module doc)."""
    a = attention_weights(q, k, mask)
    return read_values(a, v, span_mask).astype(self.config.dtype)

  def project(self, h: jax.Array) -> jax.Array:
    """Output projection of h [..., T, H, Dh] -> [..., T, E]."""
    return self.o_proj(h.reshape(*h.shape[:-2], -1))

  def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array):
    q, k, v = self.qkv(x, positions)
    return self.project(self.read(q, k, v, mask)), (q, k, v)


class MLP(nn.Module):
  """SwiGLU feed-forward block."""
  config: SmolLMConfig  # model hyper-parameters

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = self.config
    dense = lambda n, name: nn.Dense(n, use_bias=False, dtype=c.dtype, name=name)
    gate = dense(c.mlp_width, 'gate_proj')(x)
    up = dense(c.mlp_width, 'up_proj')(x)
    return dense(c.width, 'down_proj')(nn.silu(gate) * up)


class RMSNorm(nn.Module):
  """Root-mean-square layer norm with a learned scale."""
  eps: float  # added to the mean square

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],))
    return rms_norm(x, scale, self.eps)


class DecoderLayer(nn.Module):
  """Pre-norm Llama block: x + attn(norm(x)); x + mlp(norm(x))."""
  config: SmolLMConfig  # model hyper-parameters

  def setup(self):
    self.attn_norm = RMSNorm(self.config.norm_eps)
    self.attn = Attention(self.config)
    self.mlp_norm = RMSNorm(self.config.norm_eps)
    self.mlp = MLP(self.config)

  def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array):
    """x [B, T, E] -> (x' [B, T, E], (q, k, v) of this layer)."""
    a, qkv = self.attn(self.attn_norm(x), positions, mask)
    x = x + a
    return x + self.mlp(self.mlp_norm(x)), qkv


class SmolLM(nn.Module):
  """Llama-style causal LM; read ports at `layers_{i}/attn` method `read`."""
  config: SmolLMConfig  # model hyper-parameters

  def setup(self):
    c = self.config
    self.embed = nn.Embed(c.vocab_size, c.width, dtype=c.dtype, name='embed')
    self.layers = [DecoderLayer(c, name=f'layers_{i}') for i in range(c.n_layers)]
    self.final_norm = RMSNorm(c.norm_eps)

  def __call__(self, tokens: jax.Array, valid: Optional[jax.Array] = None,
               n_logits: Optional[int] = None, return_cache: bool = False):
    """Logits [B, T', V] for the last T' = n_logits positions (all if None).

    tokens [B, T] int, valid [B, T] bool (None: all valid). With
    return_cache=True also returns a dict of per-layer stacks: `x` [L, B, T, E]
    (residual input of each layer), `q` [L, B, T, H, Dh], `k`, `v`
    [L, B, T, K, Dh] (rotated q/k as used by attention), `positions` [B, T],
    `valid` [B, T].
    """
    c = self.config
    b, t = tokens.shape
    if t > c.max_len:
      raise ValueError(f'sequence length {t} exceeds the maximum length {c.max_len}')
    if valid is None:
      valid = jnp.ones((b, t), bool)
    valid = valid.astype(bool)
    positions = positions_from_valid(valid)
    mask = causal_mask(valid)
    x = self.embed(tokens)
    xs, qs, ks, vs = [], [], [], []
    for layer in self.layers:
      xs.append(x)
      x, (q, k, v) = layer(x, positions, mask)
      qs.append(q), ks.append(k), vs.append(v)
    if n_logits is not None:
      x = x[:, t - n_logits:]
    logits = unembed(self.final_norm(x).astype(c.dtype), self.embed.embedding.astype(c.dtype))
    if not return_cache:
      return logits
    cache = dict(x=jnp.stack(xs), q=jnp.stack(qs), k=jnp.stack(ks),
                 v=jnp.stack(vs), positions=positions, valid=valid)
    return logits, cache


def read_port_paths(config: SmolLMConfig) -> list[tuple[str, str]]:
  """(module path, method) of every read port, in layer order."""
  return [(f'layers_{i}/attn', 'read') for i in range(config.n_layers)]


def layer_index(path: Any) -> Optional[int]:
  """Layer index of a module path ('layers_7/attn' or ('layers_7', 'attn'))."""
  parts = path.split('/') if isinstance(path, str) else list(path)
  for p in parts:
    if isinstance(p, str) and p.startswith('layers_'):
      return int(p[len('layers_'):])
  return None
