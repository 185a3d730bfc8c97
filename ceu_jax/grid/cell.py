"""One grid cell: train (resumably), then audit under each test condition (SPEC §6).

Test conditions: 'clean' (the training distribution) and one condition per value
of `grid.delta_test`, `grid.n_test`, `grid.eta_test` that differs from training,
shifting one knob at a time. The cell keeps every condition's per-item rows: the
clean one's with its summary and plots in <cell>/audit/, each shifted one's in
<cell>/conditions/<name>/examples.csv (`aggregate.examples_path`). Every condition is scored by the one `Auditor`
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

from ceu_jax import audit_job, io
from ceu_jax import retrieval_adapter as adapter
from ceu_jax import auditor as auditor_lib
from ceu_jax.data import tasks
from ceu_jax.grid import aggregate


def test_conditions(config: ml_collections.ConfigDict) -> list[tuple[str, object]]:
  base = tasks.data_config(config.data)
  g = config.grid
  conds = [(aggregate.CLEAN, base)]
  for field, values, tag in (("delta", g.delta_test, "delta"), ("context_len", g.n_test, "n"),
                             ("eta", g.eta_test, "eta")):
    for v in values:
      if v != getattr(base, field):
        conds.append((f"{tag}={v}", dataclasses.replace(base, **{field: v})))
  return conds


def grid_corruption(config: ml_collections.ConfigDict) -> str:
  """The corruption giving D− for the grid's rows: the first of eval.corruptions."""
  return tuple(config.eval.corruptions)[0]


def audit_condition(config, params, data_cfg, *, batch_sharding=None
                    ) -> dict[str, np.ndarray]:
  """Per-example audit rows of the fixed eval set of one condition (grid corruption),
  with a bool column `stratum_<name>` per stratum of the task (tasks.TaskSpec.strata).
  `batch_sharding`: as `audit_job.on_mesh` yields it (run_cell audits on the training
  run's mesh, so the 'clean' condition runs the very programs the run's final
  evaluation compiled); None = one device."""
  corruption = grid_corruption(config)
  bundle = auditor_lib.audited_model(config, data_cfg=data_cfg)
  data = auditor_lib.eval_set(config, data_cfg=data_cfg).select((corruption,))
  auditor = auditor_lib.Auditor(bundle, auditor_lib.AuditSettings.of_config(config),
                                batch_sharding=batch_sharding)
  rows = auditor.rows(params, data)[corruption]
  strata = tasks.of_config(config.data).strata
  for name, mask in (strata(data_cfg, data.clean) if strata else {}).items():
    rows[f"stratum_{name}"] = np.asarray(mask, bool)
  return rows


def summarize_condition(rows: dict[str, np.ndarray], settings) -> dict:
  """One grid row's metrics: the summary of every example, the share of degenerate
  gaps among examples with evidence, and per stratum (rows' `stratum_<name>` columns)
  the aggregate.STRATUM_METRICS suffixed `_<name>`."""
  def summarize(r):
    return auditor_lib.summarize_rows(r, eps=settings.eps,
                                      num_resamples=settings.num_resamples)
  plain = {k: v for k, v in rows.items() if not k.startswith("stratum_")}
  summary = summarize(plain)
  row = row_from_summary(summary)
  row.update(_degenerate_share(summary))
  for key, mask in rows.items():
    if not key.startswith("stratum_") or not mask.any():
      continue
    name = key[len("stratum_"):]
    sub = summarize({k: v[mask] for k, v in plain.items()})
    flat = {**row_from_summary(sub), **_degenerate_share(sub)}
    for m in aggregate.STRATUM_METRICS:
      for tail in ("", "_lo", "_hi", "_n"):
        if m + tail in flat:
          row[f"{m}_{name}{tail}"] = flat[m + tail]
  return row, summary


def _degenerate_share(s: dict) -> dict:
  """'degenerate': degenerate gaps / examples with evidence (no CI: a count ratio)."""
  with_ev = s["n"] - s.get("n_without_evidence", 0)
  if "n_degenerate" not in s or with_ev <= 0:
    return {}
  return {"degenerate": s["n_degenerate"] / with_ev, "degenerate_n": with_ev}


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
  # calibration of the teacher-forced argmax answer's probability (SPEC §5)
  row.update(_agg(s.get("calibration", {}).get("ece"), "ece"))
  row.update(_agg(s.get("calibration", {}).get("brier_binary"), "brier"))
  for probe in adapter.PROBES:
    c = s.get("ceu", {}).get(probe, {})
    row.update(_agg(c.get("all", {}).get("mean"), f"ceu_{probe}"))
    row.update(_agg(c.get("fixed_denominator"), f"ceu_{probe}_fixed"))
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
  bundle = auditor_lib.audited_model(config)
  if bundle.approximate:     # SPEC §2: say so in the output (every row, the cell's summary)
    log(f"[cell] the read port {bundle.site} has an approximate span decomposition: "
        "span CEU values are approximate")
  # On the training run's mesh: the 'clean' condition runs the very programs the run's
  # final evaluation compiled, and the shifted conditions of the same shapes reuse them.
  with audit_job.on_mesh(config, bundle, params) as (placed, bs):
    for name, data_cfg in test_conditions(config):
      log(f"[cell] auditing condition {name}")
      ex = audit_condition(config, placed, data_cfg, batch_sharding=bs)
      metrics, summary = summarize_condition(ex, settings)
      if name == aggregate.CLEAN:
        audit_job.write_outputs(os.path.join(cell_dir, "audit"),
                                {grid_corruption(config): ex},
                                {grid_corruption(config): summary},
                                {"condition": name, "approximate_span": bundle.approximate})
      else:   # the per-item rows H3 pairs between cells (grid.paired)
        io.write_text_atomic(aggregate.examples_path(cell_dir, name),
                             audit_job.examples_csv({grid_corruption(config): ex}))
      rows.append({"condition": name, "eta_test": data_cfg.eta,
                   "delta_test": data_cfg.delta, "n_test": data_cfg.context_len,
                   "approximate_span": bundle.approximate, **metrics})
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
