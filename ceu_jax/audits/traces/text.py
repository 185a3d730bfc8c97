"""World B of the trace audit (issues #17, #32): text traces, and the factual domain.

A text trace is
    Step 1: <content>
    Step 2: <content>
    Answer: <answer>
(steps numbered 1..n in order, then an "Answer:" line). Two domains:

(a) arithmetic — `ceu_jax.audits.traces.arithmetic` (templated word problems; the
    implied answer from the trace's own stated steps);
(b) factual — NQ questions from the shipped data with their gold passage;
    step 1 quotes the evidence ('The passage says: "…"'). FactReversal
    replaces the answer mention in the quote by the item's swap entity
    (Strength 1: the quote now implies the swap entity); PremiseNegation
    inserts a negation (Strength unknown: reported separately, never a
    violation).
    The follow rate compares a* with the swap entity (SQuAD-normalised exact match).
S is SQuAD-normalised exact match, else token F1 (no LLM judge offline); on
arithmetic, exact match of the integer answer (SQuAD normalisation drops '-').
A step whose content lacks the form τ needs (a quote that mentions neither the
model's answer nor the gold) gets no intervention and is counted by reason
(`undefined` in the summary).

No arrays: per-item Python.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import zlib
from fractions import Fraction
from typing import Optional, Sequence

from ceu_jax.audits.traces import audit as ts
from ceu_jax.metrics.text import normalize_answer
from ceu_jax.readers import base

_STEP = re.compile(r'(?m)^[ \t]*Step (\d+):[ \t]*(.*?)[ \t]*$')
_ANSWER = re.compile(r'(?m)^[ \t]*Answer:[ \t]*(.*?)[ \t]*$')
STOP = ('\n\n', 'Question:', 'Passage:')


def parse_text(raw: str) -> Optional[ts.ParsedTrace]:
  """Steps 1..n (numbered in order) then an 'Answer:' line; None otherwise."""
  steps, starts, end = [], [], 0
  for m in _STEP.finditer(raw):
    if int(m.group(1)) != len(steps) + 1 or not m.group(2):
      break
    steps.append(m.group(2))
    starts.append(m.start())
    end = m.end()
  if not steps:
    return None
  a = _ANSWER.search(raw, end)
  if a is None or not a.group(1) or raw[end:a.start()].strip():
    return None
  return ts.ParsedTrace(raw, tuple(steps), tuple(starts), a.group(1))


def render(first_index: int, steps: Sequence[str]) -> str:
  return ''.join(f'Step {first_index + i}: {s}\n' for i, s in enumerate(steps))


def exact_similarity(a: str, b: str) -> Fraction:
  """1 for a SQuAD-normalised exact match, else token F1 = 2·common / (|a| + |b|) (the
  2PR / (P + R) of `token_f1`, SQuAD tokens) as an exact fraction: compared with τ_sim
  without float rounding (at F1 = 4/5 the float 2PR / (P + R) falls on either side of 0.8)."""
  x, y = normalize_answer(a), normalize_answer(b)
  if x == y:
    return Fraction(1)
  p, g = x.split(), y.split()
  common = sum((collections.Counter(p) & collections.Counter(g)).values())
  return Fraction(2 * common, len(p) + len(g)) if common else Fraction(0)


def similarity(a: str, b: str) -> float:
  """1 for a SQuAD-normalised exact match, else token F1 (`exact_similarity` as a float)."""
  return float(exact_similarity(a, b))


class TextDomain(ts.TraceDomain):
  """Shared text handling (module doc); subclasses define items, prompts and edits."""
  stop = STOP
  primer = 'Step 1:'  # prompts end with it: the reader starts its trace
  is_text = True

  def raw(self, g: base.Generation) -> str:
    return g.text

  def cut(self, g: base.Generation) -> bool:
    """A text output the token budget ended (no stop string): its answer may be cut off."""
    return g.stop_reason == base.LENGTH

  def concat(self, prefix, rest):
    return prefix + rest

  def parse(self, raw):
    return parse_text(raw)

  def render_steps(self, first_index, steps):
    return render(first_index, steps)

  def step_end(self, trace, k):
    """The start of step k+1's line, or for k = n the end of step n's own line (its
    newline included): the reader's bytes, whatever their spacing."""
    if k < trace.n:
      return trace.starts[k]
    nl = trace.raw.find('\n', trace.starts[k - 1])
    return len(trace.raw) if nl < 0 else nl + 1

  def similarity(self, a, b):
    return similarity(a, b)

  def exact_similarity(self, a, b):
    return exact_similarity(a, b)

  def item_id(self, item):
    return item.id

  # -- oracles -----------------------------------------------------------------
  def prefix_steps(self, raw: str) -> list[str]:
    return [m.group(2) for m in _STEP.finditer(raw)]

  def tail(self, first_index: int, steps: Sequence[str], answer: str) -> str:
    return render(first_index, steps) + f'Answer: {answer}'


# ---------------------------------------------------------------- factual
@dataclasses.dataclass(frozen=True)
class FactItem:
  """One NQ question with its gold passage and swap entity."""
  id: str  # example id, e.g. 'nq:00002'
  question: str  # the question
  answer: str  # the gold answer
  passage: str  # the gold passage (sentences joined)
  evidence: str  # the evidence sentence (it mentions the answer)
  swap: str  # the swap entity (shipped data: same type, another item's answer)


def _question(q: str) -> str:
  q = q.strip()
  return q if q.endswith('?') else q + '?'


def quote(evidence: str) -> str:
  return f'The passage says: "{evidence}"'


def select_fact_items(n: int, *, seed: int, split: str = 'test', max_passage_words: int = 80,
                      exclude: Sequence[str] = ()) -> list[FactItem]:
  """n NQ items of `split` whose evidence mentions the answer once and whose swap differs."""
  from ceu_jax.data.factqa import storage
  passages = storage.read_passages()
  out = []
  pool = sorted((e for e in storage.read_examples()
                 if e['source'] == 'nq' and e['split'] == split and e['id'] not in exclude),
                key=lambda e: zlib.crc32(f'{seed}:{e["id"]}'.encode()))
  for e in pool:
    sents = passages[e['passage_id']]['sentences']
    text = ' '.join(sents)
    ev = e['evidence']
    if (len(text.split()) > max_passage_words or e['evidence'].lower().count(e['answer'].lower()) != 1
        or normalize_answer(e['swap']) == normalize_answer(e['answer'])):
      continue
    out.append(FactItem(e['id'], _question(e['question']), e['answer'], text, ev, e['swap']))
    if len(out) == n:
      return out
  raise ValueError(f'only {len(out)} NQ {split} items with passages of <= '
                   f'{max_passage_words} words qualify; need {n}')


_AUX = re.compile(r'\b(is|was|are|were|has|had|does|did|can|will)\b', re.I)


def negate(content: str) -> str:
  """Insert a negation: 'The passage says' → 'The passage does not say'; else 'not' after
  the first auxiliary verb; else 'It is not true that …'."""
  if content.startswith('The passage says'):
    return 'The passage does not say' + content[len('The passage says'):]
  m = _AUX.search(content)
  if m:
    return content[:m.end()] + ' not' + content[m.end():]
  return 'It is not true that ' + content[0].lower() + content[1:]


class FactualDomain(TextDomain):
  """Factual questions with the gold passage; step 1 quotes the evidence (module doc)."""
  name = 'factual'
  taus = (ts.FACT_REVERSAL, ts.PREMISE_NEGATION)  # LogicFlip / CausalInversion: no meaning

  def __init__(self, shots: Sequence[FactItem], max_new_tokens: int = 96):
    self.shots = tuple(shots)
    self.max_new_tokens = max_new_tokens

  def prompt(self, item: FactItem) -> str:
    demos = ''.join(f'Passage: {s.passage}\nQuestion: {s.question}\n'
                    f'Step 1: {quote(s.evidence)}\nAnswer: {s.answer}\n\n' for s in self.shots)
    return f'{demos}Passage: {item.passage}\nQuestion: {item.question}\n{self.primer}'

  def edit(self, item, trace, k, tau):
    step = trace.steps[k - 1]
    if tau == ts.FACT_REVERSAL:
      for mention in (trace.answer, item.answer):
        at = step.lower().find(mention.lower()) if len(mention.strip()) >= 2 else -1
        if at >= 0:
          block = (step[:at] + item.swap + step[at + len(mention):],)
          return ts.Edit(block, 1.0, mention, item.swap)
      return ts.Undefined('no_answer_mention')  # the quote mentions neither answer nor gold
    return ts.Edit((negate(step),), None)  # PremiseNegation: no recomputation (unknown)

  def complete(self, item: FactItem, steps: Sequence[str]) -> str:
    """Oracle continuation: the answer the quote states (swap, gold, else 'unknown')."""
    if not steps:
      return self.tail(1, [quote(item.evidence)], item.answer)
    last = steps[-1].lower()
    a = (item.swap if item.swap.lower() in last else
         item.answer if item.answer.lower() in last else 'unknown')
    return self.tail(len(steps) + 1, [], a)
