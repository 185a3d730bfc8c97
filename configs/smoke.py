"""Smoke grid: the README's main command — a shortcut world, every architecture,
baseline vs CER, two seeds (SPEC §6, H1–H4).

Run (measured wall time in the README, 2-core CPU):
  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke --processes 2
(`--processes P`: P worker processes on this CPU host share the cells.)
Five seeds (the documented command behind the README's seed spread):
  python -m experiments.grid --config configs/smoke.py:full,seeds=5 --workdir runs/smoke5
Split over processes or hosts (same workdir, or merge workdirs' cells/ later):
  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke --shard 0/2
  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke --shard 1/2
Arguments: `configs/smoke.py:tiny` is a 4-cell, 20-step version (attention and
memory_port x baseline/CER, one seed, 64 test examples, test δ only); `steps=N`
sets the steps per cell; `seeds=N` trains every setting with seeds 0..N-1 (the
report then shows mean ± sd over seeds; default 2, tiny 1); `swap=β` the weight of
the swap hinge β·[γ − (L+ − L−)]_+ in the CER cells (SPEC §4; default 1 outside
the plain world, 0 in it); `world=` picks the training world:
  shortcut  ρ = 0.9, η = 0.3 (the default): 90% of (ID, KEY) pairs have a
            memorisable value and 30% of contexts miss the evidence, so memorising
            pays — found by the search in the README: the baselines are accurate
            while most of their answers do not move when the evidence changes;
  plain     ρ = 0.3, η = 0: every baseline reads its evidence (the grid of the
            README before issue #19);
  both      the two worlds as a swept axis.
Outside the plain world the regulariser axis adds evidence + distractor (k = 2).

Each cell trains a tiny model on ATR-insert, then audits it on a fixed test set
under the training distribution ('clean') and under test-time shift of δ, n and
η, one knob at a time; the report splits the clean examples into strata (evidence
present with a memorisable answer / with an answer only the evidence gives). D+
and D− have identical token counts (every corruption is token-aligned), which is
the length-matched control.
"""
from __future__ import annotations

import ml_collections

from configs import atr_insert, common


# Training worlds: (ρ prior strength, η miss rate) of the training and eval data.
WORLDS = {"plain": (0.3, 0.0), "shortcut": (0.9, 0.3)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant="full", steps=common.Opt(int, 1),
                       world=common.Opt(str, choices=tuple(WORLDS) + ("both",)),
                       seeds=common.Opt(int, 1), swap=common.Opt(float, 0.0))
  if a.variant not in ("full", "tiny"):
    raise ValueError(f"configs/smoke.py: variant must be 'full' or 'tiny', got {a.variant!r}")
  tiny = a.variant == "tiny"
  c = atr_insert.get_config("tiny,rho=0.3,context_len=64")
  c.data.num_passages = 4                     # 4 passages x 16 tokens (2 lines each)
  c.data.n_ids = c.data.n_keys = c.data.n_values = 16   # a small world: learns in minutes
  c.train.num_steps = a.steps if a.steps is not None else (20 if tiny else 600)
  c.train.batch_size = 32                               # small steps: 2 CPU cores
  c.train.learning_rate = 3e-3                          # peak LR (fast convergence)
  c.train.warmup_steps = 5 if tiny else 50              # (steps=N: at most N // 10)
  if a.steps is not None:
    c.train.warmup_steps = min(c.train.warmup_steps, max(1, a.steps // 10))
  c.train.eval_every = c.train.num_steps                # one evaluation, at the end
  c.train.checkpoint_every = 10 if tiny else 200
  c.eval.num_examples = 64 if tiny else 256
  c.eval.batch_size = 64                                # divides eval.num_examples
  c.eval.corruptions = ("value_swap",)                  # D− of every grid row

  c.grid = g = ml_collections.ConfigDict()
  # Each condition is config.eval's fixed set (seed, size) with one knob shifted;
  # the grid's rows are for the first of eval.corruptions.
  g.delta_test = (0.3, 0.6, 0.9)              # test-time δ (one condition each)
  g.n_test = (64,) if tiny else (64, 128)     # test-time context length n
  g.eta_test = (0.0,) if tiny else (0.0, 0.3, 0.6)  # test-time miss rate η
  g.compilation_cache = True                  # W/jax_cache: seeds and conditions reuse programs

  world = a.world or "shortcut"
  worlds = tuple(WORLDS) if world == "both" else (world,)
  c.data.rho, c.data.eta = WORLDS[worlds[0]]            # ρ prior, η miss rate (training)
  families = ("attention", "memory_port") if tiny else ("attention", "ssm", "memory_port")
  regs = (("none", "evidence") if worlds == ("plain",) or tiny else
          ("none", "evidence", "evidence_distractor"))
  swap = a.swap if a.swap is not None else (0.0 if worlds == ("plain",) else 1.0)
  seeds = a.seeds if a.seeds is not None else (1 if tiny else 2)
  sweep = []
  if seeds > 1:                                       # training seed (outermost, so a
    sweep.append((("seed", tuple(range(seeds))),))    # partial run has whole seeds)
  sweep += [
      (("model.family", families),),                  # every family ...
      (("cer.regularizer", regs),                     # ... x baseline vs CER (zipped with
       ("cer.lambda_ev", (0.0,) + (1.0,) * (len(regs) - 1)),   # λ_ev and the swap hinge β)
       ("cer.beta_swap", (0.0,) + (swap,) * (len(regs) - 1))),
  ]
  if len(worlds) > 1:                                 # ... x training world (ρ, η zipped)
    sweep.append((("data.rho", tuple(WORLDS[w][0] for w in worlds)),
                   ("data.eta", tuple(WORLDS[w][1] for w in worlds))))
  c.sweep = tuple(sweep)
  return c


def audit_reader_config(data: ml_collections.ConfigDict, family: str, tiny: bool,
                        steps: int, *, bypass: bool = False) -> ml_collections.ConfigDict:
  """Training config of one audited World A reader (the mediator and trace audits):
  the smoke grid's baseline cell on `data` (its task's first corruption for the
  evaluation D−), one run instead of a grid, plain task loss."""
  from ceu_jax.data import tasks  # pylint: disable=import-outside-toplevel
  c = get_config("tiny" if tiny else "full,world=plain")   # data replaced below
  del c["grid"], c["sweep"]            # one cell, not a grid
  c.data = data
  c.model.family = family
  c.model.bypass = bool(bypass)        # early fusion of the retrieved tokens into the reader
  c.cer.regularizer = "none"           # plain task loss
  c.cer.lambda_ev = 0.0
  corruption = tasks.of_config(data).corruptions[0]
  c.cer.corruption = corruption        # the evaluation D− (CEU metrics of the run's eval)
  c.eval.corruptions = (corruption,)
  c.train.num_steps = int(steps)
  c.train.warmup_steps = min(c.train.warmup_steps, c.train.num_steps)
  c.train.eval_every = c.train.num_steps
  c.train.checkpoint_every = min(c.train.checkpoint_every, c.train.num_steps)
  if tiny:
    c.eval.num_examples = c.eval.batch_size = 16
  return c
