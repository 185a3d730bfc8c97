"""Causal sensitivity of reasoning traces (SPEC §8.2, issue #17).

World A — chained ATR with exact ground truth, read by the trace oracles
(following / ignoring / seeded mixture) and by the three families trained to
write the trace then the answer in three regimes — plain; prior (half of the
(query ID, last KEY) pairs have a memorisable value); bypass (the retrieved
tokens also enter the reader by early fusion) — each trained here in
W/train/<family>_<regime> unless done, with the §8.4 answer-position probe:
  python -m experiments.trace_sensitivity --config configs/trace_sensitivity.py --workdir runs/traces_chain
World B — SmolLM2-135M-Instruct with few-shot "Step i:" traces on templated
arithmetic and on factual questions with their gold passage (shipped NQ data):
  python -m experiments.trace_sensitivity --config configs/trace_sensitivity.py:full,world=smollm2 --workdir runs/traces_smollm2
World B with trace readers fine-tuned here (issue #35; LoRA on arithmetic traces in the
following / shortcut / plain regime, configs/smollm2_traces.py, trained in W/train/<regime>
unless done, each with its competence check before the audit, and the §8.4 answer-position
probe of every reader at every layer — smollm2.probe_items arithmetic items, the trace held
fixed, the question's start moved; docs/smollm2_trace_readers.md):
  python -m experiments.trace_sensitivity --config configs/trace_sensitivity.py:full,world=smollm2,readers=smollm2+smollm2_following+smollm2_shortcut --workdir runs/traces_smollm2_ft
Tiny (the CI tests run these): `:tiny` (World A oracles, 40 items),
`:tiny,readers=trained` (attention / plain trained 30 steps) and
`:tiny,world=smollm2` (the whole model, 1 item per domain, interventions at k = 1
only, 64-token budget; about 1 min on a loaded 2-core machine);
`:tiny,world=smollm2,readers=smollm2+smollm2_following+smollm2_shortcut` (every World B
reader on the first 2 layers, fine-tunes of 3 steps, arithmetic only when no domain is
fine-tuned for: the CI test of the fine-tuned readers).
Arguments after the variant: world (chain | smollm2), n_items (per domain), seed;
World A: readers (oracles | trained | both; full default both, tiny oracles),
families and regimes ('+'-joined, e.g. attention+ssm, plain+prior), steps.
World B: readers ('+'-joined subset of smollm2, smollm2_following, smollm2_shortcut,
smollm2_plain; default smollm2), steps (the fine-tunes' train.num_steps), p_corrupt (their
share of rows with a corrupted step, configs/smollm2_traces.py), memorised / rho
(the first M audit items recur in a share R of the fine-tunes' rows: a memorised stratum on
which a shortcut reader can answer from memory; rows, tables and claims split by stratum).
"""
from __future__ import annotations

import ml_collections

from configs import common, smoke, smollm2_traces

VARIANTS = ('tiny', 'full')
WORLDS = ('chain', 'smollm2')
TAUS = ('identity', 'logic_flip', 'fact_reversal', 'premise_negation', 'causal_inversion')
ORACLES = ('following', 'ignoring', 'mixture')
WORLD_A_READERS = ('oracles', 'trained', 'both')
SMOLLM2_READERS = ('smollm2', 'smollm2_following', 'smollm2_shortcut', 'smollm2_plain')
FAMILIES = ('attention', 'ssm', 'memory_port')
REGIMES = ('plain', 'prior', 'bypass')
PRIOR_SHARE = 0.5  # share of (query ID, last KEY) pairs with a fixed value (prior regime, audit items)


def data_section(prior_share: float = PRIOR_SHARE) -> ml_collections.ConfigDict:
  """The chain world (ceu_jax.data.chain.ChainConfig documents every field)."""
  d = ml_collections.ConfigDict()
  d.task = 'atr_chain'                 # ceu_jax.data.tasks name
  d.hops = (2, 3, 4)                   # chain lengths h (trace length h − 1)
  d.n_lines = 16                       # line slots per context (112 tokens)
  d.n_same_id = 2                      # "same ID, other KEY" hard-negative lines
  d.num_passages = 4                   # passages of 4 lines (the memory port's layout)
  d.n_ids = 40                         # a small world: learns in minutes on CPU
  d.n_keys = 8                         # (>= 4 hops + 2 off-chain keys + 1)
  d.n_values = 16
  d.n_filler = 8                       # unused by chains (layout of the vocabulary only)
  d.prior_share = prior_share          # memorisable prior: share of (x_0, k_h) pairs with a fixed value
  d.world_seed = 0                     # the prior table's seed (train and test share it)
  d.answer_slots = 0                   # 0: 2 × (max hop + 1) answer slots
  return d


def train_config(family: str, regime: str, tiny: bool, steps=None) -> ml_collections.ConfigDict:
  """Training config of one chain reader (the smoke grid's baseline cell on the chain world)."""
  data = data_section(PRIOR_SHARE if regime == 'prior' else 0.0)
  return smoke.audit_reader_config(data, family, tiny, steps or (30 if tiny else 1500),
                                    bypass=regime == 'bypass')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='full', world=common.Opt(str, choices=WORLDS),
                       n_items=common.Opt(int, 1), seed=common.Opt(int, 0),
                       readers=common.Opt(str),
                       families=common.Opt(str), regimes=common.Opt(str),
                       steps=common.Opt(int, 1), memorised=common.Opt(int, 0),
                       rho=common.Opt(float, 0.0, 1.0), p_corrupt=common.Opt(float, 0.0, 1.0))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  world = a.world or 'chain'
  if a.readers is not None:
    allowed, given = ((WORLD_A_READERS, (a.readers,)) if world == 'chain'
                      else (SMOLLM2_READERS, tuple(a.readers.split('+'))))
    if any(r not in allowed for r in given) or len(set(given)) != len(given):
      raise ValueError(f'config argument readers={a.readers!r} is not allowed: readers must be '
                       + ('one of ' if world == 'chain' else "a '+'-joined subset of ")
                       + ', '.join(allowed) + f' (world={world})')
  c = ml_collections.ConfigDict()
  c.variant = a.variant                # tiny | full
  c.world = world                      # chain (World A) | smollm2 (World B)
  default_n = {'chain': (40, 1000), 'smollm2': (1, 150)}[world]
  c.n_items = a.n_items or default_n[int(not tiny)]  # items per domain
  c.seed = 0 if a.seed is None else a.seed  # item generation / selection seed
  c.taus = TAUS                        # interventions run (identity: the φ = 0 invariant check)
  # step indices k; () = every step; k > n of an item: undefined for it ('beyond_trace')
  c.positions = (1,) if tiny and world == 'smollm2' else ()
  c.tau_sim = 0.8                      # τ_sim: S ≥ it (exact) counts as "the answer did not move"
  c.lam = 0.5                          # λ: interventions with Strength ≤ λ are never violations
  c.items_per_chunk = 200 if world == 'chain' else (3 if tiny else 10)  # items per saved chunk
  c.bootstrap_seed = 42                # percentile bootstrap seed (SPEC §8)
  c.plots = True                       # write rho_by_length.png/pdf

  c.chain = x = ml_collections.ConfigDict()  # World A
  which = (a.readers if world == 'chain' else None) or ('oracles' if tiny else 'both')
  fams = tuple(a.families.split('+')) if a.families else (('attention',) if tiny else FAMILIES)
  regs = tuple(a.regimes.split('+')) if a.regimes else (('plain',) if tiny else REGIMES)
  for name, vals, allowed in (('families', fams, FAMILIES), ('regimes', regs, REGIMES)):
    bad = [v for v in vals if v not in allowed]
    if bad:
      raise ValueError(f'{name} must be a +-joined subset of {allowed}, got {bad[0]!r}')
  x.readers = ORACLES if which != 'trained' else ()  # trace oracles audited
  x.families = fams if which != 'oracles' else ()  # trained readers: these families ×
  x.regimes = regs if which != 'oracles' else ()   # these regimes (plain | prior | bypass)
  x.batch_size = 256                   # reader rows per forward (trained readers)
  x.probe_items = 64 if tiny else 500  # §8.4 answer-position probe items per trained reader (0: off)
  x.mixture_share = 0.5                # mixture oracle: share of items whose answer follows the trace
  x.mixture_seed = 0                   # mixture oracle: seed of the per-item draw
  x.data = data_section()              # the audited world (prior_share: the 'chain_prior' items)
  x.train = train_config('attention', 'plain', tiny,
                         (a.steps if world == 'chain' else None) or (30 if tiny else 8000))
                                       # the readers' training recipe (steps: train.train.
                                       # num_steps). The chain is learned in a jump off a
                                       # loss plateau (≈ 9.5) whose step depends on the seed
                                       # and on float rounding: 1,800-5,500 for attention
                                       # (docs/trace_sensitivity.md), so 8,000, not 4,000;
                                       # per reader the job sets model.family, model.bypass
                                       # (bypass regime) and data (= x.data, prior only in 'prior')

  c.smollm2 = s = ml_collections.ConfigDict()  # World B
  s.domains = ('arithmetic', 'factual')  # item domains
  s.n_layers = 0                       # SmolLM2 layers used (0: all 30)
  s.n_shots = 2                        # solved demonstrations before each question
  s.max_new_tokens = 64 if tiny else 96  # greedy budget of a trace + answer
  s.batch_size = 4 if tiny else 16     # prompts per compiled decoder call
  s.split = 'test'                     # factual items: split of the shipped NQ data
  s.max_passage_words = 80             # factual items: gold passages of at most this many words
  s.gguf_path = ''                     # GGUF file ('': $CEU_SMOLLM2_GGUF or the package's)
  readers = tuple(a.readers.split('+')) if world == 'smollm2' and a.readers else ('smollm2',)
  if ((a.memorised is not None or a.rho is not None or a.p_corrupt is not None)
      and not set(readers) - {'smollm2'}):
    raise ValueError('memorised / rho / p_corrupt set the fine-tuned World B readers\' '
                     'training: they need '
                     'world=smollm2 and readers= with smollm2_following / _shortcut / _plain')
  if readers != ('smollm2',):  # (absent otherwise: the plain World B config is unchanged)
    s.readers = readers                # World B readers: smollm2 (plain) and smollm2_<regime>
                                       # (fine-tuned here in W/train/<regime> unless done)
    if tiny:
      s.n_layers = 2                   # tiny: every reader on the first 2 layers
      s.domains = ('arithmetic',)      # tiny: the domain the readers are fine-tuned on
      s.max_new_tokens = 24            # tiny: 2-layer readers write no answer; plumbing only
    s.probe_items = 2 if tiny else 64  # §8.4 answer-position probe: arithmetic items per
                                       # reader, every layer (smollm2_probe; 0: off)
    s.train = smollm2_traces.get_config('tiny' if tiny else 'cpu')
    if a.steps:
      s.train.train.num_steps = a.steps
      s.train.train.warmup_steps = min(s.train.train.warmup_steps, a.steps)
    if a.p_corrupt is not None:        # the share of training rows with a corrupted step
      s.train.data.p_corrupt = a.p_corrupt
    if a.memorised is not None or a.rho is not None:  # the first M audit items recur in training
      s.train.data.memorised = common.given_or(a.memorised, 0)
      s.train.data.rho = common.given_or(a.rho, 0.0)
                                       # the fine-tunes' recipe (configs/smollm2_traces.py);
                                       # per reader the world sets data.regime and ties
                                       # data.n_shots, data.audit_seed (= seed), model.n_layers,
                                       # model.gguf_path, eval.max_new_tokens, eval.batch_size
                                       # to the audit's
  return c
