"""An exact two-channel model for T1 (SPEC §7), with a scalable perturbation.

Logits over V classes for a fixed query q:

  z_y(q, D) = ℓ_par(y | q) + ⟨w_y, h_f(q, D)⟩ + b_y,

with ℓ_par independent of D and ℓ_ret affine in h_f (exact, not a local
approximation). The gold class y* uses its readout row w_{y*} as is; the
non-gold rows are multiplied by `other_coupling` (0 = the non-gold logits
ignore h_f, the regime in which T1 says R_ll → R_logit).

The interface activation splits over retrieved spans, h_f = h_S + h_S̄. An
evidence swap moves the two parts by s·u_S and s·u_S̄; the span-restricted
intervention restores only the S part. Directions are chosen per example so
that ⟨w_{y*}, u_S + u_S̄⟩ = 1 (the gold-logit gap ℓ+ − ℓ− equals s exactly) and
⟨w_{y*}, u_S⟩ = r (the logit-space restoration is exactly r); u_S also carries
a component orthogonal to w_{y*}, which moves the non-gold logits when
other_coupling > 0.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ceu_jax.theory.identifiability import T1Result, t1_from_logits


@dataclasses.dataclass(frozen=True)
class TwoChannelModel:
  """Readout of the exact two-channel model.

  Attributes:
    w: [V, d] retrieval readout rows w_y.
    b: [V] biases b_y.
    par: [V] parametric (query-only) logits ℓ_par(y | q).
    gold: index of y*.
    other_coupling: multiplier on the non-gold readout rows.
  """
  w: np.ndarray
  b: np.ndarray
  par: np.ndarray
  gold: int
  other_coupling: float = 0.0

  @property
  def readout(self) -> np.ndarray:
    """[V, d] effective readout (non-gold rows scaled by other_coupling)."""
    scale = np.full(self.w.shape[0], self.other_coupling)
    scale[self.gold] = 1.0
    return self.w * scale[:, None]

  def logits(self, h: np.ndarray) -> np.ndarray:
    """Logits [..., V] for interface activations h [..., d]."""
    return self.par + h @ self.readout.T + self.b


def make_two_channel(
    num_classes: int = 8,
    dim: int = 16,
    other_coupling: float = 0.0,
    seed: int = 0,
) -> TwoChannelModel:
  """A random two-channel model; y* = 0."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(num_classes, dim)) / np.sqrt(dim)
  return TwoChannelModel(w=w, b=rng.normal(size=num_classes) * 0.5,
                         par=rng.normal(size=num_classes), gold=0,
                         other_coupling=other_coupling)


@dataclasses.dataclass(frozen=True)
class SwapDirections:
  """Per-example swap geometry: base activation and span directions."""
  h_corrupt: np.ndarray   # [B, d] h_f(q, D−)
  u_span: np.ndarray      # [B, d] u_S
  u_rest: np.ndarray      # [B, d] u_S̄
  r_true: np.ndarray      # [B] exact logit-space restoration


def sample_swaps(
    model: TwoChannelModel,
    num_examples: int,
    seed: int = 0,
    r_range: tuple[float, float] = (0.2, 0.9),
    orth_scale: float = 1.0,
) -> SwapDirections:
  """Draws corrupted activations and span directions for num_examples swaps."""
  rng = np.random.default_rng(seed)
  dim = model.w.shape[1]
  wy = model.w[model.gold]
  h = rng.normal(size=(num_examples, dim))
  u = wy / (wy @ wy)                                   # ⟨w_y, u⟩ = 1
  noise = rng.normal(size=(num_examples, dim))
  noise -= np.outer(noise @ wy / (wy @ wy), wy)        # ⟂ w_y
  noise *= orth_scale * np.linalg.norm(u) / np.linalg.norm(
      noise, axis=1, keepdims=True)
  r = rng.uniform(*r_range, size=num_examples)
  u_span = r[:, None] * u + noise
  u_rest = (1.0 - r)[:, None] * u - noise
  return SwapDirections(h, u_span, u_rest, r)


def run_swaps(
    model: TwoChannelModel, swaps: SwapDirections, scale: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Clean, corrupted and span-intervened logits [B, V] at perturbation scale."""
  h_minus = swaps.h_corrupt
  h_plus = h_minus + scale * (swaps.u_span + swaps.u_rest)
  h_int = h_minus + scale * swaps.u_span               # Π_S patched from D+
  return model.logits(h_plus), model.logits(h_minus), model.logits(h_int)


def t1_sweep(
    model: TwoChannelModel,
    scales,
    num_examples: int = 256,
    seed: int = 0,
    **swap_kwargs,
) -> list[tuple[float, T1Result]]:
  """T1 on the exact model at each perturbation scale s (gold-logit gap, nats).

  The same swap geometry is reused across scales, so only s varies.
  """
  swaps = sample_swaps(model, num_examples, seed, **swap_kwargs)
  gold = np.full(num_examples, model.gold)
  out = []
  for s in scales:
    z_plus, z_minus, z_int = run_swaps(model, swaps, float(s))
    out.append((float(s), t1_from_logits(z_plus, z_minus, z_int, gold)))
  return out


def sweep_max_abs_diff(sweep: list[tuple[float, T1Result]]) -> np.ndarray:
  """max_examples |R_ll − R_logit| at each scale of a t1_sweep."""
  return np.array([np.nanmax(np.abs(res.diff)) for _, res in sweep])
