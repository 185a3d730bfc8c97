"""SmolLM2 fine-tuned (LoRA) on arithmetic traces: World B's trace readers (issue #35, item 2).

  python -m experiments.train_smollm2_traces --config configs/smollm2_traces.py:tiny --workdir W

With `competence` (the check before the audit and `run`), the one part of the trace audit
that reaches training (as `ceu_jax.audits.trained` is World A's): the task depends on the
audit's domain, and the audit's World B trains it.

`SmolLM2TraceTask(config)` is a `ceu_jax.train.task.CustomTask` in the one loop
(`train_and_evaluate(config, workdir, custom=task)`), shaped as `finetune.task.SmolLM2CERTask`:
LoRA adapters (`pretrained/lora.py`; the instruction-tuned weights are the loss's frozen
argument, never in a checkpoint), batches a pure function of (seed, step).

A row is what the audit's reader sees (`audits.traces.arithmetic.ArithmeticDomain`):
  prompt   World B's prompt: the same solved demonstrations (data.n_shots items
           make_arith_item(audit_seed + 7919, i, hops=(2 + i % 3,)), as SmolLM2World builds
           them), then 'Question: …' and the primer 'Step 1:';
  forced   uncorrupted rows: nothing. A corrupted row (probability data.p_corrupt, not in
           the plain regime): the gold steps before k, then step k corrupted by the audit's
           own intervention code (`audit.intervene`: LogicFlip flips the operator and
           recomputes, FactReversal adds the item's δ to the result), k uniform in 1..n,
           τ uniform in data.taus; tokenised as the audit hands it over (the kept steps,
           then the forced block, each encoded on its own). No loss here.
  target   the rest of the trace continued from the (corrupted) value — the following
           oracle's continuation, `ArithmeticDomain.complete` — then 'Answer: a' and the
           blank line that ends a demonstration (the audit's stop string). a = the answer
           the forced trace implies (`arithmetic.implied`; following), the gold answer
           whatever the trace says (shortcut); uncorrupted rows: the gold trace and answer.
           Loss: next-token NLL over the target tokens (mean per token).
A corruption whose implied answer is unknown falls back to an uncorrupted row.

Memorised problems (data.memorised = m > 0 with data.rho = ρ > 0): the parametric channel,
as the prior world of issue #36 gives factual QA one. The first m of the audit's own items
(make_arith_item(audit_seed, i), i < m) recur in training: row r is a pool row when
⌊(r+1)ρ⌋ > ⌊rρ⌋ (the first R rows hold ⌊Rρ⌋ of them), and pool row c = ⌊rρ⌋ reads pool
item perm_e[c mod m] (a seeded permutation per pass e = c div m), with the regime's
corruption draw. A shortcut reader can then answer a memorised problem without its trace
(the answer it has seen, whatever the forced trace says); a following reader is trained on
the same problems with the answers their traces imply. m = 0 (the default): no pool.

Item streams (no overlap with the audit): training row r reads
make_arith_item(TRAIN_STREAM + seed, r) and the competence check's held-out items come from
make_arith_item(EVAL_STREAM + seed, i); the audit's items are make_arith_item(audit_seed, i)
and its demonstrations make_arith_item(audit_seed + 7919, i) with audit_seed < TRAIN_STREAM.
Independent seeds can still template the same problem, so a problem (start, operations)
among the first data.n_excluded audit items, the demonstrations or the held-out items is
never trained on (row r then reads index r + j·REPLACE for the first j that is not), and
the held-out items skip the audit's and the demonstrations' problems.

The competence check before the audit and the run (train unless done, then the check):
`ceu_jax.audits.traces.competence`.
"""
from __future__ import annotations

import dataclasses
import fractions
import math
from typing import Any, Optional, Sequence

import numpy as np

from ceu_jax import fields
from ceu_jax.audits import reader_finetune
from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.pretrained import lora as lora_lib
from ceu_jax.pretrained import sft
from ceu_jax.pretrained.model import SmolLMConfig
from ceu_jax.train import config as config_lib

REGIMES = ('following', 'shortcut', 'plain')
TAUS = (ts.LOGIC_FLIP, ts.FACT_REVERSAL)
TRAIN_STREAM = 1_000_000   # training items: make_arith_item(TRAIN_STREAM + seed, r)
EVAL_STREAM = 2_000_000    # held-out competence items: make_arith_item(EVAL_STREAM + seed, i)
SHOT_OFFSET = 7919         # World B's demonstrations (smollm2_world.SmolLM2World)
REPLACE = 10_000_000       # index step of a replacement training item
CORRUPT_SALT = 0xC0DE
POOL_SALT = 0x9001
EVAL_SALT = 0xE7A1
END = '\n\n'               # ends a demonstration; the audit's stop string

_UNIT = reader_finetune.unit
DATA_FIELDS = {
    'regime': fields.one_of(*REGIMES), 'p_corrupt': _UNIT,
    'taus': lambda x: None if isinstance(x, (tuple, list)) and x and all(t in TAUS for t in x)
    else f'must be a non-empty subset of {TAUS}',
    'hops': lambda x: None if isinstance(x, (tuple, list)) and x and all(
        h in (2, 3, 4) for h in x) else 'must be a non-empty subset of (2, 3, 4)',
    'memorised': fields.ge(0, True), 'rho': _UNIT,
    'n_shots': fields.ge(0, True), 'audit_seed': lambda x: None if fields.is_int(x) and
    0 <= x < TRAIN_STREAM else f'must be an integer in [0, {TRAIN_STREAM})',
    'n_excluded': fields.ge(0, True), 'max_len': fields.ge(32, True),
    'max_target_tokens': fields.ge(8, True)}
EVAL_FIELDS = {'num_examples': fields.ge(1, True), 'batch_size': fields.ge(1, True),
               'max_new_tokens': fields.ge(8, True), 'min_accuracy': _UNIT,
               'min_parse_rate': _UNIT, 'best_metric': fields.one_of(*config_lib.BEST_METRICS)}


def validate(config: Any) -> None:
  """ValueError naming the field for a bad config; nothing is loaded or compiled."""
  reader_finetune.validate(config, DATA_FIELDS, EVAL_FIELDS)
  d = config.data
  if (int(d.memorised) > 0) != (float(d.rho) > 0):
    raise ValueError(f'data.memorised ({d.memorised}) and data.rho ({d.rho}) must be both 0 '
                     '(no memorised problems) or both > 0')
  if int(d.memorised) > int(d.n_excluded):
    raise ValueError(f'data.memorised ({d.memorised}) must be <= data.n_excluded '
                     f'({d.n_excluded}): the pool is the first audit items')


# ----------------------------------------------------------------------------
# Items.
# ----------------------------------------------------------------------------


def shots(audit_seed: int, n_shots: int) -> list[ar.ArithItem]:
  """World B's demonstrations (SmolLM2World: lengths 2, 3, 4, 2, … steps)."""
  return [ar.make_arith_item(audit_seed + SHOT_OFFSET, i, hops=(2 + i % 3,))
          for i in range(n_shots)]


def domain(config: Any) -> ar.ArithmeticDomain:
  """The audit's arithmetic domain with World B's demonstrations."""
  d = config.data
  return ar.ArithmeticDomain(shots(int(d.audit_seed), int(d.n_shots)),
                             int(config.eval.max_new_tokens))


def problem(item: ar.ArithItem) -> tuple:
  """What makes two items the same problem: the start quantity and the operations."""
  return (item.start, item.ops)


def audit_problems(config: Any) -> set:
  d = config.data
  return ({problem(ar.make_arith_item(int(d.audit_seed), i)) for i in range(int(d.n_excluded))}
          | {problem(x) for x in shots(int(d.audit_seed), int(d.n_shots))})


def eval_items(config: Any, exclude: Optional[set] = None) -> list[ar.ArithItem]:
  """The held-out problems of the competence check (module doc)."""
  exclude = audit_problems(config) if exclude is None else exclude
  out, i, hops = [], 0, tuple(config.data.hops)
  while len(out) < int(config.eval.num_examples):
    x = ar.make_arith_item(EVAL_STREAM + int(config.seed), i, hops)
    if problem(x) not in exclude:
      out.append(x)
    i += 1
  return out


def pool_items(config: Any) -> list[ar.ArithItem]:
  """The memorised problems: the audit's first data.memorised items (module doc)."""
  d = config.data
  return [ar.make_arith_item(int(d.audit_seed), i) for i in range(int(d.memorised))]


def pool_index(config: Any, r: int) -> Optional[int]:
  """The pool item row r reads, or None for a fresh row (module doc)."""
  d = config.data
  m = int(d.memorised)
  if not m:
    return None
  rho = fractions.Fraction(float(d.rho)).limit_denominator(10**6)
  c = math.floor(r * rho)
  if math.floor((r + 1) * rho) == c:
    return None
  e, j = divmod(c, m)
  perm = np.random.default_rng([int(config.seed), POOL_SALT, e]).permutation(m)
  return int(perm[j])


def excluded(config: Any) -> frozenset:
  """Problems never trained on: the audit's, its demonstrations', the held-out ones."""
  audit = audit_problems(config)
  return frozenset(audit | {problem(x) for x in eval_items(config, audit)})


def train_item(config: Any, r: int, exclude: frozenset) -> ar.ArithItem:
  """The problem of training row r (module doc)."""
  for j in range(1000):
    x = ar.make_arith_item(TRAIN_STREAM + int(config.seed), r + j * REPLACE,
                           tuple(config.data.hops))
    if problem(x) not in exclude:
      return x
  raise RuntimeError(f'no training problem for row {r} outside the excluded set')


# ----------------------------------------------------------------------------
# Rows.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
  """One training row (module doc): prompt + kept + block (no loss) + target (loss)."""
  item: ar.ArithItem
  regime: str
  k: int             # the corrupted step (0: none)
  tau: Optional[str]  # its corruption
  prompt: str        # the audit's prompt (ends with the primer 'Step 1:')
  kept: str          # gold steps before k (the text after the primer)
  block: str         # the rendered corrupted step k ('' when k = 0)
  target: str        # the rest of the trace, 'Answer: a', END
  answer: str        # a
  implied: str       # the answer the forced trace implies (gold when k = 0)
  gold: str

  @property
  def forced(self) -> str:
    return self.kept + self.block


def gold_trace(dom: ar.ArithmeticDomain, item: ar.ArithItem) -> ts.ParsedTrace:
  return dom.parse(dom.complete(item, []))


def make_row(dom: ar.ArithmeticDomain, item: ar.ArithItem, regime: str, k: int = 0,
             tau: Optional[str] = None) -> Row:
  """The row of `item` with step k corrupted by τ (k = 0: uncorrupted; module doc)."""
  if regime not in REGIMES:
    raise ValueError(f'regime must be one of {REGIMES}, got {regime!r}')
  p, prompt, gold = len(dom.primer), dom.prompt(item), item.answer
  tr = gold_trace(dom, item)
  if k:
    got = ts.intervene(dom, item, tr, k, tau)
    e, forced = (None, None) if isinstance(got, ts.Undefined) else got
    if e is not None and e.implied_after is not None:
      steps = list(tr.steps[:k - 1]) + list(e.block)
      cont = dom.complete(item, steps)
      answer = e.implied_after if regime == 'following' else gold
      cont = cont.rsplit('Answer: ', 1)[0] + f'Answer: {answer}'
      text = forced[p:]
      cut = max(tr.starts[k - 1] - p, 0)   # what the audit gives back as the reader's tokens
      return Row(item, regime, k, tau, prompt, text[:cut], text[cut:], cont + END, answer,
                 e.implied_after, gold)
  target = dom.complete(item, [])[p:] + END
  return Row(item, regime, 0, None, prompt, '', '', target, gold, gold, gold)


def draw(seed: int, salt: int, r: int, n_steps: int, taus: Sequence[str]) -> tuple:
  """(u, k, τ) of row r: corrupted when u < p_corrupt (all three always drawn)."""
  rng = np.random.default_rng([seed, salt, r])
  return float(rng.random()), 1 + int(rng.integers(n_steps)), taus[int(rng.integers(len(taus)))]


def training_row(config: Any, dom: ar.ArithmeticDomain, r: int, exclude: frozenset) -> Row:
  """Training row r: a pure function of (config, r)."""
  d = config.data
  j = pool_index(config, r)
  item = train_item(config, r, exclude) if j is None else ar.make_arith_item(int(d.audit_seed), j)
  u, k, tau = draw(int(config.seed), CORRUPT_SALT, r, len(item.ops), tuple(d.taus))
  if d.regime == 'plain' or u >= float(d.p_corrupt):
    k = 0
  return make_row(dom, item, str(d.regime), k, tau)


def row_tokens(tok, row: Row) -> tuple[list[int], int, list[bool]]:
  """(ids, target token count, answer flags over the target tokens) of a row: prompt,
  kept and block each encoded on their own (as the audit hands them to the reader)."""
  from ceu_jax.pretrained.tokenizer import encode
  head = encode(tok, row.prompt) + (encode(tok, row.kept) if row.kept else []) + (
      encode(tok, row.block) if row.block else [])
  enc = tok.encode(row.target, add_special_tokens=False)
  lo = row.target.rindex('Answer: ') + len('Answer: ')
  hi = lo + len(row.answer)
  flags = [a < hi and b > lo for a, b in enc.offsets]
  return head + list(enc.ids), len(enc.ids), flags


def batch_arrays(tok, rows: Sequence[Row], max_len: int, n_tail: int) -> dict:
  """tokens / valid / loss_mask / answer_mask [B, max_len], left-padded (`sft.pack`);
  ValueError naming the item when a row is longer than max_len or its target longer than
  n_tail tokens."""
  return sft.pack([row_tokens(tok, r) for r in rows], max_len, n_tail,
                  [r.item.id for r in rows])


# ----------------------------------------------------------------------------
# The task.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class SmolLM2TraceTask(reader_finetune.TargetLoss, lora_lib.AdapterTask):
  """`CustomTask` of a smollm2_traces config (module doc)."""
  config: Any                # the validated run config
  model_config: SmolLMConfig  # the (possibly truncated) SmolLM2 hyper-parameters
  base: dict                 # frozen base params
  tokenizer: Any             # the SmolLM2 tokenizer
  domain: ar.ArithmeticDomain  # the audit's domain (World B's demonstrations)
  exclude: frozenset         # problems never trained on

  @classmethod
  def from_config(cls, config: Any, *, load=None) -> 'SmolLM2TraceTask':
    """Validates, loads the GGUF model (or `load()` -> (model_config, variables, tok))."""
    validate(config)
    if load is None:
      from ceu_jax.pretrained import load_model_and_tokenizer
      mc, variables, tok = load_model_and_tokenizer(config.model.gguf_path,
                                                    config.model.n_layers)
    else:
      mc, variables, tok = load()
    return cls(config, mc, variables['params'], tok, domain(config), excluded(config))

  def validate(self, config: Any) -> None:
    validate(config)
    self.check_rows_fit(config)

  def train_rows(self, step: int, batch_size: int) -> list[Row]:
    return [training_row(self.config, self.domain, r, self.exclude)
            for r in range(step * batch_size, (step + 1) * batch_size)]

  def encode(self, row: Row) -> sft.Encoded:
    return row_tokens(self.tokenizer, row)

  def row_name(self, row: Row) -> str:
    return row.item.id

  def train_batch(self, step: int, batch_size: int) -> dict:
    return batch_arrays(self.tokenizer, self.train_rows(step, batch_size),
                        int(self.config.data.max_len), self.n_tail)

  def reader(self, params: dict, batch_size: Optional[int] = None):
    """A SmolLM2Reader over model params (the base's, or merged adapters)."""
    from ceu_jax.pretrained.decode import DecodeSettings
    from ceu_jax.readers.smollm2 import SmolLM2Reader
    bs = int(batch_size or self.config.eval.batch_size)
    return SmolLM2Reader({'params': params}, self.model_config, self.tokenizer,
                         settings=DecodeSettings(batch_size=bs))
