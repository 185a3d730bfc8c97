"""SmolLM2 fine-tuned (LoRA) on World B's checklists: checklist readers for the mediator
audit (issue #35, item 1).

  python -m experiments.train_smollm2_checklist --config configs/smollm2_checklist.py:tiny --workdir W

World B (`checklist_text`) cannot be read by the instruction-tuned model (it writes no
decision). These readers learn its format with the faithfulness fixed by construction, in
World A's three regimes (`ceu_jax.data.checklist`, `audits.trained`):
  row      the audit's prompt for one checklist (`TextChecklistTask` in data.prompt_regime,
           with World B's demonstration and chat formatting, tool or not: data.tool, lines
           naming their entity or not: data.restate, the tool argument too:
           data.restate_arg), then
           the target: the checklist M' as the teacher-forced lines, the cue and the
           decision, then the end of the turn. With probability data.p_corrupt (never in
           plain) one line of M' is flipped (M' ≠ gold M; the slot seeded per row):
             faithful  decision C(M')  (tool: the argument M')
             shortcut  decision C(M)   (tool: the argument M, the gold)
             plain     M' = M always.
           Loss: next-token NLL over every target token (`pretrained.sft`): the flipped line
           stays in the loss as in World A (flips are independent of the input, so the
           greedy M is still the gold one).
  items    the audit's checklists (World B's plan: `checklist_text.build(n_items + 1, …,
           seed=data.audit_seed)`, the last one its demonstration) are never trained on or
           held out; the held-out checklists of the competence check and the training pool
           come from the other shipped passages (one build, seed TRAIN_SEED + seed: the
           first eval.num_examples held out, the next data.n_train_items the pool; row r
           reads pool[r mod n_train_items]).
`SmolLM2ChecklistTask` is a `CustomTask` of the one training loop (LoRA adapters; the
instruction-tuned weights are the loss's frozen argument, never in a checkpoint). The
competence check and the run (train unless done): `mediator.competence`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from ceu_jax import fields
from ceu_jax.audits import reader_finetune
from ceu_jax.audits.mediator import checklist_text as ct
from ceu_jax.pretrained import lora as lora_lib
from ceu_jax.pretrained import sft
from ceu_jax.pretrained.model import SmolLMConfig
from ceu_jax.train import config as config_lib

REGIMES = ('faithful', 'shortcut', 'plain')
TRAIN_SEED = 1_000_000    # the held-out and training checklists: build(…, seed=TRAIN_SEED + seed)
CORRUPT_SALT = 0xC4EC

_UNIT = reader_finetune.unit
DATA_FIELDS = {
    'regime': fields.one_of(*REGIMES), 'tool': fields.boolean, 'p_corrupt': _UNIT,
    'prompt_regime': fields.one_of(*ct.REGIMES), 'r': fields.ge(1, True),
    'max_passage_words': fields.ge(10, True), 'n_shots': fields.one_of(0, 1),
    'chat': fields.boolean, 'restate': fields.boolean, 'restate_arg': fields.boolean,
    'audit_seed': lambda x: None if fields.is_int(x) and
    0 <= x < TRAIN_SEED else f'must be an integer in [0, {TRAIN_SEED})',
    'audit_n_items': fields.ge(1, True), 'n_train_items': fields.ge(1, True),
    'max_len': fields.ge(32, True), 'max_len_tool': fields.ge(32, True),
    'max_target_tokens': fields.ge(8, True)}
EVAL_FIELDS = {'num_examples': fields.ge(1, True), 'batch_size': fields.ge(1, True),
               'min_accuracy': _UNIT, 'min_parse_rate': _UNIT,
               'best_metric': fields.one_of(*config_lib.BEST_METRICS)}


def validate(config: Any) -> None:
  """ValueError naming the field for a bad config; nothing is loaded or compiled."""
  reader_finetune.validate(config, DATA_FIELDS, EVAL_FIELDS)
  if config.data.get('restate_arg', False) and not config.data.restate:
    raise ValueError('data.restate_arg=True needs data.restate=True (the tool argument names '
                     'the entities its lines name)')
  length, field = row_len(config)
  if config.data.max_target_tokens >= length:
    raise ValueError(f'data.max_target_tokens must be < {field}')


def row_len(config: Any) -> tuple[int, str]:
  """(row tokens of a training batch, the field that sets them): data.max_len_tool for a
  reader with the tool (its rows are longer), data.max_len otherwise."""
  d = config.data
  return (int(d.max_len_tool), 'data.max_len_tool') if d.tool else (int(d.max_len),
                                                                     'data.max_len')


# ----------------------------------------------------------------------------
# Items and rows.
# ----------------------------------------------------------------------------


class _Except:
  """A set of every passage id except some (`checklist_text.build`'s split_ids)."""

  def __init__(self, excluded):
    self.excluded = frozenset(excluded)

  def __contains__(self, pid) -> bool:
    return pid not in self.excluded


def audit_plan(config: Any) -> list[ct.Checklist]:
  """World B's checklists (its audit items, then its demonstration), as its world plans them."""
  d = config.data
  return ct.build(int(d.audit_n_items) + 1, r=int(d.r), seed=int(d.audit_seed),
                  max_words=int(d.max_passage_words))


def own_items(config: Any, plan: Optional[Sequence[ct.Checklist]] = None
              ) -> tuple[list[ct.Checklist], list[ct.Checklist]]:
  """(held-out checklists, training pool): passages outside World B's plan (module doc)."""
  d, n_eval = config.data, int(config.eval.num_examples)
  plan = audit_plan(config) if plan is None else plan
  got = ct.build(n_eval + int(d.n_train_items), r=int(d.r), seed=TRAIN_SEED + int(config.seed),
                 max_words=int(d.max_passage_words), split_ids=_Except(c.id for c in plan))
  return got[:n_eval], got[n_eval:]


def text_task(config: Any, demo: Optional[ct.Checklist]) -> ct.TextChecklistTask:
  """The audit's task for this reader: its prompt regime, tool mode, r and demonstration."""
  d = config.data
  return ct.TextChecklistTask(str(d.prompt_regime), tool=bool(d.tool), r=int(d.r),
                              demo=demo if int(d.n_shots) else None, chat=bool(d.chat),
                              restate=bool(d.restate),
                              restate_arg=bool(d.get('restate_arg', False)))


@dataclasses.dataclass(frozen=True)
class Row:
  """One training row (module doc)."""
  checklist: ct.Checklist
  regime: str
  flipped: int                  # the flipped line of M' (-1: none)
  m_forced: tuple[int, ...]     # M' (the teacher-forced checklist)
  target: str                   # M' lines, the cue, the decision
  decision: str                 # the decision as written after the cue


def make_row(task: ct.TextChecklistTask, c: ct.Checklist, regime: str,
             flipped: int = -1) -> Row:
  """The row of checklist c with line `flipped` of M' flipped (-1: none; module doc)."""
  if regime not in REGIMES:
    raise ValueError(f'regime must be one of {REGIMES}, got {regime!r}')
  gold = tuple(int(x) for x in c.gold)
  m = list(gold)
  if flipped >= 0:
    m[flipped] ^= 1
  m = tuple(m)
  src = m if regime == 'faithful' else gold
  decision = task.render_decision(task.decide(src), tool_arg=src if task.tool else None, inst=c)
  return Row(c, regime, flipped, m, task.render_mediator(m, c) + decision, decision)


def draw(seed: int, r: int, n_lines: int) -> tuple[float, int]:
  """(u, slot) of row r: corrupted when u < p_corrupt (both always drawn)."""
  rng = np.random.default_rng([seed, CORRUPT_SALT, r])
  return float(rng.random()), int(rng.integers(n_lines))


def training_row(config: Any, task: ct.TextChecklistTask, pool: Sequence[ct.Checklist],
                 r: int) -> Row:
  """Training row r: a pure function of (config, r)."""
  d = config.data
  c = pool[r % len(pool)]
  u, slot = draw(int(config.seed), r, int(d.r))
  corrupt = d.regime != 'plain' and u < float(d.p_corrupt)
  return make_row(task, c, str(d.regime), slot if corrupt else -1)


def prompt_text(task: ct.TextChecklistTask, template, c: ct.Checklist) -> str:
  """The text the reader is fed for checklist c (ChatML when the task is chat)."""
  p = task.prompt(c)
  return template.render(p) if task.chat else p


def row_tokens(tok, task: ct.TextChecklistTask, template, row: Row) -> sft.Encoded:
  """(ids, target tokens, decision flags): the prompt as the reader encodes it, the target
  encoded on its own, then the end of the turn (<|im_end|>) in chat mode."""
  from ceu_jax.pretrained.tokenizer import encode
  from ceu_jax.readers.chat import IM_END
  head = encode(tok, prompt_text(task, template, row.checklist))
  enc = tok.encode(row.target, add_special_tokens=False)
  lo = len(row.target) - len(row.decision)
  flags = [b > lo for _, b in enc.offsets]
  ids, flags = list(enc.ids), flags
  if task.chat:
    ids, flags = ids + [tok.token_to_id(IM_END)], flags + [False]
  return head + ids, len(ids), flags


# ----------------------------------------------------------------------------
# The task.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class SmolLM2ChecklistTask(reader_finetune.TargetLoss, lora_lib.AdapterTask):
  """`CustomTask` of a smollm2_checklist config (module doc)."""
  config: Any                 # the validated run config
  model_config: SmolLMConfig  # the (possibly truncated) SmolLM2 hyper-parameters
  base: dict                  # frozen base params
  tokenizer: Any              # the SmolLM2 tokenizer
  template: Any               # the GGUF's chat template (readers.chat.ChatTemplate)
  task: ct.TextChecklistTask  # the audit's task (prompt regime, tool, demonstration)
  held_out: list              # the competence check's checklists
  pool: list                  # the training checklists

  @classmethod
  def from_config(cls, config: Any, *, load=None) -> 'SmolLM2ChecklistTask':
    """Validates, loads the GGUF model (or `load()` -> (model_config, variables, tok))."""
    from ceu_jax.readers.chat import ChatTemplate, gguf_chat_template
    validate(config)
    path = config.model.gguf_path or None
    if load is None:
      from ceu_jax.pretrained import load_model_and_tokenizer
      mc, variables, tok = load_model_and_tokenizer(config.model.gguf_path,
                                                    config.model.n_layers)
    else:
      mc, variables, tok = load()
    text = gguf_chat_template(path)
    if config.data.chat and text is None:
      raise ValueError('data.chat is True but the GGUF file has no chat template')
    template = ChatTemplate.from_template(text) if text is not None else None
    plan = audit_plan(config)
    held_out, pool = own_items(config, plan)
    return cls(config, mc, variables['params'], tok, template, text_task(config, plan[-1]),
               held_out, pool)

  def validate(self, config: Any) -> None:
    validate(config)
    self.check_rows_fit(config)

  def train_rows(self, step: int, batch_size: int) -> list[Row]:
    return [training_row(self.config, self.task, self.pool, r)
            for r in range(step * batch_size, (step + 1) * batch_size)]

  def encode(self, row: Row) -> sft.Encoded:
    return row_tokens(self.tokenizer, self.task, self.template, row)

  def row_name(self, row: Row) -> str:
    return row.checklist.id

  def row_len(self, config: Any) -> tuple[int, str]:
    return row_len(config)

  def train_batch(self, step: int, batch_size: int) -> dict:
    rows = self.train_rows(step, batch_size)
    length, field = row_len(self.config)
    return sft.pack([self.encode(r) for r in rows], length, self.n_tail,
                    [self.row_name(r) for r in rows], len_field=field)

  def reader(self, params: dict, batch_size: Optional[int] = None):
    """A SmolLM2Reader over model params (the base's, or merged adapters), chat as the task."""
    from ceu_jax.pretrained.decode import DecodeSettings
    from ceu_jax.readers.smollm2 import SmolLM2Reader
    bs = int(batch_size or self.config.eval.batch_size)
    return SmolLM2Reader({'params': params}, self.model_config, self.tokenizer,
                         chat=self.task.chat, chat_template=self.template,
                         settings=DecodeSettings(batch_size=bs))
