"""Periodic evaluation during training: the one `Auditor` on the run's fixed eval set.

The eval set is `ceu_jax.auditor.eval_set(config)` (config.eval: seed,
num_examples, corruptions) and the rows are `Auditor.rows` at the training
read port — the same rows `experiments.audit` and the grid compute for the same
checkpoint. Periodic metrics are read off `Auditor.summarize` (floats, JSON-able;
the first corruption has no prefix, the others are prefixed '<corruption>/'):
  em, nll                 exact match (teacher-forced argmax) and −L+, all examples.
  ceu_ev, ceu_dis, ceu_control  mean clipped CEU over examples with the probe's span
                          and a non-degenerate gap.
  n_ceu_ev                the number of examples behind ceu_ev.
  n_degenerate            examples with evidence but gap < ε.
  supported_0.5           share of all examples correct, with evidence,
                          non-degenerate and CEU_ev ≥ 0.5.
`final_summary` is the summary per corruption (with CIs), written to eval_final.json
together with the eval set's identity (`Evaluator.data.identity`).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ceu_jax import auditor as auditor_lib
from ceu_jax import retrieval_adapter as adapter
from ceu_jax.engine.probes import EV
from ceu_jax.train import task as task_lib


def periodic_metrics(summary: dict) -> dict[str, float]:
  """The scalar metrics of one corruption's summary (NaN where there is no value)."""
  def value(agg):
    return float("nan") if not agg or agg.get("value") is None else float(agg["value"])
  out = {"em": value(summary.get("accuracy", {}).get("em")),
         "nll": value(summary.get("nll")),
         "n_degenerate": float(summary.get("n_degenerate", 0))}
  ceu = summary.get("ceu", {})
  for p in adapter.PROBES:
    mean = ceu.get(p, {}).get("all", {}).get("mean")
    out[f"ceu_{p}"] = value(mean)
    if p == EV:
      out["n_ceu_ev"] = float(mean["n"]) if mean else 0.0
  out["supported_0.5"] = value(summary.get("supported_answer_rate", {}).get("0.5"))
  return out


PROGRESS_EVERY_S = 10.0   # at most one eval progress line per this many seconds


class Evaluator:
  """The run's fixed eval set on the mesh, scored by the `Auditor`."""

  def __init__(self, config: Any, task: task_lib.Task, batch_sharding: Any = None):
    self.data = auditor_lib.eval_set(config, data_cfg=task.data_cfg)
    self.auditor = auditor_lib.Auditor(task.audited, auditor_lib.AuditSettings.of_config(config),
                                       batch_sharding=batch_sharding)

  def rows(self, params: Any, log: Callable[[str], None] | None = None
           ) -> dict[str, dict[str, np.ndarray]]:
    """Per-example audit rows {corruption: {column: [n]}}; `log` gets progress lines
    (at most one per PROGRESS_EVERY_S seconds, and the last of each corruption)."""
    return self.auditor.rows({"params": params}, self.data, log=log,
                             log_every_s=PROGRESS_EVERY_S)

  def evaluate(self, params: Any, log: Callable[[str], None] | None = None
               ) -> tuple[dict[str, float], dict]:
    """(periodic metrics, rows)."""
    rows = self.rows(params, log)
    summary = self.auditor.summarize(rows)
    out = {}
    for i, name in enumerate(self.data.corruptions):
      prefix = "" if i == 0 else f"{name}/"
      out.update({prefix + k: v for k, v in periodic_metrics(summary[name]).items()})
    return out, rows

  def final_summary(self, rows: dict) -> dict:
    """`Auditor.summarize` per corruption (CIs)."""
    return self.auditor.summarize(rows)
