"""Several evidence items per example: per-item, max, mean, grouped CEU and a
budgeted set of pairwise interaction probes (inclusion–exclusion).

Shape legend (einsum letters):
  M evidence items, B batch, N context tokens, K probes, R probed pairs.

`multi_evidence_probes` lays out K = M + 1 + R span probes: the M items
('item_i'), their union ('grouped'), then R pairs ('pair_i_j'). `aggregate`
turns an `AuditResult` over those probes into the summary scores. An item whose
mask is empty for an example (fewer items there) is marked invalid for it.
"""
from __future__ import annotations

import itertools
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax.engine import scores
from ceu_jax.engine.probes import Probes
from ceu_jax.engine.runner import AuditResult


@flax.struct.dataclass
class MultiEvidenceLayout:
  num_items: int = flax.struct.field(pytree_node=False)
  pairs: tuple[tuple[int, int], ...] = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class MultiEvidenceScores:
  per_item: jax.Array      # [M, B] CEU of each item alone
  item_valid: jax.Array    # [M, B] the item exists for the example
  max: jax.Array           # [B] max over valid items
  mean: jax.Array          # [B] mean over valid items
  grouped: jax.Array       # [B] all items restored at once
  interaction: jax.Array   # [R, B] (L_ij − L_i − L_j + L−)/max(ΔL, ε)
  pair_valid: jax.Array    # [R, B]
  pairs: tuple[tuple[int, int], ...] = flax.struct.field(
      pytree_node=False, default=())


def choose_pairs(num_items: int, budget: int,
                 seed: Optional[int] = None) -> tuple[tuple[int, int], ...]:
  """At most ``budget`` pairs: all of them if they fit, else the first in
  lexicographic order, or a random subset when ``seed`` is given."""
  allp = list(itertools.combinations(range(num_items), 2))
  if budget >= len(allp):
    return tuple(allp)
  if seed is None:
    return tuple(allp[:budget])
  idx = np.sort(np.random.default_rng(seed).choice(len(allp), budget, False))
  return tuple(allp[i] for i in idx)


def multi_evidence_probes(item_masks: jax.Array, *, pair_budget: int = 0,
                          pair_seed: Optional[int] = None
                          ) -> tuple[Probes, MultiEvidenceLayout]:
  """Probes for items [M, B, N]: items, grouped, then budgeted pairs."""
  items = item_masks.astype(jnp.bool_)
  m = items.shape[0]
  pairs = choose_pairs(m, pair_budget, pair_seed)
  rows = [items, items.any(0)[None]]
  if pairs:
    i, j = np.array(pairs).T
    rows.append(items[i] | items[j])
  names = (tuple(f"item_{i}" for i in range(m)) + ("grouped",)
           + tuple(f"pair_{i}_{j}" for i, j in pairs))
  probes = Probes(span=jnp.concatenate(rows), names=names).validate()
  return probes, MultiEvidenceLayout(m, pairs)


def aggregate(result: AuditResult, layout: MultiEvidenceLayout,
              item_masks: Optional[jax.Array] = None,
              eps: float = scores.DEFAULT_EPS) -> MultiEvidenceScores:
  """Summary scores from an audit over `multi_evidence_probes`."""
  m, pairs = layout.num_items, layout.pairs
  L_int, L_minus = result.L_int, result.L_minus
  per_item = result.ceu[:m]
  if item_masks is None:
    valid = jnp.ones(per_item.shape, bool)
  else:
    v = item_masks.any(-1)                                       # [M, B]
    valid = jnp.broadcast_to(v.reshape(v.shape + (1,) * (per_item.ndim - 2)),
                             per_item.shape)
  n_valid = valid.sum(0)
  mx = jnp.where(valid, per_item, -jnp.inf).max(0)
  mean = jnp.where(valid, per_item, 0.0).sum(0) / jnp.maximum(n_valid, 1)
  none = n_valid == 0
  if pairs:
    i, j = (jnp.array(x) for x in np.array(pairs).T)
    l_ij = L_int[m + 1:]
    num = l_ij - L_int[i] - L_int[j] + L_minus
    inter = num / jnp.maximum(scores.delta_L(result.L_plus, L_minus), eps)
    pvalid = valid[i] & valid[j]
  else:
    inter = jnp.zeros((0,) + per_item.shape[1:], per_item.dtype)
    pvalid = jnp.zeros(inter.shape, bool)
  return MultiEvidenceScores(
      per_item=per_item, item_valid=valid,
      max=jnp.where(none, jnp.nan, mx), mean=jnp.where(none, jnp.nan, mean),
      grouped=result.ceu[m], interaction=jnp.where(pvalid, inter, jnp.nan),
      pair_valid=pvalid, pairs=pairs)
