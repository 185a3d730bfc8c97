"""experiments.reader_eval's job (ceu_jax/readers/factqa_eval.py) on the job contract, with
an oracle reader whose answers are known: open book copies the gold, closed book says
'unknown'. Outputs, resume, refusals, bad values (no model needed)."""
from __future__ import annotations

import json
import os

import pytest

from ceu_jax import jobs
from ceu_jax import workdir as workdir_lib
from ceu_jax.readers import base
from ceu_jax.readers import factqa_eval as fe
from configs import reader_eval


class GoldOracle(base.Reader):
  """Open book: the gold answer (read off the plan); closed book: 'unknown'."""

  def __init__(self):
    self.gold, self.calls = {}, 0

  def _generate(self, prompts, forced, budget, stops, ids):
    self.calls += 1
    out = []
    for p, i in zip(prompts, ids):
      text = self.gold[i] if 'Context:' in str(p[-1] if isinstance(p, list) else p) else 'unknown'
      out.append(base.Generation(id=i, text=text, tokens=(), stop_reason=base.END))
    return out

  def _loglik(self, prompts, answers, ids):
    raise NotImplementedError


def _config(**kw):
  c = reader_eval.get_config('tiny')
  c.update(kw)
  return c


def _reader(config):
  r = GoldOracle()
  from ceu_jax.data.factqa import storage
  r.gold = {e['id']: e['answer'] for e in storage.read_examples()}
  return r


def test_outputs_scores_and_resume(tmp_path):
  c, w = _config(), str(tmp_path / 'w')
  s = fe.run_reader_eval(c, w, reader=_reader(c), log=lambda m: None)
  g = s['groups']
  assert g['all/open_book']['em']['value'] == 1.0 and g['all/open_book']['em']['n'] == 8
  assert g['all/closed_book']['em']['value'] == 0.0
  assert g['all/open_book']['copied']['value'] == 1.0   # the gold occurs in its passage
  for f in ('plan.json', 'rows.csv', 'table.md', 'summary.json', 'job.json'):
    assert os.path.exists(os.path.join(w, f)), f
  units = sorted(os.listdir(os.path.join(w, 'units')))
  assert len(units) == 4      # 2 sources x 2 conditions x 1 chunk of 4
  os.remove(os.path.join(w, 'units', units[2]))
  r = _reader(c)
  again = fe.run_reader_eval(c, w, reader=r, log=lambda m: None)
  assert r.calls == 1 and again['groups'] == s['groups']
  assert again['produced_by']['units_this_run'] == 1


def test_a_changed_config_is_refused_naming_the_field_and_keeps_the_plan(tmp_path):
  c, w = _config(), str(tmp_path / 'w')
  fe.run_reader_eval(c, w, reader=_reader(c), log=lambda m: None)
  plan = open(os.path.join(w, 'plan.json')).read()
  with pytest.raises(workdir_lib.WorkdirConfigError, match='n_per_source 4 -> 3'):
    fe.run_reader_eval(_config(n_per_source=3), w, reader=_reader(c), log=lambda m: None)
  with pytest.raises(jobs.JobConfigError, match='seed 0 -> 1'):
    fe.run_reader_eval(_config(seed=1), w, reader=_reader(c), log=lambda m: None)
  assert open(os.path.join(w, 'plan.json')).read() == plan


@pytest.mark.parametrize('field,value', [('n_per_source', -3), ('n_per_source', 0),
                                         ('items_per_chunk', 0), ('batch_size', -1),
                                         ('split', 'dev'), ('n_layers', -2)])
def test_bad_values_are_refused_before_anything_is_written(tmp_path, field, value):
  with pytest.raises(ValueError, match=field):
    fe.run_reader_eval(_config(**{field: value}), str(tmp_path / 'never'), reader=GoldOracle())
  assert not os.path.exists(tmp_path / 'never')


@pytest.mark.parametrize('arg,field', [('tiny,n_per_source=-3', 'n_per_source'),
                                       ('tiny,batch_size=0', 'batch_size'),
                                       ('tiny,n_layers=-1', 'n_layers'),
                                       ('tiny,split=dev', 'split')])
def test_config_arguments_refuse_negative_counts(arg, field):
  with pytest.raises(ValueError, match=f'{field} must be'):
    reader_eval.get_config(arg)


def test_another_job_in_the_workdir_is_refused(tmp_path):
  from configs import answer_presence
  from ceu_jax.audits.answer_presence import job
  w = str(tmp_path / 'w')
  job.run_answer_presence(answer_presence.get_config('tiny,world=generated'), w,
                          log=lambda m: None)
  with pytest.raises(jobs.JobMismatchError, match='holds an answer_presence run'):
    fe.run_reader_eval(_config(), w, reader=GoldOracle(), log=lambda m: None)
  assert json.load(open(os.path.join(w, 'job.json')))['job'] == 'answer_presence'
