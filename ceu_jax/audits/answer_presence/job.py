"""The answer-presence job: world → records per baseline → audit rows → outputs.

  run_answer_presence(config, workdir)   # experiments/answer_presence.py calls this

Worlds (config.world; configs/answer_presence.py documents every field):
  atr        World A: ATR-insert raw contexts, line-filter rewriters B2-B4, the
             three families trained as in the smoke grid (ceu_jax.audits.trained);
  atr_separate  World A plus rewriters / edits that pull the answer string and the
             evidence apart (separate.py: Bev, Bval, unbind);
  factqa     World B: NQ / SQuAD items, rewriters A / B (SmolLM2) / B4 and a
             question-blind control, SmolLM2 as the reader;
  generated  seeded text records with oracle readers (exact known answers).

A unit is one chunk of records read by one reader; the job runs on the one job
contract (`ceu_jax.jobs.run_job`: the workdir lock, the config check against
W/job.json, W/units/ resumed, atomic outputs, progress). Outputs:
  rows.csv       one row per (reader, baseline, record, edit)
  scores.csv     one row per (reader, baseline, record): bucket, F1, answer
  summary.json   buckets, skips, baseline F1, effects, Δcausal, panels, verdicts
  report.md      the tables (ceu_jax.audits.answer_presence.report) and the figures
  effects.png/pdf, panel.png/pdf
"""
from __future__ import annotations

import csv
import dataclasses
import io as _io
import json
from typing import Any, Callable, Sequence

import numpy as np

from ceu_jax import claims, jobs
from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.audits.answer_presence import plots
from ceu_jax.audits.answer_presence import report
from ceu_jax.audits.answer_presence import sentinels as sp
from ceu_jax.audits.answer_presence import worlds
from ceu_jax.metrics.resampling import mean_ci

ROW_COLUMNS = ('reader', 'baseline', 'id', 'bucket', 'edit', 'f1_orig', 'f1_edit', 'delta',
               'll_orig', 'll_edit', 'dll', 'answer', 'placebo_spans', 'appended', 'residual')
SCORE_COLUMNS = ('reader', 'baseline', 'id', 'bucket', 'bucket_companion', 'f1', 'loglik',
                 'answer')
FREE_FIELDS = ('plots',)  # may change between a run and its resumption


def _summarise_reader(parts: Sequence[dict], baselines: Sequence[str], seed: int) -> dict:
  scores = {b: [s for p in parts for s in p['scores'].get(b, [])] for b in baselines}
  out: dict = dict(baseline_f1={}, baseline_loglik={}, cells={}, panel=None)
  for b in baselines:
    f1 = np.asarray([s['f1'] for s in scores[b]], np.float64)
    out['baseline_f1'][b] = mean_ci(f1, seed=seed).to_dict()
    ll = [s['loglik'] for s in scores[b] if s['loglik'] is not None]
    if ll:
      out['baseline_loglik'][b] = mean_ci(np.asarray(ll, np.float64), seed=seed).to_dict()
  for b in baselines:
    if b == 'B1':
      continue
    rows = [x for p in parts for x in p['rows'].get(b, [])]
    eff = ap.effects(rows, seed=seed)
    cell = dict(effects=[{k: (v.to_dict() if hasattr(v, 'to_dict') else v) for k, v in e.items()}
                         for e in eff],
                delta_causal=ap.delta_causal(rows, seed=seed).to_dict(),
                # Δremove and Δplacebo on Δcausal's own pairs (its Table-1 row)
                causal_parts={k: a.to_dict() for k, a in
                              ap.delta_causal_parts(rows, seed=seed).items()},
                remove_residual=sum(1 for x in rows if x['edit'] == 'remove' and x['residual']),
                placebo_missing=(sum(x['edit'] == 'remove' for x in rows)
                                 - sum(x['edit'] == 'placebo' for x in rows)),
                appended_insert_mid={bk: sum(1 for x in rows if x['edit'] == 'insert_mid'
                                             and x['appended'] and x['bucket'] == bk)
                                     for bk in ap.BUCKETS},
                identity_max_abs=max((abs(x['delta']) for x in rows if x['edit'] == 'identity'),
                                     default=None))
    if rows and 'dll' in rows[0]:
      cell['delta_causal_ll'] = ap.delta_causal(rows, seed=seed, key='dll').to_dict()
    out['cells'][b] = cell
  with_panel = [p['panel'] for p in parts if p['panel']]
  panels = [p for p in with_panel if p['ids']]
  if panels:
    f1 = {c: np.concatenate([np.asarray(p[c], np.float64) for p in panels])
          for c in ('B1', 'B2', *sp.SENTINELS, 'PLACEBO')}
    prow, v = sp.panel(f1, seed=seed)
    out['panel'] = dict(
        rows=[dict(condition=x['condition'], f1=x['f1'].to_dict(), vs=x['vs'],
                   delta=None if x['delta'] is None else x['delta'].to_dict()) for x in prow],
        verdicts=dict(E=v.E, passed=v.passed, n_pass=v.n_pass, c2a_pass=v.c2a_pass,
                      c2b_pass=v.c2b_pass, d={s: a.to_dict() for s, a in v.d.items()},
                      c2b_d=v.c2b_d.to_dict(), text=v.summary()),
        no_placebo=sum(len(p['no_placebo']) for p in with_panel))  # every chunk's
  return out


def _baselines_section(parts: Sequence[dict], baselines: Sequence[str]) -> dict:
  """Buckets and skips per baseline (from the first reader's chunks: they do not depend on it)."""
  out = {}
  for b in baselines:
    sc = [s for p in parts for s in p['scores'].get(b, [])]
    skipped: dict = {}
    for p in parts:
      for reason, ids in p['skipped'].get(b, {}).items():
        skipped.setdefault(reason, []).extend(ids)
    out[b] = dict(n_kept=len(sc), skipped={k: len(v) for k, v in skipped.items()},
                  skipped_ids=skipped,
                  buckets={k: sum(s['bucket'] == k for s in sc) for k in ap.BUCKETS},
                  buckets_companion={k: sum(s['bucket_companion'] == k for s in sc)
                                     for k in ap.BUCKETS})
  return out


def _csv(columns: Sequence[str], rows: Sequence[dict]) -> str:
  buf = _io.StringIO()
  w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction='ignore')
  w.writeheader()
  w.writerows(rows)
  return buf.getvalue()


class AnswerPresenceJob(jobs.Job):
  """The answer-presence audit on the one job contract: a unit is one chunk of
  records read by one reader (W/units/<reader>_<k>.json)."""
  name = 'answer_presence'
  free_fields = FREE_FIELDS

  def __init__(self, config):
    self.world = worlds.make_world(config)  # validates before anything is built or written
    super().__init__(config)

  def record(self):
    """The config, and in World A the version of its rewriters' definition
    (`atr_world.REWRITER_VERSION`): units computed under an older B4 are never resumed
    with this one (the run is refused, naming the field)."""
    rec = jobs.plain(self.config)
    if self.config.world == 'atr':
      from ceu_jax.audits.answer_presence import atr_world  # pylint: disable=g-import-not-at-top
      rec['rewriter_version'] = atr_world.REWRITER_VERSION
    return rec

  def prepare(self, ctx):
    self.world.prepare(ctx.workdir, ctx.log)

  def plan(self, ctx):
    return [jobs.Unit(f'{name}_{k:04d}', (name, k)) for name in self.world.readers
            for k in range(self.world.n_chunks)]

  def run_unit(self, ctx, spec):
    return self.world.chunk(*spec)

  def describe_unit(self, spec, result):
    return f"{result['calls']} reader items"

  def _parts(self, results) -> dict:
    return {name: [results[f'{name}_{k:04d}'] for k in range(self.world.n_chunks)]
            for name in self.world.readers}

  def summarize(self, ctx, results):
    return _summarise(self.config, self.world, self._parts(results))

  def write(self, ctx, results, summary):
    _write_outputs(self.config, ctx, self.world, self._parts(results), summary)


def run_answer_presence(config, workdir: str, log: Callable[[str], None] = print) -> dict:
  """Run (or resume) the audit; returns the summary dict (also in W/summary.json)."""
  return jobs.run_job(AnswerPresenceJob(config), workdir, log=log)


def headline_claims(summary: dict) -> list:
  """001's headline per reader and rewritten baseline, decided by rule: removing the gold
  answer string costs more F1 than a placebo edit of the same size (Δcausal < 0)."""
  out = []
  for name, r in summary['readers'].items():
    for b, cell in r['cells'].items():
      out.append(claims.of_run(f'{name} / {b}', 'removing the answer string costs more than a '
                               'placebo edit (Δcausal < 0, 1→1 items)', cell['delta_causal'], -1,
                               label='Δcausal'))
  return out


def _summarise(config, world, parts: dict) -> dict:
  first = parts[world.readers[0]]
  summary = dict(world=config.world, config=config.to_dict(), n_records=world.n_records,
                 baselines=_baselines_section(first, world.baselines),
                 readers={name: dict(_summarise_reader(parts[name], world.baselines,
                                                       config.bootstrap_seed),
                                     **world.reader_summary(name, parts[name]))
                          for name in world.readers})
  summary.update(world.extra_summary(first))
  summary = json.loads(json.dumps(summary))
  summary['claims'] = [dataclasses.asdict(c) for c in headline_claims(summary)
                       + world.extra_claims(summary)]
  return summary


def _write_outputs(config, ctx: jobs.JobContext, world, parts: dict, summary: dict) -> None:
  rows, scores = [], []
  for name, ps in parts.items():
    for p in ps:
      for b, xs in p['rows'].items():
        rows += [dict(x, reader=name, baseline=b) for x in xs]
      for b, xs in p['scores'].items():
        scores += [dict(x, reader=name, baseline=b) for x in xs]
  ctx.write_text('rows.csv', _csv(ROW_COLUMNS, rows))
  ctx.write_text('scores.csv', _csv(SCORE_COLUMNS, scores))
  rd = summary['readers']
  md = [f'# Answer-presence audit ({world.title})', '', world.describe(summary), '',
        '## Headline, decided by rule', '',
        claims.table(headline_claims(summary) + world.extra_claims(summary)), '',
        '## Buckets per baseline', '', report.buckets_table(summary['baselines'],
                                                            world.companion_name), '',
        '## Reader score per baseline (token F1 × 100)', '',
        report.baseline_table(rd, world.baselines, skipped=summary['baselines']), '',
        '## Remove vs placebo on 1→1 (Table-1 style)', '', report.causal_table(rd), '',
        '## Inserting the gold into compiles that lack it', '', report.insert_table(rd)]
  if any(c.get('delta_causal_ll') for r in rd.values() for c in r['cells'].values()):
    md += ['', '## Gold log-likelihood change (continuous companion)', '',
           report.loglik_table(rd)]
  for name, r in rd.items():
    if r['panel']:
      md += ['', f'## Sentinel panel: {name} (B2, compile holds the gold)', '',
             report.panel_table(r['panel'])]
  md += world.extra_report(summary)
  if config.plots:
    plots.effects_figure(rd, ctx.path('effects'))
    md += ['', '![effects](effects.png)']
    if any(r['panel'] for r in rd.values()):
      plots.panel_figure(rd, ctx.path('panel'))
      md += ['', '![sentinel panel](panel.png)']
  md += ['', '## Every edit and bucket']
  for name, r in rd.items():
    for b, cell in r['cells'].items():
      md += ['', f'### {name} / {b}', '', report.cell_table(cell)]
  ctx.write_text('report.md', '\n'.join(md) + '\n')
