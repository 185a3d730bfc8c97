"""The recorded World B mediator audit with fine-tuned checklist readers (issue #35, item 1;
docs/runs/issue35_mediator_world_b.tar.gz): its claims are re-decided here from the recorded
rows, probes and competence checks by the job's own `decide`, so the README's sentence
cannot drift from the files."""
from __future__ import annotations

import json
import os

import ml_collections
import pytest

from ceu_jax.audits.mediator import job
from ceu_jax.audits.mediator import worlds
from tests.conftest import extract_recorded_run

ARCHIVE = 'issue35_mediator_world_b.tar.gz'   # in docs/runs
PAIR = 'smollm2_lora/shortcut vs faithful'


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  w = os.path.join(extract_recorded_run(ARCHIVE, tmp_path_factory.mktemp('rec')),
                   'mediator_smollm2_ft')
  return w, json.load(open(os.path.join(w, 'summary.json')))


def test_recorded_claims_follow_from_the_recorded_rows(run):
  w, s = run
  config = ml_collections.ConfigDict(s['config'])
  rows = {k: json.load(open(os.path.join(w, 'units', f"{worlds.setting_key(v['reader'], v['tool'])}"
                                                       '_0000.json')))
          for k, v in s['settings'].items()}
  readers = list(dict.fromkeys(v['reader'] for v in s['settings'].values()))
  found = job.decide(config, s['settings'], rows, readers, s['probes'], s['competence'])
  judged = {c.name: c for c in found}
  recorded = {c['name']: c for c in s['claims']}
  assert set(judged) == set(recorded)
  for name, c in judged.items():
    assert (c.verdict, c.numbers) == (recorded[name]['verdict'], recorded[name]['numbers']), name
  for what in ('separates', 'probe separates', 'probe agrees'):   # neither reader competent
    assert judged[f'{PAIR}: {what}'].verdict == 'untested'
  assert 'its rows: Δ(shortcut) − Δ(faithful) +0.033' in judged[f'{PAIR}: separates'].numbers
  assert '→ not supported' in judged[f'{PAIR}: probe separates'].numbers


def test_recorded_competence_is_chance_level_grading(run):
  _, s = run
  for name, acc in (('smollm2_lora/faithful', 0.125), ('smollm2_lora/shortcut', 0.075)):
    c = s['competence'][name]
    assert not c['competent'] and c['n'] == 40 and c['checklist_accuracy'] == acc
    assert c['decision_parse_rate'] == 1.0                 # the format is learned
    assert abs(c['line_accuracy'] - c['line_constant']) < 0.01   # the grading is not
  for name in ('smollm2_lora/faithful', 'smollm2_lora/shortcut'):
    assert s['settings'][name]['n'] == 150
  assert s['settings']['smollm2_lora/faithful']['F_ID']['value'] == pytest.approx(0.947, abs=5e-4)
