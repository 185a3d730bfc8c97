"""The answer-presence entry point: outputs, resume, bad config, CLI; World A `:tiny` (trains)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from ceu_jax import workdir as workdir_lib
from ceu_jax.audits.answer_presence import job
from configs import answer_presence as cfg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def _same(a, b):
  """Equal up to what differs between a run and its resume (produced_by's counts, time)."""
  strip = lambda s: {k: v for k, v in s.items() if k != 'produced_by'}  # noqa: E731
  return json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True) and (
      a['produced_by']['config'] == b['produced_by']['config'])


def test_generated_tiny_outputs_and_resume(tmp_path):
  c = cfg.get_config('tiny,world=generated')
  w = str(tmp_path / 'w')
  s = job.run_answer_presence(c, w, log=lambda m: None)
  b2 = s['baselines']['B2']
  assert b2['n_kept'] == c.n_records and sum(b2['buckets'].values()) == c.n_records
  cell = s['readers']['copy']['cells']['B2']
  assert cell['delta_causal']['value'] == -100.0 and cell['identity_max_abs'] == 0.0
  assert s['readers']['copy']['panel']['verdicts']['c2a_pass']
  rows = list(csv.DictReader(open(os.path.join(w, 'rows.csv'))))
  assert sum(r['edit'] == 'identity' for r in rows) == c.n_records
  assert all(float(r['delta']) == 0.0 for r in rows if r['edit'] == 'identity')
  scores = list(csv.DictReader(open(os.path.join(w, 'scores.csv'))))
  assert len(scores) == 2 * c.n_records  # B1 and B2
  assert 'Δcausal' in open(os.path.join(w, 'report.md')).read()
  units = sorted(os.listdir(os.path.join(w, 'units')))
  assert len(units) == 4
  os.remove(os.path.join(w, 'units', units[1]))  # an interrupted run
  s2 = job.run_answer_presence(c, w, log=lambda m: None)
  assert _same(s, s2) and s2['produced_by']['units_this_run'] == 1
  assert json.load(open(os.path.join(w, 'summary.json')))['readers'] == s['readers']


def test_closed_book_reader_has_no_effects(tmp_path):
  s = job.run_answer_presence(cfg.get_config('tiny,world=generated,reader=closed_book'),
                              str(tmp_path), log=lambda m: None)
  effects = s['readers']['closed_book']['cells']['B2']['effects']
  assert effects and all(e['delta']['value'] == 0.0 for e in effects)


def test_a_world_a_run_under_the_earlier_b4_is_not_resumed(tmp_path):
  """World A's record carries the rewriters' version: a workdir whose job.json predates
  it (B4 a fresh filter of the raw context) is refused, naming the field, never mixed;
  other worlds' records are their configs, as before."""
  from ceu_jax import jobs  # pylint: disable=g-import-not-at-top
  from ceu_jax.audits.answer_presence import atr_world  # pylint: disable=g-import-not-at-top
  from tests._job_cases import refuses_a_record_without  # pylint: disable=g-import-not-at-top
  a = job.AnswerPresenceJob(cfg.get_config('tiny'))
  assert a.record()['rewriter_version'] == atr_world.REWRITER_VERSION == 2
  refuses_a_record_without(a, 'rewriter_version', tmp_path)
  g = job.AnswerPresenceJob(cfg.get_config('tiny,world=generated'))
  assert g.record() == jobs.plain(g.config)


def test_bad_config_named(tmp_path):
  with pytest.raises(ValueError, match='config.reader'):
    job.run_answer_presence(cfg.get_config('tiny,world=generated,reader=gpt'),
                            str(tmp_path / 'never'))
  assert not os.path.exists(tmp_path / 'never')  # refused before anything is written
  with pytest.raises(ValueError, match='variant'):
    cfg.get_config('huge')
  with pytest.raises(ValueError, match='world'):
    cfg.get_config('tiny,world=mars')
  c = cfg.get_config('tiny')
  c.atr.families = ('attention', 'rnn')
  with pytest.raises(ValueError, match='config.atr.families'):
    job.run_answer_presence(c, str(tmp_path / 'never'))
  c = cfg.get_config('tiny')
  c.atr.p_drop = 1.5
  with pytest.raises(ValueError, match='config.atr.p_drop'):
    job.run_answer_presence(c, str(tmp_path / 'never'))
  # another config in a used workdir is refused, naming the field
  w = str(tmp_path / 'w')
  job.run_answer_presence(cfg.get_config('tiny,world=generated'), w, log=lambda m: None)
  with pytest.raises(workdir_lib.WorkdirConfigError,
                     match=r'holds an answer_presence run of another config: n_records \d+ -> 100\.'):
    job.run_answer_presence(cfg.get_config('tiny,world=generated,n_records=100'), w)


def test_cli_tiny(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT)
  p = subprocess.run([sys.executable, '-m', 'experiments.answer_presence',
                      '--config=configs/answer_presence.py:tiny,world=generated',
                      f'--workdir={tmp_path}'],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  assert 'copy sentinel panel: C2a PASS (4/4), C2b PASS' in p.stdout
  assert 'copy B2: Δcausal -100.00 [-100.00, -100.00]' in p.stdout
  assert sorted(f for f in os.listdir(tmp_path) if f not in ('units',)) == [
      '.job.lock', 'effects.pdf', 'effects.png', 'job.json', 'panel.pdf', 'panel.png',
      'provenance.json', 'report.md', 'rows.csv', 'scores.csv', 'summary.json']
  p = subprocess.run([sys.executable, '-m', 'experiments.answer_presence',
                      '--config=configs/answer_presence.py:tiny,world=generated,reader=gpt',
                      f'--workdir={tmp_path}/x'],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 1 and 'config.reader must be one of' in p.stderr


def cfg_vocab(c):
  from ceu_jax.data import tasks
  return tasks.data_config(c.atr.train.data).vocab.token_strings()


def test_world_a_tiny_trains_audits_and_resumes(tmp_path):
  """`:tiny` (World A): attention trained 10 steps as in the smoke grid, 64 records."""
  c = cfg.get_config('tiny')
  c.items_per_chunk = 32
  w = str(tmp_path)
  logs = []
  s = job.run_answer_presence(c, w, log=logs.append)
  assert any('training attention' in m for m in logs)
  assert s['training']['attention']['completed'] and s['training']['attention']['checkpoint_step'] == 10
  for b in ('B2', 'B3', 'B4'):
    x = s['baselines'][b]
    assert x['n_kept'] + sum(x['skipped'].values()) == c.n_records
    assert sum(x['buckets'].values()) == sum(x['buckets_companion'].values()) == x['n_kept']
    cell = s['readers']['attention']['cells'][b]
    assert cell['identity_max_abs'] == 0.0 and cell['delta_causal']['n'] == x['buckets']['1→1']
    assert 'delta_causal_ll' in cell
  assert s['readers']['attention']['panel']['verdicts']['text'].startswith('C2a')
  rows = list(csv.DictReader(open(os.path.join(w, 'rows.csv'))))
  assert {r['edit'] for r in rows} == {'remove', 'placebo', 'insert_prepend', 'insert_mid',
                                       'identity'}
  vocab = set(cfg_vocab(c))
  assert all(set(r['answer'].split()) <= vocab for r in rows)  # decoded answer tokens
  os.remove(os.path.join(w, 'units', 'attention_0001.json'))
  logs.clear()
  s2 = job.run_answer_presence(c, w, log=logs.append)
  assert not any('training' in m for m in logs)  # the trained reader is reused
  assert _same(s, s2)


def test_world_b_tiny_with_smollm2(tmp_path):
  """`:tiny,world=factqa` (2 of 30 SmolLM2 layers, 4 items): rewriters A, B, B4 = A
  verified by B, the control; every baseline scored or its skips counted."""
  c = cfg.get_config('tiny,world=factqa')
  s = job.run_answer_presence(c, str(tmp_path), log=lambda m: None)
  for b in ('B1', 'B2', 'B3', 'B4'):
    x = s['baselines'][b]
    assert x['n_kept'] + sum(x['skipped'].values()) == c.n_records
  assert set(s['containment']) == {'B1 (raw)', 'B2', 'B3', 'B4', 'control'}
  report = open(os.path.join(str(tmp_path), 'report.md')).read()
  assert 'B4 = A verified by B' in report and '(n=' in report
