"""Gold log-likelihood and correctness of answers under teacher forcing (SPEC §1).

Shape legend: B batch, A answer length, V vocabulary.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logliks(logits: jax.Array, answer: jax.Array) -> jax.Array:
  """Per-token log p(y*_i | ...) [B, A] from logits [B, A, V] and answer [B, A]."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, answer[..., None].astype(jnp.int32), axis=-1)[..., 0]


PAD = 0  # answers shorter than A are right-padded with [PAD]


def gold_loglik(logits: jax.Array, answer: jax.Array) -> jax.Array:
  """log p(y* | q, D) [B]: the sum of per-token log-probabilities over the
  answer's real tokens ([PAD] positions of right-padded answers do not count)."""
  return jnp.where(answer != PAD, token_logliks(logits, answer), 0.0).sum(axis=-1)


def answer_correct(logits: jax.Array, answer: jax.Array) -> jax.Array:
  """[B] bool: the teacher-forced argmax equals y* at every real answer token."""
  hit = (jnp.argmax(logits, axis=-1) == answer) | (answer == PAD)
  return jnp.all(hit, axis=-1)


def answer_confidence(logits: jax.Array, answer: jax.Array) -> jax.Array:
  """[B] the model's confidence in its teacher-forced argmax answer, for ECE and the
  Brier score (SPEC §5): exp(Σ_i max_v log p_i(v)) over the answer's real tokens. For a
  one-token answer, the top-1 probability; for longer ones, the probability of the greedy
  decode whenever that decode is correct (the later factors are conditioned on the gold
  prefix; `metrics.calibration.teacher_forced_confidence` is the float64 reference)."""
  logits = logits.astype(jnp.float32)
  top_logp = -jax.nn.logsumexp(logits - logits.max(axis=-1, keepdims=True), axis=-1)
  return jnp.exp(jnp.where(answer != PAD, top_logp, 0.0).sum(axis=-1))
