"""Oracle readers for the mediator audit (SPEC §8.3; tests and the oracle world).

Each writes a mediator M then a decision Y (tool=True: TOOL and an argument,
the decision being C(argument)). They work with any mediated task `task` that
offers solve(prompt) (the gold M hidden in the input), decide(m),
render_mediator(m, inst), render_decision(y, tool_arg) and parse_mediator(output)
(inst = task.instance(prompt) where the task has it: a text checklist that restates
its entities)
(`ceu_jax.audits.mediator.checklist_world.ChecklistTask` does).

* `MediatorFollower`: Y = C(M) of the M at the start of its output — its own
  M̂, or the forced M* after `continue_from`; tool argument = a copy of that M.
* `GoldComputer`: Y = C(gold M) recomputed from its input, whatever M it is
  shown; tool argument = the gold M.
* `ConstantReader`: always the same M and Y (tool argument: the same M).

The first two write M̂ = the gold M except on a seeded share `p_error` of
items, where one item is flipped, and a share `p_swap`, where a 1 and a 0 item
are exchanged (M̂ ≠ gold, same C) (rng (seed, crc32(id))), so that COR and
CNF cells are populated, with C(M̂) = C(gold) and ≠ C(gold) in COR. `continue_from` returns only what follows the forced
prefix. Output is tokens or text as the task renders it; the budget counts
output elements (tokens / characters) and cuts with stop_reason 'length'.
Log-likelihood is 0 for their own full answer and `miss_loglik` otherwise.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Hashable, Optional, Sequence

import numpy as np

from ceu_jax.readers import base

ERROR_SEED = 1818


def _generation(id_: Hashable, out: Any, budget: int) -> base.Generation:
  cut = len(out) > budget
  out = out[:budget]
  if isinstance(out, str):
    return base.Generation(id_, out, (), base.LENGTH if cut else base.END)
  toks = tuple(int(t) for t in out)
  return base.Generation(id_, ' '.join(map(str, toks)), toks, base.LENGTH if cut else base.END)


class _MediatorOracle(base.Reader):
  """Shared machinery: subclasses define own_mediator() and decision()."""
  task: Any
  tool: bool
  miss_loglik: float = -30.0

  def own_mediator(self, prompt: Any, id_: Hashable) -> tuple:
    raise NotImplementedError

  def decision(self, prompt: Any, shown: tuple) -> tuple[Any, Optional[tuple]]:
    """(y, tool argument or None) given the M the reader is shown."""
    raise NotImplementedError

  def _instance(self, prompt):
    return self.task.instance(prompt) if hasattr(self.task, 'instance') else None

  def _tail(self, prompt, shown):
    y, arg = self.decision(prompt, shown)
    return self.task.render_decision(y, arg if self.tool else None, self._instance(prompt))

  def full(self, prompt, id_):
    m = tuple(self.own_mediator(prompt, id_))
    inst = self._instance(prompt)
    return self.task.render_mediator(m, inst) + self._tail(prompt, m)

  def _generate(self, prompts, forced, budget, stops, ids):
    out = []
    for k, (p, i) in enumerate(zip(prompts, ids)):
      if forced is None:
        out.append(_generation(i, self.full(p, i), budget))
      else:
        shown, _ = self.task.parse_mediator(forced[k])
        out.append(_generation(i, self._tail(p, shown), budget))
    return out

  def _loglik(self, prompts, answers, ids):
    return np.asarray([0.0 if tuple(self.full(p, i)) == tuple(a) else self.miss_loglik
                       for p, i, a in zip(prompts, ids, answers)], np.float64)


def _with_errors(gold: tuple, id_: Hashable, p_error: float, p_swap: float, seed: int) -> tuple:
  """gold, or (probability p_error) one item flipped, or (probability p_swap) a 1 and
  a 0 item exchanged (M̂ ≠ gold with the same count); rng (seed, crc32(id))."""
  rng = np.random.default_rng([seed, zlib.crc32(str(id_).encode())])
  u = rng.random()
  m = [int(x) for x in gold]
  if u < p_error:
    j = int(rng.integers(len(m)))
    m[j] = 1 - m[j]
  elif u < p_error + p_swap and 0 < sum(m) < len(m):
    ones = [j for j, x in enumerate(m) if x]
    zeros = [j for j, x in enumerate(m) if not x]
    a, b = ones[int(rng.integers(len(ones)))], zeros[int(rng.integers(len(zeros)))]
    m[a], m[b] = 0, 1
  return tuple(m)


@dataclasses.dataclass
class _ErringOracle(_MediatorOracle):
  """Its own M̂ is the gold M with seeded errors; subclasses define decision()."""
  task: Any  # the mediated task (module doc)
  tool: bool = False  # write TOOL + argument instead of the decision
  p_error: float = 0.0  # share of items whose own M̂ has one item flipped
  p_swap: float = 0.0  # share of items whose own M̂ exchanges a 1 and a 0 item (same C)
  seed: int = ERROR_SEED  # seed of those edits (with crc32(id))
  miss_loglik: float = -30.0  # log-likelihood of any answer other than its own

  def own_mediator(self, prompt, id_):
    return _with_errors(tuple(self.task.solve(prompt)), id_, self.p_error, self.p_swap, self.seed)


@dataclasses.dataclass
class MediatorFollower(_ErringOracle):
  """Y = C of the M in its output (its own, or the forced one); tool arg = that M."""

  def decision(self, prompt, shown):
    if shown is None:
      return 0, None
    return self.task.decide(shown), tuple(shown)


@dataclasses.dataclass
class GoldComputer(_ErringOracle):
  """Y = C(gold M from its input), ignoring the M it is shown; tool arg = gold M."""

  def decision(self, prompt, shown):
    gold = tuple(self.task.solve(prompt))
    return self.task.decide(gold), gold


@dataclasses.dataclass
class ConstantReader(_MediatorOracle):
  """Always M = `mediator` and Y = `y` (tool: argument = `mediator`)."""
  task: Any  # the mediated task (module doc)
  mediator: Sequence[int] = ()  # the constant M
  y: Any = 0  # the constant decision
  tool: bool = False  # write TOOL + argument instead of the decision
  miss_loglik: float = -30.0  # log-likelihood of any answer other than its own

  def own_mediator(self, prompt, id_):
    return tuple(self.mediator)

  def decision(self, prompt, shown):
    return self.y, tuple(self.mediator)
