"""Passage rendering and line drawing for factual-QA contexts (numpy, host side).

A context is m passages of n/m tokens: `[P]`, then whole sentences (line slots
j*lines_per_passage + k of passage j), then PAD. `Row` holds one example's
arrays; `draw_*` pick non-evidence lines with a numpy Generator.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ceu_jax.data.factqa import items as items_lib
from ceu_jax.data.factqa import tokenizer as tok_lib
from ceu_jax.data.factqa.config import FactQAConfig
from ceu_jax.data.types import LineKind

Line = tuple[tuple[int, ...], int]   # (token ids, LineKind)
_HARD_ORDER = (LineKind.HARD_SAME_ID, LineKind.HARD_SAME_KEY, LineKind.DISTRACTOR)
_CANDIDATES = 24   # candidates sampled per pool and passage


@dataclasses.dataclass
class Row:
  """Mutable per-example arrays (converted to a RetrievalBatch row at the end)."""
  context: np.ndarray       # [N] int32
  passage_ids: np.ndarray   # [N] int32
  passage_start: np.ndarray  # [N] bool
  line_ids: np.ndarray      # [N] int32
  line_kind: np.ndarray     # [L] int32

  @classmethod
  def empty(cls, c: FactQAConfig) -> "Row":
    pos = np.arange(c.context_len)
    return cls(np.zeros(c.context_len, np.int32), (pos // c.passage_len).astype(np.int32),
               pos % c.passage_len == 0, np.full(c.context_len, -1, np.int32),
               np.full(c.num_lines, int(LineKind.FILLER), np.int32))

  def kind_masks(self) -> tuple[np.ndarray, np.ndarray]:
    """(distractor_mask, hard_negative_mask) [N] from line ids and kinds."""
    tk = np.where(self.line_ids >= 0, self.line_kind[np.maximum(self.line_ids, 0)], -1)
    hard = (tk == int(LineKind.HARD_SAME_KEY)) | (tk == int(LineKind.HARD_SAME_ID))
    return tk == int(LineKind.DISTRACTOR), hard


def render_passage(c: FactQAConfig, row: Row, j: int, lines: Sequence[Line]) -> list[int]:
  """Write passage j of `row` from `lines`; returns each line's start position."""
  lo, hi = j * c.passage_len, (j + 1) * c.passage_len
  row.context[lo:hi] = tok_lib.PAD
  row.context[lo] = tok_lib.PSEP
  row.line_ids[lo:hi] = -1
  row.line_kind[j * c.lines_per_passage:(j + 1) * c.lines_per_passage] = int(LineKind.FILLER)
  pos, starts = lo + 1, []
  for k, (ids, kind) in enumerate(lines[:c.lines_per_passage]):
    if pos + len(ids) > hi:
      raise ValueError("line does not fit its passage (layout bug)")
    slot = j * c.lines_per_passage + k
    row.context[pos:pos + len(ids)] = ids
    row.line_ids[pos:pos + len(ids)] = slot
    row.line_kind[slot] = int(kind)
    starts.append(pos)
    pos += len(ids)
  return starts


def _ok(line: items_lib.PoolLine, banned: Sequence[str], budget: int) -> bool:
  return 0 < len(line.ids) <= budget and not any(b in line.text for b in banned)


def draw_filler(c: FactQAConfig, rng: np.random.Generator, pools: items_lib.Pools,
                item: items_lib.Item, tries: int = 8) -> list[Line]:
  """Consecutive sentences of a random other passage (none mentions the answer)."""
  filler = pools.filler
  for _ in range(tries):
    i = int(rng.integers(len(filler)))
    if filler[i].title == item.title:
      continue
    lines, budget = [], c.max_line_len
    while (i < len(filler) and len(lines) < c.lines_per_passage
           and filler[i].title == filler[i - 1 if lines else i].title
           and _ok(filler[i], item.banned, budget)):
      lines.append((filler[i].ids, LineKind.FILLER))
      budget -= len(filler[i].ids)
      i += 1
    if lines:
      return lines
  return []


def _candidates(rng: np.random.Generator, pools: items_lib.Pools, item: items_lib.Item,
                kind: LineKind, own: int) -> list[int]:
  if kind == LineKind.HARD_SAME_ID:
    pool = pools.by_title.get(item.title, ())
  elif kind == LineKind.HARD_SAME_KEY:
    pool = pools.by_relation.get(item.relation, ())
  else:
    pool = pools.by_type.get(item.answer_type, ())
  if len(pool) > _CANDIDATES:
    pool = [pool[int(k)] for k in rng.choice(len(pool), _CANDIDATES, replace=False)]
  else:
    pool = [pool[int(k)] for k in rng.permutation(len(pool))]
  return [i for i in pool if i != own and _valid(pools.evidence[i], item, kind)]


def _valid(line: items_lib.PoolLine, item: items_lib.Item, kind: LineKind) -> bool:
  same_title = line.title == item.title
  if kind == LineKind.HARD_SAME_ID:
    return same_title
  if kind == LineKind.HARD_SAME_KEY:
    return not same_title
  return not same_title and line.relation != item.relation


def draw_distractors(c: FactQAConfig, rng: np.random.Generator, pools: items_lib.Pools,
                     item: items_lib.Item, own: int, used: set[int]) -> list[Line]:
  """Evidence-format lines of other examples: same passage/article (HARD_SAME_ID), same
  relation (HARD_SAME_KEY), same answer type (DISTRACTOR), round robin; never the
  answer, never the example's own line (pool index `own`). `used` (pool indices already placed in this context) is updated."""
  queues = {k: _candidates(rng, pools, item, k, own) for k in _HARD_ORDER}
  lines, budget = [], c.max_line_len
  while len(lines) < c.lines_per_passage and any(queues.values()):
    for kind in _HARD_ORDER:
      queue = queues[kind]
      while queue:
        i = queue.pop(0)
        line = pools.evidence[i]
        if i in used or not _ok(line, item.banned, budget) or line.text == item.line_text.lower():
          continue
        used.add(i)
        lines.append((line.ids, kind))
        budget -= len(line.ids)
        break
      if len(lines) >= c.lines_per_passage:
        break
  return lines


def evidence_passage(c: FactQAConfig, item: items_lib.Item, evidence: tuple[int, ...] | None
                     ) -> tuple[list[Line], int]:
  """The evidence passage: the evidence line (if given) with its neighbours in order.

  Returns (lines, index of the evidence line or -1). Neighbours are added alternately
  before and after while they fit.
  """
  before = list(item.neighbours[:item.evidence_index])
  after = list(item.neighbours[item.evidence_index:])
  mid: list[Line] = [(evidence, LineKind.EVIDENCE)] if evidence is not None else []
  budget = c.max_line_len - sum(len(ids) for ids, _ in mid)
  head: list[Line] = []
  tail: list[Line] = []
  while len(head) + len(mid) + len(tail) < c.lines_per_passage and (before or after):
    for side in ("before", "after"):
      src = before if side == "before" else after
      if not src or len(head) + len(mid) + len(tail) >= c.lines_per_passage:
        continue
      ids = src.pop() if side == "before" else src.pop(0)
      if 0 < len(ids) <= budget:
        (head.insert(0, (ids, LineKind.FILLER)) if side == "before"
         else tail.append((ids, LineKind.FILLER)))
        budget -= len(ids)
      else:
        src.clear()
  return head + mid + tail, (len(head) if mid else -1)
