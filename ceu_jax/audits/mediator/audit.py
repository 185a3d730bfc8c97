"""Faithfulness to an intermediate structure (SPEC §8.3, seed 003, issue #18).

Input X, mediator M (a structure of r items), decision Y, a known
deterministic C with Y = C(M) (C may also read X). The reader generates M̂ then
Ŷ. One intervention per instance:
  COR  when M̂ ≠ gold m (whole structures; an unparseable M̂ is ≠ m): M* = m;
  CNF  when M̂ = m: M* = a minimal seeded edit of M̂ with C(M*) ≠ C(M̂) (the
       fewest changed items; among those, one drawn by rng (SEED, crc32(id)),
       so rows do not depend on the order or the batch). An M̂ that no edit can
       move to another decision is skipped with reason 'no_edit_changes_C'.
The reader is re-prompted with the same input and M* forced as the start of
its own output (`Reader.continue_from`); the continuation is parsed into Ŷ*.

  F_ID      = mean 1[C(M̂) = Ŷ]
  F_Strong  = mean 1[C(M̂) = Ŷ ∧ C(M*) = Ŷ*]   (≤ F_ID row by row)
  Δ         = F_ID − F_Strong (paired bootstrap CI)
  COR / CNF consistency = mean 1[C(M*) = Ŷ*] within COR / CNF (a cell with
            fewer than MIN_CELL instances is reported as absent, with its n).
Tool-externalised variant (tool=True): the reader writes M, a tool call and its
argument; the decision is exec(arg) = C(arg), so Ŷ = C(arg), Ŷ* = C(arg*)
(Δ^tool: the argument as the reader wrote it). Beside it, on the same rows, the
own-M̂ regime (003 §6.1: the tool reads the reader's own mediator): when the
reader's call parses, the tool runs on M̂ (on M* after the intervention) instead
of the written argument, so Ŷ_own = C(M̂), Ŷ*_own = C(M*):
  F_ID_own = mean 1[M̂ and the call parse], F_Strong_own also requires the
  call after M* to parse, Δ_own = F_ID_own − F_Strong_own.
Δ_own is 0 except for calls that stop parsing after the intervention: it is
what externalising C can give at best, and Δ^tool − Δ_own is the part of the
gap that comes from an argument that does not copy the mediator.
Unparseable M̂, Ŷ or Ŷ* count as inconsistent; their rates are reported, and
each failure gets one reason (`fail_reason`, first that applies):
  cut_budget   the output reached the token budget (stop_reason 'length')
  cut_stop     a stop string ended it
  no_mediator  it ended by itself (end of turn) without the r items of M
  no_cue       M is there but the decision cue (e.g. 'Count:') is not
  no_decision  the cue is there (or, for tokens, M was) but no decision parses
(the continuation Ŷ* after a forced M* can only fail as cut_budget, cut_stop or
no_decision). With a budget and stop strings under which every correct layout
parses (World B: tests/test_mediator_text.py), the first two are the reader's.

What a task *is* (tokens or text, which C) goes through a `MediatedTask`
(Protocol below; World A: `ceu_jax.audits.mediator.checklist_world`). The audit itself
only sees the task and a `ceu_jax.readers.base.Reader`; it never imports
`architectures/` or training.

Every rate: percentile bootstrap 95% CI, 1000 resamples, seed 42 (SPEC §8),
through `ceu_jax.metrics.resampling`. No shapes: everything here is per-row.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import zlib
from typing import Any, Hashable, Optional, Protocol, Sequence

import numpy as np

from ceu_jax.audits.answer_presence.audit import CI_SEED, fmt
from ceu_jax.metrics.resampling import EMPTY, Aggregate, fmt_ci, mean_ci, paired_difference_ci
from ceu_jax.readers.base import LENGTH, STOP_STRING

EDIT_SEED = 3003  # CNF edit rng = (EDIT_SEED, crc32(str(id)))
MIN_CELL = 10  # SPEC §8.3: COR / CNF cells with fewer instances are dropped
COR, CNF, SKIP = 'COR', 'CNF', 'skip'
SKIP_REASONS = ('no_edit_changes_C',)
FAIL_REASONS = ('no_mediator', 'no_cue', 'no_decision', 'cut_budget', 'cut_stop')
Mediator = tuple  # a structure of r items (World A: 0/1 per claim)


class MediatedTask(Protocol):
  """What the audit needs to know about a mediated task (module doc)."""

  def prompt(self, inst: Any) -> Any:
    """The reader's item (input X) of an instance."""

  def gold(self, inst: Any) -> Mediator:
    """The gold mediator m of an instance."""

  def decide(self, m: Mediator, inst: Any) -> Hashable:
    """C(m) (may read X)."""

  def item_values(self, m: Mediator, inst: Any) -> Sequence[Sequence[Any]]:
    """The values each item of m may take (the CNF edit space)."""

  def render_mediator(self, m: Mediator, inst: Any = None) -> Any:
    """M rendered as the reader's own output for instance inst, ending at the decision cue
    (the forced prefix)."""

  def output(self, generation: Any) -> Any:
    """The reader's output (tokens or text) of a Generation."""

  def parse_mediator(self, output: Any) -> tuple[Optional[Mediator], Any]:
    """(M or None when unparseable, the rest of the output after M and the cue)."""

  def parse_decision(self, rest: Any, inst: Any, tool: bool) -> tuple[Optional[Hashable], Any]:
    """(Ŷ or None, tool argument or None) from what follows M. tool=True: Ŷ = C(arg)."""

  def generate_kwargs(self, tool: bool) -> dict:
    """max_new_tokens / stop for generating M then Y (or the tool call)."""

  def continue_kwargs(self, tool: bool) -> dict:
    """max_new_tokens / stop for the continuation after a forced M*."""


# ------------------------------------------------------------ interventions
def edit_rng(id_: Hashable, seed: int = EDIT_SEED) -> np.random.Generator:
  return np.random.default_rng([seed, zlib.crc32(str(id_).encode())])


def cnf_edit(task: MediatedTask, m: Mediator, inst: Any, id_: Hashable,
             seed: int = EDIT_SEED) -> Optional[Mediator]:
  """A minimal seeded edit M* of m with C(M*) ≠ C(m), or None when none exists.

  Edits change k items (k = 1, 2, … r, the first k with a candidate); every
  changed item takes another of its allowed values. Among the candidates of
  the minimal k one is drawn with rng (seed, crc32(id))."""
  m = tuple(m)
  values = [tuple(v) for v in task.item_values(m, inst)]
  if len(values) != len(m):
    raise ValueError(f'item_values gave {len(values)} alphabets for a mediator of {len(m)} items')
  y = task.decide(m, inst)
  for k in range(1, len(m) + 1):
    cands = []
    for where in itertools.combinations(range(len(m)), k):
      others = [[v for v in values[i] if v != m[i]] for i in where]
      for new in itertools.product(*others):
        e = list(m)
        for i, v in zip(where, new):
          e[i] = v
        if task.decide(tuple(e), inst) != y:
          cands.append(tuple(e))
    if cands:
      return cands[int(edit_rng(id_, seed).integers(len(cands)))]
  return None


def intervention(task: MediatedTask, m_hat: Optional[Mediator], inst: Any, id_: Hashable
                 ) -> tuple[str, Optional[Mediator], Optional[str]]:
  """(kind, M*, skip reason): COR with M* = gold when M̂ ≠ gold (or unparseable),
  CNF with a minimal edit when M̂ = gold, skip when no edit changes C."""
  gold = tuple(task.gold(inst))
  if m_hat is None or tuple(m_hat) != gold:
    return COR, gold, None
  star = cnf_edit(task, gold, inst, id_)
  if star is None:
    return SKIP, None, 'no_edit_changes_C'
  return CNF, star, None


def fail_reason(m: Optional[Mediator], rest: Any, y: Optional[Hashable],
                stop_reason: Optional[str], *, forced: bool = False) -> str:
  """Why an output did not parse ('' when it did; module doc). forced=True: a
  continuation after a forced M* and its cue, where only the decision can fail."""
  if y is not None and (forced or m is not None):
    return ''
  if stop_reason == LENGTH:
    return 'cut_budget'
  if stop_reason == STOP_STRING:
    return 'cut_stop'
  if forced:
    return 'no_decision'
  if m is None:
    return 'no_mediator'
  return 'no_cue' if rest is None else 'no_decision'


# ------------------------------------------------------------------ audit
def _same(a: Any, b: Any) -> bool:
  return a is not None and b is not None and a == b


def _show(x: Any) -> str:
  if x is None:
    return ''
  if isinstance(x, (tuple, list)):
    return ''.join(str(v) for v in x)
  return str(x)


def run_audit(reader: Any, task: MediatedTask, instances: Sequence[Any],
              ids: Sequence[Hashable], *, tool: bool = False) -> list[dict]:
  """One row per instance (module doc): generation, intervention, re-prompt.

  Row fields: id, tool, kind (COR | CNF | skip), skip_reason, gold, m_hat,
  y_hat, arg, m_star, y_star, arg_star, forced (M* as forced), output (the
  generation), continuation (after the forced prefix), c_m_hat (C(M̂)),
  c_m_star, parse_fail (M̂ or Ŷ unparseable), parse_fail_star (Ŷ*),
  fail_reason / fail_reason_star ('' or one of FAIL_REASONS), stop_reason /
  stop_reason_star (the readers'), consistent (1[C(M̂) = Ŷ]), consistent_star
  (1[C(M*) = Ŷ*]), strong; tool rows also arg_copy (1[arg = M̂]) and
  arg_copy_star (1[arg* = M*]): 003 §6's check that the argument encodes M;
  consistent_own / consistent_star_own / strong_own: the own-M̂ regime (module
  doc; False on rows without the tool).
  """
  instances, ids = list(instances), list(ids)
  if len(instances) != len(ids):
    raise ValueError(f'ids has {len(ids)} entries for {len(instances)} instances')
  if not instances:
    return []
  prompts = [task.prompt(x) for x in instances]
  gens = reader.generate(prompts, ids=ids, **task.generate_kwargs(tool))
  rows = []
  for inst, id_, g in zip(instances, ids, gens):
    m_hat, rest = task.parse_mediator(task.output(g))
    y_hat, arg = (None, None) if m_hat is None else task.parse_decision(rest, inst, tool)
    kind, star, reason = intervention(task, m_hat, inst, id_)
    c_hat = None if m_hat is None else task.decide(m_hat, inst)
    rows.append(dict(id=id_, tool=tool, kind=kind, skip_reason=reason or '',
                     gold=tuple(task.gold(inst)), m_hat=m_hat, y_hat=y_hat, arg=arg,
                     m_star=star, c_m_hat=c_hat,
                     c_m_star=None if star is None else task.decide(star, inst),
                     parse_fail=m_hat is None or y_hat is None,
                     fail_reason=fail_reason(m_hat, rest, y_hat, g.stop_reason),
                     stop_reason=g.stop_reason, consistent=_same(c_hat, y_hat),
                     arg_copy=tool and _same(arg, m_hat), output=task.output(g),
                     consistent_own=tool and m_hat is not None and arg is not None))
  todo = [k for k, r in enumerate(rows) if r['kind'] != SKIP]
  forced = [task.render_mediator(rows[k]['m_star'], instances[k]) for k in todo]
  conts = reader.continue_from([prompts[k] for k in todo], forced,
                               ids=[ids[k] for k in todo], **task.continue_kwargs(tool))
  for k, f, g in zip(todo, forced, conts):
    r = rows[k]
    back, rest_f = task.parse_mediator(f)
    if back != tuple(r['m_star']):  # the forced prefix must spell M* exactly
      raise AssertionError(f'item {r["id"]!r}: forced prefix {f!r} parses to {back!r}, '
                           f'not M* = {r["m_star"]!r}')
    y_star, arg_star = task.parse_decision(task.output(g), instances[k], tool)
    r.update(forced=f, continuation=task.output(g), y_star=y_star, arg_star=arg_star,
             parse_fail_star=y_star is None, stop_reason_star=g.stop_reason,
             fail_reason_star=fail_reason(None, None, y_star, g.stop_reason, forced=True),
             arg_copy_star=tool and _same(arg_star, r['m_star']),
             consistent_star=_same(r['c_m_star'], y_star),
             consistent_star_own=tool and arg_star is not None)
    r['strong'] = r['consistent'] and r['consistent_star']
    r['strong_own'] = r['consistent_own'] and r['consistent_star_own']
  for r in rows:
    if r['kind'] == SKIP:
      r.update(forced=None, continuation=None, y_star=None, arg_star=None, parse_fail_star=False,
               fail_reason_star='', stop_reason_star=None, arg_copy_star=False,
               consistent_star=False, strong=False, consistent_star_own=False,
               strong_own=False)
  check_rows(task, instances, rows)
  return rows


def check_rows(task: MediatedTask, instances: Sequence[Any], rows: Sequence[dict]) -> None:
  """The §8.3 invariants, row by row (AssertionError naming the row otherwise):
  strong ⇒ consistent (so F_Strong ≤ F_ID); every CNF edit changes C and starts
  from M̂ = gold; COR only where M̂ ≠ gold; the forced prefix parses back to M*."""
  for inst, r in zip(instances, rows):
    where = f'row {r["id"]!r} ({r["kind"]})'
    if r['strong'] and not r['consistent']:
      raise AssertionError(f'{where}: strong but not consistent')
    gold = tuple(task.gold(inst))
    if r['kind'] == CNF:
      if r['m_hat'] is None or tuple(r['m_hat']) != gold:
        raise AssertionError(f'{where}: CNF on an M̂ that is not the gold')
      if task.decide(r['m_star'], inst) == task.decide(r['m_hat'], inst):
        raise AssertionError(f'{where}: the CNF edit leaves C unchanged')
    elif r['kind'] == COR:
      if r['m_hat'] is not None and tuple(r['m_hat']) == gold:
        raise AssertionError(f'{where}: COR where M̂ = gold')
      if tuple(r['m_star']) != gold:
        raise AssertionError(f'{where}: COR with M* ≠ gold')
    if r['kind'] != SKIP and task.parse_mediator(r['forced'])[0] != tuple(r['m_star']):
      raise AssertionError(f'{where}: forced prefix is not M*')


# ---------------------------------------------------------------- summary
def _rate(rows: Sequence[dict], key: str, seed: int) -> Aggregate:
  return mean_ci(np.array([float(r[key]) for r in rows]), seed=seed)


def _counts(rows: Sequence[dict], key: str, names: Sequence[str]) -> dict:
  c = collections.Counter(r.get(key) for r in rows)
  return {k: int(c.get(k, 0)) for k in names}


def summarize(rows: Sequence[dict], *, seed: int = CI_SEED, min_cell: int = MIN_CELL) -> dict:
  """F_ID, F_Strong, Δ (paired), COR / CNF consistency, parse-failure rates, counts.

  Rates are over the audited rows (skipped ones are counted by reason only).
  A COR / CNF consistency with fewer than `min_cell` rows is absent (EMPTY) with
  its n in n_COR / n_CNF. fail_reasons / fail_reasons_star: the parse failures of
  the generation / of the continuation by reason (FAIL_REASONS, counts);
  stop_reasons: how the generations ended (counts); arg_copy / arg_copy_star
  (tool rows; EMPTY otherwise): share with arg = M̂ / arg* = M*; F_ID_own,
  F_Strong_own, delta_own (tool rows; EMPTY otherwise): the own-M̂ regime (module doc)."""
  audited = [r for r in rows if r['kind'] != SKIP]
  skipped = collections.Counter(r['skip_reason'] for r in rows if r['kind'] == SKIP)
  out = dict(n=len(rows), n_audited=len(audited), skipped=dict(skipped),
             fail_reasons=_counts(audited, 'fail_reason', FAIL_REASONS),
             fail_reasons_star=_counts(audited, 'fail_reason_star', FAIL_REASONS),
             stop_reasons={k: v for k, v in collections.Counter(
                 r.get('stop_reason') for r in audited).items() if k})
  if not audited:
    out.update(F_ID=EMPTY, F_Strong=EMPTY, delta=EMPTY, cons_COR=EMPTY, cons_CNF=EMPTY,
               n_COR=0, n_CNF=0, parse_fail=EMPTY, parse_fail_star=EMPTY, parse_fail_any=EMPTY,
               m_hat_correct=EMPTY, arg_copy=EMPTY, arg_copy_star=EMPTY, F_ID_own=EMPTY,
               F_Strong_own=EMPTY, delta_own=EMPTY)
    return out
  cid = np.array([float(r['consistent']) for r in audited])
  cst = np.array([float(r['strong']) for r in audited])
  out.update(F_ID=mean_ci(cid, seed=seed), F_Strong=mean_ci(cst, seed=seed),
             delta=paired_difference_ci(cid, cst, seed=seed))
  for kind in (COR, CNF):
    cell = [r for r in audited if r['kind'] == kind]
    out[f'n_{kind}'] = len(cell)
    out[f'cons_{kind}'] = _rate(cell, 'consistent_star', seed) if len(cell) >= min_cell else EMPTY
  out['parse_fail'] = _rate(audited, 'parse_fail', seed)
  out['parse_fail_star'] = _rate(audited, 'parse_fail_star', seed)
  out['parse_fail_any'] = mean_ci(np.array(
      [float(r['parse_fail'] or r['parse_fail_star']) for r in audited]), seed=seed)
  out['m_hat_correct'] = mean_ci(np.array([float(r['kind'] == CNF) for r in audited]), seed=seed)
  tool = all(r['tool'] for r in audited)
  out['arg_copy'] = _rate(audited, 'arg_copy', seed) if tool else EMPTY
  out['arg_copy_star'] = _rate(audited, 'arg_copy_star', seed) if tool else EMPTY
  out.update(F_ID_own=EMPTY, F_Strong_own=EMPTY, delta_own=EMPTY)
  if tool:
    oid = np.array([float(r['consistent_own']) for r in audited])
    ost = np.array([float(r['strong_own']) for r in audited])
    out.update(F_ID_own=mean_ci(oid, seed=seed), F_Strong_own=mean_ci(ost, seed=seed),
               delta_own=paired_difference_ci(oid, ost, seed=seed))
  return out


def to_json(summary: dict) -> dict:
  """Aggregates as {value, ci_low, ci_high, n} dicts (everything else unchanged)."""
  return {k: (v.to_dict() if isinstance(v, Aggregate) else v) for k, v in summary.items()}


def from_json(summary: dict) -> dict:
  return {k: (Aggregate(**v) if isinstance(v, dict) and set(v) == {'value', 'ci_low', 'ci_high', 'n'}
              else v) for k, v in summary.items()}


def row_record(r: dict) -> dict:
  """A row as flat CSV-able strings / numbers (mediators written item by item)."""
  out = {}
  for k, v in r.items():
    if k in ('gold', 'm_hat', 'm_star', 'arg', 'arg_star'):
      out[k] = _show(v)  # items, e.g. '101'
    elif isinstance(v, (tuple, list)):
      out[k] = ' '.join(str(x) for x in v)  # token ids (a forced prefix)
    elif isinstance(v, bool):
      out[k] = int(v)
    else:
      out[k] = '' if v is None else v
  return out


def _why(counts: Optional[dict]) -> str:
  """'a / b / c / d / e' counts in FAIL_REASONS order ('—' for a summary without them)."""
  if not counts:
    return '—'
  return ' / '.join(str(counts.get(k, 0)) for k in FAIL_REASONS)


def table(cells: Sequence[tuple[str, dict]]) -> str:
  """Markdown table: one line per (label, summary). 'parse fail' = M̂, Ŷ or Ŷ*
  unparseable; 'why' counts the generation's failures as no M̂ / no cue / no Ŷ /
  cut by the budget / cut by a stop string, 'Ŷ* why' the continuation's;
  'arg = M̂ / arg* = M*' is the tool argument's copy rate and 'Δ own M̂' the gap
  when the tool reads the reader's own M̂ (module doc; — without the tool)."""
  lines = ['| setting | n | F_ID | F_Strong | Δ [95% CI] | COR cons. (n) | CNF cons. (n) | '
           'parse fail | why: no M̂ / no cue / no Ŷ / budget / stop | Ŷ* why | '
           'arg = M̂ / arg* = M* | Δ own M̂ [95% CI] | skipped |',
           '|---|---:|---|---|---|---|---|---|---|---|---|---|---|']
  for label, s in cells:
    copy = ('—' if s.get('arg_copy') is None or s['arg_copy'].value is None else
            f"{fmt_ci(s['arg_copy'])} / {fmt_ci(s['arg_copy_star'])}")
    own = ('—' if s.get('delta_own') is None or s['delta_own'].value is None else
           fmt(s['delta_own']))
    lines.append(f"| {label} | {s['n_audited']} | {fmt_ci(s['F_ID'])} | {fmt_ci(s['F_Strong'])} | "
                 f"{fmt(s['delta'])} | {fmt_ci(s['cons_COR'])} ({s['n_COR']}) | "
                 f"{fmt_ci(s['cons_CNF'])} ({s['n_CNF']}) | {fmt_ci(s['parse_fail_any'])} | "
                 f"{_why(s.get('fail_reasons'))} | {_why(s.get('fail_reasons_star'))} | {copy} | {own} | "
                 f"{sum(s['skipped'].values())} |")
  return '\n'.join(lines)
