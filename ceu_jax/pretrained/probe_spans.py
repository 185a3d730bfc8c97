"""Distractor and control spans of the NQ audit that are never the answer in another spelling.

A distractor (`dis`) or control (`control`) span must not restore the answer
through a side door: a span that spells the gold answer or the substitute
entity differently ("Sisyphos", "Sisyphean" for "Sisyphus") would inflate
CEU_dis and the control, the two numbers that show the evidence effect is
specific (issue #22). The rule, applied to the context words of the prompt:

1. Normalisation (`fold`): Unicode NFKD, combining marks dropped, casefolded;
   words are runs of letters/digits (punctuation separates words).
2. Key words of a target (the answer, the substitute): its folded words of
   ≥ 2 characters that are not in `STOPWORDS`.
3. A context word is *answer-like* when, against some key word,
   - it is equal, or
   - both have ≥ 3 characters and their common prefix is ≥ `MIN_PREFIX` (5)
     characters or ≥ max(3, `PREFIX_SHARE` (60%) of the shorter word), or
   - both have ≥ 4 characters and their `difflib` similarity ratio is
     ≥ `SIMILARITY` (0.75) (transliterations: "Sísuphos" ~ "Sisyphus").
4. A run of consecutive context words whose folded letters, joined without
   spaces, equal the target's ("U.S." ~ "US", "Sisy phus") is answer-like.
5. A word whose folded form is not ASCII (native script, IPA: "Σίσυφος",
   "ˈsɪsɪfəs") cannot be compared and counts as answer-like.

Every token whose characters overlap an answer-like word is banned, and so is
any span containing a banned token (the evidence tokens are banned too).
Spans are drawn among the rest; when none exists the probe is absent for that
item (an empty tuple), counted in the audit summary and never filled with a
bad span.

Spans are tuples of token positions of the unpadded prompt.
"""
from __future__ import annotations

import difflib
import os
import re
import unicodedata
from typing import Optional, Sequence

import numpy as np

STOPWORDS = frozenset(
    'a an the of and or in on at to for by with from as is de del la le les du des da di '
    'von van der den el al'.split())  # never key words of a target
MIN_PREFIX = 5  # a common prefix this long relates two words
PREFIX_SHARE = 0.6  # ... as does one covering this share of the shorter word (≥ 3 chars)
SIMILARITY = 0.75  # ... or a difflib ratio this high (both words ≥ 4 chars)
MAX_EXTRA_WORDS = 3  # rule 4 joins up to (target words + this) context words
ENTITY_RE = re.compile(r"[A-Z][\w'.\-]*(?:\s+[A-Z][\w'.\-]*)*")  # capitalised mentions
_WORD_RE = re.compile(r'[\w\u0300-\u036f]+')  # letters/digits, with combining marks


def fold(text: str) -> str:
  """NFKD, combining marks dropped, casefolded."""
  d = unicodedata.normalize('NFKD', text)
  return ''.join(c for c in d if not unicodedata.combining(c)).casefold()


def words(text: str, lo: int = 0, hi: Optional[int] = None) -> list[tuple[int, int, str]]:
  """(start, end, folded word) of the words in text[lo:hi]."""
  out = []
  for m in _WORD_RE.finditer(text, lo, len(text) if hi is None else hi):
    w = fold(m.group()).replace('_', '')
    if w:
      out.append((m.start(), m.end(), w))
  return out


def key_words(target: str) -> list[str]:
  """Folded words of a target (answer or substitute) that the rule compares."""
  ws = [w for _, _, w in words(target)]
  keys = [w for w in ws if len(w) >= 2 and w not in STOPWORDS]
  return keys or [w for w in ws if len(w) >= 2]


def related(word: str, key: str) -> bool:
  """Rule 3: equal, a long common prefix, or a close spelling."""
  if word == key:
    return True
  n = min(len(word), len(key))
  if n < 3:
    return False
  p = len(os.path.commonprefix([word, key]))
  if p >= MIN_PREFIX or p >= max(3, PREFIX_SHARE * n):
    return True
  return n >= 4 and difflib.SequenceMatcher(None, word, key).ratio() >= SIMILARITY


def answer_like_ranges(text: str, lo: int, hi: int,
                       targets: Sequence[str]) -> list[tuple[int, int]]:
  """Character ranges of the answer-like words of text[lo:hi] (rules 3-5)."""
  ws = words(text, lo, hi)
  out = []
  for s, e, w in ws:
    if not w.isascii() or any(related(w, k) for t in targets for k in key_words(t)):
      out.append((s, e))
  for t in targets:
    compact = ''.join(w for _, _, w in words(t))
    if not compact:
      continue
    span = len(words(t)) + MAX_EXTRA_WORDS
    for i in range(len(ws)):
      joined = ''
      for j in range(i, min(i + span, len(ws))):
        joined += ws[j][2]
        if joined == compact:
          out.append((ws[i][0], ws[j][1]))
        if len(joined) >= len(compact):
          break
  return out


def positions(offsets: Sequence[tuple[int, int]], ranges: Sequence[tuple[int, int]]
              ) -> tuple[int, ...]:
  """Token positions whose character offsets overlap any of the ranges."""
  return tuple(j for j, (a, b) in enumerate(offsets)
               if any(a < e and b > s for s, e in ranges))


def context_positions(offsets, lo: int, hi: int) -> list[int]:
  """Non-empty tokens inside the context text [lo, hi) (with its leading space)."""
  return [j for j, (a, b) in enumerate(offsets) if a >= lo - 1 and b <= hi and b > a]


def entity_spans(prompt: str, offsets, lo: int, hi: int, k: int,
                 banned: set[int]) -> tuple[list, list]:
  """Capitalised mentions with k contiguous tokens, none banned: (whole, sub-mentions)."""
  whole, sub = [], []
  for m in ENTITY_RE.finditer(prompt, lo, hi):
    ws = [(w.start(), w.end()) for w in re.finditer(r'\S+', m.group())]
    for i in range(len(ws)):
      for j in range(i, len(ws)):
        pos = positions(offsets, [(m.start() + ws[i][0], m.start() + ws[j][1])])
        if (len(pos) != k or banned & set(pos)
            or pos != tuple(range(pos[0], pos[0] + k))):
          continue
        (whole if (i, j) == (0, len(ws) - 1) else sub).append(pos)
  return whole, sub


def windows(ctx: Sequence[int], k: int, banned: set[int]) -> list[tuple[int, ...]]:
  """Contiguous k-token windows of context positions avoiding `banned`."""
  cs = set(ctx)
  return [tuple(range(s, s + k)) for s in ctx
          if all(p in cs and p not in banned for p in range(s, s + k))]


def banned_positions(prompt: str, offsets, lo: int, hi: int, ev: Sequence[int],
                     targets: Sequence[str]) -> set[int]:
  """Evidence tokens and every token overlapping an answer-like word."""
  return set(ev) | set(positions(offsets, answer_like_ranges(prompt, lo, hi, targets)))


def choose_spans(prompt: str, offsets, lo: int, hi: int, ev: Sequence[int],
                 targets: Sequence[str], rng: np.random.Generator
                 ) -> tuple[tuple[int, ...], str, tuple[int, ...]]:
  """(dis, dis_kind, control) token positions with the evidence's token count.

  dis: a capitalised entity mention (whole mentions first), else any context
  window (`dis_kind` 'entity' | 'context'); control: a random context window
  disjoint from the evidence and, when there is room, from the distractor.
  Neither contains a banned token (`banned_positions`); a probe without a
  valid span is () (and `dis_kind` 'none').
  """
  k = len(ev)
  banned = banned_positions(prompt, offsets, lo, hi, ev, targets)
  whole, sub = entity_spans(prompt, offsets, lo, hi, k, banned)
  ctx = context_positions(offsets, lo, hi)
  if whole or sub:
    pool, kind = (whole or sub), 'entity'
  else:
    pool, kind = windows(ctx, k, banned), 'context'
  dis = pool[rng.integers(len(pool))] if pool else ()
  ctl_pool = windows(ctx, k, banned | set(dis)) or windows(ctx, k, banned)
  ctl = ctl_pool[rng.integers(len(ctl_pool))] if ctl_pool else ()
  return dis, (kind if dis else 'none'), ctl
