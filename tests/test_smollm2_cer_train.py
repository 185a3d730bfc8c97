"""SmolLM2 CER fine-tuning in the project's training loop, at `configs/smollm2_cer.py:tiny`
(the first 2 layers of the real model; issue #21 acceptance 1).

Through the CLI (`python -m experiments.train_smollm2_cer`), with the loop's resume
test helpers: a checkpoint holds only the adapters and the optimizer state (no base
weight), and a run killed with SIGKILL (inside a save and after a step) and resumed
ends bit-identical to an uninterrupted run (state and metric lines).
"""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from ceu_jax.pretrained import gguf_loader
from tests.conftest import SESSION_CACHE
from tests.test_train_helpers import (assert_trees_equal, checkpoint_steps, describe,
                                      load_state, metric_rows, run_train, status)

_WHY = gguf_loader.is_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')

CONFIG = 'configs/smollm2_cer.py:tiny'
MODULE = 'experiments.train_smollm2_cer'
STEPS = 6  # tiny: 6 steps, checkpoints every 2
EXIT_PREEMPTED, EXIT_DIVERGED = 75, 65


def _run(ref, workdir, *overrides, evaluate='none'):
  return run_train(CONFIG, workdir, f'--eval={evaluate}', *overrides, cache_dir=ref['cache'],
                   module=MODULE, fast_compile=True)  # compile-bound; all runs alike


@pytest.fixture(scope='module')
def ref(tmp_path_factory):
  d = tmp_path_factory.mktemp('smollm2_cer')
  r = dict(dir=d, cache=SESSION_CACHE, workdir=str(d / 'reference'))   # every program cached
  proc = _run(r, r['workdir'], evaluate='trained')   # trains, then evaluates (one process)
  assert proc.returncode == 0, describe(proc)
  assert status(r['workdir'])['status'] == 'completed'
  return r


def test_checkpoint_holds_only_adapters_and_optimizer_state(ref):
  state = load_state(ref['workdir'], STEPS)
  assert sorted(state) == ['opt_state', 'params', 'step']
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
      state['params'])[0]]
  assert paths and all(p.endswith("['a']") or p.endswith("['b']") for p in paths), paths[:5]
  assert not any('embed' in p or 'norm' in p or 'kernel' in p for p in paths)
  n_params = sum(np.size(x) for x in jax.tree.leaves(state['params']))
  # 2 layers x rank 4 x (in + out) of the 7 projections of SmolLM2-135M.
  assert n_params == 2 * 4 * ((576 + 576) + 2 * (576 + 192) + (576 + 576)
                              + 2 * (576 + 1536) + (1536 + 576))
  n_state = sum(np.size(x) for x in jax.tree.leaves(state))
  assert n_state < 4 * n_params  # adapters + Adam moments + counters; no base weight
  assert int(state['step']) == STEPS
  b = state['params']['layers_1']['attn']['q_proj']['b']
  assert np.abs(b).max() > 0  # the adapters were trained
  rows = metric_rows(ref['workdir'], 'train')
  assert [r['step'] for r in rows] == list(range(1, STEPS + 1))
  assert {'ceu_ev', 'ceu_dis', 'ceu_control', 'cer_ev', 'cer_dis', 'task_nll'} <= set(rows[0])


def test_kill9_then_resume_is_bit_identical(ref):
  """SIGKILL inside the save of step 4, rerun, SIGKILL after step 5, rerun to the end."""
  workdir = str(ref['dir'] / 'killed')
  proc = _run(ref, workdir, '--config.train.debug_kill=in_save:4')
  assert proc.returncode == -9, describe(proc)
  assert checkpoint_steps(workdir) == [2]
  proc = _run(ref, workdir, '--config.train.debug_kill=after_step:5')
  assert proc.returncode == -9, describe(proc)
  assert 'resumed from checkpoint step 2' in proc.stderr
  assert checkpoint_steps(workdir) == [2, 4]
  proc = _run(ref, workdir)
  assert proc.returncode == 0, describe(proc)
  assert 'resumed from checkpoint step 4' in proc.stderr
  assert status(workdir)['status'] == 'completed'
  assert_trees_equal(load_state(workdir, STEPS), load_state(ref['workdir'], STEPS))
  assert metric_rows(workdir) == metric_rows(ref['workdir'])


@pytest.mark.slow
def test_sigterm_and_nan_use_the_loops_handling(ref):
  workdir = str(ref['dir'] / 'sigterm')
  proc = _run(ref, workdir, '--config.train.debug_kill=sigterm:3')
  assert proc.returncode == EXIT_PREEMPTED, describe(proc)
  assert (status(workdir)['status'], status(workdir)['step']) == ('preempted', 3)
  proc = _run(ref, workdir)
  assert proc.returncode == 0, describe(proc)
  assert_trees_equal(load_state(workdir, STEPS), load_state(ref['workdir'], STEPS))
  nan_dir = str(ref['dir'] / 'nan')
  proc = _run(ref, nan_dir, '--config.train.debug_nan_step=3')
  assert proc.returncode == EXIT_DIVERGED, describe(proc)
  st = status(nan_dir)
  assert (st['status'], st['step'], st['checkpoint_step']) == ('diverged', 3, 2)
  assert 3 not in checkpoint_steps(nan_dir)


def test_bad_read_layer_is_one_line_before_compiling(ref, tmp_path):
  proc = _run(ref, str(tmp_path / 'bad'), '--config.model.read_layer=7')
  assert proc.returncode == 1, describe(proc)
  assert 'model.read_layer must be an integer in [0, 1]' in proc.stderr
  assert not os.path.exists(tmp_path / 'bad' / 'checkpoints')


def test_held_out_evaluation_smoke(ref):
  """The entry point's evaluation of the trained checkpoint (tiny: 8 held-out pairs),
  written by the reference run (`--eval=trained`: train, then evaluate)."""
  import json  # pylint: disable=g-import-not-at-top
  from ceu_jax.metrics.text import exact_match  # pylint: disable=g-import-not-at-top
  out = os.path.join(ref['workdir'], 'eval_trained')
  with open(os.path.join(out, 'summary.json')) as f:
    s = json.load(f)
  assert (s['n'], s['step'], s['read_layer']) == (8, STEPS, 1)
  from ceu_jax import code_version  # pylint: disable=g-import-not-at-top
  assert s['versions']['code']['commit'] == code_version.code_version()['commit']
  rows, robust = [], []
  for name in sorted(os.listdir(os.path.join(out, 'batches'))):
    with open(os.path.join(out, 'batches', name)) as f:
      (robust if name.startswith('delta_0.9_') else rows).extend(json.load(f))
  at = [r for r in rows if r['layer'] == 1]
  assert len(at) == 8 and len(rows) == 16
  # Robustness at δ_test = 0.9 (tiny): the same 8 items, EM by generation, counted injections.
  assert sorted(r['id'] for r in robust) == sorted(r['id'] for r in at)
  assert all(r['em'] == exact_match(r['prediction'], [r['answer']]) for r in robust)
  d = s['delta_test']['0.9']
  assert d['n'] == 8 and d['em']['value'] == np.mean([r['em'] for r in robust])
  assert d['mean_injected'] == np.mean([r['n_injected'] for r in robust]) > 0
  assert all(r['em'] == exact_match(r['prediction'], [r['answer']]) for r in at)
  np.testing.assert_allclose(s['nll']['value'], -np.mean([r['L_plus'] for r in at]), rtol=1e-9)
  assert s['supported_0.5']['value'] <= s['em']['value']
  assert [e['layer'] for e in s['profile']['per_layer']] == [0, 1]
  assert os.path.exists(os.path.join(out, 'plots', 'layer_profile.png'))
  # The report-only path (no model loaded) on the run's files, the evaluation given twice:
  # two identical arms, so every paired difference is 0 with the CI [0, 0].
  summary = os.path.join(out, 'summary.json')
  proc = run_train(CONFIG, str(ref['dir'] / 'report'), f'--report=tiny={summary},again={summary}',
                   module=MODULE)
  assert proc.returncode == 0, describe(proc)
  with open(ref['dir'] / 'report' / 'table.md') as f:
    table = f.read()
  assert f"| tiny (step {STEPS}) | 8 | {s['em']['value']:.3f}" in table
  assert 'em δ=0.9' in table
  assert '| metric | again − tiny |' in table
  assert '| em | +0.000 [+0.000, +0.000] n=8 |' in table
  assert '| f1 δ=0.9 | +0.000 [+0.000, +0.000] n=8 |' in table
  assert os.path.exists(ref['dir'] / 'report' / 'layer_profiles.png')
