"""The Reader interface: what every behavioural audit (SPEC §8) may call.

A reader answers items. What an item is depends on the reader: text prompts
for the pretrained LM (`SmolLM2Reader`), token prompts (`ATRPrompt`) for the
project's retrieval models (`ATRReader`); answers and forced prefixes are
strings or token sequences likewise. Audit code depends on `Reader` only.

Three operations, each on a list of items (one `Generation` / score per item,
in input order):

* `generate(prompts, max_new_tokens=, stop=)`: greedy decoding with a token
  budget; `stop` holds stop strings and/or stop token ids.
* `loglik(prompts, answers)`: the gold log-likelihood log p(answer | prompt)
  under teacher forcing, summed over the answer's tokens (SPEC §1), [n] float64.
* `continue_from(prompts, forced_prefixes, max_new_tokens=, stop=)`: the
  greedy continuation after `forced_prefix` has been placed as the start of the
  reader's own output (SPEC §8.2, §8.3: an edited intermediate step is forced,
  the rest regenerated). The returned Generation holds the continuation only.

Optional, for readers with a token view of their text output (default None):
* `prefix_tokens(generation, n_chars)`: the generation's own token ids whose text
  is exactly `generation.text[:n_chars]` (None when no token boundary falls
  there). A forced prefix may then be a list mixing such token ids and strings
  (strings are tokenised in place), so that a kept part of the reader's own
  output is given back token for token, not re-tokenised from its text.

Contract for bad input (checked before any model work):
* an empty list returns an empty list (`loglik`: an empty float64 array);
* a prompt (+ forced prefix) that does not fit the reader's length limit with
  the requested budget raises `PromptTooLongError` naming the item ids; nothing
  is ever truncated;
* list lengths that disagree, a budget < 1, or ids that are not unique raise
  ValueError naming the field;
* a stop string that never occurs ends generation at the budget
  (`stop_reason == 'length'`).
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Generic, Hashable, Optional, Sequence, TypeVar, Union

import numpy as np

PromptT = TypeVar('PromptT')
AnswerT = TypeVar('AnswerT')
Stop = Union[str, int]  # a stop string, or a stop token id

# Why generation ended (Generation.stop_reason).
STOP_TOKEN = 'stop_token'  # a stop token id was generated (it is the last of `tokens`)
STOP_STRING = 'stop_string'  # the decoded text contains a stop string (text is cut before it)
LENGTH = 'length'  # the token budget max_new_tokens was reached
END = 'end'  # the reader has nothing more to say (oracles; ATR: after the last answer slot)
STOP_REASONS = (STOP_TOKEN, STOP_STRING, LENGTH, END)


@dataclasses.dataclass(frozen=True)
class Generation:
  """One item's greedy output."""
  id: Hashable  # the item id (the caller's `ids`, else its index in the list)
  text: str  # the answer as text, cut before a stop string / without a stop token
  tokens: tuple[int, ...]  # generated token ids, through the token that stopped generation
  stop_reason: str  # one of STOP_REASONS
  stop: Optional[Stop] = None  # the stop string or stop token id that fired, else None


class PromptTooLongError(ValueError):
  """Some items do not fit the reader's maximum length; `ids` / `lengths` say which."""

  def __init__(self, ids: Sequence[Hashable], lengths: Sequence[int], limit: int, what: str):
    self.ids, self.lengths, self.limit = list(ids), list(lengths), limit
    shown = ', '.join(f'{i!r} ({n})' for i, n in zip(self.ids[:10], self.lengths[:10]))
    more = f' and {len(self.ids) - 10} more' if len(self.ids) > 10 else ''
    super().__init__(f'{len(self.ids)} item(s) exceed the maximum length {limit} ({what}): '
                     f'{shown}{more}. Nothing is truncated; shorten or drop them.')


def item_ids(n: int, ids: Optional[Sequence[Hashable]]) -> list[Hashable]:
  """The ids of n items: `ids` (checked: n unique entries) or 0..n-1."""
  if ids is None:
    return list(range(n))
  ids = list(ids)
  if len(ids) != n:
    raise ValueError(f'ids has {len(ids)} entries for {n} prompts')
  if len(set(ids)) != n:
    raise ValueError('ids must be unique')
  return ids


def check_fit(ids: Sequence[Hashable], lengths: Sequence[int], limit: int, what: str) -> None:
  """Raise PromptTooLongError for every item whose length exceeds `limit`."""
  bad = [(i, n) for i, n in zip(ids, lengths) if n > limit]
  if bad:
    raise PromptTooLongError([i for i, _ in bad], [n for _, n in bad], limit, what)


def split_stops(stop: Sequence[Stop]) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """(stop strings, stop token ids) of a mixed `stop` list (validated)."""
  if isinstance(stop, (str, int)):
    stop = [stop]
  strings, tokens = [], []
  for s in stop:
    if isinstance(s, str):
      if not s:
        raise ValueError('stop strings must be non-empty')
      strings.append(s)
    elif isinstance(s, (int, np.integer)) and not isinstance(s, bool):
      tokens.append(int(s))
    else:
      raise ValueError(f'stop entries must be strings or token ids, got {s!r}')
  return tuple(strings), tuple(tokens)


def _check_budget(max_new_tokens: int) -> int:
  if (not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool)
      or max_new_tokens < 1):
    raise ValueError(f'max_new_tokens must be an int >= 1, got {max_new_tokens!r}')
  return int(max_new_tokens)


def _check_same_length(name: str, values: Sequence, n: int) -> list:
  values = list(values)
  if len(values) != n:
    raise ValueError(f'{name} has {len(values)} entries for {n} prompts')
  return values


class Reader(abc.ABC, Generic[PromptT, AnswerT]):
  """Greedy generation, gold log-likelihood and forced-prefix continuation (module doc)."""

  def generate(self, prompts: Sequence[PromptT], *, max_new_tokens: int,
               stop: Sequence[Stop] = (), ids: Optional[Sequence[Hashable]] = None
               ) -> list[Generation]:
    """Greedy continuation of each prompt (at most max_new_tokens tokens)."""
    prompts = list(prompts)
    budget = _check_budget(max_new_tokens)
    stops = split_stops(stop)
    ids = item_ids(len(prompts), ids)
    if not prompts:
      return []
    return self._generate(prompts, None, budget, stops, ids)

  def continue_from(self, prompts: Sequence[PromptT], forced_prefixes: Sequence[AnswerT], *,
                    max_new_tokens: int, stop: Sequence[Stop] = (),
                    ids: Optional[Sequence[Hashable]] = None) -> list[Generation]:
    """Greedy continuation after each forced prefix of the reader's own output."""
    prompts = list(prompts)
    forced = _check_same_length('forced_prefixes', forced_prefixes, len(prompts))
    budget = _check_budget(max_new_tokens)
    stops = split_stops(stop)
    ids = item_ids(len(prompts), ids)
    if not prompts:
      return []
    return self._generate(prompts, forced, budget, stops, ids)

  def prefix_tokens(self, generation: Generation, n_chars: int) -> Optional[list]:
    """The generation's own tokens spelling text[:n_chars] (module doc); None: no token
    view (the default) or no token boundary there."""
    return None

  def loglik(self, prompts: Sequence[PromptT], answers: Sequence[AnswerT], *,
             ids: Optional[Sequence[Hashable]] = None) -> np.ndarray:
    """log p(answer | prompt) [n] float64, summed over the answer tokens (teacher forcing)."""
    prompts = list(prompts)
    answers = _check_same_length('answers', answers, len(prompts))
    ids = item_ids(len(prompts), ids)
    if not prompts:
      return np.zeros((0,), np.float64)
    return np.asarray(self._loglik(prompts, answers, ids), np.float64)

  @abc.abstractmethod
  def _generate(self, prompts: list[PromptT], forced: Optional[list[AnswerT]], budget: int,
                stops: tuple[tuple[str, ...], tuple[int, ...]],
                ids: list[Hashable]) -> list[Generation]:
    """Non-empty, validated lists; forced None = plain generation."""

  @abc.abstractmethod
  def _loglik(self, prompts: list[PromptT], answers: list[AnswerT],
              ids: list[Hashable]) -> np.ndarray:
    """Non-empty, validated lists."""
