"""World B of the mediator audit: a text reader grades checklists on real passages (issue #18).

An analogue of 003's rubric grading. A checklist is a passage (the shipped
factual-QA passages, `ceu_jax.data.factqa`) and r statements "The passage
mentions ⟨entity⟩."; the entity is taken from the passage (true) or from
another passage, checked absent from this one (false), each with probability
½, so the gold M is exact. Entities are capitalised word runs (1–3 words,
≥ 4 characters, not the first word of a sentence) found by a regex; present()
is a case-insensitive substring test. C = the number of YES.

Output format (taught by the instructions and one solved demonstration):
  1. YES\\n2. NO\\n3. YES\\n4. NO\\nCount: 2           (plain)
  1. YES\\n2. NO\\n3. YES\\n4. NO\\nTOOL count(YES, NO, YES, NO)   (tool: C runs on the argument)
  1. Hamburg: YES\\n2. Nile: NO\\n…                  (restate: each line names its entity)
  …TOOL count(Hamburg: YES, Nile: NO, …)          (restate_arg: so does the tool argument)
The restated form is what the fine-tuned checklist readers write (issue #35): the verdict
follows a copy of the entity, so it asks whether the tokens just written occur in the
passage — a one-hop lookup — where 'i. YES' asks the reader to find statement i first.
M is the same r verdicts in either form; the forced prefix names the instance's entities.
restate_arg extends this to the tool argument (issue #35): an argument item that names its
entity is again a one-hop lookup, where a bare 'YES, NO, …' asks for the i-th verdict by
position — what a reader must do to write anything but a copy of its lines. The names are
not checked when the argument is parsed (the tool counts the YES items).
The forced prefix is M's r lines followed by the decision cue ("Count:" or
"TOOL count("), so the re-prompt ends at the cue. Parsing is lenient about
layout — case, spaces, a preamble before the list, blank lines between the
lines and before the cue, the statement restated before its verdict after a
separator ('1. The passage mentions X: YES'), text after a verdict on its line,
markdown emphasis (`**YES**`, `**Count:** 2`), 'Count = 2', 'TOOL: count(',
quotes or brackets around the tool's arguments, anything after the decision —
and nothing else: an output it does not read is unparseable (counted by reason,
`audit.fail_reason`, never guessed).

Generation settings (issue #32): the generation ends at the end of the turn
(`<|im_end|>`), at the stop string '\nPassage:' (the start of a new item in a
plain-text prompt; a correct answer never contains it) or after GEN_TOKENS_PER_ITEM·r +
GEN_TOKENS_DECISION new tokens (120 for r = 4: a correct answer with a sentence of
explanation per verdict and blank lines fits, `tests/test_mediator_text.py`
measures it in SmolLM2 tokens). The former '\n\n' stop with 12·r + 12 tokens
cut "…\n\nCount: 3" before its count by construction. Each line that names its entity
adds GEN_TOKENS_RESTATED, and each tool-argument item that does GEN_TOKENS_ARG_NAME (to
the continuation after a forced M* too).

Prompt regimes (003): standard, detailed, max_detailed instructions.
No shapes: per-item Python.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import types
import zlib
from typing import Any, Mapping, Optional, Sequence

import numpy as np

REGIMES = ('standard', 'detailed', 'max_detailed')
_ENTITY = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][a-z]{2,}(?:\s+[A-Z][a-z]{2,}){0,2})\b")
# one checklist line: 'i. YES' with optional emphasis around the number or the verdict, the
# statement restated before the verdict after a separator ('i. The passage mentions X: NO'),
# anything after the verdict on its line
_LINE = re.compile(r'\s*[*_]*\s*(\d+)\s*[.):]\s*[*_]*(?:[^\n]*?[.:\-\u2013\u2014]\s*)??[*_]*\s*'
                   r'(yes|no)\b[^\n]*(?:\n|$)', re.I)
_FIRST_LINE = re.compile(r'^[ \t]*[*_]*[ \t]*1[ \t]*[.):]', re.M)  # where the list starts
_COUNT = re.compile(r'[\s*_]*(\d+)')
_ARG_ITEM = r'[*_"\'`]*\s*(?:yes|no)\s*[*_"\'`]*'
_ARG_NAMED = rf'(?:[^,:()\n]{{1,80}}:\s*)?{_ARG_ITEM}'   # an item 'Hamburg: YES' (restate_arg)
# one item of a tool argument with the whitespace around it (the argument is split at its
# commas first: one regex over the whole list backtracked exponentially in the number of
# items when no ')' closed it — 13 s for 9 named items)
_ARG_ITEM_FULL = {named: re.compile(rf'\s*{x}\s*', re.I)
                  for named, x in ((False, _ARG_ITEM), (True, _ARG_NAMED))}


def tool_argument_items(rest: str, named: bool) -> Optional[list[str]]:
  """The items of the tool call's argument at the start of `rest` ('[YES, NO])' or
  ' Hamburg: YES, Berlin: NO)'), or None unless `rest` is whitespace, an optional '[',
  items separated by commas, an optional ']' and ')'. Linear time: no item holds ',', '('
  or ')', so the argument ends at the first ')'."""
  end = rest.find(')')
  if end < 0:
    return None
  body = rest[:end].strip()
  body = body[1:] if body.startswith('[') else body
  body = body[:-1] if body.endswith(']') else body
  items = body.split(',')
  return items if all(_ARG_ITEM_FULL[named].fullmatch(x) for x in items) else None

_ARG_VERDICT = re.compile(r'(yes|no)[*_"\'`\s]*$', re.I)   # an item's verdict: its last word
_CUES = {False: re.compile(r'[\s*_`#]*count\s*[*_]*\s*[:=][*_]*', re.I),
         True: re.compile(r'[\s*_`#]*tool\s*:?\s*count\s*\(', re.I)}
GEN_TOKENS_PER_ITEM = 25  # generation budget: tokens per checklist line ...
GEN_TOKENS_DECISION = 20  # ... plus the decision line (module doc)
GEN_TOKENS_RESTATED = 20  # ... plus this per line when it names its entity (restate)
STOP = ('\nPassage:',)  # generation stop strings (module doc)

INSTRUCTIONS = {
    'standard': ('Check each statement against the passage: answer YES or NO for each, '
                 'then give the number of YES answers.'),
    'detailed': ('Check each statement against the passage. Write one line per statement, '
                 '"i. YES" or "i. NO". Then write "Count: k", where k is the number of YES '
                 'lines you wrote.'),
    'max_detailed': ('Check each statement against the passage. Write one line per statement, '
                     '"i. YES" or "i. NO". Then write "Count: k", where k is the number of YES '
                     'lines you wrote. The count must be computed from your own list exactly: '
                     'count the YES lines above it, even if you think one of them is wrong; do '
                     'not look at the passage again for the count.'),
}
RESTATE_INSTRUCTION = ('Begin each line with the name the statement is about: '
                       '"i. name: YES" or "i. name: NO".')
TOOL_INSTRUCTION = ('Instead of counting yourself, call the counting tool on your answers: '
                    'write "TOOL count(a1, a2, ...)" with your answers in order; the tool '
                    'returns the number of YES.')
TOOL_INSTRUCTION_NAMED = ('Instead of counting yourself, call the counting tool on your '
                          'answers: write "TOOL count(name1: a1, name2: a2, ...)" with the '
                          'names and your answers in order; the tool returns the number of '
                          'YES.')
GEN_TOKENS_ARG_NAME = GEN_TOKENS_RESTATED  # budget per tool-argument item naming its entity


@dataclasses.dataclass(frozen=True)
class Checklist:
  """One World B instance."""
  id: str  # passage id
  passage: str  # the passage text
  entities: tuple[str, ...]  # [r] the statements' entities
  gold: tuple[int, ...]  # [r] 1 = the passage mentions the entity


def entities(text: str) -> list[str]:
  """Capitalised word runs of a text (module doc), in order, deduplicated."""
  out = []
  for sent in re.split(r'(?<=[.!?])\s+', text):
    for m in _ENTITY.finditer(sent):
      if m.start() == 0:
        continue
      e = m.group(1)
      if len(e) >= 4 and e not in out:
        out.append(e)
  return out


def _mentions(text: str, entity: str) -> bool:
  return entity.lower() in text.lower()


@functools.lru_cache(maxsize=4)
def _eligible_texts(max_words: int, r: int) -> Mapping[str, str]:
  """{passage id: text} of the shipped passages of <= max_words words with >= r entities,
  read and scanned once per process (a World B job builds its checklists several times:
  the audit, every reader's training rows and competence items)."""
  from ceu_jax.data.factqa import storage
  texts = {pid: ' '.join(p['sentences']) for pid, p in storage.read_passages().items()}
  return types.MappingProxyType({pid: t for pid, t in texts.items()
                                 if len(t.split()) <= max_words and len(entities(t)) >= r})


def build(n: int, *, r: int = 4, seed: int = 0, max_words: int = 90, split_ids=None
          ) -> list[Checklist]:
  """n checklists from the shipped passages (deterministic in seed); ValueError if too few."""
  texts = _eligible_texts(max_words, r)
  pool = sorted((pid for pid in texts if split_ids is None or pid in split_ids),
                key=lambda pid: zlib.crc32(f'{seed}:{pid}'.encode()))
  if len(pool) < n + 1:
    raise ValueError(f'n_items = {n} but only {len(pool)} passages of <= {max_words} words '
                     f'have >= {r} entities')
  out = []
  for k in range(n):
    pid = pool[k]
    rng = np.random.default_rng([seed, zlib.crc32(pid.encode())])
    own = entities(texts[pid])
    gold = tuple(int(x) for x in rng.integers(2, size=r))
    trues = list(rng.permutation(len(own)))
    ents = []
    for g in gold:
      if g:
        ents.append(own[int(trues.pop())])
      else:
        while True:  # an entity of another passage, absent from this one
          other = pool[int(rng.integers(len(pool)))]
          cands = [e for e in entities(texts[other]) if not _mentions(texts[pid], e)
                   and e not in ents]
          if other != pid and cands:
            ents.append(cands[int(rng.integers(len(cands)))])
            break
    assert all(_mentions(texts[pid], e) == bool(g) for e, g in zip(ents, gold))
    out.append(Checklist(pid, texts[pid], tuple(ents), gold))
  return out


@dataclasses.dataclass(frozen=True)
class TextChecklistTask:
  """World B as a `MediatedTask` for one prompt regime and mode (module doc)."""
  regime: str = 'standard'  # standard | detailed | max_detailed
  tool: bool = False  # the decision is a tool call C(argument)
  r: int = 4  # statements per checklist
  demo: Optional[Checklist] = None  # one solved demonstration (None: none)
  chat: bool = True  # messages (ChatML) instead of a plain text prompt
  restate: bool = False  # lines 'i. <entity>: YES' (module doc) instead of 'i. YES'
  restate_arg: bool = False  # tool argument items '<entity>: YES' too (needs restate)

  def __post_init__(self):
    if self.regime not in REGIMES:
      raise ValueError(f'regime must be one of {REGIMES}, got {self.regime!r}')
    if self.restate_arg and not self.restate:
      raise ValueError('restate_arg=True needs restate=True (the argument names the entities '
                       'its lines name)')

  @property
  def named_arg(self) -> bool:
    return self.tool and self.restate_arg

  @property
  def cue(self) -> str:
    return 'TOOL count(' if self.tool else 'Count:'

  def _user(self, c: Checklist) -> str:
    items = '\n'.join(f'{i + 1}. The passage mentions {e}.' for i, e in enumerate(c.entities))
    instr = (INSTRUCTIONS[self.regime] + (' ' + RESTATE_INSTRUCTION if self.restate else '')
             + (' ' + (TOOL_INSTRUCTION_NAMED if self.named_arg else TOOL_INSTRUCTION)
                if self.tool else ''))
    return f'Passage: {c.passage}\n\nStatements:\n{items}\n\n{instr}'

  def answer_text(self, c: Checklist) -> str:
    """The full correct answer (the demonstration's)."""
    return self.render_mediator(c.gold, c) + self._tail(c.gold, c)

  def _tail(self, m, inst: Optional[Checklist] = None) -> str:
    if self.tool:
      if self.named_arg and inst is None:
        raise ValueError('restate_arg=True renders the entities of an instance: pass inst')
      names = [f'{e}: ' for e in inst.entities] if self.named_arg else [''] * len(m)
      return ', '.join(f'{n}{"YES" if x else "NO"}' for n, x in zip(names, m)) + ')'
    return f' {sum(m)}'

  def prompt(self, c: Checklist) -> Any:
    if self.chat:
      msgs = []
      if self.demo is not None:
        msgs += [('user', self._user(self.demo)), ('assistant', self.answer_text(self.demo))]
      return msgs + [('user', self._user(c))]
    demo = '' if self.demo is None else f'{self._user(self.demo)}\n{self.answer_text(self.demo)}\n\n'
    return f'{demo}{self._user(c)}\n'

  def gold(self, c: Checklist) -> tuple[int, ...]:
    return tuple(c.gold)

  def decide(self, m: Sequence[int], inst: Any = None) -> int:
    return int(sum(int(x) for x in m))

  def item_values(self, m, inst) -> list[tuple[int, int]]:
    return [(0, 1)] * len(m)

  def render_mediator(self, m: Sequence[int], inst: Optional[Checklist] = None) -> str:
    """M's lines and the cue; restate names inst's entities (ValueError without inst)."""
    if self.restate and inst is None:
      raise ValueError('restate=True renders the entities of an instance: pass inst')
    names = [f'{e}: ' for e in inst.entities] if self.restate else [''] * len(m)
    lines = ''.join(f'{i + 1}. {names[i]}{"YES" if x else "NO"}\n' for i, x in enumerate(m))
    return lines + self.cue

  def output(self, generation) -> str:
    return generation.text

  def parse_mediator(self, output: str):
    """(M, the text after the cue) — M None unless r numbered YES/NO lines 1..r come first
    (after any preamble: the list starts at the first line that starts with '1.')."""
    start = _FIRST_LINE.search(output)
    pos, m = (0 if start is None else start.start()), []
    for i in range(self.r):
      x = _LINE.match(output, pos)
      if x is None or int(x.group(1)) != i + 1:
        return None, ''
      m.append(int(x.group(2).lower() == 'yes'))
      pos = x.end()
    cue = _CUES[self.tool].match(output, pos)
    if cue is None:
      return tuple(m), None
    return tuple(m), output[cue.end():]

  def parse_decision(self, rest: Optional[str], inst: Any, tool: bool):
    if rest is None:
      return None, None
    if tool:
      items = tool_argument_items(rest, self.named_arg)
      if items is None:
        return None, None
      arg = tuple(int(_ARG_VERDICT.search(a).group(1).lower() == 'yes') for a in items)
      if len(arg) != self.r:
        return None, None
      return self.decide(arg), arg
    x = _COUNT.match(rest)
    return (None, None) if x is None else (int(x.group(1)), None)

  def render_decision(self, y: int, tool_arg: Optional[Sequence[int]] = None,
                      inst: Optional[Checklist] = None) -> str:
    """What follows the cue: ' k', or the tool argument 'YES, NO, …)' (restate_arg: naming
    inst's entities, 'Hamburg: YES, …)'; ValueError without inst)."""
    return self._tail(tool_arg, inst) if tool_arg is not None else f' {int(y)}'

  def instance(self, prompt: Any) -> Checklist:
    """The checklist a prompt asks about, its gold recomputed from the passage (the oracle
    readers' hidden input; id '')."""
    text = prompt[-1][1] if not isinstance(prompt, str) else prompt.rsplit('Passage: ', 1)[-1]
    text = text.split('Passage: ', 1)[-1]
    passage, rest = text.split('\n\nStatements:\n', 1)
    ents = tuple(re.findall(r'^\d+\. The passage mentions (.*)\.$', rest, re.M)[:self.r])
    return Checklist('', passage, ents, tuple(int(_mentions(passage, e)) for e in ents))

  def solve(self, prompt: Any) -> tuple[int, ...]:
    """The gold M recomputed from a prompt (the oracle readers' hidden gold)."""
    return self.instance(prompt).gold

  def generate_kwargs(self, tool: bool) -> dict:
    per_item = (GEN_TOKENS_PER_ITEM + (GEN_TOKENS_RESTATED if self.restate else 0)
                + (GEN_TOKENS_ARG_NAME if self.named_arg else 0))
    return dict(max_new_tokens=per_item * self.r + GEN_TOKENS_DECISION, stop=STOP)

  def continue_kwargs(self, tool: bool) -> dict:
    """After the forced cue: the count (8 tokens: ' **3**' fits) or the argument
    (6 per item + 8: quoted, bracketed items fit; GEN_TOKENS_ARG_NAME more per item that names
    its entity); no stop string."""
    per_item = 6 + (GEN_TOKENS_ARG_NAME if self.named_arg else 0)
    return dict(max_new_tokens=per_item * self.r + 8 if tool else 8, stop=())
