"""Independent plain-numpy forward of SmolLM2 from the raw GGUF tensors.

Written separately from `ceu_jax.pretrained.model`: weights are read with
`gguf` directly, the converter's Q/K row permutation is undone and RoPE uses
the HF "rotate half" form, so it shares no code with the Flax model.

Shape legend: T tokens, E width, H heads, K KV heads, Dh head dim, V vocab.
"""
from __future__ import annotations

import numpy as np


def read_weights(path: str) -> tuple[dict, dict]:
  """({name: float32 array [out, in]}, metadata) straight from the GGUF file."""
  from gguf import GGUFReader
  from gguf.quants import dequantize
  r = GGUFReader(path)
  w = {t.name: np.asarray(dequantize(t.data, t.tensor_type), np.float32) for t in r.tensors}
  meta = {k: r.fields[k].contents() for k in (
      'llama.block_count', 'llama.attention.head_count', 'llama.attention.head_count_kv',
      'llama.rope.freq_base', 'llama.attention.layer_norm_rms_epsilon')}
  return w, meta


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Inverse of llama.cpp's convert permute (rows of a Q/K matrix)."""
  d = w.shape[0] // n_head
  return w.reshape(n_head, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def _rms(x, g, eps):
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def _rope_half(x, base):  # x [T, H, Dh], HF rotate_half convention
  t, _, d = x.shape
  inv = base ** (-np.arange(0, d, 2) / d)
  ang = np.arange(t)[:, None] * inv[None]  # [T, Dh/2]
  cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None]
  sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None]
  rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
  return x * cos + rot * sin


def forward(w: dict, meta: dict, ids: list[int], n_layers: int | None = None) -> np.ndarray:
  """Logits [T, V] (float64 arithmetic) of one unpadded sequence."""
  nl = n_layers or int(meta['llama.block_count'])
  nh, nkv = int(meta['llama.attention.head_count']), int(meta['llama.attention.head_count_kv'])
  base, eps = float(meta['llama.rope.freq_base']), float(meta['llama.attention.layer_norm_rms_epsilon'])
  emb = w['token_embd.weight'].astype(np.float64)  # [V, E]
  x = emb[np.asarray(ids)]
  t = len(ids)
  causal = np.tril(np.ones((t, t), bool))
  for i in range(nl):
    g = lambda n: w[f'blk.{i}.{n}'].astype(np.float64)
    h = _rms(x, g('attn_norm.weight'), eps)
    q = h @ _unpermute(g('attn_q.weight'), nh).T
    k = h @ _unpermute(g('attn_k.weight'), nkv).T
    v = h @ g('attn_v.weight').T
    dh = q.shape[-1] // nh
    q = _rope_half(q.reshape(t, nh, dh), base)
    k = _rope_half(k.reshape(t, nkv, dh), base)
    v = v.reshape(t, nkv, dh)
    rep = nh // nkv
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum('qhd,khd->hqk', q, k) / np.sqrt(dh)
    s = np.where(causal[None], s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = np.einsum('hqk,khd->qhd', a, v).reshape(t, nh * dh)
    x = x + o @ g('attn_output.weight').T
    h = _rms(x, g('ffn_norm.weight'), eps)
    gate, up = h @ g('ffn_gate.weight').T, h @ g('ffn_up.weight').T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ g('ffn_down.weight').T
  return _rms(x, w['output_norm.weight'], eps) @ emb.T
