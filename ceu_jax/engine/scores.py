"""CEU scores as pure, differentiable jnp functions (SPEC §1).

Shape legend (einsum letters):
  K probes, B batch, A answer tokens (present only for per-token logliks).
Every function broadcasts: L_plus / L_minus [B(, A)], L_int [K, B(, A)] or
[B(, A)].
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

DEFAULT_EPS = 1e-3


def delta_L(L_plus: jax.Array, L_minus: jax.Array) -> jax.Array:
  """ΔL = L+ − L− (the corruption gap)."""
  return L_plus - L_minus


def delta_int(L_int: jax.Array, L_minus: jax.Array) -> jax.Array:
  """L_int − L−; Δev and Δdis are this for the evidence / distractor probes."""
  return L_int - L_minus


def degenerate(L_plus: jax.Array, L_minus: jax.Array,
               eps: float = DEFAULT_EPS) -> jax.Array:
  """True where the gap L+ − L− < ε: CEU is not informative there."""
  return delta_L(L_plus, L_minus) < eps


def attrib(L_int: jax.Array, L_plus: jax.Array, L_minus: jax.Array) -> jax.Array:
  """Attrib_f = (L_int − L−)/(L+ − L−); NaN where the gap is exactly 0.

  Read it together with `degenerate`; gradients stay finite everywhere.
  """
  gap = delta_L(L_plus, L_minus)
  ok = gap != 0
  return jnp.where(ok, delta_int(L_int, L_minus) / jnp.where(ok, gap, 1.0),
                   jnp.nan)


def ceu_unclipped(L_int: jax.Array, L_plus: jax.Array, L_minus: jax.Array,
                  eps: float = DEFAULT_EPS) -> jax.Array:
  """(L_int − L−)/max(L+ − L−, ε): the unclipped score, for gradients."""
  return delta_int(L_int, L_minus) / jnp.maximum(delta_L(L_plus, L_minus), eps)


def ceu(L_int: jax.Array, L_plus: jax.Array, L_minus: jax.Array,
        eps: float = DEFAULT_EPS) -> jax.Array:
  """CEU = clip_[0,1]((L_int − L−)/max(L+ − L−, ε)); pair it with `degenerate`."""
  return jnp.clip(ceu_unclipped(L_int, L_plus, L_minus, eps), 0.0, 1.0)


def hinge_below(score: jax.Array, alpha: float) -> jax.Array:
  """[α − score]_+ (the CER evidence term, SPEC §4)."""
  return jnp.maximum(alpha - score, 0.0)


def tokenwise(L_int: jax.Array, L_plus: jax.Array, L_minus: jax.Array,
              token_index: Sequence[int] | jax.Array,
              eps: float = DEFAULT_EPS) -> tuple[jax.Array, jax.Array]:
  """Token-wise CEU(t) from per-token logliks.

  L_int [K, B, A] (probe k intervenes at one decoding step), L_plus / L_minus
  [B, A]; ``token_index`` [K] is the answer token scored for each probe.
  Returns (ceu [K, B], degenerate [K, B]).
  """
  idx = jnp.asarray(token_index)
  li = jnp.take_along_axis(L_int, idx[:, None, None], axis=-1)[..., 0]  # [K, B]
  lp = jnp.take(L_plus, idx, axis=-1).T                               # [K, B]
  lm = jnp.take(L_minus, idx, axis=-1).T
  return ceu(li, lp, lm, eps), degenerate(lp, lm, eps)
