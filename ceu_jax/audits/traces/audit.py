"""Causal sensitivity of reasoning traces (SPEC §8.2, seed 002, issues #17, #32).

A reader emits steps s_1..s_n then an answer a. An intervention ι = (k, τ)
replaces step s_k by a forced block (s'_k; for CausalInversion the swapped pair
s_{k+1}, s_k), keeps the prefix s_<k byte for byte (it is cut from the
reader's own raw output, never re-rendered), and lets the reader regenerate
everything after the block with `Reader.continue_from`, giving a*.

  S(a, a*) ∈ [0, 1]   similarity (the domain's: exact match on tokens, token F1 on text)
  φ = 1 − S(a, a*)
  Strength(ι) = 1 when the edited trace implies another answer than the
                original one (the domain's decision / recomputation function),
                0 when it implies the same; None (*unknown*, counted by reason)
                when the domain has no such function for τ or the trace's steps
                cannot be aligned to the task's operations — never a violation
  V = 1[S ≥ τ_sim ∧ Strength > λ],  ρ = mean V (defaults τ_sim = 0.8, λ = 0.5); S ≥ τ_sim
                is SPEC §8.2's offline rule, compared exactly (`at_least`: S as a
                fraction, τ_sim as the decimal it is written as)
  follow = 1[a* = the answer the edited trace implies] (`TraceDomain.same_answer`),
                over interventions whose implied answer is known: it separates
                "the answer followed the trace" from "the answer changed"

Parse failures are counted, never scored: an original output that does not
parse into steps + answer, or that the token budget cut short (`TraceDomain.cut`:
its answer may be incomplete), gives one `parse_failure` row and no intervention;
a regeneration that does not parse or was cut short (`regen_parsed` False) has S, φ, V and
follow None and is left out of φ, ρ and the follow rate — its rate is a column
of every summary cell. The former convention (an unparseable regeneration is a
changed answer, S = 0) survives only as the labelled sensitivity columns
`phi_unparsed_as_changed` / `rho_unparsed_as_changed`. An intervention that is
undefined for an item (`TraceDomain.edit` returns `Undefined(reason)`: the
last step has no successor to swap with, a step lacks the form τ needs, …)
gives a row with applied False and its reason, counted by reason; τ a domain
never defines (`TraceDomain.taus`) are not run at all.

A step index k < 1 or not an integer raises `StepIndexError` naming the item (so does
`intervene` at k > n); in `run_traces` a given position beyond an item's trace (k > n:
the number of steps is the reader's choice) is undefined for it ('beyond_trace', counted
by reason, for every τ). A domain
may end its prompts with a `primer` (e.g. 'Step 1:'): the raw output is primer +
generation, and the reader is given the forced prefix without it (its prompt
already holds it). For text outputs the kept prefix goes back to a reader with a
token view as its own tokens (`Reader.prefix_tokens`), the forced block as text. The identity intervention (s'_k = s_k) is run at every
position as an invariant check: φ must be 0 for a greedy reader, and its row
says whether the regenerated output is identical to the original (`identical`). Its
forced prefix is the reader's own raw output through the end of step k
(`TraceDomain.step_end`; its own tokens for a reader with a token view), never a
re-rendering of the parsed step: s'_k = s_k byte for byte.

No arrays: per-item Python. Aggregates: the mean over rows with a percentile
bootstrap CI (`ceu_jax.metrics.resampling.bootstrap`, the function `mean_ci`
wraps) that resamples items, not rows (the rows of one item share its trace),
as Σ values / Σ rows per resample (= `mean_ci` when every item has one row).
"""
from __future__ import annotations

import abc
import collections
import dataclasses
from fractions import Fraction
from typing import Any, Hashable, Optional, Sequence, Union

import numpy as np

from ceu_jax.metrics.resampling import bootstrap
from ceu_jax.readers import base

IDENTITY = 'identity'
LOGIC_FLIP = 'logic_flip'
FACT_REVERSAL = 'fact_reversal'
PREMISE_NEGATION = 'premise_negation'
CAUSAL_INVERSION = 'causal_inversion'
TAUS = (IDENTITY, LOGIC_FLIP, FACT_REVERSAL, PREMISE_NEGATION, CAUSAL_INVERSION)
EDIT_TAUS = TAUS[1:]  # the four interventions of SPEC §8.2 (identity is the invariant check)
TAU_SIM = 0.8  # SPEC §8.2 default τ_sim
LAMBDA = 0.5  # SPEC §8.2 default λ
CI_SEED = 42  # SPEC §8 bootstrap seed
# Bumped when a unit's rows under the same config change (part of the job's record, so a
# run's units scored under earlier rules are not resumed). 2 (review 823): S ≥ τ_sim
# exact; chain Strength from the same-extent prefix, unknown past the chain; one budget
# per regeneration; positions past a trace counted; the identity forces the reader's bytes.
# 3: a chain regeneration has the original's budget (its step count may change, SPEC §8.2),
# not exactly the original's remaining length.
RULES_VERSION = 3
BREAKDOWNS = ('domain', 'tau', 'k', 'trace_len')
NO_RECOMPUTATION = 'no_recomputation'  # Strength unknown: the domain has no function for τ


class StepIndexError(ValueError):
  """A step index outside the trace; names the item."""


@dataclasses.dataclass(frozen=True)
class Undefined:
  """An intervention that is undefined for an item, with the reason (counted, never scored)."""
  reason: str


UNEDITABLE = Undefined('uneditable')  # step k exists but its content lacks the form τ needs
LAST_STEP = Undefined('last_step')  # CausalInversion at k = n: no step k+1 to swap with
BEYOND_TRACE = Undefined('beyond_trace')  # a given position k > n: the item's trace is shorter


@dataclasses.dataclass(frozen=True)
class ParsedTrace:
  """A raw output split into steps and an answer, with where each starts in the raw output."""
  raw: Any  # the raw output (str, or a tuple of token ids)
  steps: tuple  # s_1..s_n (step contents: strings or token ids)
  starts: tuple[int, ...]  # offset in `raw` where step i's rendering begins (i = 1..n)
  answer: Any  # a (string or token tuple)

  @property
  def n(self) -> int:
    return len(self.steps)


@dataclasses.dataclass(frozen=True)
class Edit:
  """An intervention's forced block and its strength."""
  block: tuple  # the steps forced at positions k, k+1, ... (1 step, 2 for causal inversion)
  strength: Optional[float]  # Strength(ι) ∈ [0, 1], None: unknown (see unknown_reason)
  implied_before: Any = None  # answer implied by the original trace (World A, arithmetic: its
  #   prefix of the edited prefix's extent) (None: none / unknown)
  implied_after: Any = None  # answer implied by the edited trace (None: unresolvable / unknown)
  unknown_reason: Optional[str] = None  # why strength is None (default NO_RECOMPUTATION)


class TraceDomain(abc.ABC):
  """What the audit needs to know about one kind of trace (module doc)."""
  name: str = 'domain'
  taus: tuple = EDIT_TAUS  # the interventions this domain defines (others are never run)
  max_new_tokens: int = 32  # greedy budget of the original generation
  stop: tuple = ()  # stop strings / token ids
  primer: Any = ''  # raw text / tokens the prompt already ends with (the output's start)
  is_text: bool = False  # raw outputs are text (generation.text): kept parts go back as tokens

  @abc.abstractmethod
  def item_id(self, item: Any) -> Hashable:
    """The item's unique id."""

  @abc.abstractmethod
  def prompt(self, item: Any) -> Any:
    """The reader's prompt for the item."""

  def group(self, item: Any) -> str:
    """The reporting domain of an item (e.g. 'arithmetic'); default: the domain's name."""
    return self.name

  @abc.abstractmethod
  def raw(self, generation: base.Generation) -> Any:
    """The raw output of a generation (text, or tokens without the stop token)."""

  @abc.abstractmethod
  def concat(self, prefix: Any, rest: Any) -> Any:
    """prefix followed by rest (string or token concatenation)."""

  @abc.abstractmethod
  def parse(self, raw: Any) -> Optional[ParsedTrace]:
    """Steps and answer of a raw output; None when it does not parse."""

  @abc.abstractmethod
  def render_steps(self, first_index: int, steps: Sequence) -> Any:
    """The raw rendering of `steps` placed at positions first_index, first_index+1, …"""

  @abc.abstractmethod
  def edit(self, item: Any, trace: ParsedTrace, k: int, tau: str) -> Union[Edit, Undefined]:
    """The Edit of intervention (k, τ) (1 ≤ k ≤ n, τ in `taus`); `Undefined(reason)` when
    it is undefined for this item (counted by reason, never silently skipped)."""

  @abc.abstractmethod
  def similarity(self, a: Any, b: Any) -> float:
    """S(a, b) ∈ [0, 1] with S(a, a) = 1."""

  def exact_similarity(self, a: Any, b: Any) -> Fraction:
    """S(a, b) as an exact fraction, compared with τ_sim (`at_least`); default: the float S
    (exact for a domain whose S is 0 or 1; a domain with token F1 overrides it)."""
    return Fraction(self.similarity(a, b))

  def implied_answer(self, implied: Any) -> Any:
    """The answer an implied value stands for (compared with a*); None: unknown."""
    return implied

  def same_answer(self, a: Any, b: Any) -> bool:
    """Whether two answers are the same answer (the follow rate's equality): S = 1."""
    return self.similarity(a, b) == 1.0

  def cut(self, generation: base.Generation) -> bool:
    """Whether a generation was cut short (its answer may be incomplete: a parse failure,
    'cut_by_budget'); default: never (a domain whose budget is exact by construction)."""
    return False

  def step_end(self, trace: ParsedTrace, k: int) -> int:
    """Offset in `trace.raw` where step k's raw text ends (the identity intervention forces
    raw[:step_end]): the start of step k+1, or for k = n the end of step n's rendering
    (a text domain overrides it: the end of step n's own line)."""
    if k < trace.n:
      return trace.starts[k]
    return trace.starts[k - 1] + len(self.render_steps(k, trace.steps[k - 1:k]))

  def implied_by(self, item: Any, trace: ParsedTrace) -> Any:
    """The answer the whole original trace implies (the rows' `implied_trace`: is the reader's
    answer its own trace's?); default None (not computed)."""
    return None

  def budget(self, trace: ParsedTrace, k: int, block: Sequence) -> int:
    """Greedy budget of a regeneration (default: the original budget)."""
    return self.max_new_tokens


def at_least(s: Fraction, tau_sim: float) -> bool:
  """S ≥ τ_sim, exactly: SPEC §8.2's offline rule ('token F1 ≥ τ_sim'), with τ_sim read as
  the decimal it is written as (0.8 = 4/5), so an F1 of exactly 4/5 is ≥ 0.8 whatever the
  rounding of its float."""
  return Fraction(s) >= Fraction(str(tau_sim))


def _is_index(k: Any) -> bool:
  return isinstance(k, (int, np.integer)) and not isinstance(k, bool)


def check_step(item_id: Hashable, trace: ParsedTrace, k: int) -> None:
  """StepIndexError unless 1 ≤ k ≤ n (k an int)."""
  if not _is_index(k) or not 1 <= k <= trace.n:
    raise StepIndexError(f'item {item_id!r}: step index k={k!r} is outside its trace '
                         f'(steps 1..{trace.n})')


def forced_prefix(domain: TraceDomain, trace: ParsedTrace, k: int, block: Sequence) -> Any:
  """raw[:start of step k] (byte-identical kept prefix) + the rendered forced block."""
  return domain.concat(trace.raw[:trace.starts[k - 1]], domain.render_steps(k, block))


def intervene(domain: TraceDomain, item: Any, trace: ParsedTrace, k: int, tau: str
              ) -> Union[tuple, Undefined]:
  """(Edit, forced prefix) of intervention (k, τ) on an item's parsed trace;
  `Undefined(reason)` when it is undefined for the item ('not_in_domain' for a τ the
  domain does not define).

  Raises StepIndexError naming the item when k is outside 1..n, ValueError for an unknown τ.
  """
  if tau not in TAUS:
    raise ValueError(f'tau must be one of {TAUS}, got {tau!r}')
  check_step(domain.item_id(item), trace, k)
  if tau == IDENTITY:   # the reader's own raw output through step k, never a re-rendering
    return Edit((trace.steps[k - 1],), 0.0), trace.raw[:domain.step_end(trace, k)]
  if tau not in domain.taus:
    return Undefined('not_in_domain')
  e = domain.edit(item, trace, k, tau)
  if e is None:
    e = Undefined('undefined')
  if isinstance(e, Undefined):
    return e
  if k - 1 + len(e.block) > trace.n:
    raise StepIndexError(f'item {domain.item_id(item)!r}: the {tau} block at k={k} '
                         f'({len(e.block)} steps) runs past the trace (steps 1..{trace.n})')
  return e, forced_prefix(domain, trace, k, e.block)


def run_traces(reader: base.Reader, domain: TraceDomain, items: Sequence, *,
               taus: Sequence[str] = TAUS, positions: Optional[Sequence[int]] = None,
               tau_sim: float = TAU_SIM, lam: float = LAMBDA) -> list[dict]:
  """Generate every item's trace, intervene, regenerate, score. One row per (item, k, τ).

  positions: step indices k to intervene at (None: every step of each trace); an index
    beyond an item's trace (k > n: the reader chose fewer steps) gives rows with applied
    False and undefined 'beyond_trace' for every τ (counted by reason); k < 1 or a
    non-integer raises StepIndexError naming the item, duplicates ValueError (caller bugs).
  τ outside `domain.taus` (identity aside) are not run.
  Rows: {id, domain, trace_len, k, tau, parsed, applied, answer, answer_after,
    regen_parsed, regen_failure (reason), S, phi, same (S ≥ τ_sim, exact), strength, strong (Strength > λ),
    strength_unknown (reason), violation, follows, identical (identity rows: the
    regenerated output equals the original), forced, continuation, implied_before,
    implied_after, implied_trace (`TraceDomain.implied_by`)}; S, φ, same, violation and follows are None when the regeneration
    does not parse. An item whose original output does not parse gives one row with
    tau 'parse_failure' (parsed False, `parse_failure` = 'no_trace' or 'cut_by_budget':
    `TraceDomain.cut`) and no interventions; an intervention that is
    undefined for the item gives a row with applied False and `undefined` = its reason.
  """
  for t in taus:
    if t not in TAUS:
      raise ValueError(f'taus: {t!r} is not one of {TAUS}')
  if not 0.0 <= tau_sim <= 1.0:
    raise ValueError(f'tau_sim must lie in [0, 1], got {tau_sim!r}')
  if not 0.0 <= lam <= 1.0:
    raise ValueError(f'lam (λ) must lie in [0, 1], got {lam!r}')
  if positions is not None and len(set(positions)) != len(tuple(positions)):
    raise ValueError(f'positions must be distinct step indices, got {tuple(positions)}')
  items = list(items)
  if not items:
    return []
  taus = [t for t in taus if t == IDENTITY or t in domain.taus]
  ids = [domain.item_id(x) for x in items]
  primer = domain.primer
  gens = reader.generate([domain.prompt(x) for x in items], ids=ids,
                         max_new_tokens=domain.max_new_tokens, stop=domain.stop)
  rows, calls = [], []
  for n_item, (item, i, g) in enumerate(zip(items, ids, gens)):
    raw = domain.concat(primer, domain.raw(g))
    tr = None if domain.cut(g) else domain.parse(raw)
    if tr is None:
      rows.append(dict(id=i, domain=domain.group(item), trace_len=None, k=None,
                       tau='parse_failure', parsed=False, answer=None, raw=_show(raw),
                       parse_failure='cut_by_budget' if domain.cut(g) else 'no_trace'))
      continue
    ks = range(1, tr.n + 1) if positions is None else positions
    for k in ks:
      if _is_index(k) and k > tr.n:   # a position this item's trace does not reach: counted
        rows.extend(dict(id=i, domain=domain.group(item), trace_len=tr.n, k=k, tau=t,
                         parsed=True, applied=False, undefined=BEYOND_TRACE.reason)
                    for t in taus)
        continue
      check_step(i, tr, k)
      for t in taus:
        got = intervene(domain, item, tr, k, t)
        if isinstance(got, Undefined):
          rows.append(dict(id=i, domain=domain.group(item), trace_len=tr.n, k=k, tau=t,
                           parsed=True, applied=False, undefined=got.reason))
        else:
          calls.append((item, i, tr, k, t, got[0], got[1], n_item))
  conts = _regenerate(reader, domain, gens, calls)
  for (item, i, tr, k, t, e, forced, _), g in zip(calls, conts):
    rows.append(_score(domain, item, i, tr, k, t, e, forced, g, tau_sim, lam))
  return rows


def _regenerate(reader: base.Reader, domain: TraceDomain, gens: Sequence[base.Generation],
                calls: Sequence[tuple]) -> list:
  """The regeneration of every call, in call order, each under its own budget
  (`TraceDomain.budget`): one `continue_from` per distinct budget, so an item's rows never
  depend on which items share its chunk."""
  by_budget: dict = {}
  for j, c in enumerate(calls):
    by_budget.setdefault(int(domain.budget(c[2], c[3], c[5].block)), []).append(j)
  conts: list = [None] * len(calls)
  for budget, js in sorted(by_budget.items()):
    got = reader.continue_from(
        [domain.prompt(calls[j][0]) for j in js],
        [_reader_prefix(reader, domain, gens[calls[j][7]], *calls[j][2:5], calls[j][6])
         for j in js],
        ids=[(calls[j][1], calls[j][3], calls[j][4]) for j in js],
        max_new_tokens=budget, stop=domain.stop)
    for j, g in zip(js, got):
      conts[j] = g
  return conts


def _score(domain, item, i, tr, k, t, e, forced, g, tau_sim, lam) -> dict:
  """The row of one applied intervention (run_traces documents the fields)."""
  cont = domain.raw(g)
  full = domain.concat(forced, cont)
  cut = domain.cut(g)
  after = None if cut else domain.parse(full)
  ok = after is not None
  a_star = after.answer if ok else None
  s_exact = domain.exact_similarity(tr.answer, a_star) if ok else None
  s = None if s_exact is None else float(s_exact)
  same = None if s_exact is None else at_least(s_exact, tau_sim)
  known = e.strength is not None
  strong = e.strength > lam if known else None
  implied = domain.implied_answer(e.implied_after)
  return dict(
      id=i, domain=domain.group(item), trace_len=tr.n, k=k, tau=t, parsed=True, applied=True,
      answer=_show(tr.answer), answer_after=_show(a_star), regen_parsed=ok,
      regen_failure=None if ok else ('cut_by_budget' if cut else 'no_answer'),
      S=s, phi=None if s is None else float(1 - s_exact), same=same,
      strength=e.strength, strong=strong,
      strength_unknown=None if known else (e.unknown_reason or NO_RECOMPUTATION),
      violation=float(same and strong) if ok and known else None,
      follows=(bool(domain.same_answer(a_star, implied)) if ok and implied is not None
               else None),
      identical=(full == tr.raw) if t == IDENTITY else None,
      forced=_show(forced), continuation=_show(cont),
      implied_before=_show(e.implied_before), implied_after=_show(e.implied_after),
      implied_trace=_show(domain.implied_by(item, tr)))


def _reader_prefix(reader: base.Reader, domain: TraceDomain, g: base.Generation,
                   trace: ParsedTrace, k: int, tau: str, forced: Any) -> Any:
  """The forced prefix as the reader gets it: without the primer its prompt already ends
  with and, where the reader has a token view (`Reader.prefix_tokens`) of a text output,
  with the kept part given back as the reader's own tokens — re-tokenising its text could
  hand it other tokens than it wrote. The identity intervention's whole prefix is the
  reader's own raw output through step k (`intervene`), given as its own tokens where a
  token boundary falls at its end (else the kept part as tokens, step k as its own text)."""
  text = _unprime(domain, forced)
  if not domain.is_text:
    return text
  p = len(domain.primer)
  if tau == IDENTITY:
    own = reader.prefix_tokens(g, len(forced) - p)
    if own is not None:
      return own
  cut = trace.starts[k - 1] - p  # chars of the generation kept before step k
  kept = reader.prefix_tokens(g, cut) if cut > 0 else None
  if kept is None:
    return text
  return list(kept) + [text[cut:]]


def _unprime(domain: TraceDomain, forced: Any) -> Any:
  """The forced prefix as the reader gets it: without the primer its prompt already ends with."""
  n = len(domain.primer)
  if forced[:n] != domain.primer:
    raise AssertionError('a forced prefix must start with the primer')  # raw starts with it
  return forced[n:]


def _show(x: Any) -> Any:
  """JSON-able form of an answer / raw output (token tuples become lists)."""
  if isinstance(x, tuple):
    return [int(t) if isinstance(t, (int, np.integer)) else t for t in x]
  return x
