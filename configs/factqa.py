"""Factual QA with controlled corruption: train a retrieval model, audit its CEU (SPEC §3).

Run (train, then audit the workdir's checkpoint; dispatch: ceu_jax/data/tasks.py):
  python -m experiments.train --config configs/factqa.py:tiny --workdir /tmp/factqa
  python -m experiments.audit --config configs/factqa.py:tiny --workdir /tmp/factqa
Arguments: `tiny` (CPU-sized, minutes) or `base`, then optional overrides, e.g.
`configs/factqa.py:tiny,family=ssm,delta=0.5,counterfactual=true,sources=squad`.
Data: ceu_jax/data/factqa/shipped (regenerate with `python scripts/prepare_factqa.py`).
The model / train / cer / eval / sharding sections are those of configs/atr_insert.py
(same field names, same defaults); only the data section differs. The corruption
names are the ATR-insert ones (value_swap = the factqa entity swap); factqa also
accepts entity_swap, distractor_injection and paraphrase in cer / eval.
"""
from __future__ import annotations

import ml_collections

from architectures import FAMILIES, PRESETS
from configs import atr_insert, common


_or = common.given_or


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant="base", family=common.Opt(str, choices=FAMILIES),
                       preset=common.Opt(str, choices=tuple(PRESETS)),
                       delta=common.Opt(float, 0.0, 1.0), eta=common.Opt(float, 0.0, 1.0),
                       context_len=common.Opt(int, 1), bypass=False, counterfactual=False,
                       sources=common.Opt(str, choices=("squad+nq", "squad", "nq", "nq+squad")),
                       nq_swap=common.Opt(str, choices=("dataset", "equal_length")),
                       seed=common.Opt(int, 0), steps=common.Opt(int, 1))
  if a.variant not in ("tiny", "base"):
    raise ValueError(f"configs/factqa.py: variant must be 'tiny' or 'base', got {a.variant!r}")
  tiny = a.variant == "tiny"
  shared = ",".join([a.variant, f"bypass={a.bypass}"] + [
      f"{k}={a[k]}" for k in ("family", "preset", "seed", "steps") if a[k] is not None])
  c = atr_insert.get_config(shared)

  c.data = d = ml_collections.ConfigDict()
  d.task = "factqa"                        # task name (atr_insert | factqa)
  d.num_passages = 4 if tiny else 8        # m passages in the retrieved bundle
  d.context_len = _or(a.context_len, 256 if tiny else 512)  # n context tokens (m x n/m)
  d.query_len = 32                         # Q: [BOS] + question tokens (longer: skipped)
  d.answer_len = 8                         # A: answer tokens, PAD-padded (longer: skipped)
  d.lines_per_passage = 4                  # sentence slots per passage (L = m x this)
  d.eta = _or(a.eta, 0.0)                  # η miss probability in training data
  d.delta = _or(a.delta, 0.3)              # δ share of non-evidence passages with distractors
  d.sources = tuple(_or(a.sources, "squad+nq").split("+"))  # prepared sources used: squad, nq
  d.counterfactual = a.counterfactual      # invented-name slice (priors uninformative)
  d.nq_swap = _or(a.nq_swap, "dataset")    # NQ entity swap: dataset | equal_length
  if tiny:  # sized so that train and audit each take < 15 min on 2 CPU cores
    t = c.train
    t.num_steps = _or(a.steps, 1000)       # optimiser steps
    t.batch_size = 32                      # global batch
    t.warmup_steps = min(100, t.num_steps)  # linear warm-up steps
    t.learning_rate = 3e-3                 # peak learning rate (ssm: ~0.65 s/step, 1 core)
    t.eval_every = 500                     # steps between evaluations
    t.checkpoint_every = 500               # steps between checkpoints
    c.eval.num_examples = 256              # fixed evaluation set size (audit too)
  return c
