"""Periodic evaluation on the fixed eval set: EM, NLL and CEU via the engine.

For every corruption in `eval.corruptions`, D− = corrupt(D+, key fold_in(eval
seed, corruption index)) and `ceu_jax.audit.audit_batch` (the engine's `audit`)
scores three span probes ('ev' = E(D+), 'dis' = one evidence-format
non-evidence line, 'ctrl' = a random non-evidence span of the evidence's
length) at the training site.

Periodic metrics (floats, JSON-able; the first corruption has no prefix, the
others are prefixed '<corruption>/'):
  em, nll               exact match (teacher-forced argmax = greedy EM) and −L+.
  ceu_ev, ceu_dis, ceu_ctrl  mean clipped CEU over examples with evidence and a
                        non-degenerate gap.
  n_degenerate          examples with evidence but gap < ε.
  supported_0.5         share of all examples correct, non-degenerate, CEU_ev ≥ 0.5.
`final_summary` adds `ceu_jax.metrics.summarize_audit` per corruption (CIs).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from ceu_jax import audit as audit_lib
from ceu_jax import metrics as metrics_lib
from ceu_jax.train import task as task_lib
from ceu_jax.train import sharding as sharding_lib

PROBES = ("ev", "dis", "ctrl")


@functools.lru_cache(maxsize=16)
def _loglik_fn(model):
  return audit_lib.make_loglik_fn(model)


class Evaluator:
  """Holds the eval set (D+ and D− per corruption) on the mesh; scores it with
  `ceu_jax.audit.audit_batch` (the engine's audit and the audit's probe spans)."""

  def __init__(self, config: Any, task: task_lib.Task, batch_sharding: Any = None):
    self.task = task
    self.corruption_names = tuple(config.eval.corruptions)
    self.chunk_size = int(config.eval.chunk_size)
    self.eps = float(config.cer.eps)
    self.num_resamples = int(config.eval.num_resamples)
    self.seed = int(config.eval.seed)
    put = ((lambda t: sharding_lib.shard_batch(t, batch_sharding)) if batch_sharding
           is not None else (lambda t: t))
    self.batches = []
    for clean in task_lib.eval_batches(config, task.data_cfg):
      corrupt = {name: task.data.corrupt(task.data_cfg, clean, name,
                                         jax.random.fold_in(jax.random.PRNGKey(self.seed), j))
                 for j, name in enumerate(self.corruption_names)}
      self.batches.append(put(dict(clean=clean, corrupt=corrupt)))

  def rows(self, params: Any) -> dict[str, dict[str, np.ndarray]]:
    """Per-example audit rows {corruption: {correct, L_plus, L_minus, L_int_ev, ...}}."""
    variables = {"params": params}
    out: dict[str, dict[str, list]] = {c: {} for c in self.corruption_names}
    for i, b in enumerate(self.batches):
      key = jax.random.fold_in(jax.random.PRNGKey(self.seed), task_lib.PROBE_SALT + i)
      for name in self.corruption_names:
        rows = audit_lib.audit_batch(
            self.task.model, variables, _loglik_fn(self.task.model), self.task.site,
            b["clean"], b["corrupt"][name], key, chunk_size=self.chunk_size, eps=self.eps,
            allow_approximate=self.task.approximate)
        for k, v in rows.items():
          out[name].setdefault(k, []).append(np.asarray(v))
    return {c: {k: np.concatenate(v) for k, v in cols.items()} for c, cols in out.items()}

  def _means(self, r: dict[str, np.ndarray]) -> dict[str, float]:
    ok = r["has_evidence"] & ~r["degenerate"]
    out = {"n_degenerate": float((r["has_evidence"] & r["degenerate"]).sum())}
    for p in PROBES:
      ceu = r[f"ceu_{p}"]
      out[f"ceu_{p}"] = float(ceu[ok].mean()) if ok.any() else float("nan")
    with np.errstate(invalid="ignore"):
      out["supported_0.5"] = float((r["correct"] & ok & (r["ceu_ev"] >= 0.5)).mean())
    return out

  def evaluate(self, params: Any) -> tuple[dict[str, float], dict]:
    """(periodic metrics, rows)."""
    rows = self.rows(params)
    first = rows[self.corruption_names[0]]
    out = {"em": float(first["correct"].mean()), "nll": float(-first["L_plus"].mean())}
    for i, name in enumerate(self.corruption_names):
      prefix = "" if i == 0 else f"{name}/"
      out.update({prefix + k: v for k, v in self._means(rows[name]).items()})
    return out, rows

  def final_summary(self, rows: dict) -> dict:
    """`summarize_audit` per corruption (CEU over examples with evidence)."""
    out = {}
    for name, r in rows.items():
      keep = r["has_evidence"]
      sel = {k: v[keep] for k, v in r.items()
             if k in ("correct", "L_plus", "L_minus", "L_int_ev", "L_int_dis", "L_int_ctrl")}
      out[name] = metrics_lib.summarize_audit(sel, eps=self.eps,
                                              num_resamples=max(self.num_resamples, 1))
      out[name]["n_without_evidence"] = int((~keep).sum())
    return out
