"""The World B pair claims over training seeds (issue #35): several finished runs of one
companion audit that differ only in the fine-tuned readers' seed, decided by `claims.RULE`
over seeds (every seed the predicted sign and |mean| ≥ 2 sd; one seed: its CI).

  python -m experiments.over_seeds --runs runs/traces_ft,runs/traces_ft_s1 [--out F.json]

Each run is re-decided by its own job's rule (`mediator.job.decide`, `traces.verdicts.decide`:
competence checks included) from its summary.json and rows (the mediator's unit files, the
trace audit's rows.csv); for every pair claim —
`<pair>: separates` (the behavioural audit tells the shortcut reader from the faithful /
following one) and `<pair>: probe separates` (the §8.4 probe does), per stratum where the
rows carry one — each seed's paired difference is the one its run decided from, and
`<pair>: probe agrees` compares the two verdicts over seeds. A claim untested in any seed
(a reader not competent there, no shared item) is untested over seeds, naming the seed.
Runs are refused unless they are the same job with the same config up to SEED_FIELD
(compared as the job contract compares a rerun: `workdir.config_diff`, fields the job added
later at the value the earlier run ran as; the error names the fields that differ) and
distinct seeds. With one run the verdicts are that run's own (tested on the recorded runs).
Over several, the rule reads the seeds' means, not their CIs: two seeds with the same small
difference are 'supported' (sd 0), as for the main job's claims.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Optional, Sequence

import ml_collections

from ceu_jax import claims, code_version
from ceu_jax import workdir as workdir_lib
from ceu_jax.audits import layer_probe
from ceu_jax.audits.mediator import verdicts as mediator_verdicts

SEED_FIELD = 'smollm2.train.seed'   # the fine-tunes' seed: rows, corruption draws, adapters
JOBS = ('mediator', 'trace_sensitivity')
METRICS = {('mediator', 'separates'): mediator_verdicts.SEPARATION_METRIC,
           ('trace_sensitivity', 'separates'): 'follow(following) − follow(shortcut)',
           ('mediator', 'probe separates'): 'ΔL(shortcut) − ΔL(faithful) (nats)',
           ('trace_sensitivity', 'probe separates'): 'ΔL(shortcut) − ΔL(following) (nats)'}


@dataclasses.dataclass(frozen=True)
class Run:
  workdir: str
  job: str                                  # the job that wrote it (W/job.json)
  config: dict                              # its config (summary.json)
  seed: int                                 # its SEED_FIELD
  claims: dict                              # claim name -> claims.Claim, its job's rule
  differences: dict                         # pair claim name -> (kind, its Aggregate or None)
  produced_by: dict                         # summary.json's produced_by (job, code, ...)


def _mediator(workdir: str, summary: dict) -> tuple[list, dict]:
  from ceu_jax.audits.mediator import job, verdicts
  config = ml_collections.ConfigDict(summary['config'])
  settings = summary['settings']
  rows = job.unit_rows(workdir, settings)
  readers = list(dict.fromkeys(v['reader'] for v in settings.values()))
  probes = summary.get('probes') or {}
  found = job.decide(config, settings, rows, readers, probes, summary.get('competence') or {})
  seed, diffs = int(config.bootstrap_seed), {}
  for label, short, faith in verdicts.contrasts(readers, config.tools):
    if short in rows and faith in rows:
      diffs[f'{label}: separates'] = ('separates', verdicts.gap_difference(
          rows[short], rows[faith], seed=seed))
    if short in probes and faith in probes:
      diffs[f'{label}: probe separates'] = ('probe separates', layer_probe.delta_l_difference(
          probes[short], probes[faith], seed=seed))
  return found, diffs


def _traces(workdir: str, summary: dict) -> tuple[list, dict]:
  from ceu_jax.audits.traces import verdicts
  config = summary['config']
  rows = verdicts.read_rows(os.path.join(workdir, 'rows.csv'))
  readers = {r: summary['readers'][r] for r in rows}         # the job's order (rows.csv's)
  probes = summary.get('probes') if config['world'] == 'smollm2' else None
  seed = int(config['bootstrap_seed'])
  found = verdicts.decide(readers, rows, probes, summary.get('competence'), seed=seed)
  diffs = {}
  for a, b in verdicts.reader_pairs(list(readers)):
    strata = [None] + sorted({x['stratum'] for r in (a, b) for x in rows[r] if x.get('stratum')})
    for st in strata:
      tag = f' [{st}]' if st else ''
      diffs[f'{a} vs {b}{tag}: separates'] = ('separates', verdicts.follow_difference(
          rows[a], rows[b], seed=seed, stratum=st))
      if probes and a in probes and b in probes:
        diffs[f'{a} vs {b}{tag}: probe separates'] = ('probe separates',
                                                       layer_probe.delta_l_difference(
                                                           probes[b], probes[a], seed=seed,
                                                           stratum=st))
  return found, diffs


DECIDERS: dict[str, Callable[[str, dict], tuple[list, dict]]] = {
    'mediator': _mediator, 'trace_sensitivity': _traces}


def load(workdir: str) -> Run:
  """A finished run of a companion audit, re-decided by its job's rule."""
  try:
    with open(os.path.join(workdir, 'job.json')) as f:
      job = json.load(f)['job']
    with open(os.path.join(workdir, 'summary.json')) as f:
      summary = json.load(f)
  except FileNotFoundError as e:
    raise ValueError(f'{workdir}: not a finished audit run (no {os.path.basename(e.filename)})'
                     ) from None
  if job not in DECIDERS:
    raise ValueError(f'{workdir}: job {job!r} has no pair claims over seeds; allowed: {JOBS}')
  flat = workdir_lib.flatten(summary['config'])
  if SEED_FIELD not in flat:
    raise ValueError(f'{workdir}: its config has no {SEED_FIELD} (not a run with fine-tuned '
                     'readers)')
  found, diffs = DECIDERS[job](workdir, summary)
  return Run(workdir, job, summary['config'], int(flat[SEED_FIELD]),
             {c.name: c for c in found}, diffs, summary.get('produced_by', {}))


def _added(job: str, d: tuple) -> bool:
  """A field the job added after one of the runs was recorded, absent from that run's
  config and at the value it ran as in the other's (the job contract's `added_fields`)."""
  from ceu_jax import jobs
  added = _job_class(job).added_fields
  field, a, b = d
  if field not in added or (a is not workdir_lib.ABSENT) == (b is not workdir_lib.ABSENT):
    return False
  value = b if a is workdir_lib.ABSENT else a
  return added[field] is jobs.ANY_VALUE or not workdir_lib.config_diff({'v': added[field]},
                                                                        {'v': value})


def _job_class(job: str):
  if job == 'mediator':
    from ceu_jax.audits.mediator.job import MediatorJob
    return MediatorJob
  from ceu_jax.audits.traces.job import TraceSensitivityJob
  return TraceSensitivityJob


def check_same(runs: Sequence[Run]) -> None:
  """ValueError unless the runs are one job with one config up to SEED_FIELD and their
  seeds differ (naming what differs)."""
  if not runs:
    raise ValueError('runs: give at least one finished run')
  first = runs[0]
  for r in runs[1:]:
    if r.job != first.job:
      raise ValueError(f'runs: {r.workdir} is a {r.job} run, {first.workdir} a {first.job} run')
    differ = [d for d in workdir_lib.config_diff(first.config, r.config)
              if d[0] != SEED_FIELD and not _added(first.job, d)]
    if differ:
      raise ValueError(f'runs: {r.workdir} differs from {first.workdir} in more than '
                       f'{SEED_FIELD}: {workdir_lib.format_diff(differ[:5])}'
                       + (f' and {len(differ) - 5} more' if len(differ) > 5 else ''))
  seeds = [r.seed for r in runs]
  if len(set(seeds)) != len(seeds):
    raise ValueError(f'runs: {SEED_FIELD} must differ between runs, got {seeds}')


def _over(name: str, kind: str, runs: Sequence[Run], metric: str) -> claims.Claim:
  per = [(r, r.claims.get(name), r.differences.get(name, (kind, None))[1]) for r in runs]
  statement = next((c.statement for _, c, _ in per if c is not None), name)
  missing = [f'seed {r.seed}: not decided in {r.workdir}' for r, c, _ in per if c is None]
  untested = [f'seed {r.seed}: {c.numbers}' for r, c, _ in per
              if c is not None and c.verdict == claims.UNTESTED]
  if missing or untested:
    return claims.Claim(name, statement, claims.UNTESTED, '; '.join(missing + untested),
                        claims.RULE)
  d = claims.Difference(metric, tuple(claims.SeedDifference(str(r.seed), agg)
                                      for r, _, agg in per))
  verdict = claims.direction(d, +1)
  return claims.Claim(name, statement, verdict, f'{metric} {d.text()} → {verdict}',
                      claims.RULE)


def decide(runs: Sequence[Run]) -> list[claims.Claim]:
  """Every pair claim of the runs (`separates`, `probe separates`, `probe agrees`), by
  `claims.RULE` over their seeds."""
  check_same(runs)
  names = list(dict.fromkeys(n for r in runs for n in r.differences))
  out, by_name = [], {}
  for name in names:
    kind = next(r.differences[name][0] for r in runs if name in r.differences)
    c = _over(name, kind, runs, METRICS[runs[0].job, kind])
    out.append(c)
    by_name[name] = c
  for name in names:
    if not name.endswith(': probe separates'):
      continue
    label = name[:-len(': probe separates')]
    out.append(layer_probe.agreement(
        label, by_name[name], by_name.get(f'{label}: separates'),
        'the mechanistic probe and the behavioural audit reach the same separation verdict '
        'over seeds'))
  return out


def report(runs: Sequence[Run], found: Sequence[claims.Claim]) -> str:
  """The claims table with the runs it was decided from."""
  head = [f'# {runs[0].job}: pair claims over {len(runs)} seed{"s" * (len(runs) != 1)}', '',
          '| seed | run | code |', '|---:|---|---|']
  for r in runs:
    code = r.produced_by.get('versions', {}).get('code')
    head.append(f'| {r.seed} | {r.workdir} | {code_version.describe(code)} |')
  return '\n'.join(head + ['', claims.table(found)]) + '\n'


def run(workdirs: Sequence[str], out: Optional[str] = None) -> tuple[list, str]:
  """Load, check and decide; write `out` (JSON: claims, runs, code version) atomically."""
  from ceu_jax import io
  runs = [load(w) for w in workdirs]
  found = decide(runs)
  text = report(runs, found)
  if out:
    io.write_json_atomic(out, dict(
        claims=[dataclasses.asdict(c) for c in found],
        runs=[dict(workdir=r.workdir, seed=r.seed, job=r.job, produced_by=r.produced_by)
              for r in runs],
        produced_by=dict(tool='ceu_jax.audits.over_seeds', code=code_version.code_version())))
  return found, text
