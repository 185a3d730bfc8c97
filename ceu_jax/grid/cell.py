"""One grid cell: train (resumably), then audit under each test condition (SPEC §6).

Test conditions: 'clean' (the training distribution) and one condition per value
of `grid.delta_test`, `grid.n_test`, `grid.eta_test` that differs from training,
shifting one knob at a time. Every condition is scored by the one `Auditor`
(`ceu_jax.auditor`) at the cell's read port f (`model.read_port`, the port CER
trained) on THE fixed eval set of `config.eval` with that knob shifted (same
seed, size and corruptions for every cell); the grid's rows are for the first
of `eval.corruptions`. The 'clean' condition is exactly the training-time
evaluation's set, so its rows equal the ones in the cell's eval_final.json and
in `experiments.audit` of the cell (tested). D+ and D− have identical token
counts (token-aligned corruptions): the length-matched control.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import ml_collections
import numpy as np

from ceu_jax import audit_job
from ceu_jax import retrieval_adapter as adapter
from ceu_jax import auditor as auditor_lib
from ceu_jax.data import tasks


def test_conditions(config: ml_collections.ConfigDict) -> list[tuple[str, object]]:
  base = tasks.data_config(config.data)
  g = config.grid
  conds = [("clean", base)]
  for field, values, tag in (("delta", g.delta_test, "delta"), ("context_len", g.n_test, "n"),
                             ("eta", g.eta_test, "eta")):
    for v in values:
      if v != getattr(base, field):
        conds.append((f"{tag}={v}", dataclasses.replace(base, **{field: v})))
  return conds


def grid_corruption(config: ml_collections.ConfigDict) -> str:
  """The corruption giving D− for the grid's rows: the first of eval.corruptions."""
  return tuple(config.eval.corruptions)[0]


def audit_condition(config, params, data_cfg) -> dict[str, np.ndarray]:
  """Per-example audit rows of the fixed eval set of one condition (grid corruption)."""
  corruption = grid_corruption(config)
  bundle = auditor_lib.audited_model(config, data_cfg=data_cfg)
  data = auditor_lib.eval_set(config, data_cfg=data_cfg).select((corruption,))
  auditor = auditor_lib.Auditor(bundle, auditor_lib.AuditSettings.of_config(config))
  return auditor.rows(params, data)[corruption]


def _agg(d: dict | None, prefix: str) -> dict:
  if not d:
    return {}
  return {prefix: d["value"], f"{prefix}_lo": d["ci_low"], f"{prefix}_hi": d["ci_high"],
          f"{prefix}_n": d["n"]}


def row_from_summary(s: dict) -> dict:
  """Flatten summarize_audit's output into the grid row schema (aggregate.py)."""
  row = {"n_examples": s["n"], "n_degenerate": s["n_degenerate"]}
  row.update(_agg(s.get("accuracy", {}).get("em"), "em"))
  row.update(_agg(s.get("nll"), "nll"))
  for probe in adapter.PROBES:
    row.update(_agg(s.get("ceu", {}).get(probe, {}).get("all", {}).get("mean"), f"ceu_{probe}"))
  for name in ("delta_L", "delta_ev", "delta_dis"):
    row.update(_agg(s.get("deltas", {}).get(name, {}).get("mean"), name))
  for tau, agg in s.get("supported_answer_rate", {}).items():
    row.update(_agg(agg, f"supported_{tau}"))
  return row


def run_cell(config: ml_collections.ConfigDict, cell_dir: str, *,
             train_fn: Callable | None = None, load_fn: Callable | None = None,
             log=print) -> dict:
  """Train the cell (resuming from cell_dir/train), audit every condition, return rows."""
  from ceu_jax import train as train_lib     # heavy; imported only when a cell runs
  train_fn = train_fn or train_lib.train_and_evaluate
  load_fn = load_fn or train_lib.load_trained_params
  train_dir = os.path.join(cell_dir, "train")
  train_summary = train_fn(config, train_dir)
  params = load_fn(config, train_dir)
  rows = []
  settings = auditor_lib.AuditSettings.of_config(config)
  for name, data_cfg in test_conditions(config):
    log(f"[cell] auditing condition {name}")
    ex = audit_condition(config, params, data_cfg)
    summary = auditor_lib.summarize_rows(ex, eps=settings.eps,
                                         num_resamples=settings.num_resamples)
    if name == "clean":
      audit_job.write_outputs(os.path.join(cell_dir, "audit"), {grid_corruption(config): ex},
                              {grid_corruption(config): summary}, {"condition": name})
    rows.append({"condition": name, "eta_test": data_cfg.eta, "delta_test": data_cfg.delta,
                 "n_test": data_cfg.context_len, **row_from_summary(summary)})
  return {"rows": rows, "train": _jsonable(train_summary)}


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (np.generic,)):
    return x.item()
  if isinstance(x, float) and not np.isfinite(x):
    return None
  return x if isinstance(x, (int, float, str, bool, type(None))) else str(x)
