"""The trace-sensitivity entry point: World A tiny end to end, resume, config checks (issue #17)."""
import csv
import json
import os
import subprocess
import sys

import pytest

from ceu_jax import workdir as workdir_lib
from ceu_jax.audits.traces import job as trace_job
from configs import trace_sensitivity as cfgs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def test_tiny_chain_entry_point(tmp_path):
  w = str(tmp_path / 'w')
  env = dict(os.environ, PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, '-m', 'experiments.trace_sensitivity', '--config',
                        'configs/trace_sensitivity.py:tiny', '--workdir', w],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  s = json.load(open(os.path.join(w, 'summary.json')))
  r = s['readers']
  assert r['following']['all']['phi']['value'] == 1.0 and r['following']['all']['rho']['value'] == 0.0
  assert r['ignoring']['all']['phi']['value'] == 0.0 and r['ignoring']['all']['rho']['value'] == 1.0
  assert r['following']['all']['follow']['value'] == 1.0  # the follow rate beside φ and ρ
  assert r['ignoring']['all']['follow']['value'] == 0.0
  assert s['taus_defined'] == {'chain': ['fact_reversal', 'premise_negation', 'causal_inversion']}
  for x in r.values():
    assert x['identity']['phi']['value'] == 0.0 and x['parse_failure_rate'] == 0.0
    assert set(x['by_trace_len']) == {'1', '2', '3'}
  with open(os.path.join(w, 'rows.csv')) as f:
    rows = list(csv.DictReader(f))
  n_undefined = sum(n for x in r.values() for ts_ in x['undefined'].values()
                    for reasons in ts_.values() for n in reasons.values())
  assert n_undefined > 0  # CausalInversion at every trace's last step
  assert len(rows) == sum(x['all']['n'] + x['identity']['n'] for x in r.values()) + n_undefined
  assert {x['undefined'] for x in rows if x['applied'] == 'False'} == {'last_step'}
  for name in ('report.md', 'rho_by_length.png', 'rho_by_length.pdf'):
    assert os.path.getsize(os.path.join(w, name)) > 0
  report = open(os.path.join(w, 'report.md')).read()
  assert 'LogicFlip has no meaning' in report and 'follow [95% CI] (n)' in report
  assert 'regen parse fail' in report and 'φ / ρ if unparsed = changed' in report


def test_resume_and_config_check(tmp_path):
  w = str(tmp_path / 'w')
  c = cfgs.get_config('tiny,n_items=12')
  with c.unlocked():
    c.items_per_chunk = 5
    c.chain.readers = ('mixture',)
  logs = []
  s1 = trace_job.run_trace_sensitivity(c, w, log=logs.append)
  units = sorted(os.listdir(os.path.join(w, 'units')))
  assert len(units) == 3
  os.remove(os.path.join(w, 'units', units[1]))
  logs.clear()
  s2 = trace_job.run_trace_sensitivity(c, w, log=logs.append)
  assert '3 units, 2 finished before' in logs[0]
  assert sum(x.startswith('[trace_sensitivity] unit ') for x in logs) == 1
  assert s2['readers'] == s1['readers']
  other = cfgs.get_config('tiny,n_items=13')
  with other.unlocked():
    other.items_per_chunk = 5
    other.chain.readers = ('mixture',)
  with pytest.raises(workdir_lib.WorkdirConfigError, match='n_items'):
    trace_job.run_trace_sensitivity(other, w)


@pytest.mark.parametrize('field,value,match', [
    ('tau_sim', 1.5, 'tau_sim'), ('lam', -0.1, 'lam'), ('taus', ('flip',), 'taus'),
    ('world', 'mars', 'world'), ('n_items', 0, 'n_items'),
    ('items_per_chunk', 0, 'items_per_chunk')])
def test_bad_config_fails_before_any_work(tmp_path, field, value, match):
  c = cfgs.get_config('tiny')
  with c.unlocked():
    c[field] = value
  with pytest.raises(ValueError, match=match):
    trace_job.run_trace_sensitivity(c, str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w')


def test_a_run_scored_under_earlier_rules_is_not_resumed(tmp_path):
  """The job's record carries the audit's rules version: a workdir whose job.json
  predates it is refused, naming the field, so no unit of the earlier rules is mixed in."""
  from ceu_jax.audits.traces import audit as ts  # pylint: disable=g-import-not-at-top
  from tests._job_cases import refuses_a_record_without  # pylint: disable=g-import-not-at-top
  a = trace_job.TraceSensitivityJob(cfgs.get_config('tiny,readers=oracles'))
  assert a.record()['rules_version'] == ts.RULES_VERSION == 3
  refuses_a_record_without(a, 'rules_version', tmp_path)


def test_config_arguments():
  assert cfgs.get_config('tiny').n_items == 40
  assert cfgs.get_config('tiny,world=smollm2').n_items == 1
  assert cfgs.get_config('full,world=smollm2').n_items == 150
  with pytest.raises(ValueError, match='world must be one of chain, smollm2'):
    cfgs.get_config('tiny,world=mars')
  with pytest.raises(ValueError, match='variant'):
    cfgs.get_config('huge')


def test_trace_modules_never_import_architectures():
  code = ('import sys, ceu_jax.audits.traces.audit, ceu_jax.audits.traces.chain_world, '
          'ceu_jax.audits.traces.text, ceu_jax.audits.traces.arithmetic, '
          'ceu_jax.audits.traces.smollm2_world, ceu_jax.audits.traces.summary, '
          'ceu_jax.audits.traces.job; '
          'print(sorted(m for m in sys.modules if m.split(".")[0] == "architectures"))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.stdout.strip() == '[]'


def test_tiny_trained_reader_and_answer_probe(tmp_path):
  """World A with a trained reader (2 steps: plumbing): trained in W/train, audited (its
  unparseable outputs counted), the §8.4 answer probe per chain length, the overview;
  a rerun reuses the trained reader and the probe."""
  w = str(tmp_path / 'w')
  c = cfgs.get_config('tiny,readers=both,steps=2,n_items=8')
  logs = []
  s = trace_job.run_trace_sensitivity(c, w, log=logs.append)
  assert any(x.startswith('training attention (2 steps)') for x in logs)
  assert set(s['readers']) == {'following', 'ignoring', 'mixture', 'attention/plain'}
  t = s['readers']['attention/plain']
  parsed = sum(g['n'] for g in s['reader_stats'].get('attention/plain', {}).values())
  assert t['n_parse_failure'] + parsed == 8
  for g in ('chain', 'chain_prior'):  # the oracles follow / ignore on both groups
    assert s['readers']['following']['by_domain'][g]['rho']['value'] == 0.0
    assert s['readers']['ignoring']['by_domain'][g]['rho']['value'] == 1.0
    assert s['reader_stats']['following'][g]['own_trace'] == s['reader_stats']['following'][g]['n']
  p = s['probes']['attention/plain']
  assert p['n'] == 8 and sum(x['n'] for x in p['by_hops'].values()) == 8
  assert set(p['by_hops']) <= {'2', '3', '4'} and p['delta_L']['value'] is not None
  report = open(os.path.join(w, 'report.md')).read()
  assert '## Overview (World A)' in report and 'answer-position probe' in report
  logs.clear()
  s2 = trace_job.run_trace_sensitivity(c, w, log=logs.append)
  assert not any(x.startswith('training') for x in logs)
  assert s2['probes'] == s['probes'] and s2['readers'] == s['readers']


def test_rho_plot_panels_group_trained_readers_by_family_untrained_first():
  readers = {'attention/plain': {}, 'following': {}, 'ssm/prior': {}, 'attention/bypass': {},
             'ignoring': {}}
  panels = trace_job._panels(readers)
  assert list(panels) == ['readers', 'attention', 'ssm']
  assert panels['readers'] == [('following', 'following'), ('ignoring', 'ignoring')]
  assert panels['attention'] == [('plain', 'attention/plain'), ('bypass', 'attention/bypass')]
