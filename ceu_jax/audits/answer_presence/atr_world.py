"""World A of the answer-presence audit: ATR-insert contexts, line-filter rewriters (issue #16).

Exact ground truth: the raw context C is an ATR-insert example (the smoke
world, η = 0.2 misses), the gold is its VALUE token(s). Rewriters are
query-conditioned line filters of fixed output length, so the trained readers
can read their output: every line slot is kept or becomes a filler line
("NOTE w w w w w ."), passage markers stay where they are.

  B2 (rewriter A) keeps the lines holding the query's ID, B3 (rewriter B) its
  KEY. Errors: the evidence line is dropped with probability p_drop (1→0 when
  no coincidental mention is left); on missed examples (no evidence line in C)
  the gold line "ID #q KEY k_q VALUE v* ." is surfaced into a blank slot with
  probability p_surface (0→1). B4 is SPEC §8.1's "A's compile then a
  verification pass by B": B2's compile with each line A kept checked by B's
  filter (kept if it holds the KEY; B drops the evidence line with p_drop),
  the rest becoming filler; it never holds a line B2 lacks. Draws are seeded
  by (seed, rewriter, id).

`ATRMedium` is the audit's token medium (SPEC §8.1 "token match on ATR"):
present = the gold VALUE token(s) anywhere (coincidental mentions count);
beside it `present_companion` = "the evidence line is present". Edits keep
the context length N and every position outside the edited tokens:
  remove / placebo  a region of `width` tokens (the gold's own length in the
                    main table) → the sentinel, right-padded with [FILL]. The
                    panel pads every arm to its longest sentinel ("content was
                    removed", 3 tokens): the region then also covers the tokens
                    just before the gold in its line (its KEY and "VALUE", or
                    "#i IS"), the same width in every arm, so lengths match;
                    placebo regions are windows of the same width inside one
                    line that overlap no remove region.
  insert_*          the note line "NOTE v* w w w w ." (the last free filler
                    line of c, its first word(s) replaced by the gold) is moved
                    to the first line slot (prepend) or to the line boundary
                    nearest the middle (mid); the lines in between shift by one
                    slot. A compile with no free filler line cannot hold an
                    insert (skipped, counted).
Scores: token F1 × 100 of the greedy answer (= EM × 100 for one-token
values) and, as a continuous companion, the gold log-likelihood (Δ log-lik).

Shape legend: N context tokens, L line slots, T tokens per line, Q query.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import zlib
from typing import Any, Optional, Sequence

import numpy as np

from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.data import atr
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.vocab import SENTINELS as VOCAB_SENTINELS

# panel name (SPEC §8.1) -> ATR vocabulary sentinel (ceu_jax.data.vocab.SENTINELS)
PANEL_NAMES = {'[MASK]': 'mask', '[REMOVED]': 'removed', 'natural': 'deletion_phrase',
               'word': 'generic_word', 'symbol': 'symbol'}
REWRITERS = {'B2': ('id',), 'B3': ('key',), 'B4': ('id', 'key')}  # kept when the line has these
VERIFIED = {'B4': 'B2'}  # B4 verifies B2's compile (the lines it kept or surfaced)
# Bumped when a rewriter's compile of the same record changes (part of the job's record,
# so a run's units under an older definition are not resumed). 2: B4 = B2 verified by B.
REWRITER_VERSION = 2
BASELINES = ('B1',) + tuple(REWRITERS)


@dataclasses.dataclass(frozen=True)
class ATRMedium:
  """Token contexts [N] in the layout of `cfg` (module doc)."""
  cfg: ATRConfig  # the world's data config (layout, vocabulary)
  width: int = 0  # remove/placebo region width in tokens (0: the gold occurrence's own)

  def __post_init__(self):
    if self.cfg.variant != 'value_for_key':
      raise ValueError("the answer-presence audit reads ATR 'value_for_key' worlds (the gold is "
                       f"the VALUE); got data.variant {self.cfg.variant!r}")
    if self.cfg.value_len > self.cfg.line_len - 2:
      raise ValueError(f'data.value_len {self.cfg.value_len} leaves no room for the note line')

  # -- layout ----------------------------------------------------------------
  @property
  def vocab(self):
    return self.cfg.vocab

  @property
  def sentinels(self) -> dict:
    return {name: self.vocab.sentinel(v) for name, v in PANEL_NAMES.items()}

  def _layout(self):
    return atr.layout(self.cfg)

  def line_starts(self) -> tuple[int, ...]:
    """[L] context position of each line slot's first token."""
    return _line_starts(self.cfg)

  def lines(self, x: Sequence[int]) -> list[tuple[int, ...]]:
    """The L line slots of a context, each T tokens."""
    x = tuple(x)
    t = self.cfg.line_len
    return [x[s:s + t] for s in self.line_starts()]

  def with_lines(self, x: Sequence[int], lines: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """x with its line slots replaced (markers and padding kept)."""
    out = list(x)
    for s, line in zip(self.line_starts(), lines):
      out[s:s + self.cfg.line_len] = list(line)
    return tuple(out)

  @property
  def passage_ids(self) -> tuple[int, ...]:
    return _passage_ids(self.cfg)

  def is_free(self, line: Sequence[int]) -> bool:
    """A filler line of filler words only (no ID / KEY / VALUE token): free for an insert."""
    v = self.vocab
    return (line[0] == v.tok('NOTE') and line[-1] == v.tok('.')
            and all(v.filler_base <= t < v.id_base for t in line[1:-1]))

  # -- presence --------------------------------------------------------------
  def occurrences(self, x: Sequence[int], golds: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Disjoint (start, end) token spans of gold occurrences, leftmost then longest."""
    x = tuple(x)
    pats = sorted({tuple(g) for g in golds if len(g)}, key=len, reverse=True)
    spans, i = [], 0
    while i < len(x):
      hit = None
      for p in pats:
        for j in range(i, len(x) - len(p) + 1):
          if x[j:j + len(p)] == p:
            if hit is None or j < hit[0]:
              hit = (j, j + len(p))
            break
      if hit is None:
        break
      spans.append(hit)
      i = hit[1]
    return spans

  def present(self, x, golds) -> bool:
    return x is not None and bool(self.occurrences(x, golds))

  def evidence_lines(self, x: Sequence[int], r: ap.Record) -> list[int]:
    """Line slots holding the evidence line of r's query (either format)."""
    v, q = self.vocab, tuple(r.question)
    q_id, q_key = q[2], q[4]
    out = []
    for k, line in enumerate(self.lines(x)):
      for g in r.golds:
        g = tuple(g)
        std = (v.tok('ID'), q_id, v.tok('KEY'), q_key, v.tok('VALUE')) + g + (v.tok('.'),)
        par = (v.tok('KEY'), q_key, v.tok('OF'), q_id, v.tok('IS')) + g + (v.tok('.'),)
        if tuple(line) in (std, par):
          out.append(k)
          break
    return out

  def present_companion(self, x, r: ap.Record) -> bool:
    """'evidence line present' (reported beside present())."""
    return x is not None and bool(self.evidence_lines(x, r))

  def check(self, r: ap.Record) -> Optional[str]:
    """Skip reason (SKIP_REASONS) or None. A gold is ≥ 1 whole vocabulary token
    (the text rule's ≥ 2 characters has no token analogue); 'cannot_hold_insert':
    a compile without the gold and without a free filler line."""
    if not r.golds or any(len(tuple(g)) < 1 for g in r.golds):
      return 'gold_too_short'
    if r.context is None or not any(int(t) != self.vocab.pad for t in r.context):
      return 'empty_context'
    if not self.present(r.context, r.golds) and not any(
        self.is_free(line) for line in self.lines(r.context)):
      return 'cannot_hold_insert'
    return None

  # -- edits -----------------------------------------------------------------
  def _regions(self, x, golds) -> list[tuple[int, int]]:
    """Remove regions: each occurrence widened to `width` inside its line (left first)."""
    lay = self._layout()
    out = []
    for a, b in self.occurrences(x, golds):
      extra = max(self.width - (b - a), 0)
      line = lay.line_of_pos[a]
      start = self.line_starts()[line] if line >= 0 else a
      end = start + self.cfg.line_len if line >= 0 else b
      if a - extra >= start and (not out or out[-1][1] <= a - extra):
        out.append((a - extra, b))
      elif b + extra <= end:
        out.append((a, b + extra))
      else:
        raise ValueError(f'a gold occurrence at {a} cannot be widened to {self.width} tokens '
                         'inside its line')
    return out

  def fill(self, sentinel, n: int) -> list[int]:
    """`sentinel` padded with [FILL] tokens to n tokens; ValueError when it does not fit."""
    sentinel = list(sentinel)
    if len(sentinel) > n:
      raise ValueError(f'sentinel of {len(sentinel)} tokens does not fit a {n}-token region: '
                       'use ATRMedium.for_panel() (width = the longest sentinel)')
    return sentinel + [self.vocab.tok('[FILL]')] * (n - len(sentinel))

  def _replace(self, x, regions, sentinel) -> tuple[int, ...]:
    out = list(x)
    for a, b in regions:
      out[a:b] = self.fill(sentinel, b - a)
    return tuple(out)

  def remove(self, x, golds, sentinel) -> tuple[int, ...]:
    return self._replace(x, self._regions(x, golds), sentinel)

  def placebo_spans(self, x, golds, id_) -> list[tuple[int, int]]:
    """One window per remove region, its width, inside one line, overlapping no
    remove region nor another window; rng (1729, crc32(id))."""
    regions = self._regions(x, golds)
    rng = ap.placebo_rng(id_)
    t = self.cfg.line_len
    taken: list[tuple[int, int]] = []
    for a, b in regions:
      w = b - a
      cands = [(s + o, s + o + w) for s in self.line_starts() for o in range(t - w + 1)
               if not any(s + o < y and x_ < s + o + w for x_, y in regions + taken)]
      if not cands:
        break
      taken.append(cands[int(rng.integers(len(cands)))])
    return sorted(taken)

  def placebo(self, x, golds, id_, sentinel) -> tuple[tuple[int, ...], int]:
    spans = self.placebo_spans(x, golds, id_)
    return self._replace(x, spans, sentinel), len(spans)

  def _insert(self, x, gold, at_middle: bool) -> tuple[int, ...]:
    lines = [tuple(l) for l in self.lines(x)]
    free = [k for k, line in enumerate(lines) if self.is_free(line)]
    if not free:
      raise ValueError('this context has no free filler line to hold an insert (check() skips it)')
    k = free[-1]
    gold = tuple(gold)
    note = lines[k][:1] + gold + lines[k][1 + len(gold):]
    rest = lines[:k] + lines[k + 1:]
    m = len(lines) // 2 if at_middle else 0
    return self.with_lines(x, rest[:m] + [note] + rest[m:])

  def insert_prepend(self, x, gold) -> tuple[int, ...]:
    return self._insert(x, gold, False)

  def insert_mid(self, x, gold) -> tuple[tuple[int, ...], bool]:
    return self._insert(x, gold, True), len(self.lines(x)) < 2

  def for_panel(self) -> 'ATRMedium':
    """Every panel arm padded to the longest sentinel (module doc)."""
    return dataclasses.replace(self, width=max(len(s) for s in self.sentinels.values()))

  # -- reader ----------------------------------------------------------------
  def prompt(self, r: ap.Record, context):
    from ceu_jax.readers.atr import ATRPrompt
    return ATRPrompt(tuple(int(t) for t in r.question), tuple(int(t) for t in context),
                     self.passage_ids)

  def generate_kwargs(self) -> dict:
    return dict(max_new_tokens=self.cfg.answer_len, stop=())

  def answer_text(self, generation) -> str:
    return self.vocab.decode(generation.tokens)

  def score(self, generation, golds) -> float:
    """Token F1 × 100 (multiset overlap; EM × 100 for one-token golds), best gold."""
    pred = collections.Counter(int(t) for t in generation.tokens if int(t) != self.vocab.pad)
    best = 0.0
    for g in golds:
      gold = collections.Counter(int(t) for t in g)
      common = sum((pred & gold).values())
      if common:
        p, r = common / sum(pred.values()), common / sum(gold.values())
        best = max(best, 2 * p * r / (p + r))
    return 100.0 * best


@functools.lru_cache(maxsize=16)
def _line_starts(cfg: ATRConfig) -> tuple[int, ...]:
  lay = atr.layout(cfg)
  starts = [0] * cfg.num_lines
  for pos in np.nonzero((lay.line_of_pos >= 0) & (lay.offset_of_pos == 0))[0]:
    starts[int(lay.line_of_pos[pos])] = int(pos)
  return tuple(starts)


@functools.lru_cache(maxsize=16)
def _passage_ids(cfg: ATRConfig) -> tuple[int, ...]:
  return tuple(int(p) for p in atr.layout(cfg).passage_of_pos)


# ---------------------------------------------------------------- rewriters
def item_rng(seed: int, name: str, id_) -> np.random.Generator:
  """The generator of draw `name` for record `id_`: fixed per (seed, name, id), order-free."""
  return np.random.default_rng([seed, zlib.crc32(name.encode()), zlib.crc32(str(id_).encode())])


def rewrite(medium: ATRMedium, r: ap.Record, name: str, *, p_drop: float, p_surface: float,
            seed: int) -> tuple[int, ...]:
  """The compile of rewriter `name` (B2/B3/B4) of r's raw context (module doc)."""
  if name not in REWRITERS:
    raise ValueError(f'rewriter must be one of {sorted(REWRITERS)}, got {name!r}')
  v, q = medium.vocab, tuple(r.question)
  need = {'id': q[2], 'key': q[4]}
  raw = tuple(r.raw_context)
  lines = [tuple(l) for l in medium.lines(raw)]
  rng = item_rng(seed, name, r.id)
  ev = medium.evidence_lines(raw, r)
  u_drop, u_surface = rng.random(), rng.random()  # drawn for every record: order-free
  verifies = name in VERIFIED   # verify another rewriter's compile: its lines, its fillers
  if verifies:
    prior = rewrite(medium, r, VERIFIED[name], p_drop=p_drop, p_surface=p_surface, seed=seed)
    lines_in = [tuple(l) for l in medium.lines(prior)]
    offered = [need['id'] in line for line in lines_in]   # the lines A kept (or surfaced)
  else:
    lines_in, offered = lines, [True] * len(lines)
  keep = [o and all(need[f] in line for f in REWRITERS[name])
          for o, line in zip(offered, lines_in)]
  if ev and keep[ev[0]] and lines_in[ev[0]] == lines[ev[0]] and u_drop < p_drop:
    keep[ev[0]] = False
  out = []
  for line, o, k in zip(lines_in, offered, keep):
    words = (v.filler_base + rng.integers(0, v.n_filler, size=len(line) - 2)).tolist()
    out.append(line if k or not o else (v.tok('NOTE'), *words, v.tok('.')))
  if verifies:
    return medium.with_lines(raw, out)
  if not ev and u_surface < p_surface:
    blank = [k for k, kept in enumerate(keep) if not kept]
    if blank:
      slot = blank[int(rng.integers(len(blank)))]
      out[slot] = (v.tok('ID'), need['id'], v.tok('KEY'), need['key'], v.tok('VALUE'),
                   *tuple(r.golds[0]), v.tok('.'))
  return medium.with_lines(raw, out)


def raw_records(data_cfg: ATRConfig, n: int, seed: int) -> list[ap.Record]:
  """n raw ATR examples of the test split (context = raw context; compile added per rewriter)."""
  import jax
  b = jax.device_get(atr.generate_batch(data_cfg, seed, 0, n, 'test'))
  return [ap.Record(f'atr:{i}', tuple(int(t) for t in b.query[i]),
                    (tuple(int(t) for t in b.answer[i]),),
                    tuple(int(t) for t in b.context[i]), tuple(int(t) for t in b.context[i]))
          for i in range(n)]


def compiled_records(medium: ATRMedium, raw: Sequence[ap.Record], name: str, **kw) -> list[ap.Record]:
  """Records of baseline `name`: B1 = the raw context itself, B2-B4 = the rewriter's compile."""
  if name == 'B1':
    return list(raw)
  return [dataclasses.replace(r, context=rewrite(medium, r, name, **kw)) for r in raw]
