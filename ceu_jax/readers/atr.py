"""The project's retrieval models (`architectures/`) as a `Reader`: tokens in, tokens out.

An item is an `ATRPrompt` (query [Q], context [N], passage_ids [N], the row of a
`RetrievalBatch`); an answer / forced prefix is a token sequence of at most A
tokens (A = the model's answer length). The model is any flax module with
`.spec` (query_len, context_len, answer_len) whose
`apply(variables, query, context, passage_ids, answer)` returns logits
[B, A, V] with `logits[:, i]` predicting answer[:, i] from answer[:, :i]
(docs/conventions.md §2; the shift is inside the model).

* generation: greedy over the A answer slots, one forward per slot (the slots
  after the current one hold PAD and are never read: the reader is causal);
* continuation after a forced prefix f: the slots 0..|f|-1 hold f (teacher
  forcing), greedy from slot |f| on;
* loglik: teacher-forced `likelihood.gold_loglik` (PAD answer slots do not count).

`max_new_tokens` may not exceed the free slots (A − |f|): PromptTooLongError.
Stop entries must be token ids (a text stop needs a tokenizer; there is none).

Shape legend: B batch, Q query length, N context length, A answer length,
V vocabulary.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np

from ceu_jax import likelihood
from ceu_jax.readers import base

PAD = likelihood.PAD


@dataclasses.dataclass(frozen=True)
class ATRPrompt:
  """One retrieval item, as the model reads it."""
  query: tuple[int, ...]  # [Q] query tokens (0 = PAD)
  context: tuple[int, ...]  # [N] retrieved context, flat
  passage_ids: tuple[int, ...]  # [N] passage index of each context token


def prompts_from_batch(batch: Any) -> list[ATRPrompt]:
  """The rows of a RetrievalBatch (or anything with query/context/passage_ids) as items."""
  q, c, p = (np.asarray(x) for x in (batch.query, batch.context, batch.passage_ids))
  return [ATRPrompt(tuple(q[i].tolist()), tuple(c[i].tolist()), tuple(p[i].tolist()))
          for i in range(q.shape[0])]


def answers_from_batch(batch: Any) -> list[tuple[int, ...]]:
  """The gold answers of a batch, right PAD removed."""
  out = []
  for row in np.asarray(batch.answer).tolist():
    while row and row[-1] == PAD:
      row = row[:-1]
    out.append(tuple(row))
  return out


class ATRReader(base.Reader[ATRPrompt, Sequence[int]]):
  """Greedy decoding of a trained retrieval model (module doc)."""

  def __init__(self, model: Any, variables: dict, *, vocab: Any = None, batch_size: int = 256):
    spec = model.spec
    self.model = model
    self.variables = variables
    self.vocab = vocab  # optional ceu_jax.data.vocab.Vocab: Generation.text = vocab.decode
    self.batch_size = batch_size  # rows per forward (the last batch is padded: one compile)
    self.query_len, self.context_len = spec.query_len, spec.context_len
    self.answer_len = spec.answer_len  # A: the most tokens a reader can produce
    self.max_len = spec.answer_len
    self._apply = jax.jit(model.apply)

  def text(self, tokens: Sequence[int]) -> str:
    if self.vocab is not None:
      return self.vocab.decode(tokens)
    return ' '.join(str(int(t)) for t in tokens)

  # -- batching ----------------------------------------------------------------
  def _arrays(self, prompts: list[ATRPrompt], ids: list) -> tuple[np.ndarray, ...]:
    for name, want in (('query', self.query_len), ('context', self.context_len),
                       ('passage_ids', self.context_len)):
      lengths = [len(getattr(p, name)) for p in prompts]
      base.check_fit(ids, lengths, want, f'{name} tokens')
      short = [i for i, n in zip(ids, lengths) if n != want]
      if short:
        raise ValueError(f'{name} of items {short[:10]} is shorter than the model\'s '
                         f'{want} tokens (pad them as the task does)')
    return tuple(np.asarray([getattr(p, f) for p in prompts], np.int32)
                 for f in ('query', 'context', 'passage_ids'))

  def _logits(self, q, c, p, answer) -> np.ndarray:
    """logits [B, A, V] in fixed-size chunks of batch_size rows (one compile)."""
    n = q.shape[0]
    bs = min(self.batch_size, 1 << (n - 1).bit_length())  # a power of 2: few compiles
    out = []
    for lo in range(0, n, bs):
      parts = [x[lo:lo + bs] for x in (q, c, p, answer)]
      k = parts[0].shape[0]
      if k < bs:  # pad the last chunk by repeating its last row (results discarded)
        parts = [np.concatenate([x, np.repeat(x[-1:], bs - k, 0)]) for x in parts]
      out.append(np.asarray(self._apply(self.variables, *parts))[:k])
    return np.concatenate(out)

  # -- Reader ----------------------------------------------------------------
  def _generate(self, prompts, forced, budget, stops, ids):
    strings, stop_ids = stops
    if strings:
      raise ValueError(f'ATR readers stop on token ids only, got stop strings {list(strings)}')
    q, c, p = self._arrays(prompts, ids)
    n, a_len = len(prompts), self.answer_len
    pre = [tuple(int(t) for t in f) for f in forced] if forced is not None else [()] * n
    base.check_fit(ids, [len(f) + budget for f in pre], a_len,
                   f'forced prefix + max_new_tokens={budget} answer slots')
    answer = np.full((n, a_len), PAD, np.int32)
    for i, f in enumerate(pre):
      answer[i, :len(f)] = f
    start = np.asarray([len(f) for f in pre])
    gen: list[list[int]] = [[] for _ in range(n)]
    done: list[Optional[base.Generation]] = [None] * n
    stop_set = set(stop_ids)
    for slot in range(int(start.min()), int(start.max()) + budget):
      rows = [i for i in range(n) if done[i] is None and start[i] <= slot]
      if not rows:
        continue
      nxt = self._logits(q, c, p, answer)[:, slot].argmax(-1)  # every row: one shape
      for i in rows:
        t = int(nxt[i])
        answer[i, slot] = t
        gen[i].append(t)
        if t in stop_set:
          done[i] = base.Generation(ids[i], self.text(gen[i][:-1]), tuple(gen[i]),
                                    base.STOP_TOKEN, t)
        elif len(gen[i]) == budget:
          done[i] = base.Generation(ids[i], self.text(gen[i]), tuple(gen[i]), base.LENGTH)
    return done

  def _loglik(self, prompts, answers, ids) -> np.ndarray:
    q, c, p = self._arrays(prompts, ids)
    ans = [tuple(int(t) for t in a) for a in answers]
    base.check_fit(ids, [len(a) for a in ans], self.answer_len, 'answer tokens')
    answer = np.full((len(ans), self.answer_len), PAD, np.int32)
    for i, a in enumerate(ans):
      answer[i, :len(a)] = a
    logits = self._logits(q, c, p, answer)
    return np.asarray(likelihood.gold_loglik(logits, answer), np.float64)
