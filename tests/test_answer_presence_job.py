"""The answer-presence entry point (:tiny, oracle readers): outputs, resume, bad config, CLI."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from ceu_jax.audits import job
from configs import answer_presence as cfg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tiny_run_outputs_and_resume(tmp_path):
  c = cfg.get_config('tiny')
  w = str(tmp_path / 'w')
  s = job.run_answer_presence(c, w)
  assert s['n_kept'] == c.n_records and sum(s['buckets'].values()) == c.n_records
  assert s['delta_causal']['value'] == -100.0 and s['verdicts']['c2a_pass']
  rows = list(csv.DictReader(open(os.path.join(w, 'rows.csv'))))
  assert sum(r['edit'] == 'identity' for r in rows) == c.n_records
  assert all(float(r['delta']) == 0.0 for r in rows if r['edit'] == 'identity')
  assert 'Δcausal' in open(os.path.join(w, 'report.md')).read()
  chunks = sorted(os.listdir(os.path.join(w, 'chunks')))
  os.remove(os.path.join(w, 'chunks', chunks[1]))  # an interrupted run
  s2 = job.run_answer_presence(c, w)
  assert json.dumps(s2, sort_keys=True) == json.dumps(s, sort_keys=True)
  assert json.load(open(os.path.join(w, 'summary.json')))['effects'] == s['effects']


def test_closed_book_reader_has_no_effects(tmp_path):
  s = job.run_answer_presence(cfg.get_config('tiny,reader=closed_book'), str(tmp_path))
  assert all(e['delta']['value'] == 0.0 for e in s['effects'])


def test_bad_config_named():
  with pytest.raises(ValueError, match='reader'):
    job.run_answer_presence(cfg.get_config('tiny,reader=gpt'), '/nonexistent-never-created')
  with pytest.raises(ValueError, match='variant'):
    cfg.get_config('huge')


def test_cli_tiny(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT)
  p = subprocess.run([sys.executable, '-m', 'experiments.answer_presence',
                      '--config=configs/answer_presence.py:tiny', f'--workdir={tmp_path}'],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  assert 'C2a PASS (4/4), C2b PASS' in p.stdout
  assert sorted(f for f in os.listdir(tmp_path) if f != 'chunks') == [
      'effects.pdf', 'effects.png', 'panel.pdf', 'panel.png', 'report.md', 'rows.csv',
      'summary.json']
