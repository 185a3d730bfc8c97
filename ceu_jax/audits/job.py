"""The answer-presence job: world → records per baseline → audit rows → outputs.

  run_answer_presence(config, workdir)   # experiments/answer_presence.py calls this

Worlds (config.world; configs/answer_presence.py documents every field):
  atr        World A: ATR-insert raw contexts, line-filter rewriters B2-B4, the
             three families trained as in the smoke grid (ceu_jax.audits.trained);
  factqa     World B: NQ / SQuAD items, rewriters A / B (SmolLM2) / B4 and a
             question-blind control, SmolLM2 as the reader;
  generated  seeded text records with oracle readers (exact known answers).

Work is done in chunks of records per reader, each saved under W/chunks
(atomically); a rerun skips finished chunks and continues (resumable). The
config is checked against W/config.json first (a different config is refused,
naming the fields), and W/.answer_presence.lock keeps a second job out.
Outputs, all written atomically (ceu_jax.io):
  rows.csv       one row per (reader, baseline, record, edit)
  scores.csv     one row per (reader, baseline, record): bucket, F1, answer
  summary.json   buckets, skips, baseline F1, effects, Δcausal, panels, verdicts
  report.md      the tables (ceu_jax.audits.report) and the figures
  effects.png/pdf, panel.png/pdf
"""
from __future__ import annotations

import csv
import io as _io
import json
import os
import time
from typing import Any, Callable, Sequence

import numpy as np

from ceu_jax import io
from ceu_jax import workdir as workdir_lib
from ceu_jax.audits import answer_presence as ap
from ceu_jax.audits import plots, report
from ceu_jax.audits import sentinels as sp
from ceu_jax.audits import worlds
from ceu_jax.metrics.resampling import mean_ci
from ceu_jax.progress import Progress

ROW_COLUMNS = ('reader', 'baseline', 'id', 'bucket', 'edit', 'f1_orig', 'f1_edit', 'delta',
               'll_orig', 'll_edit', 'dll', 'answer', 'placebo_spans', 'appended', 'residual')
SCORE_COLUMNS = ('reader', 'baseline', 'id', 'bucket', 'bucket_companion', 'f1', 'loglik',
                 'answer')
FREE_FIELDS = ('plots',)  # may change between a run and its resumption


def _check_config(config, workdir: str) -> None:
  workdir_lib.refuse_other_job_config(config, workdir, 'an answer-presence', FREE_FIELDS)


def audit_chunk(reader, medium, by_baseline: dict, *, loglik: bool,
                identity_baselines: Sequence[str]) -> dict:
  """Everything one reader gives on one chunk of records (JSON-able).

  by_baseline: {'B1': raw records, 'B2': ..., ...}. Per baseline: skipped ids
  per reason, per-record (bucket, companion bucket, F1, log-lik, answer) and,
  for every baseline but B1, the audit rows; the sentinel panel on B2.
  """
  scorer = ap.Scorer(reader, medium, loglik=loglik)
  out: dict = dict(skipped={}, scores={}, rows={}, panel=None)
  for b, recs in by_baseline.items():
    v = ap.validate(recs, medium=medium)
    out['skipped'][b] = {k: [str(i) for i in ids] for k, ids in v.skipped_ids.items()}
    res = scorer.results(v.kept, [r.context for r in v.kept])
    out['scores'][b] = [dict(id=str(r.id), bucket=ap.bucket(r, medium),
                             bucket_companion=ap.bucket(r, medium, companion=True),
                             f1=x[0], loglik=x[1], answer=x[2]) for r, x in zip(v.kept, res)]
    if b == 'B1':
      continue
    rows = ap.run_audit(reader, v.kept, scorer=scorer, identity=b in identity_baselines)
    for x in rows:
      x.pop('context')
      x['id'] = str(x['id'])
    out['rows'][b] = rows
    if b == 'B2':
      f1 = sp.panel_f1(reader, v.kept, scorer=scorer)
      out['panel'] = {k: ([str(i) for i in val] if k in ('ids', 'no_placebo')
                          else np.asarray(val, np.float64).tolist()) for k, val in f1.items()}
  out['calls'] = scorer.calls
  return out


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
  panels = [p['panel'] for p in parts if p['panel'] and p['panel']['ids']]
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
        no_placebo=sum(len(p['no_placebo']) for p in panels))
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


def _csv(path: str, columns: Sequence[str], rows: Sequence[dict]) -> None:
  buf = _io.StringIO()
  w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction='ignore')
  w.writeheader()
  w.writerows(rows)
  io.write_text_atomic(path, buf.getvalue())


def run_answer_presence(config, workdir: str, log: Callable[[str], None] = print) -> dict:
  """Run (or resume) the audit; returns the summary dict (also in W/summary.json)."""
  world = worlds.make(config)  # validates the config before anything is built or written
  os.makedirs(os.path.join(workdir, 'chunks'), exist_ok=True)
  _check_config(config, workdir)
  t0 = time.time()
  with workdir_lib.WorkdirLock(workdir, 'answer_presence'):
    if workdir_lib.read_config_json(workdir) is None:
      io.write_json_atomic(os.path.join(workdir, workdir_lib.CONFIG_FILE), config.to_dict())
    world.prepare(workdir, log)
    units = [(name, k) for name in world.readers for k in range(world.n_chunks)]
    paths = {u: os.path.join(workdir, 'chunks', f'{u[0]}_{u[1]:04d}.json') for u in units}
    done = sum(os.path.exists(p) for p in paths.values())
    prog = Progress(total=len(units), done=done)
    log(f'answer presence ({config.world}): {len(units)} chunks, {done} done before')
    calls = 0
    for u in units:
      if os.path.exists(paths[u]):
        continue
      part = world.chunk(u[0], u[1])
      calls += part['calls']
      io.write_json_atomic(paths[u], part)
      done += 1
      log(f'chunk {done}/{len(units)} ({u[0]} #{u[1]}, {part["calls"]} reader items; '
          f'{prog.update(done)})')
    parts = {name: [io.read_json(paths[(name, k)]) for k in range(world.n_chunks)]
             for name in world.readers}
    summary = _summarise(config, world, parts)
    summary['wall_s_this_run'] = round(time.time() - t0, 1)
    summary['reader_items_this_run'] = calls
    _write_outputs(config, workdir, world, parts, summary)
  return summary


def _summarise(config, world, parts: dict) -> dict:
  first = parts[world.readers[0]]
  summary = dict(world=config.world, config=config.to_dict(), n_records=world.n_records,
                 baselines=_baselines_section(first, world.baselines),
                 readers={name: _summarise_reader(parts[name], world.baselines,
                                                  config.bootstrap_seed)
                          for name in world.readers})
  summary.update(world.extra_summary(first))
  return json.loads(json.dumps(summary))


def _write_outputs(config, workdir: str, world, parts: dict, summary: dict) -> None:
  rows, scores = [], []
  for name, ps in parts.items():
    for p in ps:
      for b, xs in p['rows'].items():
        rows += [dict(x, reader=name, baseline=b) for x in xs]
      for b, xs in p['scores'].items():
        scores += [dict(x, reader=name, baseline=b) for x in xs]
  _csv(os.path.join(workdir, 'rows.csv'), ROW_COLUMNS, rows)
  _csv(os.path.join(workdir, 'scores.csv'), SCORE_COLUMNS, scores)
  rd = summary['readers']
  md = [f'# Answer-presence audit ({world.title})', '', world.describe(summary), '',
        '## Buckets per baseline', '', report.buckets_table(summary['baselines'],
                                                            world.companion_name), '',
        '## Reader score per baseline (token F1 × 100)', '',
        report.baseline_table(rd, world.baselines), '',
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
    plots.effects_figure(rd, os.path.join(workdir, 'effects'))
    md += ['', '![effects](effects.png)']
    if any(r['panel'] for r in rd.values()):
      plots.panel_figure(rd, os.path.join(workdir, 'panel'))
      md += ['', '![sentinel panel](panel.png)']
  md += ['', '## Every edit and bucket']
  for name, r in rd.items():
    for b, cell in r['cells'].items():
      md += ['', f'### {name} / {b}', '', report.cell_table(cell)]
  io.write_json_atomic(os.path.join(workdir, 'summary.json'), summary)
  io.write_text_atomic(os.path.join(workdir, 'report.md'), '\n'.join(md) + '\n')
