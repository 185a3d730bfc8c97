"""Causal sensitivity of reasoning traces (SPEC §8.2, issue #17).

World A — chained ATR with exact ground truth, read by the trace oracles
(following / ignoring / seeded mixture):
  python -m experiments.trace_sensitivity --config configs/trace_sensitivity.py --workdir runs/traces_chain
World B — SmolLM2-135M-Instruct with few-shot "Step i:" traces on templated
arithmetic and on factual questions with their gold passage (shipped NQ data):
  python -m experiments.trace_sensitivity --config configs/trace_sensitivity.py:full,world=smollm2 --workdir runs/traces_smollm2
Tiny (the CI tests run these): `:tiny` (World A, 40 items) and
`:tiny,world=smollm2` (the whole model, 1 item per domain, interventions at k = 1
only, 64-token budget; about 1 min on a loaded 2-core machine).
Arguments after the variant: world (chain | smollm2), n_items (per domain), seed.
"""
from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ('tiny', 'full')
WORLDS = ('chain', 'smollm2')
TAUS = ('identity', 'logic_flip', 'fact_reversal', 'premise_negation', 'causal_inversion')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='full', world=common.Opt(str, choices=WORLDS),
                       n_items=common.Opt(int, 1), seed=common.Opt(int, 0))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  world = a.world or 'chain'
  c = ml_collections.ConfigDict()
  c.variant = a.variant                # tiny | full
  c.world = world                      # chain (World A) | smollm2 (World B)
  default_n = {'chain': (40, 1000), 'smollm2': (1, 150)}[world]
  c.n_items = a.n_items or default_n[int(not tiny)]  # items per domain
  c.seed = 0 if a.seed is None else a.seed  # item generation / selection seed
  c.taus = TAUS                        # interventions run (identity: the φ = 0 invariant check)
  c.positions = (1,) if tiny and world == 'smollm2' else ()  # step indices k; () = every step
  c.tau_sim = 0.8                      # τ_sim: S above it counts as "the answer did not move"
  c.lam = 0.5                          # λ: interventions with Strength ≤ λ are never violations
  c.chunk_size = 200 if world == 'chain' else (3 if tiny else 10)  # items per saved chunk
  c.bootstrap_seed = 42                # percentile bootstrap seed (SPEC §8)
  c.plots = True                       # write rho_by_length.png/pdf

  c.chain = x = ml_collections.ConfigDict()  # World A
  x.hops = (2, 3, 4)                   # chain lengths h (trace length h − 1)
  x.n_lines = 16                       # line slots per context
  x.n_same_id = 2                      # "same ID, other KEY" hard-negative lines
  x.readers = ('following', 'ignoring', 'mixture')  # trace oracles audited
  x.mixture_share = 0.5                # mixture oracle: share of items whose answer follows the trace
  x.mixture_seed = 0                   # mixture oracle: seed of the per-item draw

  c.smollm2 = s = ml_collections.ConfigDict()  # World B
  s.domains = ('arithmetic', 'factual')  # item domains
  s.n_layers = 0                       # SmolLM2 layers used (0: all 30)
  s.n_shots = 2                        # solved demonstrations before each question
  s.max_new_tokens = 64 if tiny else 96  # greedy budget of a trace + answer
  s.batch_size = 4 if tiny else 16     # prompts per compiled decoder call
  s.split = 'test'                     # factual items: split of the shipped NQ data
  s.max_passage_words = 80             # factual items: gold passages of at most this many words
  s.gguf_path = ''                     # GGUF file ('': $CEU_SMOLLM2_GGUF or the package's)
  return c
