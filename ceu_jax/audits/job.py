"""The answer-presence job: records → audit rows → rows.csv, summary.json, report.md.

  run_answer_presence(config, workdir)   # experiments/answer_presence.py calls this

World 'generated': seeded text records (gold answers planted 1-3 times, or
absent, in a raw and a compiled context) — exact ground truth for the
pipeline; readers are the oracles of `ceu_jax.readers.oracles` ('copy': uses
its evidence; 'closed_book': ignores it). Work is done in chunks of records
saved under W/chunks (atomically); a rerun skips finished chunks (resumable).
Outputs (rows.csv, summary.json, report.md, effects.png/pdf, panel.png/pdf)
are written atomically (ceu_jax.io).
"""
from __future__ import annotations

import csv
import io as _io
import json
import os
import random
from typing import Sequence

import numpy as np
from absl import logging

from ceu_jax import io
from ceu_jax.audits import answer_presence as ap
from ceu_jax.audits import plots
from ceu_jax.audits import sentinels as sp
from ceu_jax.progress import Progress
from ceu_jax.readers.oracles import ClosedBookOracle, CopyOracle, question_of

WORLDS = ('generated',)
READERS = ('copy', 'closed_book')
_LETTERS = 'bcdefghijlnoprtuvwxyz'  # no letter of '[mask]'


def generated_records(n: int, seed: int, p_raw: float = 0.7, p_keep: float = 0.8,
                      p_surface: float = 0.2) -> list[ap.Record]:
  """n text records; raw holds the gold with p_raw, the compile keeps it with p_keep
  (surfaces it when raw lacks it with p_surface); coincidental case changes included."""
  rng = random.Random(seed)

  def word():
    return ''.join(rng.choice(_LETTERS) for _ in range(rng.randint(3, 7)))

  def text(words, gold, has):
    words = list(words)
    for _ in range(rng.randint(1, 3) if has else 0):
      words.insert(rng.randint(0, len(words)), gold.upper() if rng.random() < 0.3 else gold)
    out, k = [], 0
    while k < len(words):
      m = rng.randint(3, 8)
      out.append(' '.join(words[k:k + m]) + '.')
      k += m
    return ' '.join(out)

  recs = []
  for i in range(n):
    gold = ' '.join(word() for _ in range(rng.randint(1, 3)))
    filler = [word() for _ in range(rng.randint(12, 40))]
    raw_has = rng.random() < p_raw
    comp_has = rng.random() < (p_keep if raw_has else p_surface)
    recs.append(ap.Record(f'g{seed}-{i}', f'what is item {i}', (gold,),
                          text(filler[::-1], gold, comp_has), text(filler, gold, raw_has)))
  return recs


def make_reader(name: str, records: Sequence[ap.Record]):
  """An oracle reader over the records' golds (see module doc)."""
  if name == 'copy':
    return CopyOracle(candidates={r.id: list(r.golds) for r in records})
  if name == 'closed_book':  # knows every other item's answer
    return ClosedBookOracle(table={question_of(ap.default_prompt('x', r.question)): r.golds[0]
                                   for r in records[::2]})
  raise ValueError(f'config.reader must be one of {READERS}, got {name!r}')


def _check(config) -> None:
  if config.world not in WORLDS:
    raise ValueError(f'config.world must be one of {WORLDS}, got {config.world!r}')
  if config.reader not in READERS:
    raise ValueError(f'config.reader must be one of {READERS}, got {config.reader!r}')
  for k in ('n_records', 'chunk_size', 'max_new_tokens'):
    if int(config[k]) < 1:
      raise ValueError(f'config.{k} must be >= 1, got {config[k]}')


def _chunk(reader, recs, config) -> dict:
  kw = dict(max_new_tokens=config.max_new_tokens)
  rows = ap.run_audit(reader, recs, sentinel=config.sentinel, **kw)
  for x in rows:
    x.pop('context')
  f1 = sp.panel_f1(reader, recs, **kw) if any(ap.present(r.context, r.golds) for r in recs) else None
  if f1 is not None:
    f1 = {k: [float(v) if not isinstance(v, str) else v for v in vals] for k, vals in f1.items()}
  return dict(rows=rows, panel=f1)


def run_answer_presence(config, workdir: str) -> dict:
  """Run (or resume) the audit; returns the summary dict (also in W/summary.json)."""
  _check(config)
  os.makedirs(os.path.join(workdir, 'chunks'), exist_ok=True)
  records = generated_records(config.n_records, config.seed)
  v = ap.validate(records, max_context_chars=config.max_context_chars or None)
  reader = make_reader(config.reader, v.kept)
  chunks = [v.kept[k:k + config.chunk_size] for k in range(0, len(v.kept), config.chunk_size)]
  paths = [os.path.join(workdir, 'chunks', f'{k:05d}.json') for k in range(len(chunks))]
  done = sum(os.path.exists(p) for p in paths)
  prog = Progress(total=len(chunks), done=done)
  for k, (recs, path) in enumerate(zip(chunks, paths)):
    if os.path.exists(path):
      continue
    io.write_json_atomic(path, _chunk(reader, recs, config))
    done += 1
    logging.info('chunk %d/%d (%s)', done, len(chunks), prog.update(done))
  parts = [io.read_json(p) for p in paths]
  rows = [x for p in parts for x in p['rows']]
  eff = ap.effects(rows, seed=config.bootstrap_seed)
  causal = ap.delta_causal(rows, seed=config.bootstrap_seed)
  summary = dict(
      config=config.to_dict(), n_records=len(records), n_kept=len(v.kept),
      skipped=dict(v.skipped), skipped_ids={k: [str(i) for i in x] for k, x in v.skipped_ids.items()},
      buckets=ap.bucket_counts(v.kept),
      buckets_normalized=ap.bucket_counts(v.kept, normalized=True),  # companion presence
      effects=[dict(edit=x['edit'], bucket=x['bucket'], n=x['n'], f1=x['f1'].to_dict(),
                    delta=x['delta'].to_dict()) for x in eff],
      delta_causal=causal.to_dict(),
      appended_insert_mid=sum(1 for x in rows if x['edit'] == 'insert_mid' and x['appended']),
      remove_residual=sum(1 for x in rows if x['edit'] == 'remove' and x['residual']),
      # rows with a remove but no placebo (no room for a non-answer span): out of Δcausal
      placebo_missing=(sum(x['edit'] == 'remove' for x in rows)
                       - sum(x['edit'] == 'placebo' for x in rows)))
  report = ['# Answer-presence audit', '',
            f"world {config.world}, reader {config.reader}: {len(v.kept)} of {len(records)} "
            f"records kept; skipped {dict(v.skipped) or 'none'}", '',
            f"buckets: {summary['buckets']} (SQuAD-normalised word match: "
            f"{summary['buckets_normalized']})", '', ap.effects_table(eff, causal)]
  panels = [p['panel'] for p in parts if p['panel']]
  if panels:
    f1 = {c: np.concatenate([np.asarray(p[c], np.float64) for p in panels])
          for c in ('B1', 'B2', *sp.SENTINELS, 'PLACEBO')}
    prow, verdicts = sp.panel(f1, seed=config.bootstrap_seed)
    summary['panel'] = [dict(condition=x['condition'], f1=x['f1'].to_dict(), vs=x['vs'],
                             delta=None if x['delta'] is None else x['delta'].to_dict())
                        for x in prow]
    summary['verdicts'] = dict(E=verdicts.E, passed=verdicts.passed, c2a_pass=verdicts.c2a_pass,
                               c2b_pass=verdicts.c2b_pass, d={s: a.to_dict() for s, a in verdicts.d.items()},
                               c2b_d=verdicts.c2b_d.to_dict(), text=verdicts.summary())
    report += ['', '## Sentinel panel (compiled context holds the gold)', '',
               sp.panel_table(prow, verdicts)]
  buf = _io.StringIO()
  cols = ['id', 'bucket', 'edit', 'f1_orig', 'f1_edit', 'delta', 'placebo_spans', 'appended',
          'residual']
  w = csv.DictWriter(buf, fieldnames=cols)
  w.writeheader()
  w.writerows({c: x[c] for c in cols} for x in rows)
  io.write_text_atomic(os.path.join(workdir, 'rows.csv'), buf.getvalue())
  if config.plots:
    plots.effects_figure(summary['effects'], os.path.join(workdir, 'effects'))
    report += ['', '![effects](effects.png)']
    if 'panel' in summary:
      plots.panel_figure(summary['panel'], summary['verdicts']['text'], os.path.join(workdir, 'panel'))
      report += ['', '![sentinel panel](panel.png)']
  io.write_json_atomic(os.path.join(workdir, 'summary.json'), json.loads(json.dumps(summary)))
  io.write_text_atomic(os.path.join(workdir, 'report.md'), '\n'.join(report) + '\n')
  return summary
