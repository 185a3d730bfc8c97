"""Held-out evaluation of a SmolLM2 fine-tune (or the base model) on factual-QA pairs.

  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:cpu --workdir W
  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:cpu --workdir W0 --eval=base

Items: the first `eval.num_examples` token-aligned entity-swap pairs of
`data.eval_split` (`cer_task.build_pairs`, same short contexts as training).
Per item: the greedy answer to the clean prompt (EM / token F1 against the gold,
SQuAD normalisation, `metrics.text`), NLL = −log p(y* | D+), and the engine's
CEU of the ev / dis / control probes at every layer's read port (the fast
causal audit, `audit_nq.audit_batch`, tested against the engine). Supported
answer (SPEC §6) = EM correct AND CEU_ev ≥ τ (0.5) at the trained port
`model.read_layer`. Every aggregate carries a bootstrap 95% CI and its n.

Outputs in <workdir>/eval_{trained|base}/ (atomic writes; a rerun skips finished
batches): batches/*.json, summary.json (metrics + per-layer profile), and
plots/layer_profile.{png,pdf} (`audit_nq.plot_profile`).
"""
from __future__ import annotations

import os
import time
import types
from typing import Any

import numpy as np

from ceu_jax import io
from ceu_jax.metrics import mean_ci
from ceu_jax.metrics.text import exact_match, token_f1
from ceu_jax.pretrained import audit_nq
from ceu_jax.pretrained import lora as lora_lib

TAU = 0.5  # CEU_ev threshold of a supported answer (SPEC §6 default)


def _log(msg: str) -> None:
  print(f'[smollm2_cer eval] {msg}', flush=True)


def _variables(task, workdir: str, trained: bool) -> tuple[dict, Any]:
  if not trained:
    return {'params': task.base}, None
  from ceu_jax.pretrained import cer_task
  tree, step = cer_task.restore_trainable(task, workdir)
  return {'params': lora_lib.merged(tree, task.base, task.lora)}, step


def evaluate(task, workdir: str, *, trained: bool = True) -> dict:
  """Evaluates the newest checkpoint of `workdir` (or the base model); returns the summary."""
  from ceu_jax.pretrained import cer_task
  from ceu_jax.readers.smollm2 import SmolLM2Reader
  c = task.config
  out_dir = os.path.join(workdir, 'eval_trained' if trained else 'eval_base')
  os.makedirs(os.path.join(out_dir, 'batches'), exist_ok=True)
  t0 = time.time()
  variables, step = _variables(task, workdir, trained)
  pairs, report = cer_task.build_pairs(task.tokenizer, c, c.data.eval_split,
                                       limit=int(c.eval.num_examples))
  if len(pairs) < int(c.eval.num_examples):
    _log(f'only {len(pairs)} aligned held-out pairs (asked {c.eval.num_examples}): {report}')
  bs, n_tail, pad_to = int(c.eval.batch_size), int(c.data.max_answer_tokens), int(c.data.max_len)
  eps = float(c.cer.eps)
  reader = None
  rows: list[dict] = []
  n_batches = (len(pairs) + bs - 1) // bs
  for b in range(n_batches):
    path = os.path.join(out_dir, 'batches', f'{b:05d}.json')
    if os.path.exists(path):
      rows += io.read_json(path)
      continue
    ps = pairs[b * bs:(b + 1) * bs]
    arrays = audit_nq.batch_arrays(task.tokenizer, ps, bs, pad_to)
    prof = audit_nq.audit_batch(variables, task.model_config, arrays, n_tail,
                                audit_nq.SPAN_PROBES, eps)
    new = audit_nq.batch_rows(ps, prof, audit_nq.SPAN_PROBES)
    if reader is None:
      reader = SmolLM2Reader(variables, task.model_config, task.tokenizer)
    gens = reader.generate([p.clean_prompt for p in ps], max_new_tokens=int(c.eval.max_new_tokens),
                           stop=['\n'], ids=[p.id for p in ps])
    pred = {p.id: g.text.strip() for p, g in zip(ps, gens)}
    for r in new:
      r['prediction'] = pred[r['id']]
      r['em'] = exact_match(pred[r['id']], [r['answer']])
      r['f1'] = token_f1(pred[r['id']], [r['answer']])
    io.write_json_atomic(path, new)
    rows += new
    el = time.time() - t0
    _log(f'batch {b + 1}/{n_batches}: {el:.0f}s elapsed')
  summary = summarize(rows, task.model_config.n_layers, c)
  summary.update(step=step, trained=trained, pairs=report, wall_s=time.time() - t0,
                 read_layer=int(c.model.read_layer))
  io.write_json_atomic(os.path.join(out_dir, 'summary.json'), summary)
  audit_nq.plot_profile(summary['profile'], audit_nq.SPAN_PROBES,
                        os.path.join(out_dir, 'plots', 'layer_profile'))
  return summary


def summarize(rows: list[dict], n_layers: int, config: Any) -> dict:
  """Headline metrics with 95% CIs at the trained port, and the per-layer profile."""
  cfg = types.SimpleNamespace(num_resamples=int(config.eval.num_resamples),
                              seed=int(config.seed), eps=float(config.cer.eps))
  agg = lambda x: mean_ci(np.asarray(x, np.float64), num_resamples=cfg.num_resamples,
                          seed=cfg.seed).to_dict()
  layer = int(config.model.read_layer)
  at = [r for r in rows if r['layer'] == layer]
  ceu = lambda name: [r[f'ceu_{name}'] for r in at if r[f'ceu_{name}'] is not None]
  supported = [float(r['em'] == 1.0 and r['ceu_ev'] is not None and r['ceu_ev'] >= TAU)
               for r in at]
  return {
      'n': len(at), 'em': agg([r['em'] for r in at]), 'f1': agg([r['f1'] for r in at]),
      'nll': agg([-r['L_plus'] for r in at]),
      'ceu_ev': agg(ceu('ev')), 'ceu_dis': agg(ceu('dis')), 'ceu_control': agg(ceu('control')),
      f'supported_{TAU}': agg(supported),
      'profile': audit_nq.summarize(rows, audit_nq.SPAN_PROBES, n_layers, cfg),
  }
