"""Pair claims over training seeds (`ceu_jax.audits.over_seeds`): one run decides as its own
job did (the recorded World B runs); several runs combine each seed's paired difference by
`claims.RULE`; runs that differ in more than the seed are refused, naming the fields."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from ceu_jax import claims
from ceu_jax.audits import over_seeds
from ceu_jax.metrics.resampling import Aggregate
from tests.conftest import extract_recorded_run

# (archive in docs/runs, folder): recorded World B runs with a pair of fine-tuned readers
RECORDED = {'traces': ('issue35_traces_world_b.tar.gz', 'traces_smollm2_ft'),
            'mediator': ('issue35_mediator_world_b_restate.tar.gz', 'med_ft_restate'),
            'mediator_tool': ('issue35_mediator_world_b_tool_named.tar.gz', 'med_ft_tool_named')}
PAIR_SUFFIXES = (': separates', ': probe separates', ': probe agrees')


@pytest.fixture(scope='module')
def recorded(tmp_path_factory):
  return {k: os.path.join(extract_recorded_run(a, tmp_path_factory.mktemp(k)), f)
          for k, (a, f) in RECORDED.items()}


@pytest.mark.parametrize('key', list(RECORDED))
def test_one_run_decides_its_pair_claims_as_its_job_did(recorded, key):
  w = recorded[key]
  run = over_seeds.load(w)
  assert run.seed == 0
  found = {c.name: c for c in over_seeds.decide([run])}
  mine = {c['name']: c for c in json.load(open(os.path.join(w, 'summary.json')))['claims']
          if c['name'].endswith(PAIR_SUFFIXES)}
  assert set(found) == set(mine) and mine
  for name, c in found.items():
    assert c.verdict == mine[name]['verdict'], name
  assert any(c.verdict == claims.SUPPORTED for c in found.values())


def _as_seed(src: str, dst: str, seed: int, **changes) -> str:
  """A copy of a recorded run as if trained with another seed (and other config changes)."""
  shutil.copytree(src, dst)
  p = os.path.join(dst, 'summary.json')
  s = json.load(open(p))
  s['config']['smollm2']['train']['seed'] = seed
  for k, v in changes.items():
    node = s['config']
    *path, last = k.split('.')
    for x in path:
      node = node[x]
    node[last] = v
  json.dump(s, open(p, 'w'))
  return dst


def test_two_seeds_combine_by_the_seed_rule(recorded, tmp_path):
  w = recorded['mediator_tool']
  w1 = _as_seed(w, str(tmp_path / 's1'), 1)
  found = {c.name: c for c in over_seeds.decide([over_seeds.load(w), over_seeds.load(w1)])}
  sep = found['smollm2_lora/shortcut vs faithful +tool: separates']
  # the same rows twice: the same difference in both seeds, sd 0, every seed positive
  assert sep.verdict == claims.SUPPORTED and sep.rule == claims.RULE
  assert sep.numbers.startswith('Δ(shortcut) − Δ(faithful) +0.500 ± 0.000 over 2 seeds '
                                '(0: +0.500 [+0.413, +0.587] n=150; 1: +0.500')
  probe = found['smollm2_lora/shortcut vs faithful +tool: probe separates']
  # over seeds the rule reads the seeds' means, not their CIs: −0.011 twice, sd 0 -> opposite
  # (one seed: its CI straddles 0 -> not supported, above)
  assert probe.verdict == claims.OPPOSITE and '-0.011 ± 0.000 over 2 seeds' in probe.numbers
  assert found['smollm2_lora/shortcut vs faithful +tool: probe agrees'].verdict == (
      claims.NOT_SUPPORTED)


def _fake(seed: int, diffs: dict, verdicts: dict | None = None) -> over_seeds.Run:
  agg = {k: Aggregate(v, v - 0.01, v + 0.01, 50) for k, v in diffs.items()}
  cl = {k: claims.Claim(k, 's', (verdicts or {}).get(k, claims.SUPPORTED), f'n {k}')
        for k in diffs}
  return over_seeds.Run(f'w{seed}', 'mediator', {'smollm2': {'train': {'seed': seed}}}, seed,
                        cl, {k: ('separates', a) for k, a in agg.items()}, {})


def test_seed_rule_every_seed_signed_and_mean_two_sd():
  """Against the rule written out: +0.30, +0.32 supported; +0.30, −0.05 not; +0.30, +0.01 not
  (|mean| < 2 sd); −0.2, −0.3 opposite; a seed untested -> untested, naming it."""
  name = 'a vs b: separates'
  for values, want in (((0.30, 0.32), claims.SUPPORTED), ((0.30, -0.05), claims.NOT_SUPPORTED),
                       ((0.30, 0.01), claims.NOT_SUPPORTED), ((-0.2, -0.3), claims.OPPOSITE)):
    runs = [_fake(s, {name: v}) for s, v in enumerate(values)]
    assert over_seeds.decide(runs)[0].verdict == want, values
  runs = [_fake(0, {name: 0.3}), _fake(1, {name: 0.3}, {name: claims.UNTESTED})]
  c = over_seeds.decide(runs)[0]
  assert c.verdict == claims.UNTESTED and c.numbers == f'seed 1: n {name}'


def test_runs_differing_in_more_than_the_seed_are_refused(recorded, tmp_path):
  w = recorded['mediator_tool']
  other = over_seeds.load(_as_seed(w, str(tmp_path / 'x'), 1, **{'smollm2.probe_items': 8}))
  run = over_seeds.load(w)
  with pytest.raises(ValueError, match=r'differs from .* in more than smollm2\.train\.seed: '
                                       r"smollm2\.probe_items 64 -> 8"):
    over_seeds.decide([run, other])
  # a field the job added later, absent from one run, at the value that run ran as: the same
  tool = _as_seed(w, str(tmp_path / 'y'), 1)
  s = json.load(open(os.path.join(tool, 'summary.json')))
  del s['config']['smollm2']['tool_init']                 # recorded before tool_init existed
  json.dump(s, open(os.path.join(tool, 'summary.json'), 'w'))
  with pytest.raises(ValueError, match=r"smollm2\.tool_init \(absent\) -> 'no_tool'"):
    over_seeds.check_same([over_seeds.load(tool), run])    # ran as 'fresh' -> not the same
  # the restated no-tool run predates data.restate_arg; a seed run recorded with it false
  old = recorded['mediator']
  new = _as_seed(old, str(tmp_path / 'z'), 1, **{'smollm2.train.data.restate_arg': False})
  assert 'restate_arg' not in json.load(open(os.path.join(old, 'summary.json')))['config'][
      'smollm2']['train']['data']
  over_seeds.check_same([over_seeds.load(old), over_seeds.load(new)])
  with pytest.raises(ValueError, match=r'smollm2\.train\.seed must differ between runs, '
                                       r'got \[0, 0\]'):
    over_seeds.decide([run, run])
  with pytest.raises(ValueError, match='is a trace_sensitivity run'):
    over_seeds.decide([run, dataclasses.replace(run, job='trace_sensitivity', seed=1)])
  with pytest.raises(ValueError, match=r'not a finished audit run \(no job.json\)'):
    over_seeds.load(str(tmp_path))


def test_entry_point_prints_the_table_and_writes_the_json(recorded, tmp_path):
  out = tmp_path / 'o.json'
  p = subprocess.run([sys.executable, '-m', 'experiments.over_seeds',
                      f'--runs={recorded["traces"]}', f'--out={out}'],
                     capture_output=True, text=True, check=False, timeout=300)
  assert p.returncode == 0, p.stderr
  assert '# trace_sensitivity: pair claims over 1 seed' in p.stdout
  assert '[memorised]: separates | ' in p.stdout
  data = json.load(open(out))
  assert [r['seed'] for r in data['runs']] == [0] and data['produced_by']['code']
  v = {c['name']: c['verdict'] for c in data['claims']}
  assert v['smollm2_following vs smollm2_shortcut [memorised]: separates'] == 'supported'
