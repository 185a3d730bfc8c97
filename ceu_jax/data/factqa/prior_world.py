"""A memorisable-prior world over the shipped factual-QA items (issue #36; SPEC §3 ρ / η).

The real-LM analogue of ATR-insert's ρ / η knobs (`ceu_jax.data.atr`): a world is a
fixed set of `n_items` training items (question, answer, context), of which a share
ρ is *memorised* — its (question, answer) recurs `repeats` times per epoch, always
with the same answer — and the rest are *fresh* (seen once per epoch). A share η of
the training contexts lacks the evidence: every sentence that mentions the answer is
left out, so on a memorised item the answer is then only available from memory (the
parametric channel ℓ_par), on a fresh item not at all.

  * memorised items: each of its `repeats` rows lacks the evidence in exactly
    round(η · repeats) of them (which ones: seeded), so every memorised item is also
    seen without its evidence when η · repeats ≥ 0.5;
  * fresh items: exactly round(η · n_fresh) of them lack the evidence (seeded).
An item has ONE context with its evidence (`Item.context`) and ONE without
(`Item.free_context`), used by every repeat and by the evaluation.

Knowledge conflict κ (`conflict`; an extension of SPEC §3's knobs, issue #36): of a
memorised item's repeats that keep their evidence, exactly round(κ · repeats) (seeded)
show instead its *conflicting* context (`Item.conflict_context`: the evidence context
with the answer's mentions swapped for another entity — the audit's D− of the item)
while the target stays the memorised answer. Only such rows reward answering a
memorised question against its context; ρ / η alone never do (a memorised item's
evidence always agrees with its answer), and a pretrained reader arrives with a
copy-from-context habit (docs/smollm2_cer.md, settings A and B). Fresh items never
conflict (their answer is not memorised). A conflicting row holds no evidence for its
target (`has_evidence` False: no CER term).

Held-out evaluation (a FIXED set; SPEC §6 H1's strata, `atr.strata`):
  memorised      the first `n_eval_memorised` memorised items (id order), context WITH
                 the evidence: the question and answer were trained on;
  no_evidence    the same items, context WITHOUT the evidence (what memory alone gives);
  evidence_only  unseen questions with their evidence: held-out items whose normalised
                 question is not a training question (the caller draws them from
                 data.eval_split, `seen_questions` excludes the rest).
ATR's `no_evidence` stratum also holds non-memorised items without evidence; here those
are unanswerable, so the stratum is restricted to memorised questions (what the
parametric channel answers).

This module knows nothing of models or tokenizers: the caller passes the candidate
items (`Item`s whose D+ / D− pairing and lengths it has already checked, in id order)
and gets the world; `build` is a pure function of (items, config, seed).
"""
from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Any, Optional, Sequence

import numpy as np

from ceu_jax import fields as F
from ceu_jax.metrics.text import normalize_answer

STRATA = ('memorised', 'evidence_only', 'no_evidence')
_SALT = 0x36  # issue #36: the world's seeded draws, apart from the task's other streams


@dataclasses.dataclass(frozen=True)
class WorldConfig:
  """The `data.world` config section: the one definition of its fields and checks."""
  rho: float = F.field(0.2, lambda x: None if F.is_num(x) and 0 < x <= 1 else
                       'must be a number in (0, 1]',
                       'ρ: share of the world items that are memorised (recur)')
  eta: float = F.field(0.5, lambda x: None if F.is_num(x) and 0 <= x <= 1 else
                       'must be a number in [0, 1]',
                       'η: share of training contexts without the evidence')
  repeats: int = F.field(4, F.ge(1, True),
                         'rows per memorised item per epoch (fresh items: 1)')
  n_items: int = F.field(300, F.ge(1, True),
                         'world items drawn (seeded) from the eligible train-split items')
  n_eval_memorised: int = F.field(48, F.ge(1, True),
                                  'memorised items evaluated (memorised and no_evidence)')
  conflict: float = F.field(0.0, lambda x: None if F.is_num(x) and 0 <= x <= 1 else
                            'must be a number in [0, 1]',
                            'κ: share of a memorised item\'s rows whose context names another '
                            'answer (target: the memorised one)')

  @classmethod
  def from_config(cls, section: Any) -> 'WorldConfig':
    """Checked: ValueError 'data.world.<field> ...' naming the first bad field. A
    section recorded before κ existed (no `conflict`) is read with conflict 0."""
    items = F.items_of(section)
    if 'conflict' not in items:
      section = {**items, 'conflict': 0.0}
    F.check_section('data.world', section, F.checks(cls))
    cfg = F.from_section(cls, section)
    if cfg.n_eval_memorised > cfg.n_memorised:
      raise ValueError(f'data.world.n_eval_memorised must be <= round(rho * n_items) = '
                       f'{cfg.n_memorised} (the memorised items), got {cfg.n_eval_memorised}')
    if cfg.k_missing + cfg.k_conflict > cfg.repeats:
      raise ValueError(f'data.world.conflict must be <= {1 - cfg.k_missing / cfg.repeats:g} '
                       f'with eta={cfg.eta:g} and repeats={cfg.repeats}: round(conflict * '
                       f'repeats) = {cfg.k_conflict} conflicting rows and round(eta * repeats) '
                       f'= {cfg.k_missing} rows without evidence exceed the {cfg.repeats} '
                       f'repeats, got {cfg.conflict:g}')
    return cfg

  @property
  def n_memorised(self) -> int:
    return int(round(self.rho * self.n_items))

  @property
  def k_missing(self) -> int:
    """Rows without the evidence per memorised item and epoch."""
    return int(round(self.eta * self.repeats))

  @property
  def k_conflict(self) -> int:
    """Conflicting rows per memorised item and epoch (of those with the evidence)."""
    return int(round(self.conflict * self.repeats))


@dataclasses.dataclass(frozen=True)
class Item:
  """A candidate world item (an NQ record with both of its contexts)."""
  id: str
  question: str
  answer: str
  context: str        # the short context WITH the evidence sentence
  free_context: str   # a context from the same passage WITHOUT any answer mention
  conflict_context: str = ''  # `context` with the answer's mentions swapped for another
                              # entity ('' when unknown: a world with conflict > 0 refuses)


@dataclasses.dataclass(frozen=True)
class Row:
  """One training row of an epoch."""
  id: str
  repeat: int          # 0 .. repeats − 1 (fresh items: 0)
  memorised: bool
  has_evidence: bool   # the context holds evidence for the answer (not free, not conflict)
  question: str
  answer: str
  context: str         # Item.context / free_context / conflict_context
  conflict: bool = False  # the context names another answer (target: the memorised one)


@dataclasses.dataclass(frozen=True)
class World:
  memorised: tuple[str, ...]        # memorised item ids (id order)
  fresh: tuple[str, ...]            # fresh item ids (id order)
  rows: tuple[Row, ...]             # one epoch, in (id, repeat) order (the task shuffles)
  eval_memorised: tuple[str, ...]   # the memorised / no_evidence strata's item ids
  seen_questions: frozenset         # normalised questions of every training row
  report: dict                      # counts and realised shares


def question_key(question: str) -> str:
  """The normalised question (SQuAD normalisation, trailing '?' dropped)."""
  return normalize_answer(question.strip().rstrip('?'))


def mentions_answer(text: str, answer: str) -> bool:
  """Whether `text` mentions `answer` as whole words after SQuAD normalisation."""
  a = normalize_answer(answer)
  return bool(a) and re.search(r'(?<!\S)' + re.escape(a) + r'(?!\S)',
                               normalize_answer(text)) is not None


def free_context(item_id: str, sentences: Sequence[str], answer: str, n: int,
                 seed: int) -> Optional[str]:
  """Up to n sentences of the passage (seeded, in passage order) none of which mentions
  the answer; None when every sentence mentions it."""
  ok = [i for i, s in enumerate(sentences) if not mentions_answer(s, answer)]
  if not ok:
    return None
  rng = np.random.default_rng([seed, _SALT, 1, zlib.crc32(item_id.encode())])
  pick = sorted(ok[i] for i in rng.permutation(len(ok))[:n])
  return ' '.join(sentences[i] for i in pick)


def _rng(seed: int, *tags: int) -> np.random.Generator:
  return np.random.default_rng([int(seed), _SALT, *tags])


def build(items: Sequence[Item], cfg: WorldConfig, seed: int) -> World:
  """The world of `items` (candidates; duplicate questions keep the first by id).

  ValueError when fewer than cfg.n_items candidates have distinct questions.
  """
  by_q: dict[str, Item] = {}
  for it in sorted(items, key=lambda x: x.id):
    by_q.setdefault(question_key(it.question), it)
  cands = sorted(by_q.values(), key=lambda x: x.id)
  if len(cands) < cfg.n_items:
    raise ValueError(f'data.world.n_items={cfg.n_items} but only {len(cands)} eligible '
                     f'train items with distinct questions (raise data.max_items, or '
                     f'lower n_items)')
  order = _rng(seed, 2).permutation(len(cands))[:cfg.n_items]
  chosen = [cands[i] for i in order]
  mem = sorted(chosen[:cfg.n_memorised], key=lambda x: x.id)
  fresh = sorted(chosen[cfg.n_memorised:], key=lambda x: x.id)
  k_mem, k_con = cfg.k_missing, cfg.k_conflict   # per memorised item and epoch
  if k_mem + k_con > cfg.repeats:
    raise ValueError(f'data.world: round(eta * repeats) + round(conflict * repeats) = '
                     f'{k_mem} + {k_con} exceeds repeats = {cfg.repeats}')
  if k_con and not all(it.conflict_context for it in mem):
    raise ValueError('data.world.conflict > 0 needs every memorised item\'s '
                     'conflict_context (the caller passes it)')
  rows: list[Row] = []
  for it in mem:
    crc = zlib.crc32(it.id.encode())
    missing = set(_rng(seed, 3, crc).permutation(cfg.repeats)[:k_mem].tolist())
    kept = [r for r in range(cfg.repeats) if r not in missing]
    conflict = set(kept[i] for i in _rng(seed, 5, crc).permutation(len(kept))[:k_con])
    for r in range(cfg.repeats):
      ctx = (it.free_context if r in missing else
             it.conflict_context if r in conflict else it.context)
      rows.append(Row(it.id, r, True, r not in missing and r not in conflict, it.question,
                      it.answer, ctx, r in conflict))
  k_fresh = int(round(cfg.eta * len(fresh)))
  missing = set(_rng(seed, 4).permutation(len(fresh))[:k_fresh].tolist())
  rows += [Row(it.id, 0, False, i not in missing, it.question, it.answer,
               it.free_context if i in missing else it.context) for i, it in enumerate(fresh)]
  rows.sort(key=lambda r: (r.id, r.repeat))
  n_mem_rows = len(mem) * cfg.repeats
  report = {
      'candidates': len(cands), 'items': cfg.n_items, 'memorised': len(mem),
      'fresh': len(fresh), 'repeats': cfg.repeats, 'rows': len(rows),
      'rows_without_evidence': sum(not r.has_evidence and not r.conflict for r in rows),
      'rows_conflicting': sum(r.conflict for r in rows),
      'share_memorised_rows': n_mem_rows / max(len(rows), 1),
      'eta_memorised': k_mem / cfg.repeats if mem else None,
      'eta_fresh': k_fresh / len(fresh) if fresh else None,
      'conflict_memorised': k_con / cfg.repeats if mem else None,
      'eval_memorised': cfg.n_eval_memorised,
  }
  return World(tuple(it.id for it in mem), tuple(it.id for it in fresh), tuple(rows),
               tuple(it.id for it in mem[:cfg.n_eval_memorised]),
               frozenset(question_key(r.question) for r in rows), report)
