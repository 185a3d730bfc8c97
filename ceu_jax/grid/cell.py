"""One grid cell: train (resumably), then audit under each test condition (SPEC §6).

Test conditions: 'clean' (the training distribution) and one condition per value
of `grid.delta_test`, `grid.n_test`, `grid.eta_test` that differs from training,
shifting one knob at a time. Every cell is scored on the same fixed test
examples per condition (seed `grid.eval_seed`, split 'test'). D+ and D− have
identical token counts (token-aligned corruptions): the length-matched control.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax
import ml_collections
import numpy as np

import architectures
from ceu_jax import audit, metrics
from ceu_jax.data import tasks

AUDIT_BATCH = 128


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


def model_for(config, data_cfg):
  """The cell's model at this condition's sizes (position tables are parameter-free)."""
  return architectures.build_model(
      config.model, vocab_size=data_cfg.vocab.size, context_len=data_cfg.context_len,
      num_passages=data_cfg.num_passages, query_len=data_cfg.query_len,
      answer_len=data_cfg.target_len)


def audit_condition(config, params, data_cfg) -> dict[str, np.ndarray]:
  """Per-example audit rows of the fixed test set of one condition."""
  g = config.grid
  model = model_for(config, data_cfg)
  site = architectures.read_port_sites(config.model)[-1][0]
  loglik_fn = audit.make_loglik_fn(model)
  spec = tasks.of_config(config.data)
  clean = spec.generate_batch(data_cfg, g.eval_seed, 0, g.eval_examples, "test")
  minus = spec.corrupt(data_cfg, clean, g.corruption, jax.random.PRNGKey(g.eval_seed))
  approx = architectures.span_decomposition(config.model.family) != "exact"
  parts = []
  for start in range(0, g.eval_examples, AUDIT_BATCH):
    take = lambda b: jax.tree_util.tree_map(lambda x: x[start:start + AUDIT_BATCH], b)
    key = jax.random.fold_in(jax.random.PRNGKey(g.eval_seed), start)
    parts.append(audit.audit_batch(model, params, loglik_fn, site, take(clean), take(minus),
                                   key, chunk_size=config.eval.chunk_size,
                                   eps=config.cer.eps, allow_approximate=approx))
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


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
  for probe, name in (("ev", "ceu_ev"), ("dis", "ceu_dis"), ("ctrl", "ceu_ctrl")):
    row.update(_agg(s.get("ceu", {}).get(probe, {}).get("all", {}).get("mean"), name))
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
  for name, data_cfg in test_conditions(config):
    log(f"[cell] auditing condition {name}")
    ex = audit_condition(config, params, data_cfg)
    if name == "clean":
      all_rows = {config.grid.corruption: ex}
      audit.write_outputs(os.path.join(cell_dir, "audit"), all_rows,
                          {"condition": name}, config.cer.eps)
    summary = metrics.summarize_audit(
        {k: v for k, v in ex.items() if k not in ("example_id", "has_evidence")},
        eps=config.cer.eps)
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
