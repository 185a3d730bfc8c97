"""Answer-presence audit and five-sentinel panel (SPEC §8.1, issue #16).

World A — ATR-insert, exact ground truth: the three families trained as in the
smoke grid (trained here, in W/train/<family>, unless done), the smoke world
with η = 0.2 as raw context, line-filter rewriters B2/B3/B4:
  python -m experiments.answer_presence --config configs/answer_presence.py --workdir runs/answer_presence_atr
World A with the answer string and the evidence apart (the same data and readers; rewriters
Bev / Bval that surface the evidence line / the bare gold VALUE, the unbind edit; separate.py):
  python -m experiments.answer_presence --config configs/answer_presence.py:full,world=atr_separate --workdir runs/answer_presence_atr_separate
World B — SmolLM2-135M-Instruct on Natural Questions and SQuAD items:
  python -m experiments.answer_presence --config configs/answer_presence.py:full,world=factqa --workdir runs/answer_presence_factqa
Oracle readers on generated text records (exact known answers):
  python -m experiments.answer_presence --config configs/answer_presence.py:full,world=generated --workdir /tmp/ap_gen
Tiny (the CI tests run these): `:tiny` (World A: attention only, 10 training
steps, 64 records), `:tiny,world=factqa` (2 of SmolLM2's 30 layers, 4 items),
`:tiny,world=generated`, `:tiny,world=atr_separate` (as `:tiny`; its test swaps in
oracle readers). Arguments after the variant: world, reader
(generated world: copy | closed_book), n_records, steps (World A training steps).
Wall times are in the README.
"""
from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ('tiny', 'full')
WORLDS = ('atr', 'atr_separate', 'factqa', 'generated')


def _train_config(tiny: bool, steps):
  """The smoke grid's plain-world baseline cell at 1,000 steps (configs/smoke.py, regulariser
  none; the readers of the README's answer-presence tables); family set per reader."""
  from configs import smoke
  c = smoke.get_config('tiny' if tiny else 'full,world=plain,steps=1000')
  del c['grid'], c['sweep']  # one cell, not a grid
  c.cer.regularizer = 'none'
  c.cer.lambda_ev = 0.0
  if tiny:
    c.train.num_steps = 10
    c.train.warmup_steps = 2
    c.train.eval_every = 10
    c.train.checkpoint_every = 10
    c.eval.num_examples = c.eval.batch_size = 16
    c.eval.corruptions = ('value_swap',)
  if steps is not None:
    c.train.num_steps = steps
    c.train.eval_every = steps
  return c


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='full', world=common.Opt(str, choices=WORLDS),
                       reader='copy', n_records=common.Opt(int, 1), steps=common.Opt(int, 1))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  world = a.world or 'atr'
  separate = world == 'atr_separate'
  c = ml_collections.ConfigDict()
  c.variant = a.variant                # tiny | full
  c.world = world                      # atr (World A) | atr_separate (World A with answer string
                                       # and evidence apart) | factqa (World B) | generated (oracles)
  c.reader = a.reader                  # generated world only: copy (uses its evidence) | closed_book
  default_n = {'atr': (64, 2000), 'atr_separate': (64, 2000), 'factqa': (4, 200), 'generated': (200, 2000)}[world]
  c.n_records = a.n_records or default_n[int(not tiny)]  # records (World B: items over all sources)
  c.seed = 0                           # record / item selection seed
  c.items_per_chunk = {'atr': 500, 'atr_separate': 500, 'factqa': 2 if tiny else 20,
                       'generated': 50 if tiny else 250}[world]  # records per saved chunk
  c.plots = True                       # write effects.png/pdf and panel.png/pdf
  c.bootstrap_seed = 42                # percentile bootstrap seed (SPEC §8)

  c.atr = x = ml_collections.ConfigDict()  # World A
  x.families = ('attention',) if tiny else ('attention', 'ssm', 'memory_port')  # readers
  x.train = _train_config(tiny, a.steps)  # training config of every family (smoke baseline cell)
  x.eta = 0.2                          # raw-context miss rate η (the evidence line is absent)
  x.p_drop = 0.2                       # rewriter drops the evidence line (→ 1→0 bucket)
  x.p_surface = 1.0 if separate else 0.5  # rewriter surfaces the gold line on missed examples (→ 0→1;
                                       # atr_separate: Bev / Bval surface on compiles without it)
  x.rewriter_seed = 7                  # seed of the rewriters' draws (with the rewriter and id)
  x.loglik = True                      # gold log-likelihood change beside F1 (= EM here)
  x.batch_size = 256                   # reader rows per forward

  c.factqa = f = ml_collections.ConfigDict()  # World B
  f.sources = ('nq', 'squad')          # items alternate between these sources
  f.split = 'test'                     # factual-QA split of the items and distractors
  f.max_passage_words = 50 if tiny else 100  # gold and distractor passages of at most this many
                                       # words (tiny: short prompts, the prefill's cost)
  f.n_distractors = 1 if tiny else 2   # seeded distractor passages in the raw context
  f.eta = 0.2                          # the gold passage is missing (→ a third distractor)
  f.n_layers = 2 if tiny else 0        # SmolLM2 layers used (0: all 30; tiny: plumbing only)
  f.chat = True                        # ChatML prompts (the model's own template)
  f.n_shots = 1 if tiny else 3         # solved demonstrations (train split) before each question
  f.max_new_tokens = 4 if tiny else 16  # reader budget (cut at the first newline)
  f.rewrite_max_new_tokens = 8 if tiny else 64  # rewriter B's budget
  f.extract_sentences = 2              # rewriter A / control: sentences kept
  f.max_context_chars = 6000           # a context whose insert would be longer is skipped
  f.batch_size = 4 if tiny else 16     # prompts per compiled decoder call
  f.gguf_path = ''                     # GGUF file ('': $CEU_SMOLLM2_GGUF or the package's)

  c.generated = g = ml_collections.ConfigDict()  # oracle world
  g.max_new_tokens = 16                # oracle budget (words)
  g.max_context_chars = 4000           # a context whose insert would be longer is skipped
  return c
