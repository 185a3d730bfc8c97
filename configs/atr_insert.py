"""ATR-insert: train a retrieval model, audit its causal evidence usage (SPEC §3).

Run:
  python -m experiments.train --config configs/atr_insert.py:tiny --workdir /tmp/atr
  python -m experiments.audit --config configs/atr_insert.py:tiny --workdir /tmp/atr
  python -m experiments.show_examples --config configs/atr_insert.py:tiny
Arguments: `tiny` (CPU-sized, minutes) or `base`, then optional overrides,
e.g. `configs/atr_insert.py:tiny,family=ssm,rho=0.5,bypass=true`: family
(attention | ssm | memory_port), preset (p100k | p400k | p1500k), rho, delta,
eta (in [0, 1]), context_len (>= 1), bypass (true | false), seed (>= 0), steps
(>= 1). Values are checked strictly (configs/common.py).
"""
from __future__ import annotations

import ml_collections

from architectures import FAMILIES, PRESETS
from configs import common


_or = common.given_or


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant="base", family=common.Opt(str, choices=FAMILIES),
                       preset=common.Opt(str, choices=tuple(PRESETS)),
                       rho=common.Opt(float, 0.0, 1.0), delta=common.Opt(float, 0.0, 1.0),
                       eta=common.Opt(float, 0.0, 1.0), context_len=common.Opt(int, 1),
                       bypass=False, seed=common.Opt(int, 0), steps=common.Opt(int, 1))
  tiny = a.variant == "tiny"
  if a.variant not in ("tiny", "base"):
    raise ValueError(f"configs/atr_insert.py: variant must be 'tiny' or 'base', got {a.variant!r}")
  c = ml_collections.ConfigDict()
  c.seed = _or(a.seed, 0)                  # seeds parameters, data stream and probes

  c.data = d = ml_collections.ConfigDict()
  d.task = "atr_insert"                    # task name (atr_insert | factqa)
  d.variant = "value_for_key"              # value_for_key | key_for_value
  d.num_passages = 8                       # m passages in the retrieved bundle
  d.context_len = _or(a.context_len, 128 if tiny else 512)  # n context tokens
  d.value_len = 1                          # value tokens per binding (>= 1; the answer for value_for_key)
  d.eta = _or(a.eta, 0.0)                  # η miss probability in training data
  d.delta = _or(a.delta, 0.3)              # δ hard-negative rate in training data
  d.rho = _or(a.rho, 0.0)                  # ρ prior strength (memorisable pairs)
  d.overlap_rate = 0.25                    # filler lines mentioning the query's tokens
  d.filler_rate = 0.5                      # plain non-evidence lines in filler format
  d.paraphrase_rate = 0.1                  # evidence-format lines in the paraphrase format
  d.hard_negative_kinds = "both"           # same_key | same_id | both
  d.n_ids = 32 if tiny else 64             # ID vocabulary
  d.n_keys = 32 if tiny else 64            # KEY vocabulary
  d.n_values = 32 if tiny else 64          # VALUE vocabulary
  d.n_filler = 64                          # filler-word vocabulary
  d.world_seed = 0                         # fixes the ρ prior table

  c.model = common.model_section(_or(a.family, "attention"),
                                 _or(a.preset, "p100k" if tiny else "p400k"))
  c.model.bypass = a.bypass

  c.train = t = ml_collections.ConfigDict()
  t.batch_size = 64 if tiny else 128       # global batch (split over the data axis)
  t.num_steps = _or(a.steps, 3000 if tiny else 20000)  # optimiser steps
  t.learning_rate = 1e-3                   # peak learning rate
  t.warmup_steps = 200 if tiny else 1000   # linear warm-up steps (steps=N: at most N // 10)
  if a.steps is not None:
    t.warmup_steps = min(t.warmup_steps, max(1, a.steps // 10))
  t.weight_decay = 0.01                    # AdamW weight decay
  t.grad_clip = 1.0                        # global-norm clipping (0 = off)
  t.log_every = 50                         # steps between metric lines
  t.eval_every = 500 if tiny else 2000     # steps between evaluations
  t.checkpoint_every = 500 if tiny else 2000  # steps between checkpoints
  t.keep_latest = 2                        # latest checkpoints kept
  t.keep_best = 1                          # best checkpoints kept (by eval.best_metric)
  t.async_checkpointing = True             # orbax saves in the background (committed atomically)
  t.debug_nan_step = -1                    # TEST ONLY: loss × NaN at this step (-1 = off)
  t.debug_kill = ""                        # TEST ONLY: '<after_step|in_save|after_save|sigterm>:<step>'
                                           # (SIGKILL self there; 'sigterm' sends SIGTERM)

  # CER objective (SPEC §4): every field, its default, range and meaning is defined once
  # in ceu_jax.train.losses.LossConfig; override as --config.cer.<field>=...
  c.cer = common.cer_section()

  # Evaluation and audits (SPEC §1, §5): every field the audit reads, its default, range
  # and meaning is defined once in ceu_jax.audit_config.EvalSection (eval.eps is the ε of
  # the audit's CEU, apart from cer.eps of the CER loss; eval.probe_chunk 'auto' = the
  # engine's measured chunk rule); override as --config.eval.<field>=...
  c.eval = e = common.eval_section(
      num_examples=512 if tiny else 2048,  # fixed evaluation set size
      batch_size=128,                      # evaluation batch
      seed=1234)                           # evaluation-set seed (same set for every cell)
  e.best_metric = "em"                     # metric that picks the best checkpoint (em | nll | ceu_ev | supported_0.5)

  c.sharding = common.sharding_section()
  return c
