"""World A of the mediator audit: the checklist ATR task as a `MediatedTask` (issue #18).

The data (`ceu_jax.data.checklist`) has the exact gold mediator M (one YES /
NO per claim) and C = the number of YES. Here it is seen the way the audit
(`ceu_jax.audits.mediator.audit`) sees every task:

  prompt           an ATRPrompt (query, context, passage ids)
  output           the reader's generated tokens
  mode             `cfg.tool` (the answer layout of `ceu_jax.data.checklist`): plain
                   `M Y`, tool `M TOOL arg`; `with_tool(tool)` gives the task of the
                   other mode (the same instances); the audit's `tool` must agree
                   (ValueError otherwise)
  forced prefix    M* as r YES / NO tokens, ending at the decision cue (SPEC §8.3):
                   plain: nothing more (the count slot follows at once); tool: the
                   TOOL token, so the continuation is the argument alone
  parse_mediator   the first r tokens, each YES or NO (else unparseable); tool: then
                   the cue TOOL (the rest after it; None without it: no cue)
  parse_decision   plain: one count token N0 … ALL; tool: r YES / NO tokens after
                   the cue, the decision being C(argument) (executed here)

`solve(prompt)` recomputes the gold M from a prompt (claim j holds iff the
context binds the query's ID and claim j's KEY to claim j's VALUE): the
oracle readers use it as "the gold hidden in the input".
No shapes: per-item Python.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from ceu_jax.data import checklist
from ceu_jax.data.checklist import ChecklistConfig, Example

# Bumped when the tool mode's forced prefix changes (part of the mediator job's record,
# so units forced the earlier way are not resumed). 2: M* then the TOOL cue (600df61).
TOOL_PREFIX_VERSION = 2


@dataclasses.dataclass(frozen=True)
class ChecklistTask:
  """The checklist world for the audit (module doc); `cfg.tool` is ignored (per call)."""
  cfg: ChecklistConfig  # the world's data config (layout, vocabulary, r)

  @property
  def vocab(self):
    return self.cfg.vocab

  @property
  def r(self) -> int:
    return self.cfg.r

  @property
  def tool(self) -> bool:
    return bool(self.cfg.tool)

  def with_tool(self, tool: bool) -> 'ChecklistTask':
    """This task in the mode `tool` (instances, prompts and gold do not depend on it)."""
    if bool(tool) == self.tool:
      return self
    return dataclasses.replace(self, cfg=dataclasses.replace(self.cfg, tool=bool(tool)))

  def _mode(self, tool: bool) -> None:
    if bool(tool) != self.tool:
      raise ValueError(f'audited with tool={bool(tool)} on a checklist task of cfg.tool='
                       f'{self.tool}: use task.with_tool({bool(tool)})')

  # -- instances -----------------------------------------------------------
  def instances(self, n: int, seed: int, split: str = 'test') -> list[Example]:
    """n test examples (gold answers), batch 0 of (seed, split)."""
    return [checklist.example(self.cfg, seed, split, 0, i) for i in range(n)]

  def prompt(self, inst: Example):
    from ceu_jax.readers.atr import ATRPrompt
    return ATRPrompt(inst.query, inst.context, tuple(int(p) for p in checklist.passage_ids(self.cfg)))

  def gold(self, inst: Example) -> tuple[int, ...]:
    return tuple(inst.gold)

  def decide(self, m: Sequence[int], inst: Any = None) -> int:
    return checklist.decide(m)

  def item_values(self, m, inst) -> list[tuple[int, int]]:
    return [(0, 1)] * len(m)

  # -- rendering / parsing ---------------------------------------------------
  def mediator_tokens(self, m: Sequence[int]) -> tuple[int, ...]:
    v = self.vocab
    return tuple(v.yes if int(x) else v.no for x in m)

  def render_mediator(self, m: Sequence[int], inst: Any = None) -> tuple[int, ...]:
    """M's tokens and the decision cue (tool: TOOL; plain: none) — the forced prefix."""
    return self.mediator_tokens(m) + ((self.vocab.tool,) if self.tool else ())

  def render_decision(self, y: int, tool_arg: Optional[Sequence[int]] = None,
                      inst: Any = None) -> tuple[int, ...]:
    """What follows the cue: the count token of y, or the argument's tokens (inst: unused)."""
    if tool_arg is not None:
      return self.mediator_tokens(tool_arg)
    return (self.vocab.count(int(y)),)

  def output(self, generation) -> tuple[int, ...]:
    return tuple(int(t) for t in generation.tokens)

  def _items(self, toks: Sequence[int]) -> Optional[tuple[int, ...]]:
    v = self.vocab
    if len(toks) != self.r or any(t not in (v.yes, v.no) for t in toks):
      return None
    return tuple(int(t == v.yes) for t in toks)

  def parse_mediator(self, output: Sequence[int]):
    """(M or None, the rest after M and the cue: tool mode, None when TOOL does not follow)."""
    output = tuple(output)
    m, rest = self._items(output[:self.r]), output[self.r:]
    if self.tool:
      rest = rest[1:] if rest[:1] == (self.vocab.tool,) else None
    return m, rest

  def parse_decision(self, rest: Optional[Sequence[int]], inst: Any, tool: bool):
    """(Ŷ, argument) from what follows the cue (a generation's rest, or the continuation
    after a forced prefix): tool: the first r tokens as the argument, Ŷ = C(arg)."""
    self._mode(tool)
    if not rest:
      return None, None
    rest = tuple(rest)
    if tool:
      arg = self._items(rest[:self.r])
      return (None, None) if arg is None else (self.decide(arg, inst), arg)
    return self.vocab.count_of(rest[0]), None

  def generate_kwargs(self, tool: bool) -> dict:
    self._mode(tool)
    return dict(max_new_tokens=2 * self.r + 1 if tool else self.r + 1, stop=())

  def continue_kwargs(self, tool: bool) -> dict:
    """After the forced cue: the r argument tokens (tool) or the count token."""
    self._mode(tool)
    return dict(max_new_tokens=self.r if tool else 1, stop=())

  # -- the gold hidden in the input (oracles) --------------------------------
  def solve(self, prompt) -> tuple[int, ...]:
    """Gold M recomputed from the prompt's query and context."""
    v, q, ctx = self.vocab, tuple(prompt.query), tuple(prompt.context)
    q_id = q[2]
    bound = {}
    for s in checklist.line_starts(self.cfg):
      line = ctx[s:s + checklist.LINE_LEN]
      if line[0] == v.tok('ID') and line[1] == q_id:
        bound[line[3]] = line[5]
    claims = [(q[4 + j], q[5 + self.r + j]) for j in range(self.r)]  # query layout: data.checklist
    return tuple(int(bound.get(k) == val) for k, val in claims)
