"""Theorem-style bound plots T1–T3 on trained ATR-insert models (SPEC §7, issue #7).

Run (mid: ≤ 30 min on 2 CPU cores, training included, models of accuracy ≥ 0.9 in
the smoke grid's plain world; the search behind it is in docs/bounds.md):
  python -m experiments.bounds --config configs/bounds.py:mid --workdir runs/bounds_mid
tiny (≤ 15 min; weak models, accuracy ≤ 0.28):
  python -m experiments.bounds --config configs/bounds.py:tiny --workdir runs/bounds_tiny
Full config (for an accelerator; hours on CPU):
  python -m experiments.bounds --config configs/bounds.py:full --workdir runs/bounds
Arguments: `mid`, `tiny`, `full` or `micro` (seconds; used by the smoke test), then
optional overrides, e.g. `configs/bounds.py:tiny,steps=300,examples=128` (`steps`
sets every model's steps, CER models' included).

Writes W/plots/{t1,t2,t3}.{png,pdf}, W/bounds.md (the report's `bounds` section)
and W/bounds.json; models are trained (resumably) under W/models/<name>/ and
finished models are skipped on a rerun.
"""
from __future__ import annotations

import ml_collections

from configs import atr_insert, common

VARIANTS = ("micro", "tiny", "mid", "full")


def _models(variant: str, steps: int, cer_steps: int) -> tuple:
  """(name, ((dotted config key, value), ...)) per model: a spread of mean CEU."""
  bypass, cer = ("model.bypass", True), ("cer.regularizer", "evidence")
  port_only = ("port_only", (("model.bypass", False), ("train.num_steps", steps)))
  shortcut = ("bypass", (bypass, ("train.num_steps", steps)))
  cer_hi = ("bypass_cer_l1", (bypass, cer, ("cer.lambda_ev", 1.0),
                              ("train.num_steps", cer_steps)))
  if variant == "micro":
    return (shortcut, port_only)
  if variant in ("tiny", "mid"):
    return (shortcut, cer_hi, port_only)
  cer_lo = ("bypass_cer_l0.3", (bypass, cer, ("cer.lambda_ev", 0.3),
                                ("train.num_steps", cer_steps)))
  cer_top = ("bypass_cer_l3", (bypass, cer, ("cer.lambda_ev", 3.0),
                               ("train.num_steps", cer_steps)))
  return (shortcut, cer_lo, cer_hi, cer_top, port_only)


def _model_base(variant: str, steps: int) -> ml_collections.ConfigDict:
  """The training config every model starts from (configs/atr_insert.py)."""
  small = variant != "full"
  c = atr_insert.get_config(f"{'tiny' if small else 'base'},rho=0.3"
                            + (",context_len=64" if small else ""))
  c.train.num_steps = steps
  c.train.batch_size = 32 if small else 128
  c.train.learning_rate = 2e-3 if small else 1e-3
  c.train.warmup_steps = min(50, steps // 4) if small else 1000
  if variant == "mid":                     # the smoke grid's world (configs/smoke.py):
    c.data.num_passages = 4                # 4 passages x 16 tokens, 16 IDs/KEYs/VALUEs,
    c.data.n_ids = c.data.n_keys = c.data.n_values = 16   # which learns in minutes
    c.train.learning_rate = 3e-3
  c.train.eval_every = 0                   # no training-time eval: run_bounds measures itself
  c.train.checkpoint_every = max(steps // 2, 1)
  c.train.log_every = max(min(100, steps // 4), 1)
  c.eval.num_examples = 64 if variant == "micro" else 256
  c.eval.batch_size = 64
  c.eval.num_resamples = 0                 # the bounds report bootstraps its own CIs
  return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant="tiny", steps=0, examples=0, seed=0)
  if a.variant not in VARIANTS:
    raise ValueError(f"configs/bounds.py: variant must be one of {VARIANTS}, got {a.variant!r}")
  micro, full = a.variant == "micro", a.variant == "full"
  mid = a.variant == "mid"
  steps = a.steps or (5 if micro else 20000 if full else 1500 if mid else 1200)
  cer_steps = a.steps or (5 if micro else 20000 if full else 1000 if mid else 500)
  n = a.examples or (16 if micro else 2048 if full else 256)
  c = ml_collections.ConfigDict()
  c.seed = a.seed                          # seeds the eval sets, probes and search
  c.model_base = _model_base(a.variant, steps)  # atr_insert training config shared by all models
  c.models = _models(a.variant, steps, cer_steps)  # (name, overrides) per model (range of mean CEU)

  c.eval = e = ml_collections.ConfigDict()
  e.num_examples = n                       # test examples per evaluation set
  e.heldout_examples = n                   # held-out ('eval' split) examples for fitting ĉ
  e.batch_size = 16 if micro else 128      # examples per forward / audit call
  e.seed = 9000 + a.seed                   # eval-set seed (same sets for every model)
  e.corruption = "evidence_swap"           # D− for CEU_ev (α) and the swap margin (γ)
  e.probe_chunk = ml_collections.FieldReference(  # probes per vmapped chunk: 'auto' (the
      "auto", field_type=object)           # engine's rule) or an int (=8 on a command line)
  e.eps = 1e-3                             # ε of the stabilised CEU (degenerate below)
  e.num_resamples = 100 if micro else 1000  # bootstrap resamples for every CI

  c.t1 = t = ml_collections.ConfigDict()
  t.corruption = "value_swap"              # D− of the T1 restoration (smallest swap)
  t.num_examples = min(n, 128 if not full else 512)  # trained-model examples per model
  t.scales = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)  # two-channel
                                           # gold-logit gaps s (nats)
  t.synthetic_examples = 64 if micro else 256  # swaps per scale on the exact two-channel model
  t.synthetic_coupling = 0.0               # non-gold rows' coupling to h_f (0 = T1 exact regime)

  c.t2 = s = ml_collections.ConfigDict()
  s.num_examples = min(n, 48 if not full else 512)  # attacked examples per model
  s.budget = 2 if micro else 3             # max non-evidence lines substituted per example
  s.value_draws = 1 if not full else 2     # hard-negative renderings per (slot, kind)
  s.beam_width = 1                         # 1 = greedy search
  s.max_slots = 8                          # max non-evidence line slots considered

  c.t3 = r = ml_collections.ConfigDict()
  r.model = "bypass" if micro else "port_only"  # which model the T3 plot is about
  r.etas = ((0.0, 0.5) if micro else (0.0, 0.2, 0.4, 0.6) if not full
            else (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8))
                                           # test-time miss probabilities η
  r.deltas = (0.3, 0.9) if micro else (0.0, 0.3, 0.9) if not full else (0.0, 0.3, 0.6, 0.9)
                                           # test-time distractor rates δ
  r.base_delta = 0.3                       # δ at which α is estimated (the training δ)
  r.tau = 0.5                              # supported iff correct and CEU_ev ≥ τ
  r.c_method = "mle"                       # ĉ estimator: mle | envelope
  return c
