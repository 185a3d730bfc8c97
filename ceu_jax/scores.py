"""Gold log-likelihood under teacher forcing (SPEC §1).

Shape legend: B batch, A answer length, V vocabulary.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logliks(logits: jax.Array, answer: jax.Array) -> jax.Array:
  """Per-token log p(y*_i | ...) [B, A] from logits [B, A, V] and answer [B, A]."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, answer[..., None].astype(jnp.int32), axis=-1)[..., 0]


def gold_loglik(logits: jax.Array, answer: jax.Array) -> jax.Array:
  """log p(y* | q, D) [B]: the sum of per-token log-probabilities."""
  return token_logliks(logits, answer).sum(axis=-1)
