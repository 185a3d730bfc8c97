"""World B of the answer-presence audit: SmolLM2 on Natural Questions / SQuAD items (issue #16).

Items: the shipped factual-QA examples of one split (`ceu_jax.data.factqa`),
alternating sources, in a seeded order, with a gold passage of at most
`max_passage_words` words. Raw context C: the gold passage and
`n_distractors` passages of other items of the same source (same length
limit), shuffled, one passage per line; with probability η the gold passage
is replaced by one more distractor. Draws are seeded by (seed, crc32(id)).

Rewriters (each maps (C, q) to a compile c; every one is conditioned on q
except the control):
  A  (B2)  extractive: the `k` sentences of C with the highest content-word
           overlap with q (ties: earlier first), in their order in C;
  B  (B3)  the reader model itself, prompted to compress C for q (greedy,
           ≤ `rewrite_max_new_tokens` new tokens);
  B4       A's compile verified by B (SPEC §8.1): each of its sentences is kept
           when the reader model answers yes to whether it helps answer q
           (`verify_with_model`; SmolLM2-135M answers no to every one, so its B4
           compiles are empty: docs/answer_presence.md);
  control  question-blind: the first `k` sentences of C (reported as answer
           containment only).
Content words: lower-cased word characters, minus a fixed stop-word list.
The reader prompt is fixed: `n_shots` solved demonstrations, then
"Context: c / Question: q? / Answer with a short phrase."; the answer is the
generation up to its first newline.
"""
from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Any, Sequence

import numpy as np

from ceu_jax.audits.answer_presence import audit as ap

BASELINES = ('B1', 'B2', 'B3', 'B4')
REWRITER_NAMES = {'B1': 'raw context', 'B2': 'A (extractive)', 'B3': 'B (SmolLM2 compress)',
                  'B4': 'A verified by B', 'control': 'first sentences (question-blind)'}
INSTRUCTION = 'Answer with a short phrase.'
REWRITE_INSTRUCTION = ('Rewrite the context as at most two short sentences that keep the '
                       'facts needed to answer the question.')
STOPWORDS = frozenset((
    'a an the and or but if of to in on at by for with from as is are was were be been being '
    'it its this that these those there here what which who whom whose when where why how '
    'do does did done has have had having not no yes i you he she we they them his her their '
    'our your my me him us than then so such can could would should will shall may might '
    'must about into over after before under between during through up down out off again '
    'also only just more most other some any each all both few many much very s t').split())
_WORDS = re.compile(r'\w+')
_SENT = re.compile(r'(?<=[.!?])\s+')


def content_words(text: str) -> set[str]:
  """Lower-cased word tokens that are not stop words."""
  return {w for w in _WORDS.findall(text.lower()) if w not in STOPWORDS}


def sentences(text: str) -> list[str]:
  """Sentences of a text: split after . ! ? and at line breaks."""
  out = []
  for line in text.split('\n'):
    out += [s.strip() for s in _SENT.split(line) if s.strip()]
  return out


@dataclasses.dataclass(frozen=True)
class Item:
  """One question with its raw context."""
  id: str  # example id (e.g. 'nq:01234')
  source: str  # nq | squad
  question: str  # the question q
  answer: str  # the gold answer
  raw: str  # raw context C: one passage per line
  gold_in_raw: bool  # the gold passage is one of the raw passages (not missed)


def _words(passage: dict) -> int:
  return len(' '.join(passage['sentences']).split())


def select_items(n: int, *, seed: int, sources: Sequence[str], split: str,
                 max_passage_words: int, n_distractors: int, eta: float) -> list[Item]:
  """n items alternating over `sources` (module doc)."""
  from ceu_jax.data.factqa import storage
  examples = [e for e in storage.read_examples() if e['split'] == split]
  passages = storage.read_passages()

  def key(e):
    return zlib.crc32(f'{seed}:{e["id"]}'.encode())
  pools, dpool = {}, {}
  for src in sources:
    ok = sorted((e for e in examples if e['source'] == src
                 and _words(passages[e['passage_id']]) <= max_passage_words), key=key)
    pools[src] = ok
    dpool[src] = sorted({e['passage_id'] for e in ok})
  per = [n // len(sources) + (k < n % len(sources)) for k in range(len(sources))]
  for src, want in zip(sources, per):
    if len(pools[src]) < want:
      raise ValueError(f'{src} has only {len(pools[src])} {split} items with passages of '
                       f'<= {max_passage_words} words; need {want}')
  items = []
  for k in range(max(per)):
    for src, want in zip(sources, per):
      if k >= want:
        continue
      e = pools[src][k]
      rng = np.random.default_rng([seed, zlib.crc32(e['id'].encode())])
      others = [p for p in dpool[src] if p != e['passage_id']]
      picks = [others[j] for j in rng.choice(len(others), n_distractors + 1, replace=False)]
      missed = bool(rng.random() < eta)
      chosen = picks if missed else [e['passage_id']] + picks[:n_distractors]
      order = rng.permutation(len(chosen))
      raw = '\n'.join(' '.join(passages[chosen[j]]['sentences']) for j in order)
      items.append(Item(e['id'], src, e['question'], e['answer'], raw, not missed))
  return items


# ---------------------------------------------------------------- rewriters
def extractive(raw: str, question: str, k: int) -> str:
  """Rewriter A: the k sentences of raw with the highest content-word overlap with q."""
  sents = sentences(raw)
  q = content_words(question)
  ranked = sorted(range(len(sents)), key=lambda i: (-len(q & content_words(sents[i])), i))
  return ' '.join(sents[i] for i in sorted(ranked[:k]))


def first_sentences(raw: str, k: int) -> str:
  """The question-blind control rewriter: the first k sentences of raw."""
  return ' '.join(sentences(raw)[:k])


VERIFY_INSTRUCTION = ('Does the sentence state a fact that helps answer the question? '
                      'Answer yes or no.')


def verify_prompt(sentence: str, question: str) -> list:
  """B4's verification question for one sentence of A's compile (one ChatML user turn)."""
  return [('user', f'Question: {_question(question)}\nSentence: {sentence.strip()}\n'
                   f'{VERIFY_INSTRUCTION}')]


def verify_with_model(reader, items: Sequence[Item], compiles: Sequence[str]) -> list[str]:
  """B4 (SPEC §8.1): A's compile, then a verification pass by rewriter B (the reader
  model): each sentence of the compile is kept when B answers 'yes' to whether it helps
  answer the question. A compile with no kept sentence is empty (counted by the audit's
  skips, beside every baseline mean)."""
  asks, owner = [], []
  for j, (it, comp) in enumerate(zip(items, compiles)):
    for k, sent in enumerate(sentences(comp)):
      asks.append(verify_prompt(sent, it.question))
      owner.append((j, k, sent))
  kept: list[list[str]] = [[] for _ in items]
  if asks:
    gens = reader.generate(asks, max_new_tokens=2, stop=('\n',),
                           ids=[f'{items[j].id}/{k}' for j, k, _ in owner])
    for (j, _, sent), g in zip(owner, gens):
      if g.text.strip().lower().startswith('yes'):
        kept[j].append(sent)
  return [' '.join(x) for x in kept]


def rewrite_prompt(raw: str, question: str) -> list:
  """The prompt of rewriter B (one ChatML user message)."""
  q = _question(question)
  return [('user', f'Context:\n{raw}\n\nQuestion: {q}\n{REWRITE_INSTRUCTION}')]


def rewrite_with_model(reader, items: Sequence[Item], max_new_tokens: int) -> list[str]:
  """Rewriter B: the reader model's greedy compression of each raw context."""
  gens = reader.generate([rewrite_prompt(it.raw, it.question) for it in items],
                         max_new_tokens=max_new_tokens, stop=(), ids=[it.id for it in items])
  return [' '.join(g.text.split()) for g in gens]


# ---------------------------------------------------------------- reader prompt
def _question(q: str) -> str:
  q = q.strip()
  q = q[0].upper() + q[1:] if q else q
  return q if q.endswith('?') else q + '?'


def user_text(context: str, question: str) -> str:
  return f'Context: {context}\n\nQuestion: {_question(question)}\n{INSTRUCTION}'


def select_shots(n: int, *, seed: int, max_words: int = 40) -> list[dict]:
  """n solved demonstrations from the train split (short passages, alternating sources)."""
  from ceu_jax.data.factqa import storage
  passages = storage.read_passages()
  pool = sorted((e for e in storage.read_examples() if e['split'] == 'train'
                 and 12 <= _words(passages[e['passage_id']]) <= max_words
                 and len(e['answer'].split()) <= 4),
                key=lambda e: zlib.crc32(f'{seed}:{e["id"]}'.encode()))
  by = {}
  for e in pool:
    by.setdefault(e['source'], []).append(e)
  srcs = sorted(by)
  out = []
  for k in range(n):
    e = by[srcs[k % len(srcs)]][k // len(srcs)]
    out.append(dict(id=e['id'], question=e['question'], answer=e['answer'],
                    context=' '.join(passages[e['passage_id']]['sentences'])))
  return out


def make_prompt_fn(shots: Sequence[dict], chat: bool = True):
  """(context, question) -> the reader's prompt (messages in chat mode, else text)."""
  shots = [dict(s) for s in shots]

  def prompt(context: str, question: str) -> Any:
    if chat:
      msgs = []
      for s in shots:
        msgs += [('user', user_text(s['context'], s['question'])), ('assistant', s['answer'])]
      return msgs + [('user', user_text(context, question))]
    demos = ''.join(f"{user_text(s['context'], s['question'])}\nAnswer: {s['answer']}\n\n"
                    for s in shots)
    return f'{demos}{user_text(context, question)}\nAnswer:'
  return prompt


def records(items: Sequence[Item], compiles: dict[str, Sequence[str]]) -> dict[str, list]:
  """Audit records per baseline: B1 = raw, B2..B4 = the compiles."""
  out = {'B1': [ap.Record(it.id, it.question, (it.answer,), it.raw, it.raw) for it in items]}
  for b in ('B2', 'B3', 'B4'):
    out[b] = [ap.Record(it.id, it.question, (it.answer,), c, it.raw)
              for it, c in zip(items, compiles[b])]
  return out
