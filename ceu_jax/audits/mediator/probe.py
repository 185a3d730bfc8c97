"""SPEC §8.4 companion of the mediator audit: a position probe at the decision with M held fixed.

For a reader with a read port (World A), on test items:
  D+  = the item (query, context), answer = [gold M, decision] (teacher forced);
  D−  = the same item with every evidence VALUE swapped (`value_swap`): its gold
        M differs, but the answer — M and the decision — is kept (M held fixed).
  L±  = log p(decision tokens | q, D±, M) (the count token; tool: the argument).
ΔL = L+ − L− is the direct X → Y effect that bypasses M (≈ 0 for a reader
whose decision reads only M). The position probe patches the read port's
output at the decision position(s) only, from D+ into D−, and scores
CEU_dec = restoration of L (SPEC §1, stabilised, degenerate below ε): how much
of that direct effect flows through the read at the decision itself.

The engine does the interventions (`ceu_jax.audits.position_probe`, shared
with the trace audit's answer probe); this module only builds inputs. Shape legend: B batch, Q query
length, A answer length, T reader positions (Q + A), K probes (1).
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ceu_jax import engine
from ceu_jax.audits import position_probe
from ceu_jax.data import checklist
from ceu_jax.retrieval_adapter import ModelInputs

PROBE = 'decision'
CORRUPT_SEED = 18  # key of the value_swap draws


def decision_slots(cfg: checklist.ChecklistConfig) -> list[int]:
  """Answer slots of the decision: the count token, or the tool argument."""
  return list(range(cfg.r + 1, 2 * cfg.r + 1)) if cfg.tool else [cfg.r]


def decision_probe(model: Any, variables: Any, site: engine.Site, cfg: checklist.ChecklistConfig,
                   n: int, *, seed: int = 0, eps: float = 1e-3, boot_seed: int = 42,
                   loglik_fn=None) -> dict:
  """ΔL (direct X → Y effect with M fixed) and CEU at the decision position(s), with CIs."""
  if not isinstance(n, int) or n < 1:
    raise ValueError(f'n must be an integer >= 1, got {n!r}')
  plus = checklist.generate_batch(cfg, seed, 0, n, 'test')           # answers: gold M, C(M)
  minus = checklist.corrupt(cfg, plus, 'value_swap', jax.random.PRNGKey(CORRUPT_SEED))
  out = position_probe.slot_probe(model, variables, site, ModelInputs.of(plus),
                                  ModelInputs.of(minus), decision_slots(cfg), name=PROBE,
                                  eps=eps, boot_seed=boot_seed, loglik_fn=loglik_fn)
  del out['per_item']
  out['gold_m_changed'] = float(np.mean(np.any(
      np.asarray(minus.context) != np.asarray(plus.context), -1)))
  return out
