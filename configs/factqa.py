"""Factual QA with controlled corruption: train a retrieval model, audit its CEU (SPEC §3).

Run (once the training / audit entry points accept data.task = 'factqa'):
  python -m experiments.train --config configs/factqa.py:tiny --workdir /tmp/factqa
  python -m experiments.audit --config configs/factqa.py:tiny --workdir /tmp/factqa
Arguments: `tiny` (CPU-sized, minutes) or `base`, then optional overrides, e.g.
`configs/factqa.py:tiny,family=ssm,delta=0.5,counterfactual=true,sources=squad`.
Data: ceu_jax/data/factqa/shipped (regenerate with `python scripts/prepare_factqa.py`).
"""
from __future__ import annotations

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant="base", family="attention", preset="",
                       delta=0.3, eta=0.0, context_len=0, bypass=False,
                       counterfactual=False, sources="squad+nq", nq_swap="dataset",
                       seed=0, steps=0)
  tiny = a.variant == "tiny"
  if a.variant not in ("tiny", "base"):
    raise ValueError(f"configs/factqa.py: variant must be 'tiny' or 'base', got {a.variant!r}")
  c = ml_collections.ConfigDict()
  c.seed = a.seed                          # seeds parameters, data stream and probes

  c.data = d = ml_collections.ConfigDict()
  d.task = "factqa"                        # task name (atr_insert | factqa)
  d.num_passages = 4 if tiny else 8        # m passages in the retrieved bundle
  d.context_len = a.context_len or (256 if tiny else 512)  # n context tokens (m x n/m)
  d.query_len = 32                         # Q: [BOS] + question tokens (longer: skipped)
  d.answer_len = 8                         # A: answer tokens, PAD-padded (longer: skipped)
  d.lines_per_passage = 4                  # sentence slots per passage (L = m x this)
  d.eta = a.eta                            # η miss probability in training data
  d.delta = a.delta                        # δ share of non-evidence passages with distractors
  d.sources = tuple(a.sources.split("+"))  # prepared sources used: squad, nq
  d.counterfactual = a.counterfactual      # invented-name slice (priors uninformative)
  d.nq_swap = a.nq_swap                    # NQ entity swap: dataset | equal_length

  c.model = common.model_section(a.family, a.preset or ("p100k" if tiny else "p400k"))
  c.model.bypass = a.bypass

  c.train = t = ml_collections.ConfigDict()
  t.batch_size = 32 if tiny else 128       # global batch (split over the data axis)
  t.num_steps = a.steps or (2000 if tiny else 20000)  # optimiser steps
  t.learning_rate = 1e-3                   # peak learning rate
  t.warmup_steps = 200 if tiny else 1000   # linear warm-up steps
  t.weight_decay = 0.01                    # AdamW weight decay
  t.grad_clip = 1.0                        # global-norm clipping (0 = off)
  t.log_every = 50                         # steps between metric lines
  t.eval_every = 500 if tiny else 2000     # steps between evaluations
  t.checkpoint_every = 500 if tiny else 2000  # steps between checkpoints
  t.keep_latest = 2                        # latest checkpoints kept
  t.keep_best = 1                          # best checkpoints kept (by eval.best_metric)
  t.async_checkpointing = True             # orbax saves in the background

  c.cer = r = ml_collections.ConfigDict()
  r.regularizer = "none"                   # none | evidence | evidence_distractor
  r.lambda_ev = 1.0                        # λ_ev weight of [α − CEU_ev]_+
  r.alpha = 0.6                            # α target evidence CEU, in (0, 1]
  r.lambda_dis = 0.5                       # λ_dis weight of CEU_dis
  r.beta_swap = 0.0                        # β weight of the swap term
  r.swap_form = "hinge"                    # contrastive | hinge
  r.gamma = 2.0                            # γ hinge margin (nats)
  r.lambda_noret = 0.0                     # λ_noret no-retrieval penalty (0 = off)
  r.beta0 = -3.0                           # β_0 allowed log p(y*|q, ∅)
  r.k = 2                                  # probes per example: 1 ev, 2 +dis, 3 +control
  r.grad_path = "all"                      # all | numerator (clean recording under stop_gradient)
  r.corruption = "entity_swap"             # corruption giving D− for CER (factqa name)
  r.eps = 1e-3                             # ε of the stabilised CEU
  r.site = -1                              # read port f: index into read_port_sites (-1 = deepest)

  c.eval = e = ml_collections.ConfigDict()
  e.num_examples = 256 if tiny else 1024   # fixed evaluation set size (from split 'eval')
  e.batch_size = 64                        # evaluation batch
  e.seed = 1234                            # evaluation-set seed (same set for every cell)
  e.corruptions = ("entity_swap", "removal", "paraphrase")  # D− kinds audited
  e.chunk_size = 16                        # probes per vmapped chunk
  e.best_metric = "em"                     # metric that picks the best checkpoint
  e.num_resamples = 1000                   # bootstrap resamples of the final summary (0 = no CIs)

  c.sharding = common.sharding_section()
  return c
