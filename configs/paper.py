"""The full experiment grid of SPEC §6, for accelerators.

Run (one host, or split with --shard i/N over a job array on a shared workdir):
  python -m experiments.grid --config configs/paper.py --workdir runs/paper --shard $I/$N
Aggregate once every shard has finished:
  python -m experiments.grid --config configs/paper.py --workdir runs/paper --aggregate_only

Cells: 3 architectures x 3 η x 3 δ x 2 n x 6 regulariser settings x 3 seeds = 972
cells, plus a k ablation (3 architectures x k ∈ {1, 2, 3} x 3 seeds = 27 cells via
`configs/paper.py:k_ablation`) and a granularity ablation (`:granularity`).
Expected cost (an estimate): `python -m benchmarks.scale_bench` compiles every
distinct train step of this grid and reads XLA's cost analysis (FLOPs and bytes
accessed per step; a CER step with k = 2 costs 3.4-4.1x a plain one), adds the
periodic evaluations and audits, and prints device-hours for an H100 and a TPU
v5e at an assumed 30% utilisation; the README's "Paper grid cost" section gives
its numbers. Trim a first pass with seeds = (0,) (÷3) or one n (÷2).
"""
from __future__ import annotations

import ml_collections

from configs import atr_insert, common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant="main")
  if a.variant not in ("main", "k_ablation", "granularity"):
    raise ValueError("configs/paper.py: variant must be main, k_ablation or granularity, "
                     f"got {a.variant!r}")
  c = atr_insert.get_config("base")
  c.train.num_steps = 20000                    # optimiser steps per cell
  c.eval.num_examples = 2048                   # fixed evaluation set per cell

  c.grid = g = ml_collections.ConfigDict()
  # Each condition is config.eval's fixed set (seed, size) with one knob shifted;
  # the grid's rows are for the first of eval.corruptions.
  g.delta_test = (0.0, 0.3, 0.6, 0.9)          # test-time δ shift
  g.n_test = (256, 512, 1024, 2048)            # test-time context length shift
  g.eta_test = (0.0, 0.1, 0.3, 0.5)            # test-time η shift
  g.compilation_cache = True                   # W/jax_cache: seeds and conditions reuse programs

  families = (("model.family", ("attention", "ssm", "memory_port")),)
  seeds = (("seed", (0, 1, 2)),)
  if a.variant == "main":
    c.sweep = (
        families,
        (("data.eta", (0.0, 0.1, 0.3)),),
        (("data.delta", (0.0, 0.3, 0.6)),),
        (("data.context_len", (256, 512)),),
        # regulariser x (λ, α): zipped so each setting is one cell, not a product
        (("cer.regularizer", ("none", "evidence", "evidence", "evidence",
                              "evidence_distractor", "evidence_distractor")),
         ("cer.lambda_ev", (0.0, 0.3, 1.0, 3.0, 1.0, 1.0)),
         ("cer.alpha", (0.6, 0.6, 0.6, 0.8, 0.6, 0.8))),
        seeds,
    )
  elif a.variant == "k_ablation":
    c.cer.regularizer = "evidence_distractor"
    c.sweep = (families, (("cer.k", (1, 2, 3)),), seeds)
  else:
    c.cer.regularizer = "evidence"
    c.sweep = (families, (("cer.granularity", ("span", "port")),), seeds)
  return c
