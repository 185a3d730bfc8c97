"""Mediator job (issue #18): oracle world end to end, resume, config check; tiny World A; §8.4 probe."""
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ceu_jax import workdir as workdir_lib
from ceu_jax.audits.mediator import job as mediator_job
from ceu_jax.audits.mediator import probe as mediator_probe
from ceu_jax.audits.mediator import verdicts, worlds
from ceu_jax.data import checklist
from configs import mediator as mediator_config


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def test_oracle_world_end_to_end_and_resume(tmp_path):
  wd = str(tmp_path / 'w')
  c = mediator_config.get_config('tiny,world=oracle')
  s = mediator_job.run_mediator(c, wd, log=lambda *_: None)
  st = s['settings']
  assert set(st) == {'follower', 'follower +tool', 'gold_computer', 'gold_computer +tool',
                     'constant', 'constant +tool'}
  for k in ('follower', 'follower +tool'):
    assert st[k]['F_ID']['value'] == st[k]['F_Strong']['value'] == 1.0
    assert st[k]['delta']['value'] == 0.0
  assert st['gold_computer']['cons_CNF']['value'] == 0.0
  assert st['gold_computer']['cons_COR']['value'] == 1.0
  # The headline by rule (ceu_jax.audits.mediator.verdicts): each oracle's verdict is known.
  v = {x['name']: x['verdict'] for x in s['claims']}
  for t in ('', ' +tool'):
    assert v[f'follower{t}: gap'] == 'not supported'          # Δ = 0 exactly
    assert v[f'gold_computer{t}: gap'] == 'supported'         # its Y bypasses M̂
    assert v[f'gold_computer{t}: asymmetry'] == 'opposite'    # COR 1, CNF 0 by construction
    assert v[f'constant{t}: asymmetry'] == 'untested'         # its CNF cell is too small
    assert v[f'gold_computer vs follower{t}: separates'] == 'supported'
  assert v['follower +tool: tool closes the gap'] == 'supported'
  assert 'follower: tool closes the gap' not in v             # tool settings only
  assert '| gold_computer vs follower: separates |' in open(os.path.join(wd, 'report.md')).read()
  # A finished run judged again from its files (rows.csv, summary.json): the same claims.
  assert [dataclasses.asdict(x) for x in verdicts.claims_of_workdir(wd)] == s['claims']
  for f in ('rows.csv', 'summary.json', 'report.md', 'cor_cnf.png', 'fid_fstrong.png'):
    assert os.path.exists(os.path.join(wd, f)), f
  with open(os.path.join(wd, 'rows.csv')) as f:
    assert len(f.readlines()) == 1 + 6 * c.n_items
  again = mediator_job.run_mediator(c, wd, log=lambda *_: None)  # resumes: every chunk done
  assert again['settings'] == st
  other = mediator_config.get_config('tiny,world=oracle,n_items=32')
  with pytest.raises(workdir_lib.WorkdirConfigError, match='n_items'):
    mediator_job.run_mediator(other, wd, log=lambda *_: None)


def test_bad_config_is_refused_before_work(tmp_path):
  with pytest.raises(ValueError, match='families must be'):
    mediator_config.get_config('tiny,families=lstm')
  c = mediator_config.get_config('tiny,world=oracle')
  with c.unlocked():
    c.n_items = 0
  with pytest.raises(ValueError, match='n_items must be'):
    mediator_job.run_mediator(c, str(tmp_path / 'w'), log=lambda *_: None)
  assert not os.path.exists(tmp_path / 'w')


def test_tiny_world_a(tmp_path):
  """One trained reader (few steps): the pipeline runs, invariants hold, probe is reported."""
  c = mediator_config.get_config('tiny,regimes=faithful,tools=off,steps=4,n_items=24')
  with c.unlocked():
    c.atr.probe_items = 8
  s = mediator_job.run_mediator(c, str(tmp_path / 'w'), log=lambda *_: None)
  x = s['settings']['attention/faithful']
  assert x['n'] == 24 and x['F_Strong']['value'] <= x['F_ID']['value']
  assert x['probe']['n'] == 8 and x['probe']['delta_L']['n'] == 8


def test_tiny_world_a_tool_forces_the_cue(tmp_path):
  """A trained tool reader (few steps): M* and TOOL are forced (SPEC §8.3: ending at the
  decision cue), the reader continues with the r argument tokens alone."""
  import csv
  c = mediator_config.get_config('tiny,regimes=faithful,tools=on,steps=4,n_items=24')
  with c.unlocked():
    c.atr.probe_items, c.plots = 0, False
  s = mediator_job.run_mediator(c, str(tmp_path / 'w'), log=lambda *_: None)
  x = s['settings']['attention/faithful +tool']
  assert x['n'] == 24 and x['F_Strong']['value'] <= x['F_ID']['value']
  v = worlds._task(c).vocab   # the world's vocabulary (tiny sizes)
  rows = list(csv.DictReader(open(tmp_path / 'w' / 'rows.csv')))
  audited = [r for r in rows if r['kind'] != 'skip']
  assert len(rows) == 24 and audited
  for r in audited:
    forced = [int(t) for t in r['forced'].split()]
    assert forced == [v.yes if m == '1' else v.no for m in r['m_star']] + [v.tool]
    assert len(r['continuation'].split()) == 3   # the argument's r tokens, no cue


@pytest.mark.parametrize('tool', [False, True])
def test_decision_probe_delta_matches_direct_forward(tool):
  from ceu_jax.auditor import audited_model
  tc = mediator_config.train_config('attention', 'plain', tool, True)
  bundle = audited_model(tc)
  cfg = bundle.data_cfg
  model = bundle.model
  plus = checklist.generate_batch(cfg, 0, 0, 6, 'test')
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), *plus.model_inputs())  # one program
  out = mediator_probe.decision_probe(model, variables, bundle.site, cfg, 6, eps=1e-6)
  minus = checklist.corrupt(cfg, plus, 'value_swap', jax.random.PRNGKey(mediator_probe.CORRUPT_SEED))
  slots = mediator_probe.decision_slots(cfg)

  forward = jax.jit(model.apply)  # the plain forward, one program (not op by op)

  def ll(b):  # slow reference: a Python loop over slots of the plain forward
    logits = np.asarray(forward(variables, *b.model_inputs()), np.float64)
    ans = np.asarray(b.answer)
    tot = np.zeros(ans.shape[0])
    for s in slots:
      z = logits[:, s]
      lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
      tot += z[np.arange(len(ans)), ans[:, s]] - lse
    return tot
  want = float(np.mean(ll(plus) - ll(minus)))
  assert out['delta_L']['value'] == pytest.approx(want, abs=1e-5)
  assert out['n'] == 6


def test_tiny_world_b(tmp_path):
  """`:tiny,world=smollm2` plumbing (2 of 30 layers, so the outputs are mostly unparseable)."""
  c = mediator_config.get_config('tiny,world=smollm2,n_items=2')
  with c.unlocked():
    c.smollm2.regimes = ('detailed',)
  wd = str(tmp_path / 'w')
  s = mediator_job.run_mediator(c, wd, log=lambda *_: None)
  assert set(s['settings']) == {'smollm2/detailed', 'smollm2/detailed +tool'}
  for x in s['settings'].values():
    assert x['n'] == 2 and x['F_Strong']['value'] <= x['F_ID']['value']
    assert x['n_COR'] + x['n_CNF'] == x['n_audited']
  assert os.path.exists(os.path.join(wd, 'plan.json'))


def test_sigterm_during_a_readers_training_exits_75_with_one_line(tmp_path):
  """A job that trains its readers, stopped by SIGTERM during a training: the checkpoint
  is saved, the process exits with code 75 and says how to resume, without a traceback."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from tests.test_multiprocess_helpers import REPO, fast_compile_env  # pylint: disable=g-import-not-at-top
  w = tmp_path / 'w'
  p = subprocess.run([sys.executable, '-m', 'experiments.mediator',
                      '--config=configs/mediator.py:tiny', f'--workdir={w}',
                      '--config.atr.train.train.debug_kill=sigterm:2'], cwd=REPO,
                     env=fast_compile_env(dict(os.environ)), capture_output=True, text=True,
                     timeout=600, check=False)
  assert p.returncode == 75, p.stderr[-3000:]
  assert ('stopped by signal 15 after step 2; checkpoint saved; rerun the same command to '
          'resume; exiting with code 75') in p.stderr
  assert 'Traceback' not in p.stderr


def test_cor_cnf_figure_names_the_settings_it_has_no_point_for(monkeypatch):
  """A setting with a COR or CNF cell under min_cell has no point; the figure names it with
  its cell sizes instead of dropping it silently, and every point's legend entry has its n."""
  from ceu_jax import plotting
  from ceu_jax.audits.mediator import plots
  figs = []
  monkeypatch.setattr(plotting, 'save_figure', lambda fig, stem: figs.append(fig) or [])
  cell = lambda v: dict(value=v, ci_low=v, ci_high=v, n=20)   # noqa: E731
  none = dict(value=None, ci_low=None, ci_high=None, n=0)
  plots.cor_cnf_figure({
      'a': dict(reader='a', tool=False, cons_COR=cell(0.9), cons_CNF=cell(0.5), n_COR=20, n_CNF=30),
      'b +tool': dict(reader='b', tool=True, cons_COR=none, cons_CNF=cell(0.9), n_COR=9,
                      n_CNF=141)}, 'unused')
  ax = figs[0].axes[0]
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ['a (n 20 / 30)']
  assert any('b +tool (n 9 / 141)' in t.get_text() for t in ax.texts)
  plots.cor_cnf_figure({'b +tool': dict(reader='b', tool=True, cons_COR=none,
                                        cons_CNF=cell(0.9), n_COR=5, n_CNF=145)}, 'unused')
  ax = figs[1].axes[0]
  assert ax.get_legend() is None and any('(n 5 / 145)' in t.get_text() for t in ax.texts)


def test_a_world_a_tool_run_forced_the_earlier_way_is_not_resumed(tmp_path):
  """World A with the tool records the forced prefix's version: a workdir whose job.json
  predates it (M* without the TOOL cue) is refused, naming the field; without the tool
  the record is the config, as before."""
  from ceu_jax import jobs  # pylint: disable=g-import-not-at-top
  from ceu_jax.audits.mediator import checklist_world, job as mjob  # pylint: disable=g-import-not-at-top
  from configs import mediator as mcfg  # pylint: disable=g-import-not-at-top
  from tests._job_cases import refuses_a_record_without  # pylint: disable=g-import-not-at-top
  a = mjob.MediatorJob(mcfg.get_config('tiny,world=oracle,tools=on'))
  assert a.record()['tool_prefix_version'] == checklist_world.TOOL_PREFIX_VERSION == 2
  refuses_a_record_without(a, 'tool_prefix_version', tmp_path)
  off = mjob.MediatorJob(mcfg.get_config('tiny,world=oracle,tools=off'))
  assert off.record() == jobs.plain(off.config)
