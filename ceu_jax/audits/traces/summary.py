"""Summaries and tables of the trace audit's rows (SPEC §8.2, issues #17, #32).

  cell(rows)        φ, ρ, follow rate (bootstrap CIs over items), parse failures,
                    Strength unknown by reason, the unparsed = changed sensitivity columns
  summarize(rows)   parse failures, the identity check, `cell` overall and by domain,
                    τ, k, trace length, domain × τ and domain × trace length, undefined
                    interventions by reason
  table / by_length_table / fmt   the report's markdown
  rate_ci / fmt_rate   a competence rate with its CI and n, and how it is printed

Every φ, ρ and follow rate is over regenerations that parse (`audit` module doc);
the regeneration parse-failure rate and the counts of undefined interventions and of
Strength unknown (by reason) sit beside them in every cell and table.
"""
from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np

from ceu_jax.audits.traces.audit import BREAKDOWNS, CI_SEED, EDIT_TAUS, IDENTITY, TAU_SIM
from ceu_jax.metrics.resampling import bootstrap, fmt_ci, mean_ci


def ratio_of_sums(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """Σ sums / Σ counts over items, per resample ([R, n] -> [R]): a mean over rows whose
  rows of one item are resampled together."""
  return sums.sum(axis=1) / counts.sum(axis=1)


def _hashable(x: Any) -> Any:
  return tuple(x) if isinstance(x, list) else x


def item_sums(rows: Sequence[dict], value) -> tuple[np.ndarray, np.ndarray]:
  """(Σ value(row), number of rows) per item (rows grouped by item id, first-seen order)."""
  sums, counts = collections.defaultdict(float), collections.defaultdict(int)
  for x in rows:
    key = _hashable(x['id'])
    sums[key] += float(value(x))
    counts[key] += 1
  keys = list(sums)
  return (np.asarray([sums[k] for k in keys], np.float64),
          np.asarray([counts[k] for k in keys], np.float64))


def _agg(rows: Sequence[dict], value, seed: int) -> dict:
  """Mean of value(row) over rows, CI from a bootstrap over items (rows of one item move
  together: they share the item's trace and reader state), as an Aggregate dict."""
  sums, counts = item_sums(rows, value)
  agg = bootstrap(ratio_of_sums, sums, counts, seed=seed)
  return dict(agg.to_dict(), n=len(rows), n_items=len(sums))


def cell(rows: Sequence[dict], *, seed: int = CI_SEED) -> dict:
  """One summary cell of applied-intervention rows.

  n: applied interventions; regen_parse_failure: the share whose regeneration does not
  parse (n_regen_unparsed of n; regen_failure: by reason) — left out of everything below. phi: mean φ; rho: mean V
  over rows of known Strength; follow: share with a* = the edited trace's implied answer
  over rows where that answer is known; follow_strong: the same over rows with Strength > λ
  (the edit moved the implied answer); same_unknown: share with S ≥ τ_sim among rows of
  unknown Strength (n_unknown_strength; strength_unknown counts every applied row of unknown
  Strength by reason). Sensitivity columns, the former convention (an unparseable
  regeneration is a changed answer, S = 0): phi_unparsed_as_changed, rho_unparsed_as_changed.
  """
  ok = [x for x in rows if x['regen_parsed']]
  known = [x for x in ok if x['violation'] is not None]
  unknown = [x for x in ok if x['strength'] is None]
  fol = [x for x in ok if x['follows'] is not None]
  return dict(
      n=len(rows), n_regen_unparsed=len(rows) - len(ok),
      regen_parse_failure=(len(rows) - len(ok)) / len(rows) if rows else None,
      phi=_agg(ok, lambda x: x['phi'], seed),
      rho=_agg(known, lambda x: x['violation'], seed),
      follow=_agg(fol, lambda x: x['follows'], seed),
      follow_strong=_agg([x for x in fol if x['strong']], lambda x: x['follows'], seed),
      n_unknown_strength=len(unknown),
      same_unknown=_agg(unknown, lambda x: x['same'], seed),
      regen_failure=dict(sorted(collections.Counter(
          x['regen_failure'] for x in rows if not x['regen_parsed']).items())),
      strength_unknown=dict(sorted(collections.Counter(
          x['strength_unknown'] for x in rows if x['strength'] is None).items())),
      phi_unparsed_as_changed=_agg(rows, lambda x: x['phi'] if x['regen_parsed'] else 1.0, seed),
      rho_unparsed_as_changed=_agg([x for x in rows if x['strength'] is not None],
                                   lambda x: x['violation'] if x['regen_parsed'] else 0.0, seed))


def summarize(rows: Sequence[dict], *, tau_sim: float = TAU_SIM, seed: int = CI_SEED) -> dict:
  """Parse failures, identity check, overall cell and breakdowns by domain, τ, k, trace length.

  Edit rows are the applied interventions of the four τ (identity rows are the
  invariant check, summarised under 'identity' with n_identical: regenerated outputs
  identical to the original). Breakdowns: {key: {value: cell}}, plus 'domain_tau'
  {domain: {τ: cell}} for the report's table, 'by_domain_len' {domain: {trace
  length: cell}} for the plot and 'domain_tau_len' {domain: {τ: {trace length:
  cell}}}; 'by_stratum' {stratum: cell} where rows carry a stratum (World B with
  memorised problems); 'undefined' {domain: {τ: {reason: n}}} counts the
  interventions undefined for an item. tau_sim is only recorded (run_traces scored
  the rows with it).
  """
  n_items = len({(x['domain'], _hashable(x['id'])) for x in rows})
  fails = [x for x in rows if x['tau'] == 'parse_failure']
  traced = [x for x in rows if x['tau'] != 'parse_failure']
  scored = [x for x in traced if x.get('applied', True)]
  undefined: dict = {}
  for x in traced:
    if not x.get('applied', True):
      d = undefined.setdefault(x['domain'], {}).setdefault(x['tau'], {})
      d[x['undefined']] = d.get(x['undefined'], 0) + 1
  edits = [x for x in scored if x['tau'] != IDENTITY]
  ident = [x for x in scored if x['tau'] == IDENTITY]
  out = dict(
      n_items=n_items, n_parse_failure=len(fails),
      parse_failure_rate=len(fails) / n_items if n_items else None,
      parse_failure_by_domain={d: sum(x['domain'] == d for x in fails) for d in
                               sorted({x['domain'] for x in rows})},
      parse_failure_reasons=dict(sorted(collections.Counter(
          x.get('parse_failure', 'no_trace') for x in fails).items())),
      identity=dict(cell(ident, seed=seed), n_identical=sum(bool(x['identical']) for x in ident)),
      all=cell(edits, seed=seed), tau_sim=tau_sim,
      undefined={d: dict(sorted(ts_.items())) for d, ts_ in sorted(undefined.items())})
  for key in BREAKDOWNS:
    groups = collections.defaultdict(list)
    for x in edits:
      groups[x[key]].append(x)
    out[f'by_{key}'] = {str(v): cell(xs, seed=seed) for v, xs in sorted(groups.items(),
                                                                       key=lambda kv: str(kv[0]))}
  strata = {x['stratum']: [] for x in rows if x.get('stratum')}   # every stratum audited
  for x in edits:
    if x.get('stratum'):
      strata[x['stratum']].append(x)
  if strata:   # World B with memorised problems (rows tagged by the job)
    out['by_stratum'] = {k: cell(xs, seed=seed) for k, xs in sorted(strata.items())}
  dt = collections.defaultdict(lambda: collections.defaultdict(list))
  for x in edits:
    dt[x['domain']][x['tau']].append(x)
  out['domain_tau'] = {d: {t: cell(xs, seed=seed) for t, xs in ts_.items()}
                       for d, ts_ in dt.items()}
  dl = collections.defaultdict(lambda: collections.defaultdict(list))
  dtl = collections.defaultdict(lambda: collections.defaultdict(list))
  for x in edits:
    dl[x['domain']][x['trace_len']].append(x)
    dtl[(x['domain'], x['tau'])][x['trace_len']].append(x)
  out['by_domain_len'] = {d: {str(n): cell(xs, seed=seed) for n, xs in sorted(ls.items())}
                          for d, ls in dl.items()}
  out['domain_tau_len'] = {}
  for (d, t), ls in dtl.items():
    out['domain_tau_len'].setdefault(d, {})[t] = {str(n): cell(xs, seed=seed)
                                                  for n, xs in sorted(ls.items())}
  return out


def fmt(a: dict) -> str:
  """'0.123 [0.100, 0.150]' of an Aggregate dict, '—' when empty (`fmt_ci`)."""
  return fmt_ci(a or None)


def fmt_n(a: dict) -> str:
  """fmt(a) followed by its n, '—' when empty."""
  return '—' if not a or a.get('value') is None else f"{fmt(a)} ({a['n']})"


def rate_ci(hits: Sequence, seed: int = CI_SEED) -> dict:
  """A rate of 0/1 outcomes (one per problem) with its percentile bootstrap 95% CI and n
  (SPEC §8: 1,000 resamples, seed 42; `mean_ci`); empty: value None, n 0."""
  return mean_ci(np.asarray(hits, dtype=np.float64), seed=seed).to_dict()


def fmt_rate(part: dict, name: str) -> str:
  """'value [lo, hi] (n=..)' of rate `name` of a competence check from its `cis`; a check
  computed before its CIs were kept (a cached competence.json, a recorded run): the point
  value alone, marked '(no CI)'; '—' when absent."""
  ci = (part.get('cis') or {}).get(name)
  if ci is not None:
    return fmt_ci(ci, with_n=True)
  v = part.get(name)
  return '—' if v is None else f'{v:.3f} (no CI)'


def _reasons(d: dict) -> str:
  return ', '.join(f'{r} {n}' for r, n in d.items()) or '—'


def table(summary: dict) -> str:
  """Markdown table of φ, ρ and the follow rate by domain × τ (and the identity check)."""
  lines = ['| domain | τ | applied | regen parse fail | φ [95% CI] | ρ [95% CI] | '
           'follow [95% CI] (n) | follow, Strength > λ (n) | Strength unknown '
           '(S ≥ τ_sim among them) | not applied | φ / ρ if unparsed = changed |',
           '|---|---|---:|---:|---|---|---|---|---|---|---|']
  undefined = summary.get('undefined', {})
  for d in sorted(set(summary['domain_tau']) | set(undefined)):
    ts_ = summary['domain_tau'].get(d, {})
    for t in EDIT_TAUS:
      und = undefined.get(d, {}).get(t, {})
      if t not in ts_ and not und:
        continue
      c = ts_.get(t)
      if c is None:
        lines.append(f'| {d} | {t} | 0 | — | — | — | — | — | — | {_reasons(und)} | — |')
        continue
      unk = ('—' if not c['n_unknown_strength'] and not c['strength_unknown'] else
             f"{_reasons(c['strength_unknown'])} ({fmt(c['same_unknown'])})")
      lines.append(
          f"| {d} | {t} | {c['n']} | {c['regen_parse_failure']:.3f} ({c['n_regen_unparsed']}) | "
          f"{fmt(c['phi'])} | {fmt(c['rho'])} | {fmt_n(c['follow'])} | "
          f"{fmt_n(c['follow_strong'])} | {unk} | {_reasons(und)} | "
          f"{_val(c['phi_unparsed_as_changed'])} / {_val(c['rho_unparsed_as_changed'])} |")
  i = summary['identity']
  lines += ['', f"identity (s'_k = s_k, n={i['n']}): φ = {fmt(i['phi'])}; regenerated output "
            f"identical to the original: {i['n_identical']} of {i['n']}; regen parse failures: "
            f"{i['n_regen_unparsed']}; parse failures: {summary['n_parse_failure']} of "
            f"{summary['n_items']} items ({_reasons(summary.get('parse_failure_reasons', {}))})"]
  return '\n'.join(lines)


def _val(a: dict) -> str:
  return '—' if not a or a.get('value') is None else f"{a['value']:.3f}"


def tau_length_table(summary: dict) -> str:
  """Markdown table of φ, ρ and the follow rate by domain × τ × trace length."""
  lines = ['| domain | τ | trace length | applied | regen parse fail | φ [95% CI] | ρ [95% CI] | '
           'follow [95% CI] (n) |', '|---|---|---:|---:|---:|---|---|---|']
  for d, ts_ in summary.get('domain_tau_len', {}).items():
    for t in EDIT_TAUS:
      for L, c in ts_.get(t, {}).items():
        lines.append(f"| {d} | {t} | {L} | {c['n']} | {c['regen_parse_failure']:.3f} | "
                     f"{fmt(c['phi'])} | {fmt(c['rho'])} | {fmt_n(c['follow'])} |")
  return '\n'.join(lines)


def by_length_table(summary: dict) -> str:
  """Markdown table of φ, ρ and the follow rate by trace length."""
  return breakdown_table(summary['by_trace_len'], 'trace length')


def breakdown_table(cells: dict, name: str) -> str:
  """Markdown table of φ, ρ, the follow rate and parse failures of {value: cell}."""
  lines = [f'| {name} | applied | regen parse fail | φ [95% CI] | ρ [95% CI] | follow [95% CI] (n) |',
           '|---:|---:|---:|---|---|---|']
  for v, c in cells.items():
    fail = '—' if c['regen_parse_failure'] is None else f"{c['regen_parse_failure']:.3f}"
    lines.append(f"| {v} | {c['n']} | {fail} | {fmt(c['phi'])} | "
                 f"{fmt(c['rho'])} | {fmt_n(c['follow'])} |")
  return '\n'.join(lines)
