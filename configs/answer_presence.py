"""Answer-presence audit and sentinel panel (SPEC §8.1, issue #16).

Run (generated world, copy oracle, 2,000 records):
  python -m experiments.answer_presence --config configs/answer_presence.py --workdir runs/answer_presence
Tiny (200 records; the CI test runs it in seconds):
  python -m experiments.answer_presence --config configs/answer_presence.py:tiny --workdir /tmp/ap_tiny
Overrides after the variant, e.g. `configs/answer_presence.py:tiny,reader=closed_book`.
"""
from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ('tiny', 'full')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='full', reader='copy', n_records=-1)
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  c = ml_collections.ConfigDict()
  c.variant = a.variant                # tiny | full
  c.world = 'generated'                # record source: generated (seeded text records)
  c.reader = a.reader                  # copy (uses its evidence) | closed_book (ignores it)
  c.n_records = a.n_records if a.n_records > 0 else (200 if tiny else 2000)  # records generated
  c.seed = 0                           # record generator seed
  c.chunk_size = 50 if tiny else 250   # records per resumable chunk
  c.sentinel = '[MASK]'                # sentinel of remove / placebo in the main table
  c.max_new_tokens = 16                # reader's greedy budget
  c.max_context_chars = 4000           # a context that cannot hold an insert within this is skipped (0: no limit)
  c.plots = True                       # write effects.png/pdf and panel.png/pdf
  c.bootstrap_seed = 42                # percentile bootstrap seed (SPEC §8)
  return c
