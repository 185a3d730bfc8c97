"""The trace audit with fine-tuned World B readers at `:tiny` (issue #35, item 2): the first 2
layers of SmolLM2, fine-tunes of 3 steps in W/train/<regime>, 1 audited item, 2 held-out
problems in each competence check. Checks that the adapters are saved, reused on rerun (the
second run trains nothing), and that the summary has the fine-tuned readers' rows and
competence beside the plain model's."""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from ceu_jax import workdir as workdir_lib
from ceu_jax.audits.traces import job as trace_job
from ceu_jax.pretrained import gguf_loader
from configs import trace_sensitivity as cfgs
from tests.test_train_helpers import remove_units

_WHY = gguf_loader.is_available()
# compile-bound: most XLA optimisations off (2026-11-30: 62 -> 55 s; not in the decode-bound
# trace_text / trace_identity modules, which they slow down: 90 -> 124 s)
pytestmark = [pytest.mark.usefixtures("fast_compiled_module"),
              pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')]

READERS = ('smollm2', 'smollm2_following', 'smollm2_shortcut')
ARG = 'tiny,world=smollm2,readers=' + '+'.join(READERS)
MEM = ARG + ',memorised=1,rho=0.5'   # the audited item is trained on: the memorised stratum


def test_config_and_world_validation():
  c = cfgs.get_config(ARG)
  s = c.smollm2
  assert s.readers == READERS and s.n_layers == 2 and s.domains == ('arithmetic',)
  assert s.train.train.num_steps == 3 and s.train.model.n_layers == 2
  assert cfgs.get_config(ARG + ',steps=5').smollm2.train.train.num_steps == 5
  assert 'readers' not in cfgs.get_config('full,world=smollm2').smollm2   # unchanged config
  with pytest.raises(ValueError, match="readers must be a '\\+'-joined subset of smollm2"):
    cfgs.get_config('tiny,world=smollm2,readers=smollm2+faithful')
  from ceu_jax.audits.traces import worlds
  with c.unlocked():
    c.smollm2.train.data.p_corrupt = 2.0
  with pytest.raises(ValueError, match=r'smollm2.train.data.p_corrupt must lie in \[0, 1\]'):
    worlds.make_world(c)
  # memorised problems: the audit's first M arithmetic items are the memorised stratum
  w = worlds.make_world(cfgs.get_config(ARG + ',n_items=3,memorised=2,rho=0.5'))
  ids = [x.id for x in w.items['arithmetic']]
  assert [w.stratum('arithmetic', i) for i in ids] == ['memorised', 'memorised', 'fresh']
  assert w.train_config('smollm2_shortcut').data.memorised == 2
  assert worlds.make_world(cfgs.get_config(ARG)).stratum('arithmetic', ids[0]) is None
  with pytest.raises(ValueError, match='memorised / rho / p_corrupt set the fine-tuned World B readers'):
    cfgs.get_config('full,world=smollm2,memorised=2,rho=0.5')
  with pytest.raises(ValueError, match='memorised / rho / p_corrupt set the fine-tuned'):
    cfgs.get_config('full,world=smollm2,p_corrupt=0.75')
  assert cfgs.get_config(ARG + ',p_corrupt=0.75').smollm2.train.data.p_corrupt == 0.75
  assert cfgs.get_config(ARG).smollm2.train.data.p_corrupt == 0.5
  with pytest.raises(ValueError, match=r'smollm2.train.data.memorised \(2\) and data.rho'):
    worlds.make_world(cfgs.get_config(ARG + ',memorised=2'))


def test_tiny_fine_tuned_readers_trained_once_and_audited(tmp_path):
  w = str(tmp_path / 'w')
  logs: list = []
  s = trace_job.run_trace_sensitivity(cfgs.get_config(MEM), w, log=logs.append)
  assert sum('training smollm2_' in m for m in logs) == 2
  # the fine-tuned readers' rows, on arithmetic only, beside the plain model's
  assert tuple(s['readers']) == READERS
  for r in READERS:
    assert s['readers'][r]['n_items'] == 1
    assert set(s['readers'][r]['parse_failure_by_domain']) <= {'arithmetic'}
  rows = open(os.path.join(w, 'rows.csv')).read()
  assert all(f'\n{r},arithmetic,' in rows for r in READERS)
  # competence before the audit, for every reader; claims of a non-competent reader untested
  comp = s['competence']
  assert tuple(comp) == READERS
  for r, c in comp.items():
    assert c['n'] == 2 and 0.0 <= c['parse_rate'] <= 1.0 and 0.0 <= c['accuracy'] <= 1.0
    assert c['competent'] == (c['accuracy'] >= 0.5 and c['parse_rate'] >= 0.8)
    assert {'follow', 'gold', 'n', 'parse_rate'} <= set(c['corrupted'])
  for cl in s['claims']:   # '<reader>: …', '<reader>: follows [stratum]', '<a> vs <b> […]: …'
    named = [x.split(' [')[0] for x in cl['name'].split(':')[0].split(' vs ')]
    if not all(comp[r]['competent'] for r in named):
      assert cl['verdict'] == 'untested' and 'not competent' in cl['numbers']
  report = open(os.path.join(w, 'report.md')).read()
  assert '## Competence before the audit' in report and '| smollm2_shortcut |' in report
  # the one audited item is memorised: rows, summary, competence, claims and report say so
  assert all(line.endswith(',memorised') for line in rows.strip().splitlines()[1:])
  for r in READERS:
    assert set(s['readers'][r]['by_stratum']) == {'memorised'}
    assert comp[r]['memorised']['n'] == 1
  names = {cl['name'] for cl in s['claims']}
  assert 'smollm2_following vs smollm2_shortcut [memorised]: separates' in names
  assert '| smollm2_shortcut [memorised] |' in report
  assert json.load(open(os.path.join(w, 'summary.json')))['competence'] == comp
  # §8.4: the answer-position probe of every reader, a layer profile, its claims and plot
  assert tuple(s['probes']) == READERS
  for r, p in s['probes'].items():
    assert p['n'] == 1 and len(p['layers']) == 2 and set(p['by_stratum']) == {'memorised'}
    assert list(p['delta_L_by_item']) == [f'arith:0:0']
    assert os.path.exists(os.path.join(w, 'probes', f'{r}.json'))
  assert s['probes']['smollm2'] != s['probes']['smollm2_shortcut']   # adapters merged
  for tag in ('', ' [memorised]'):
    for what in ('probe separates', 'probe agrees'):
      assert f'smollm2_following vs smollm2_shortcut{tag}: {what}' in names
  assert '## §8.4 companion' in report and '| smollm2_following | memorised | 1 |' in report
  assert os.path.exists(os.path.join(w, 'probe_layers.png'))
  # adapters saved in the workdir, with the competence check
  for regime in ('following', 'shortcut'):
    sub = os.path.join(w, 'train', regime)
    assert workdir_lib.run_info(sub)['completed'] and workdir_lib.checkpoint_steps(sub) == [2, 3]
    assert json.load(open(os.path.join(sub, 'config.json')))['data']['regime'] == regime
    assert json.load(open(os.path.join(sub, 'competence.json')))['n'] == 2
  f = os.path.join(w, 'train', 'following', 'metrics.jsonl')
  before = (open(f).read(), os.path.getmtime(os.path.join(w, 'train', 'following', 'status.json')))
  # rerun the fine-tuned readers' units on the same workdir (the plain model's is kept: it
  # trains nothing): their readers are built again, the adapters reused, nothing trains
  remove_units(w, ('smollm2_following_', 'smollm2_shortcut_'), expect=2)
  assert len(os.listdir(os.path.join(w, 'units'))) == 1   # the plain model's, kept
  os.remove(os.path.join(w, 'summary.json'))
  logs.clear()
  s2 = trace_job.run_trace_sensitivity(cfgs.get_config(MEM), w, log=logs.append)
  assert not any('training' in m or '§8.4 probe' in m for m in logs), logs
  assert before == (open(f).read(),
                    os.path.getmtime(os.path.join(w, 'train', 'following', 'status.json')))
  assert s2['competence'] == comp
  assert s2['readers'] == s['readers']   # greedy: the same rows from the same adapters
  assert s2['probes'] == s['probes']      # read back from W/probes


def test_loss_is_the_mean_nll_of_the_target_tokens():
  """sft.target_loss (logits of the last n_tail positions only) against a full forward: the mean
  of −log p over exactly the target tokens; the forced prefix and the prompt carry no loss."""
  from ceu_jax.audits.traces import audit as ts
  from ceu_jax.audits.traces import finetune as ft
  from ceu_jax.pretrained import sft
  from ceu_jax.pretrained import load_smollm2, load_tokenizer
  from ceu_jax.pretrained import lora as lora_lib
  from ceu_jax.pretrained.model import SmolLM
  from configs import smollm2_traces
  c = smollm2_traces.get_config('tiny')
  mc, variables = load_smollm2(None, n_layers=2)
  tok, dom, lcfg = load_tokenizer(None), ft.domain(c), lora_lib.from_config(c)
  ex = ft.excluded(c)
  item = ft.train_item(c, 0, ex)
  rows = [ft.make_row(dom, item, 'following', 1, ts.FACT_REVERSAL), ft.make_row(dom, item, 'plain')]
  batch = ft.batch_arrays(tok, rows, 320, 80)
  adapters = lora_lib.init_adapters(jax.random.PRNGKey(0), mc, lcfg)
  adapters = jax.tree_util.tree_map_with_path(   # a non-zero update, so the merge matters
      lambda p, x: x + 0.01 if p[-1].key == 'b' else x, adapters)
  loss, metrics = sft.target_loss(adapters, variables['params'], batch, config=mc, lora=lcfg,
                                n_tail=80)
  params = lora_lib.merge(variables['params'], adapters, lcfg)
  logits = SmolLM(mc).apply({'params': params}, batch['tokens'][:, :-1], batch['valid'][:, :-1])
  logp = np.asarray(jax.nn.log_softmax(logits, -1))
  nll = [-logp[i, t - 1, batch['tokens'][i, t]] for i in range(2) for t in range(1, 320)
         if batch['loss_mask'][i, t]]
  assert len(nll) == batch['loss_mask'].sum()
  np.testing.assert_allclose(float(loss), np.mean(nll), rtol=1e-5)
  assert float(metrics['task_nll']) == float(loss) and 0.0 <= float(metrics['token_acc']) <= 1.0
