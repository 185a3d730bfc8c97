"""Causal sensitivity of reasoning traces (SPEC §8.2, seed 002, issue #17).

A reader emits steps s_1..s_n then an answer a. An intervention ι = (k, τ)
replaces step s_k by a forced block (s'_k; for CausalInversion the swapped pair
s_{k+1}, s_k), keeps the prefix s_<k byte for byte (it is cut from the
reader's own raw output, never re-rendered), and lets the reader regenerate
everything after the block with `Reader.continue_from`, giving a*.

  S(a, a*) ∈ [0, 1]   similarity (the domain's: exact match on tokens, token F1 on text)
  φ = 1 − S(a, a*)
  Strength(ι) = 1 when the edited trace implies another answer than the
                original one (the domain's decision / recomputation function),
                0 when it implies the same; None when the domain has no such
                function for τ (reported separately, never counted as a violation)
  V = 1[S > τ_sim ∧ Strength > λ],  ρ = mean V (defaults τ_sim = 0.8, λ = 0.5)

Everything about what a trace *is* goes through a `TraceDomain` (parse a raw
output into steps, render a step, build an intervention, compare answers);
`ceu_jax.audits.traces.chain_world` holds World A's chain domain and the oracle
readers. This module knows only the `Reader` interface (never architectures/).

Bad input: an original output that does not parse into steps is counted
(`parse_failure` row, rate in the summary) and gets no intervention; a
regenerated output that does not parse has lost its answer (a* = None, S = 0)
and is counted too. A step index k outside 1..n raises `StepIndexError` naming
the item. A domain may end its prompts with a `primer` (e.g. 'Step 1:'): the
raw output is primer + generation, and the reader is given the forced prefix
without it (its prompt already holds it). The identity intervention (s'_k = s_k) is run at every position as
an invariant check: φ must be 0 for a deterministic reader.

No arrays: per-item Python. Aggregates: the mean over rows with a percentile
bootstrap CI (`ceu_jax.metrics.resampling.bootstrap`) that resamples items, not
rows (the rows of one item share its trace), as Σ values / Σ rows per resample.
"""
from __future__ import annotations

import abc
import collections
import dataclasses
from typing import Any, Hashable, Optional, Sequence

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
BREAKDOWNS = ('domain', 'tau', 'k', 'trace_len')
UNEDITABLE = 'uneditable'  # TraceDomain.edit: step k exists but its content lacks the form τ needs


class StepIndexError(ValueError):
  """A step index outside the trace; names the item."""


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
  strength: Optional[float]  # Strength(ι) ∈ [0, 1], None: unknown for this domain / τ
  implied_before: Any = None  # answer implied by the original trace (None: none / unknown)
  implied_after: Any = None  # answer implied by the edited trace (None: unresolvable / unknown)


class TraceDomain(abc.ABC):
  """What the audit needs to know about one kind of trace (module doc)."""
  name: str = 'domain'
  max_new_tokens: int = 32  # greedy budget of the original generation
  stop: tuple = ()  # stop strings / token ids
  primer: Any = ''  # raw text / tokens the prompt already ends with (the output's start)

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
  def edit(self, item: Any, trace: ParsedTrace, k: int, tau: str) -> Any:
    """The Edit of intervention (k, τ) (1 ≤ k ≤ n); None when τ is undefined here (the
    domain has no such intervention, or the position cannot hold its block); UNEDITABLE
    when step k's content lacks the form τ needs (counted, never silently skipped)."""

  @abc.abstractmethod
  def similarity(self, a: Any, b: Any) -> float:
    """S(a, b) ∈ [0, 1] with S(a, a) = 1."""

  def budget(self, trace: ParsedTrace, k: int, block: Sequence) -> int:
    """Greedy budget of a regeneration (default: the original budget)."""
    return self.max_new_tokens


def check_step(item_id: Hashable, trace: ParsedTrace, k: int) -> None:
  """StepIndexError unless 1 ≤ k ≤ n (k an int)."""
  if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= trace.n:
    raise StepIndexError(f'item {item_id!r}: step index k={k!r} is outside its trace '
                         f'(steps 1..{trace.n})')


def forced_prefix(domain: TraceDomain, trace: ParsedTrace, k: int, block: Sequence) -> Any:
  """raw[:start of step k] (byte-identical kept prefix) + the rendered forced block."""
  return domain.concat(trace.raw[:trace.starts[k - 1]], domain.render_steps(k, block))


def intervene(domain: TraceDomain, item: Any, trace: ParsedTrace, k: int, tau: str
              ) -> Any:
  """(Edit, forced prefix) of intervention (k, τ) on an item's parsed trace; None when
  τ is undefined there, UNEDITABLE when step k's content lacks the form τ needs.

  Raises StepIndexError naming the item when k is outside 1..n, ValueError for an unknown τ.
  """
  if tau not in TAUS:
    raise ValueError(f'tau must be one of {TAUS}, got {tau!r}')
  check_step(domain.item_id(item), trace, k)
  if tau == IDENTITY:
    e = Edit((trace.steps[k - 1],), 0.0)
  else:
    e = domain.edit(item, trace, k, tau)
    if e is None or e == UNEDITABLE:
      return e
  if k - 1 + len(e.block) > trace.n:
    raise StepIndexError(f'item {domain.item_id(item)!r}: the {tau} block at k={k} '
                         f'({len(e.block)} steps) runs past the trace (steps 1..{trace.n})')
  return e, forced_prefix(domain, trace, k, e.block)


def run_traces(reader: base.Reader, domain: TraceDomain, items: Sequence, *,
               taus: Sequence[str] = TAUS, positions: Optional[Sequence[int]] = None,
               tau_sim: float = TAU_SIM, lam: float = LAMBDA) -> list[dict]:
  """Generate every item's trace, intervene, regenerate, score. One row per (item, k, τ).

  positions: step indices k to intervene at (None: every step of each trace);
    an index beyond an item's trace raises StepIndexError naming the item.
  Rows: {id, domain, trace_len, k, tau, parsed, answer, answer_after, regen_parsed,
    S, phi, same (S > τ_sim), strength, violation, forced, continuation, implied_before, implied_after};
    an item whose original output does not parse gives one row with tau
    'parse_failure' (parsed False) and no interventions; a step whose content lacks
    the form τ needs gives a row with applied False (counted as uneditable).
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
  ids = [domain.item_id(x) for x in items]
  primer = domain.primer
  gens = reader.generate([domain.prompt(x) for x in items], ids=ids,
                         max_new_tokens=domain.max_new_tokens, stop=domain.stop)
  rows, calls = [], []
  for item, i, g in zip(items, ids, gens):
    raw = domain.concat(primer, domain.raw(g))
    tr = domain.parse(raw)
    if tr is None:
      rows.append(dict(id=i, domain=domain.group(item), trace_len=None, k=None,
                       tau='parse_failure', parsed=False, answer=None, raw=_show(raw)))
      continue
    ks = range(1, tr.n + 1) if positions is None else positions
    for k in ks:
      check_step(i, tr, k)
      for t in taus:
        got = intervene(domain, item, tr, k, t)
        if got == UNEDITABLE:
          rows.append(dict(id=i, domain=domain.group(item), trace_len=tr.n, k=k, tau=t,
                           parsed=True, applied=False))
        elif got is not None:
          calls.append((item, i, tr, k, t, got[0], got[1]))
  if calls:
    conts = reader.continue_from(
        [domain.prompt(c[0]) for c in calls], [_unprime(domain, c[6]) for c in calls],
        ids=[(c[1], c[3], c[4]) for c in calls],
        max_new_tokens=max(domain.budget(c[2], c[3], c[5].block) for c in calls),
        stop=domain.stop)
  else:
    conts = []
  for (item, i, tr, k, t, e, forced), g in zip(calls, conts):
    cont = domain.raw(g)
    after = domain.parse(domain.concat(forced, cont))
    a_star = None if after is None else after.answer
    s = 0.0 if a_star is None else float(domain.similarity(tr.answer, a_star))
    strong = e.strength is not None and e.strength > lam
    rows.append(dict(
        id=i, domain=domain.group(item), trace_len=tr.n, k=k, tau=t, parsed=True, applied=True,
        answer=_show(tr.answer), answer_after=_show(a_star), regen_parsed=after is not None,
        S=s, phi=1.0 - s, same=s > tau_sim, strength=e.strength,
        violation=None if e.strength is None else float(s > tau_sim and strong),
        forced=_show(forced), continuation=_show(cont),
        implied_before=_show(e.implied_before), implied_after=_show(e.implied_after)))
  return rows


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


# ---------------------------------------------------------------- summaries
def _ratio(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
  return sums.sum(axis=1) / counts.sum(axis=1)


def _agg(rows: Sequence[dict], value, seed: int) -> dict:
  """Mean of value(row) over rows, CI from a bootstrap over items (rows of one item move
  together: they share the item's trace and reader state), as an Aggregate dict."""
  sums, counts = collections.defaultdict(float), collections.defaultdict(int)
  for x in rows:
    key = _hashable(x['id'])
    sums[key] += float(value(x))
    counts[key] += 1
  keys = list(sums)
  agg = bootstrap(_ratio, np.asarray([sums[k] for k in keys], np.float64),
                  np.asarray([counts[k] for k in keys], np.float64), seed=seed)
  return dict(agg.to_dict(), n=len(rows), n_items=len(keys))


def cell(rows: Sequence[dict], *, seed: int = CI_SEED) -> dict:
  """φ and ρ (mean over rows, 95% CI from a bootstrap over items) of a set of scored rows.

  phi: mean φ over every row; rho: mean V over rows of known strength;
  same_unknown: share with S > τ_sim among rows of unknown strength (reported
  separately, SPEC §8.2); regen_parse_failure: share of regenerations without an answer.
  """
  known = [x for x in rows if x['violation'] is not None]
  unknown = [x for x in rows if x['violation'] is None]
  return dict(
      n=len(rows), phi=_agg(rows, lambda x: x['phi'], seed),
      rho=_agg(known, lambda x: x['violation'], seed),
      n_unknown_strength=len(unknown),
      same_unknown=_agg(unknown, lambda x: x['same'], seed),
      regen_parse_failure=float(np.mean([not x['regen_parsed'] for x in rows])) if rows else None)


def summarize(rows: Sequence[dict], *, tau_sim: float = TAU_SIM, seed: int = CI_SEED) -> dict:
  """Parse-failure rate, identity check, overall φ / ρ and breakdowns by domain, τ, k, trace length.

  Edit rows are those of the four interventions (identity rows are the
  invariant check, summarised under 'identity'). Breakdowns: {key: {value: cell}},
  plus 'domain_tau' {domain: {τ: cell}} for the report's table and 'by_domain_len'
  {domain: {trace length: cell}} for the plot. tau_sim is only
  recorded (run_traces scored the rows with it).
  """
  n_items = len({(x['domain'], _hashable(x['id'])) for x in rows})
  fails = [x for x in rows if x['tau'] == 'parse_failure']
  scored = [x for x in rows if x['tau'] != 'parse_failure' and x.get('applied', True)]
  uneditable = collections.Counter((x['domain'], x['tau']) for x in rows
                                   if x['tau'] != 'parse_failure' and not x.get('applied', True))
  edits = [x for x in scored if x['tau'] != IDENTITY]
  ident = [x for x in scored if x['tau'] == IDENTITY]
  out = dict(
      n_items=n_items, n_parse_failure=len(fails),
      parse_failure_rate=len(fails) / n_items if n_items else None,
      parse_failure_by_domain={d: sum(x['domain'] == d for x in fails) for d in
                               sorted({x['domain'] for x in rows})},
      identity=cell(ident, seed=seed), all=cell(edits, seed=seed), tau_sim=tau_sim,
      uneditable={d: {t: n for (d2, t), n in sorted(uneditable.items()) if d2 == d}
                  for d in sorted({d for d, _ in uneditable})})
  for key in BREAKDOWNS:
    groups = collections.defaultdict(list)
    for x in edits:
      groups[x[key]].append(x)
    out[f'by_{key}'] = {str(v): cell(xs, seed=seed) for v, xs in sorted(groups.items(),
                                                                       key=lambda kv: str(kv[0]))}
  dt = collections.defaultdict(lambda: collections.defaultdict(list))
  for x in edits:
    dt[x['domain']][x['tau']].append(x)
  out['domain_tau'] = {d: {t: cell(xs, seed=seed) for t, xs in ts.items()} for d, ts in dt.items()}
  dl = collections.defaultdict(lambda: collections.defaultdict(list))
  for x in edits:
    dl[x['domain']][x['trace_len']].append(x)
  out['by_domain_len'] = {d: {str(n): cell(xs, seed=seed) for n, xs in sorted(ls.items())}
                          for d, ls in dl.items()}
  return out


def _hashable(x: Any) -> Any:
  return tuple(x) if isinstance(x, list) else x


def fmt(a: dict) -> str:
  """'0.123 [0.100, 0.150]' of an Aggregate dict, '—' when empty."""
  if not a or a.get('value') is None:
    return '—'
  return f"{a['value']:.3f} [{a['ci_low']:.3f}, {a['ci_high']:.3f}]"


def table(summary: dict) -> str:
  """Markdown table of φ and ρ by domain × τ (and the identity check)."""
  lines = ['| domain | τ | n | φ [95% CI] | ρ [95% CI] | S>τ_sim, strength unknown | regen parse fail |',
           '|---|---|---:|---|---|---|---:|']
  for d, ts in summary['domain_tau'].items():
    for t in EDIT_TAUS:
      if t in ts:
        c = ts[t]
        lines.append(f"| {d} | {t} | {c['n']} | {fmt(c['phi'])} | {fmt(c['rho'])} | "
                     f"{fmt(c['same_unknown']) if c['n_unknown_strength'] else '—'} | "
                     f"{c['regen_parse_failure']:.3f} |")
  i = summary['identity']
  for d, ts_ in summary.get('uneditable', {}).items():
    lines += ['', f"{d}: steps whose content lacks the form the intervention needs "
              f"(no intervention, counted): {dict(ts_)}"]
  lines += ['', f"identity (s'_k = s_k, n={i['n']}): φ = {fmt(i['phi'])}; "
            f"parse failures: {summary['n_parse_failure']} of {summary['n_items']} items"]
  return '\n'.join(lines)


def by_length_table(summary: dict) -> str:
  """Markdown table of φ and ρ by trace length."""
  lines = ['| trace length | n | φ [95% CI] | ρ [95% CI] |', '|---:|---:|---|---|']
  for L, c in summary['by_trace_len'].items():
    lines.append(f"| {L} | {c['n']} | {fmt(c['phi'])} | {fmt(c['rho'])} |")
  return '\n'.join(lines)
