"""Faithfulness to an intermediate structure (SPEC §8.3, seed 003, issue #18).

World A — checklist ATR (exact M and C): the three families trained in three
regimes (faithful / shortcut / plain), each with and without the tool (trained
here in W/train/<family>_<regime>[_tool] unless done), audited on test items:
  python -m experiments.mediator --config configs/mediator.py --workdir runs/mediator_atr
World B — SmolLM2-135M-Instruct grading text checklists (r = 4 "The passage
mentions ⟨entity⟩." statements per shipped passage), three prompt regimes, with
and without the tool:
  python -m experiments.mediator --config configs/mediator.py:full,world=smollm2 --workdir runs/mediator_smollm2
Oracle readers on World A items (exact known answers; no training):
  python -m experiments.mediator --config configs/mediator.py:full,world=oracle --workdir /tmp/med_oracle
Tiny (the CI test runs it): `:tiny` (attention only, faithful + shortcut, 30
training steps, 64 items), `:tiny,world=oracle`, `:tiny,world=smollm2` (2 of
SmolLM2's 30 layers: plumbing only, 4 checklists).
World B with checklist readers fine-tuned here (issue #35: SmolLM2 + LoRA in the faithful /
shortcut / plain regime, with and without the tool, each checked for competence first):
  python -m experiments.mediator --config configs/mediator.py:full,world=smollm2,finetuned=faithful+shortcut --workdir runs/mediator_smollm2_ft
Arguments after the variant: world (atr | oracle | smollm2), n_items, steps (training
steps of every World A reader, or of World B's fine-tunes), families (a '+'-joined list, e.g.
attention+ssm), regimes (e.g. faithful+shortcut), tools (both | off | on), finetuned (World B:
a '+'-joined subset of faithful, shortcut, plain; tiny then keeps one prompt regime).
"""
from __future__ import annotations

import ml_collections

from configs import common, smoke, smollm2_checklist

VARIANTS = ('tiny', 'full')
WORLDS = ('atr', 'oracle', 'smollm2')
FAMILIES = ('attention', 'ssm', 'memory_port')
REGIMES = ('faithful', 'shortcut', 'plain')


def data_section(regime: str = 'plain', tool: bool = False) -> ml_collections.ConfigDict:
  """The checklist world (ceu_jax.data.checklist.ChecklistConfig documents every field)."""
  d = ml_collections.ConfigDict()
  d.task = 'checklist'                 # ceu_jax.data.tasks name
  d.r = 3                              # claims per query (mediator items)
  d.claims = 'verdict'                 # verdict (context binds YES / NO) | value (claim states a VALUE)
  d.num_passages = 4                   # passages in the retrieved bundle
  d.lines_per_passage = 3              # line slots per passage (12 lines, 88 context tokens)
  d.p_hard = 0.5                       # a false claim's VALUE bound to its KEY under another ID
  d.regime = regime                    # training answers: faithful | shortcut | plain
  d.p_corrupt = 0.3                    # P(one claim of the teacher-forced M flipped), faithful / shortcut
  d.tool = tool                        # answer = M TOOL arg instead of M Y
  d.n_ids = d.n_keys = d.n_values = 16  # a small world: learns in minutes on CPU
  d.n_filler = 32                      # filler-word vocabulary
  return d


def train_config(family: str, regime: str, tool: bool, tiny: bool, steps=None):
  """Training config of one reader: the smoke grid's baseline cell on the checklist world."""
  return smoke.audit_reader_config(data_section(regime, tool), family, tiny,
                                    steps or (30 if tiny else 1500))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='full', world=common.Opt(str, choices=WORLDS),
                       n_items=common.Opt(int, 1), steps=common.Opt(int, 1),
                       families=common.Opt(str), regimes=common.Opt(str),
                       tools=common.Opt(str, choices=('both', 'off', 'on')),
                       finetuned=common.Opt(str))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  c = ml_collections.ConfigDict()
  c.variant = a.variant                # tiny | full
  c.world = a.world or 'atr'           # atr (trained World A readers) | oracle (oracle readers)
  c.n_items = a.n_items or {'smollm2': (4, 150)}.get(c.world, (64, 1000))[int(not tiny)]  # items per setting
  c.seed = 0                           # test-item seed
  c.items_per_chunk = 32 if c.world == 'smollm2' else 500  # items per resumable chunk (a unit
                                       # of the job: a progress line each; SmolLM2 generates
                                       # 32 checklists in 1.3-1.9 min on 2 cores)
  c.bootstrap_seed = 42                # percentile bootstrap seed (SPEC §8)
  c.min_cell = 10                      # COR / CNF cells with fewer items are dropped
  c.plots = True                       # write cor_cnf.png/pdf and fid_fstrong.png/pdf
  c.tools = {'off': (False,), 'on': (True,)}.get(a.tools, (False, True))  # without / with the tool

  c.atr = x = ml_collections.ConfigDict()  # World A
  fams = tuple(a.families.split('+')) if a.families else (
      ('attention',) if tiny else FAMILIES)
  regs = tuple(a.regimes.split('+')) if a.regimes else (
      ('faithful', 'shortcut') if tiny else REGIMES)
  for name, vals, allowed in (('families', fams, FAMILIES), ('regimes', regs, REGIMES)):
    bad = [v for v in vals if v not in allowed]
    if bad:
      raise ValueError(f'{name} must be a +-joined subset of {allowed}, got {bad[0]!r}')
  x.families = fams                    # reader architectures
  x.regimes = regs                     # training regimes
  x.batch_size = 256                   # reader rows per forward
  x.probe_items = 64 if tiny else 500  # §8.4 decision-position probe items per reader (0: off)
  x.data = data_section()              # the world (training: regime / tool set per reader)
  x.train = train_config('attention', 'plain', False, tiny, a.steps)  # the readers' training
                                       # recipe (steps: train.train.num_steps); per reader the
                                       # job sets model.family and data (= x.data with the
                                       # reader's regime and tool)

  c.smollm2 = b = ml_collections.ConfigDict()  # World B
  b.regimes = ('standard', 'detailed', 'max_detailed')  # prompt regimes (003)
  b.r = 2 if tiny else 4               # statements per checklist (tiny: 2, plumbing only;
                                       # a reader's generation budget grows with r)
  b.max_passage_words = 90             # passages of at most this many words
  b.n_shots = 1                        # solved demonstrations (another passage) before the item
  b.chat = True                        # ChatML prompts (the model's own template)
  b.n_layers = 2 if tiny else 0        # SmolLM2 layers used (0: all 30; tiny: plumbing only)
  b.batch_size = 4 if tiny else 16     # prompts per compiled decoder call
  b.gguf_path = ''                     # GGUF file ('': $CEU_SMOLLM2_GGUF or the package's)
  if a.finetuned is not None:          # (absent otherwise: the plain World B config is unchanged)
    fin = tuple(a.finetuned.split('+'))
    bad = [v for v in fin if v not in REGIMES]
    if bad or len(set(fin)) != len(fin) or c.world != 'smollm2':
      raise ValueError(f'config argument finetuned={a.finetuned!r} is not allowed: finetuned '
                       f'must be a +-joined subset of {REGIMES} (world=smollm2)')
    b.finetuned = fin                  # checklist readers smollm2_lora/<regime>, fine-tuned here
                                       # in W/train/<regime>[_tool] unless done (configs/
                                       # smollm2_checklist.py), each with its competence check
    b.probe_names = 'verbatim'         # the probe's D− output: verbatim (D+'s) | follow_input
                                       # (a restated line names D−'s entity; smollm2_probe doc)
    b.probe_items = 2 if tiny else 64  # §8.4 decision-position probe: checklists per setting,
                                       # every layer (mediator.smollm2_probe; 0: off)
    if tiny:
      b.regimes = ('detailed',)        # tiny: one prompt regime beside the fine-tunes
    b.train = smollm2_checklist.get_config('tiny' if tiny else 'cpu')
                                       # the fine-tunes' recipe; per reader the world sets
                                       # data.regime, data.tool and ties data.audit_seed,
                                       # audit_n_items, r, max_passage_words, chat, model.*,
                                       # eval.batch_size to the audit's
    b.tool_init = 'fresh'              # a tool reader's adapters start fresh | from no_tool: the
                                       # trained no-tool reader of its regime (W/train/<regime>,
                                       # trained first unless done), then tool_init_steps steps
                                       # on the tool rows (docs/mediator.md: why)
    b.tool_init_steps = 2 if tiny else 40  # the warm-started tool readers' steps (no_tool)
    if a.steps:
      b.train.train.num_steps = a.steps
      b.train.train.warmup_steps = min(b.train.train.warmup_steps, a.steps)

  c.oracle = o = ml_collections.ConfigDict()  # oracle world
  o.p_error = 0.2                      # share of items whose M̂ has one claim flipped
  o.p_swap = 0.1                       # share whose M̂ exchanges a YES and a NO (same C)
  o.constant = (1, 0, 1)               # the constant reader's M
  o.constant_y = 2                     # the constant reader's decision
  return c
