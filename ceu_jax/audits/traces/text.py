"""World B of the trace audit (issue #17): SmolLM2 with few-shot "Step i:" traces.

A text trace is
    Step 1: <content>
    Step 2: <content>
    Answer: <answer>
(steps numbered 1..n in order, then an "Answer:" line). Two domains:

(a) arithmetic — templated word problems of h ∈ {2, 3, 4} steps: a start
    quantity then h operations (+ n, − n, × n); step i states
    "a op n = r". Recomputation is exact: the answer implied by a (possibly
    edited) trace is the last stated result carried through the item's
    remaining operations. LogicFlip flips the step's operator (+↔−, × → +) and
    recomputes that step; FactReversal changes its result (r + δ, δ ∈ 1..3
    seeded); CausalInversion swaps steps k and k+1. Strength = 1 when the
    implied answer changes (the recomputation decides, never assumed).
(b) factual — NQ questions from the shipped data with their gold passage;
    step 1 quotes the evidence ('The passage says: "…"'). FactReversal
    replaces the answer mention in the quote by the item's swap entity
    (Strength 1: the quote now implies the swap entity); PremiseNegation
    inserts a negation (Strength unknown: reported separately, never a
    violation).
S is SQuAD-normalised exact match, else token F1 (no LLM judge offline); on
arithmetic, exact match of the integer answer (SQuAD normalisation drops '-').
A step whose content lacks the form τ needs (no "a op n = r"; a quote without
the answer) gets no intervention and is counted (`uneditable` in the summary).

No arrays: per-item Python.
"""
from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Any, Hashable, Optional, Sequence

import numpy as np

from ceu_jax.audits.traces import audit as ts
from ceu_jax.metrics.text import normalize_answer, token_f1
from ceu_jax.readers import base

_STEP = re.compile(r'(?m)^[ \t]*Step (\d+):[ \t]*(.*?)[ \t]*$')
_ANSWER = re.compile(r'(?m)^[ \t]*Answer:[ \t]*(.*?)[ \t]*$')
_ARITH = re.compile(r'^\s*(-?\d+)\s*([-+*×x])\s*(-?\d+)\s*=\s*(-?\d+)\s*\.?\s*$')
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


def similarity(a: str, b: str) -> float:
  """1 for a SQuAD-normalised exact match, else token F1."""
  if normalize_answer(a) == normalize_answer(b):
    return 1.0
  return float(token_f1(a, [b]))


class TextDomain(ts.TraceDomain):
  """Shared text handling (module doc); subclasses define items, prompts and edits."""
  stop = STOP
  primer = 'Step 1:'  # prompts end with it: the reader starts its trace

  def raw(self, g: base.Generation) -> str:
    return g.text

  def concat(self, prefix, rest):
    return prefix + rest

  def parse(self, raw):
    return parse_text(raw)

  def render_steps(self, first_index, steps):
    return render(first_index, steps)

  def similarity(self, a, b):
    return similarity(a, b)

  def item_id(self, item):
    return item.id

  # -- oracles -----------------------------------------------------------------
  def prefix_steps(self, raw: str) -> list[str]:
    return [m.group(2) for m in _STEP.finditer(raw)]

  def tail(self, first_index: int, steps: Sequence[str], answer: str) -> str:
    return render(first_index, steps) + f'Answer: {answer}'


# ---------------------------------------------------------------- arithmetic
OPS = {'+': lambda a, n: a + n, '-': lambda a, n: a - n, '*': lambda a, n: a * n}
FLIP = {'+': '-', '-': '+', '*': '+'}
_NAMES = ('Tom', 'Ana', 'Li', 'Sara', 'Omar', 'Ines', 'Ken', 'Mia')
_THINGS = ('apples', 'coins', 'books', 'stamps', 'shells', 'cards')
_SAY = {'+': '{p} gets {n} more.', '-': '{p} gives away {n}.',
        '*': 'Then the number of {t} is multiplied by {n}.'}


@dataclasses.dataclass(frozen=True)
class ArithItem:
  """One templated word problem."""
  id: str  # 'arith:<seed>:<index>'
  question: str  # the word problem
  start: int  # the start quantity
  ops: tuple[tuple[str, int], ...]  # (operator, operand) per step
  delta: int  # FactReversal offset δ (1..3)

  @property
  def results(self) -> tuple[int, ...]:
    out, cur = [], self.start
    for op, n in self.ops:
      cur = OPS[op](cur, n)
      out.append(cur)
    return tuple(out)

  @property
  def steps(self) -> tuple[str, ...]:
    prev = (self.start,) + self.results[:-1]
    return tuple(f'{a} {op} {n} = {r}' for a, (op, n), r in zip(prev, self.ops, self.results))

  @property
  def answer(self) -> str:
    return str(self.results[-1])


def make_arith_item(seed: int, index: int, hops: Sequence[int] = (2, 3, 4)) -> ArithItem:
  rng = np.random.default_rng([seed, index, 0xA817])
  h = int(hops[rng.integers(len(hops))])
  p, t = _NAMES[rng.integers(len(_NAMES))], _THINGS[rng.integers(len(_THINGS))]
  start = int(rng.integers(3, 20))
  ops, cur = [], start
  for _ in range(h):
    op = ('+', '-', '*')[rng.integers(3)]
    if op == '*' and cur > 30:
      op = '-'
    n = int(rng.integers(2, 4)) if op == '*' else int(rng.integers(2, 10))
    if op == '-' and n > cur:
      op = '+'
    ops.append((op, n))
    cur = OPS[op](cur, n)
  text = f'{p} has {start} {t}. ' + ' '.join(_SAY[o].format(p=p, n=n, t=t) for o, n in ops)
  q = f'{text} How many {t} does {p} have now?'
  return ArithItem(f'arith:{seed}:{index}', q, start, tuple(ops), int(rng.integers(1, 4)))


_NUM = re.compile(r'-?\d+')


def number_similarity(a: str, b: str) -> float:
  """Exact match of the first integers (signs kept: SQuAD normalisation would drop '-'),
  text similarity when either answer holds no integer."""
  x, y = _NUM.search(a), _NUM.search(b)
  if x is None or y is None:
    return similarity(a, b)
  return float(int(x.group()) == int(y.group()))


def parse_step(content: str) -> Optional[tuple[int, str, int, int]]:
  m = _ARITH.match(content)
  if m is None:
    return None
  op = {'×': '*', 'x': '*'}.get(m.group(2), m.group(2))
  return int(m.group(1)), op, int(m.group(3)), int(m.group(4))


def arith_implied(item: ArithItem, steps: Sequence[str]) -> Optional[str]:
  """The answer implied by steps 1..j: the last stated result through operations j+1..h."""
  j = len(steps)
  if j == 0 or j > len(item.ops):
    return None
  last = parse_step(steps[-1])
  if last is None:
    return None
  cur = last[3]
  for op, n in item.ops[j:]:
    cur = OPS[op](cur, n)
  return str(cur)


class ArithmeticDomain(TextDomain):
  """Templated multi-step arithmetic, few-shot 'Step i:' traces (module doc)."""
  name = 'arithmetic'

  def __init__(self, shots: Sequence[ArithItem], max_new_tokens: int = 96):
    self.shots = tuple(shots)
    self.max_new_tokens = max_new_tokens

  def prompt(self, item: ArithItem) -> str:
    demos = ''.join(f'Question: {s.question}\n{render(1, s.steps)}Answer: {s.answer}\n\n'
                    for s in self.shots)
    return f'{demos}Question: {item.question}\n{self.primer}'

  def similarity(self, a, b):
    return number_similarity(a, b)

  def edit(self, item, trace, k, tau):
    steps = list(trace.steps)
    if tau == ts.CAUSAL_INVERSION:
      if k >= trace.n:
        return None
      block = (steps[k], steps[k - 1])
    else:
      if tau not in (ts.LOGIC_FLIP, ts.FACT_REVERSAL):
        return None
      p = parse_step(steps[k - 1])
      if p is None:
        return ts.UNEDITABLE
      a, op, n, r = p
      if tau == ts.LOGIC_FLIP:
        op = FLIP[op]
        r = OPS[op](a, n)
      else:
        r = r + item.delta
      block = (f'{a} {op} {n} = {r}',)
    before = arith_implied(item, steps)
    after = arith_implied(item, steps[:k - 1] + list(block))
    return ts.Edit(block, float(after != before), before, after)

  def complete(self, item: ArithItem, steps: Sequence[str]) -> str:
    """Trace-following continuation (oracles): recompute from the last given step."""
    j = len(steps)
    if j == 0:
      return self.tail(1, item.steps, item.answer)
    last = parse_step(steps[-1])
    cur = None if last is None else last[3]
    rest = []
    for op, n in item.ops[j:]:
      if cur is None:
        break
      new = OPS[op](cur, n)
      rest.append(f'{cur} {op} {n} = {new}')
      cur = new
    return self.tail(j + 1, rest, 'unknown' if cur is None else str(cur))


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
      return ts.UNEDITABLE  # the quote mentions neither the answer nor the gold
    if tau == ts.PREMISE_NEGATION:
      return ts.Edit((negate(step),), None)
    return None  # LogicFlip / CausalInversion: not defined on a one-quote trace

  def complete(self, item: FactItem, steps: Sequence[str]) -> str:
    """Oracle continuation: the answer the quote states (swap, gold, else 'unknown')."""
    if not steps:
      return self.tail(1, [quote(item.evidence)], item.answer)
    last = steps[-1].lower()
    a = (item.swap if item.swap.lower() in last else
         item.answer if item.answer.lower() in last else 'unknown')
    return self.tail(len(steps) + 1, [], a)


# ---------------------------------------------------------------- the world
class SmolLM2World:
  """World B for the job: SmolLM2 reading both domains."""
  title = 'World B: SmolLM2-135M-Instruct, few-shot "Step i:" traces'
  readers = ('smollm2',)

  def __init__(self, config):
    s = config.smollm2
    for d in s.domains:
      if d not in ('arithmetic', 'factual'):
        raise ValueError(f"smollm2.domains: {d!r} is not one of ('arithmetic', 'factual')")
    if int(s.n_shots) < 1:
      raise ValueError(f'smollm2.n_shots must be >= 1, got {s.n_shots!r}')
    if int(s.max_new_tokens) < 8:
      raise ValueError(f'smollm2.max_new_tokens must be >= 8, got {s.max_new_tokens!r}')
    self.s, n, seed = s, int(config.n_items), int(config.seed)
    self.items, self.domains = {}, {}
    budget = int(s.max_new_tokens)
    if 'arithmetic' in s.domains:
      # demonstrations of different lengths (2, 3, 4, 2, … steps): traces need not copy one length
      shots = [make_arith_item(seed + 7919, i, hops=(2 + i % 3,)) for i in range(int(s.n_shots))]
      self.domains['arithmetic'] = ArithmeticDomain(shots, budget)
      self.items['arithmetic'] = [make_arith_item(seed, i) for i in range(n)]
    if 'factual' in s.domains:
      shots = select_fact_items(int(s.n_shots), seed=seed + 7919, split='train',
                                max_passage_words=40)
      self.domains['factual'] = FactualDomain(shots, budget)
      self.items['factual'] = select_fact_items(n, seed=seed, split=s.split,
                                                max_passage_words=int(s.max_passage_words))

  def prepare(self, workdir, log):
    pass

  def reader(self, name):
    from ceu_jax import readers
    return readers.from_config(self.s)

  def describe(self) -> str:
    return ('SmolLM2-135M-Instruct (%s layers), plain few-shot prompts (%d solved '
            'demonstrations) with "Step i:" traces. Arithmetic: templated 2–4-step problems, '
            'Strength by exact recomputation (LogicFlip, FactReversal, CausalInversion). '
            'Factual: NQ items with their gold passage, step 1 quotes the evidence; '
            'FactReversal puts the swap entity in the quote (Strength 1), PremiseNegation '
            'inserts a negation (Strength unknown, reported separately). S is exact match, '
            'else token F1: there is no LLM judge offline.'
            % (self.s.n_layers or 'all 30', self.s.n_shots))
