"""`experiments.audit`: audit the checkpoint in a training workdir (SPEC §1, §5).

Writes W/audit/examples.csv, W/audit/summary.json and W/audit/plots/*; resumable
(finished batches are kept under W/audit/parts/ and skipped on a rerun).
"""
from __future__ import annotations

import hashlib
import json
import os

import architectures
from ceu_jax import audit
from ceu_jax.data import evalsets, tasks

DATA_DIR_ENV = "CEU_JAX_DATA_DIR"


def default_data_dir() -> str:
  """Where fixed evaluation sets are materialised ($CEU_JAX_DATA_DIR or ~/.cache)."""
  return os.environ.get(DATA_DIR_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "ceu_jax", "evalsets")


def read_port(config) -> str:
  """The designated read port of the config (`cer.site` indexes the model's ports)."""
  sites = architectures.read_port_sites(config.model)
  index = int(config.cer.get("site", -1))
  if not -len(sites) <= index < len(sites):
    raise ValueError(f"cer.site must index one of the {len(sites)} read ports "
                     f"{[s for s, _ in sites]}, got {index}")
  return sites[index][0]


def run_audit(config, workdir: str, *, data_dir: str | None = None, log=print) -> dict:
  """Audit the newest valid checkpoint of `workdir` on the config's fixed eval set."""
  from ceu_jax.train import config as train_config, load_trained_params
  train_config.validate(config)
  spec = tasks.of_config(config.data)
  data_cfg = spec.config_cls.from_config(config.data)
  site = read_port(config)
  model = architectures.build_model(
      config.model, vocab_size=data_cfg.vocab.size, context_len=data_cfg.context_len,
      num_passages=data_cfg.num_passages, query_len=data_cfg.query_len,
      answer_len=data_cfg.target_len)
  variables = load_trained_params(config, workdir)
  names = tuple(config.eval.corruptions)
  clean, corrupted = _eval_set(spec, data_cfg, config.eval, names, data_dir)
  approximate = architectures.span_decomposition(config.model.family) != "exact"
  if approximate:
    log(f"[audit] WARNING: {config.model.family} read ports have an approximate span "
        "decomposition; span CEU values are approximate")
  fingerprint = dict(
      site=site, approximate_span=approximate,
      params_digest=_digest(variables), data=json.loads(json.dumps(data_cfg.__dict__)),
      eval_set_digest=_digest((clean, corrupted)),  # a regenerated eval set is never mixed
      eval_seed=int(config.eval.seed), num_examples=int(config.eval.num_examples))
  return audit.audit_eval_set(
      model, variables, site, clean, corrupted, os.path.join(workdir, "audit"),
      fingerprint=fingerprint, batch_size=int(config.eval.batch_size),
      chunk_size=int(config.eval.chunk_size), eps=float(config.cer.eps),
      seed=int(config.eval.seed), allow_approximate=approximate, log=log)


def _eval_set(spec, data_cfg, e, names, data_dir):
  """(D+, {name: D−}): ATR's materialised eval set, or the task's own stream."""
  if spec.name == "atr_insert":
    return evalsets.load_eval_set(data_cfg, int(e.seed), int(e.num_examples), names,
                                  data_dir or default_data_dir())
  clean = spec.generate_batch(data_cfg, int(e.seed), 0, int(e.num_examples), "eval")
  return clean, {name: spec.corrupt(data_cfg, clean, name, evalsets.corruption_key(
      int(e.seed), name)) for name in names}


def _digest(variables) -> str:
  import jax
  import numpy as np
  h = hashlib.sha1()
  for leaf in jax.tree_util.tree_leaves(variables):
    h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return h.hexdigest()[:16]
