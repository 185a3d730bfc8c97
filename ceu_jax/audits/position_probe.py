"""SPEC §8.4 position probes of the companion audits: the read port patched at chosen answer slots.

Both World A companions (mediator, traces) hold the model's own intermediate
output fixed (teacher-forced), corrupt the context so that the gold
intermediate output would change, and ask how much the final answer still
moves (ΔL, the direct X → Y effect that bypasses the intermediate output) and
how much of that flows through the read at the answer position itself
(CEU at that position: restoration by patching the read port there, from D+
into D−; stabilised, degenerate below ε, SPEC §1).

  probe = slot_probe(model, variables, site, plus, minus, slots, name='decision')

The engine does the interventions (`ceu_jax.engine.audit`, position probes);
this module only builds the loglik function and the position mask and
summarises with CIs. Shape legend: B batch, Q query length, A answer length,
S scored slots, T reader positions (`model.spec.reader_len`: Q + A, plus the
context N for a bypass model), V vocabulary.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax import engine
from ceu_jax.metrics.resampling import mean_ci
from ceu_jax.retrieval_adapter import ModelInputs


def slot_loglik_fn(model: Any, slots: Sequence[int]):
  """loglik_fn(variables, ModelInputs) -> [B]: log p of the answer at `slots` (teacher forced)."""
  idx = jnp.asarray(list(slots))

  def loglik_fn(variables, inputs: ModelInputs) -> jax.Array:
    logits = model.apply(variables, inputs.query, inputs.context, inputs.passage_ids,
                         inputs.answer)                              # [B, A, V]
    logp = jax.nn.log_softmax(logits[:, idx].astype(jnp.float32), -1)  # [B, S, V]
    tgt = inputs.answer[:, idx]                                      # [B, S]
    return jnp.take_along_axis(logp, tgt[..., None], -1)[..., 0].sum(-1)  # [B]
  return loglik_fn


def slot_probe(model: Any, variables: Any, site: engine.Site, plus: ModelInputs,
               minus: ModelInputs, slots: Sequence[int], *, name: str, eps: float = 1e-3,
               boot_seed: int = 42, loglik_fn=None) -> dict:
  """ΔL = L(D+) − L(D−) of the answer at `slots` and CEU_<name> (the read port patched at
  the reader positions that predict those slots), means with 95% bootstrap CIs.

  Returns {delta_L, ceu_<name> (over non-degenerate items), n, n_degenerate, eps,
  per_item: {delta_L, ceu, degenerate} lists}."""
  a = plus.answer.shape[1]
  spec = getattr(model, 'spec', None)   # T = [context (bypass models);] query; shifted answer
  t = int(spec.reader_len) if spec is not None else plus.query.shape[1] + a
  mask = np.zeros((1, t), bool)
  mask[0, [t - a + s for s in slots]] = True                           # position T−A+s predicts slot s
  probes = engine.Probes(positions=jnp.asarray(mask), names=(name,))
  fn = loglik_fn or slot_loglik_fn(model, slots)
  res = engine.audit(fn, variables, clean=plus, corrupt=minus, site=site, probes=probes, eps=eps)
  dl = np.asarray(res.delta_L, np.float64)                            # [B]
  deg = np.asarray(res.degenerate, bool)                              # [B]
  ceu = np.asarray(res.ceu_of(name), np.float64)                      # [B]
  return {'delta_L': mean_ci(dl, seed=boot_seed).to_dict(),
          f'ceu_{name}': mean_ci(ceu[~deg], seed=boot_seed).to_dict(),
          'n': int(dl.shape[0]), 'n_degenerate': int(deg.sum()), 'eps': eps,
          'per_item': {'delta_L': dl.tolist(), 'ceu': ceu.tolist(), 'degenerate': deg.tolist()}}
