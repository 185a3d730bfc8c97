"""Deterministic oracle readers for tests of the audits (same `Reader` interface).

* `CopyOracle` answers a gold string found in its context (SPEC §8.1's
  present(): case-insensitive substring for text, contiguous token match for
  ATR token prompts) and abstains ('' / no tokens) when none is there: a reader
  that uses its evidence and nothing else.
* `ClosedBookOracle` answers from a fixed table keyed by the question and
  never looks at the context: a reader that ignores its evidence.

Both work on text prompts (`format_prompt`'s "Context: … Question: …" layout by
default) and on `ATRPrompt`s. Their log-likelihood is 0 for their own answer
and `miss_loglik` for any other (they are certain); continuation after a forced
prefix returns the rest of their answer when the prefix starts it, else
nothing. They stop with reason 'end' (or 'length' when the budget, counted in
whitespace words / tokens, cuts the answer).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Hashable, Mapping, Sequence, Union

import numpy as np

from ceu_jax.metrics.text import normalize_answer
from ceu_jax.readers import base
from ceu_jax.readers.atr import ATRPrompt

Answer = Union[str, tuple[int, ...]]
_CONTEXT = re.compile(r'Context:(.*?)(?:\nQuestion:|$)', re.S)
_QUESTION = re.compile(r'Question:(.*?)(?:\nAnswer:|$)', re.S)


def context_of(prompt: Any) -> Union[str, tuple[int, ...]]:
  """The retrieved context of a prompt: ATR context tokens, the text after
  'Context:' (up to '\\nQuestion:'), or the whole text when there is no such field."""
  if isinstance(prompt, ATRPrompt):
    return tuple(prompt.context)
  m = _CONTEXT.search(prompt)
  return m.group(1).strip() if m else prompt


def question_of(prompt: Any) -> Union[str, tuple[int, ...]]:
  """The question of a prompt: ATR query tokens, or the text after 'Question:'
  (up to '\\nAnswer:'), else the whole text."""
  if isinstance(prompt, ATRPrompt):
    return tuple(prompt.query)
  m = _QUESTION.search(prompt)
  return m.group(1).strip() if m else prompt


def find(needle: Answer, hay: Union[str, tuple[int, ...]]) -> int:
  """First position of needle in hay (case-insensitive for text), -1 if absent."""
  if isinstance(needle, str):
    return hay.lower().find(needle.lower()) if needle else -1
  n = len(needle)
  for i in range(len(hay) - n + 1) if n else ():
    if tuple(hay[i:i + n]) == needle:
      return i
  return -1


def _same(a: Answer, b: Answer) -> bool:
  if isinstance(a, str) and isinstance(b, str):
    return normalize_answer(a) == normalize_answer(b)
  return tuple(a) == tuple(b)


class Oracle(base.Reader[Any, Answer]):
  """Shared machinery: subclasses define `answer(prompt, id) -> Answer`."""
  miss_loglik: float

  def answer(self, prompt: Any, id_: Hashable) -> Answer:
    raise NotImplementedError

  def _generation(self, id_, full: Answer, budget: int, stops) -> base.Generation:
    strings, stop_ids = stops
    if isinstance(full, str):
      words = full.split()
      cut = len(words) > budget
      text = ' '.join(words[:budget]) if cut else full
      hits = [(text.find(s), s) for s in strings if s in text]
      if hits:
        at, s = min(hits)
        return base.Generation(id_, text[:at], (), base.STOP_STRING, s)
      return base.Generation(id_, text, (), base.LENGTH if cut else base.END)
    toks = tuple(full)
    for j, t in enumerate(toks[:budget]):
      if t in stop_ids:
        return base.Generation(id_, ' '.join(map(str, toks[:j])), toks[:j + 1],
                               base.STOP_TOKEN, t)
    cut = len(toks) > budget
    toks = toks[:budget]
    return base.Generation(id_, ' '.join(map(str, toks)), toks,
                           base.LENGTH if cut else base.END)

  def _generate(self, prompts, forced, budget, stops, ids):
    out = []
    for k, (p, i) in enumerate(zip(prompts, ids)):
      a = self.answer(p, i)
      if forced is not None:
        f = forced[k] if isinstance(forced[k], str) else tuple(int(t) for t in forced[k])
        starts = a.lower().startswith(f.lower()) if isinstance(a, str) else a[:len(f)] == f
        a = a[len(f):] if starts else a[:0]
      out.append(self._generation(i, a, budget, stops))
    return out

  def _loglik(self, prompts, answers, ids) -> np.ndarray:
    return np.asarray([0.0 if _same(self.answer(p, i), a) else self.miss_loglik
                       for p, i, a in zip(prompts, ids, answers)], np.float64)


@dataclasses.dataclass
class CopyOracle(Oracle):
  """Answers the candidate found earliest in the context (ties: the longest), else abstains.

  candidates: one list for every item, or a mapping item id -> its golds.
  """
  candidates: Union[Sequence[Answer], Mapping[Hashable, Sequence[Answer]]]
  context: Callable[[Any], Any] = context_of  # prompt -> its context (str or tokens)
  miss_loglik: float = -30.0  # log-likelihood of any answer other than its own

  def answer(self, prompt: Any, id_: Hashable) -> Answer:
    if isinstance(self.candidates, Mapping):
      if id_ not in self.candidates:
        raise KeyError(f'CopyOracle has no candidates for item id {id_!r}')
      cands = self.candidates[id_]
    else:
      cands = self.candidates
    ctx = self.context(prompt)
    cands = [c if isinstance(c, str) else tuple(c) for c in cands]
    found = [(find(c, ctx), -len(c), k) for k, c in enumerate(cands)]
    found = [f for f in found if f[0] >= 0]
    if not found:
      return '' if isinstance(ctx, str) else ()
    return cands[min(found)[2]]


@dataclasses.dataclass
class ClosedBookOracle(Oracle):
  """Answers table[question(prompt)] ('' / () for unknown questions); ignores the context."""
  table: Mapping[Any, Answer]
  question: Callable[[Any], Any] = question_of  # prompt -> its key in `table`
  miss_loglik: float = -30.0  # log-likelihood of any answer other than its own

  def answer(self, prompt: Any, id_: Hashable) -> Answer:
    key = self.question(prompt)
    if key in self.table:
      a = self.table[key]
      return a if isinstance(a, str) else tuple(a)
    return '' if isinstance(key, str) else ()
