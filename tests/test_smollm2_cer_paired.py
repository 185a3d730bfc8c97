"""ceu_jax/finetune/paired.py: paired base / baseline / CER comparisons of SmolLM2 CER
evaluations, on synthetic per-item rows whose paired differences are known exactly
(no model is loaded)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ceu_jax import claims
from ceu_jax.finetune import paired

N, LAYER = 40, 1


def _rows(correct, ceu_ev=0.8, degenerate=(), ceu_dis=0.1, ids=None, f1=None):
  """Clean rows of one evaluation (layers 0 and LAYER; layer 0 is noise that must be
  ignored): item i correct iff i in `correct`, CEU_ev / CEU_dis constants (None where
  degenerate), item 0 without a distractor span."""
  ids = range(N) if ids is None else ids
  out = []
  for i in ids:
    deg = i in degenerate
    em = float(i in correct)
    for layer in (0, LAYER):
      out.append(dict(id=f'nq:{i:05d}', layer=layer, em=em if layer else 1.0 - em,
                      f1=em if f1 is None else f1, L_plus=em - 2.0, degenerate=deg,
                      has_ev=True, has_dis=i != 0,
                      ceu_ev=None if deg else (ceu_ev if layer else 0.0),
                      ceu_dis=None if deg or i == 0 else ceu_dis))
  return out


def _robust(correct, ids=None):
  return [dict(id=f'nq:{i:05d}', em=float(i in correct), f1=float(i in correct), n_injected=1)
          for i in (range(N) if ids is None else ids)]


def _items(rows, robust=None):
  return paired.items_from_rows(rows, LAYER, {'0.9': robust} if robust else None)


def _one(d: claims.Difference):
  (s,) = d.per_seed
  return s.diff


def test_identical_arms_differ_by_zero_with_a_zero_ci():
  a = _items(_rows(range(10), degenerate={3, 30}), _robust(range(5)))
  diffs = paired.compare(a, a, num_resamples=200)
  assert set(diffs) >= {'em', 'f1', 'nll', 'supported', 'ceu_ev', 'ceu_ev_fixed', 'ceu_dis',
                        'em δ=0.9', 'f1 δ=0.9'}
  for m, d in diffs.items():
    s = _one(d)
    assert (s.value, s.ci_low, s.ci_high) == (0.0, 0.0, 0.0), m


@pytest.mark.parametrize('k', [1, 7, 40])
def test_one_arm_flipped_on_k_items_differs_by_k_over_n(k):
  base = _items(_rows(correct=()), _robust(()))
  flipped = _items(_rows(correct=range(k)), _robust(range(k)))
  diffs = paired.compare(base, flipped, num_resamples=200)     # flipped − base
  for m in ('em', 'f1', 'supported', 'em δ=0.9', 'f1 δ=0.9'):
    s = _one(diffs[m])
    assert s.value == pytest.approx(k / N) and s.n == N, m
    assert 0.0 <= s.ci_low <= k / N <= s.ci_high <= 1.0, m
  assert _one(diffs['nll']).value == pytest.approx(-k / N)  # nll = −L_plus: 2 → 1
  back = paired.compare(flipped, base, num_resamples=200)     # the other order: −k/n
  assert _one(back['em']).value == pytest.approx(-k / N)


def test_ceu_ev_both_denominators():
  """B has CEU_ev 0.9 but 8 degenerate gaps, A 0.6 everywhere: §1 pairs the 32 items
  non-degenerate in both (+0.3); the fixed denominator counts B's 8 as 0 over all 40."""
  a = _items(_rows(range(N), ceu_ev=0.6, ceu_dis=0.2))
  b = _items(_rows(range(N), ceu_ev=0.9, ceu_dis=0.05, degenerate=set(range(8))))
  d = paired.compare(a, b, num_resamples=200)
  assert _one(d['ceu_ev']).value == pytest.approx(0.3) and _one(d['ceu_ev']).n == 32
  fixed = _one(d['ceu_ev_fixed'])
  assert fixed.value == pytest.approx((32 * 0.9 - 40 * 0.6) / 40) and fixed.n == 40
  # CEU_dis: items with a distractor span (not item 0) and non-degenerate in both.
  assert _one(d['ceu_dis']).value == pytest.approx(-0.15) and _one(d['ceu_dis']).n == 32
  # supported = correct and CEU_ev ≥ 0.5 on a non-degenerate gap: B loses its 8.
  assert _one(d['supported']).value == pytest.approx(-8 / N)


def test_pairs_only_the_items_both_runs_scored():
  a = _items(_rows(range(N), ids=range(N)))
  b = _items(_rows(range(N), ids=range(10, N + 5)))          # 30 shared items
  assert _one(paired.compare(a, b, num_resamples=100)['em']).n == 30
  x, y = paired.item_pairs('em', a, b)
  assert len(x) == len(y) == 30


def _write_eval(root, name, rows, robust, *, trained=True, regularizer=None):
  """A run's files as evaluate_reader and the loop leave them: eval_*/batches/,
  eval_*/summary.json and (trained) the workdir's config.json."""
  ev = os.path.join(root, name, 'eval_trained' if trained else 'eval_base')
  os.makedirs(os.path.join(ev, 'batches'))
  for b in range(0, N, 16):   # batches of 16 items (rows of 2 layers each)
    lo, hi = b, min(b + 16, N)
    with open(os.path.join(ev, 'batches', f'{b // 16:05d}.json'), 'w') as f:
      json.dump([r for r in rows if lo <= int(r['id'][3:]) < hi], f)
    with open(os.path.join(ev, 'batches', f'delta_0.9_{b // 16:05d}.json'), 'w') as f:
      json.dump([r for r in robust if lo <= int(r['id'][3:]) < hi], f)
  with open(os.path.join(ev, 'summary.json'), 'w') as f:
    json.dump(dict(trained=trained, read_layer=LAYER, step=None if not trained else 5), f)
  if trained:
    with open(os.path.join(root, name, 'config.json'), 'w') as f:
      json.dump({'cer': {'regularizer': regularizer}}, f)
  return os.path.join(ev, 'summary.json')


def test_report_section_from_the_runs_files(tmp_path):
  """base / baseline / CER runs on disk: three paired columns (later − earlier) and the
  H1 / H2 verdicts, decided by the one seed's paired CI."""
  entries = [
      ('base', _write_eval(tmp_path, 'b', _rows(range(4), ceu_ev=0.5), _robust(()),
                           trained=False)),
      ('baseline', _write_eval(tmp_path, 'ft', _rows(range(20), ceu_ev=0.6, ceu_dis=0.3),
                               _robust(range(16)), regularizer='none')),
      ('cer', _write_eval(tmp_path, 'cer', _rows(range(20), ceu_ev=0.9, ceu_dis=0.05),
                          _robust(range(18)), regularizer='evidence_distractor')),
  ]
  assert [paired.role(p, json.load(open(p))) for _, p in entries] == ['base', 'baseline', 'cer']
  text = paired.section(entries, num_resamples=200)
  assert '| metric | baseline − base | cer − base | cer − baseline |' in text
  # EM: baseline − base = 16/40, cer − base = 16/40, cer − baseline = 0 (same items).
  assert '| em | +0.400 [' in text and '+0.000 [+0.000, +0.000] n=40 |' in text
  assert '| em δ=0.9 |' in text and '| ceu_ev_fixed (degenerate = 0) |' in text
  assert '| ceu_ev (§1: non-degenerate in both) | +0.100 [+0.100, +0.100] n=40 |' in text
  # CER − baseline: CEU_ev +0.3 on every item, CEU_dis −0.25, no EM cost: H2 supported
  # (its paired CIs exclude 0) with both denominators; the baseline (EM 0.5) is no H1.
  assert '| H2 SmolLM2-135M, cer vs baseline (fixed denominator) |' in text
  assert text.count('| **supported** |') == 2
  assert '| H1 SmolLM2-135M baseline |' in text and '**not supported**' in text
  assert 'Rule: paired per-seed differences' in text


def test_report_section_says_when_per_item_rows_are_missing(tmp_path):
  p = _write_eval(tmp_path, 'ft', _rows(range(3)), _robust(()), regularizer='none')
  os.makedirs(tmp_path / 'old' / 'eval_trained')
  old = str(tmp_path / 'old' / 'eval_trained' / 'summary.json')
  with open(old, 'w') as f:
    json.dump(dict(trained=True, read_layer=LAYER), f)
  text = paired.section([('old', old), ('ft', p)])
  assert text.startswith('Paired comparisons: no per-item rows beside ' + old)
  assert paired.load_items(os.path.dirname(old)) is None
  one = paired.section([('ft', p)])       # one run: nothing to pair, a baseline's H1
  assert one.startswith('Claims of one setting') and '| H1 SmolLM2-135M ft |' in one
  assert '| metric |' not in one and '| H2' not in one
  cer = _write_eval(tmp_path, 'cer', _rows(range(3)), _robust(()), regularizer='evidence')
  assert paired.section([('cer', cer)]) == ''   # a CER run alone: no claim to decide


def _world_rows(seed: int, *, mem_ev: float, mem_dis: float, ev_only_correct: int):
  """A prior world's clean rows: items 0-19 memorised (all correct, CEU_ev mem_ev + a
  seed-dependent 0.01·seed), 20-39 evidence_only (the first ev_only_correct of them
  correct, CEU_ev 0.8)."""
  rows = []
  for r in _rows(correct=set(range(20)) | set(range(20, 20 + ev_only_correct))):
    i = int(r['id'][3:])
    mem = i < 20
    if r['layer'] == LAYER and r['ceu_ev'] is not None:
      r['ceu_ev'] = mem_ev + 0.01 * seed if mem else 0.8
      r['ceu_dis'] = None if r['ceu_dis'] is None else (mem_dis if mem else 0.1)
    rows.append(dict(r, stratum='memorised' if mem else 'evidence_only'))
  return rows


def test_several_seeds_pair_seed_by_seed_and_decide_by_the_rule_per_stratum(tmp_path):
  """baseline/s<k> and cer/s<k>, k = 0..2: paired seed by seed; in the world the baseline
  is accurate on memorised items without using their evidence (H1 [memorised] supported,
  H1 [evidence_only] not: EM 0.5 there), CER raises CEU_ev there by 0.8 in every seed
  (H2 [memorised] supported by the rule over 3 seeds)."""
  entries = []
  for k in range(3):
    entries.append((f'baseline/s{k}', _write_eval(
        tmp_path, f'ft{k}', _world_rows(k, mem_ev=0.1, mem_dis=0.3, ev_only_correct=10),
        _robust(range(20)), regularizer='none')))
  for k in range(3):
    entries.append((f'cer/s{k}', _write_eval(
        tmp_path, f'cer{k}', _world_rows(k, mem_ev=0.9, mem_dis=0.05, ev_only_correct=10),
        _robust(range(20)), regularizer='evidence_distractor')))
  assert paired.setting_and_seed('cer/s2') == ('cer', 's2')
  assert paired.setting_and_seed('cer') == ('cer', 'run')
  text = paired.section(entries, num_resamples=200)
  assert '| metric | cer − baseline |' in text      # two settings, one comparison
  # ceu_ev [memorised]: +0.8 in every seed (the seed offsets cancel), each seed's CI.
  line = next(l for l in text.splitlines() if l.startswith('| ceu_ev [memorised] |'))
  assert '+0.800 ± 0.000 over 3 seeds (s0: +0.800 [+0.800, +0.800] n=20; s1:' in line
  verdict = {l.split(' | ')[0][2:]: l.split(' | ')[2] for l in text.splitlines()
             if l.startswith('| H')}
  assert verdict['H1 SmolLM2-135M baseline [memorised]'] == '**supported**'
  assert verdict['H1 SmolLM2-135M baseline [evidence_only]'] == '**not supported**'
  assert verdict['H1 SmolLM2-135M baseline'] == '**supported**'   # 20/40 unsupported ≥ 0.25
  assert verdict['H2 SmolLM2-135M [memorised], cer vs baseline (fixed denominator)'] == (
      '**supported**')
  # evidence_only: CER equals the baseline there: H2 not supported (zero differences).
  assert verdict['H2 SmolLM2-135M [evidence_only], cer vs baseline (§1 denominator)'] == (
      '**not supported**')


def test_seeded_labels_that_mix_roles_or_repeat_are_refused(tmp_path):
  a = _write_eval(tmp_path, 'a', _rows(range(3)), _robust(()), regularizer='none')
  b = _write_eval(tmp_path, 'b', _rows(range(3)), _robust(()), regularizer='evidence')
  with pytest.raises(ValueError, match="the runs of 'x' mix roles"):
    paired.section([('x/s0', a), ('x/s1', b)])
  with pytest.raises(ValueError, match="two runs labelled 'x/s0'"):
    paired.section([('x/s0', a), ('x/s0', a)])
  with pytest.raises(ValueError, match='no training seed in common'):
    paired.compare({'s0': paired.load_items(os.path.dirname(a))},
                   {'s1': paired.load_items(os.path.dirname(b))})


def test_hinge_activity_from_the_logged_training_batches(tmp_path):
  """3 of 4 logged batches with an active evidence hinge (shares 0.5, 0.25, 0, 1), a torn
  last line skipped; a baseline's lines (no CER terms) give no row."""
  from ceu_jax.finetune import evaluate as cer_eval
  cer = _write_eval(tmp_path, 'cer', _rows(range(3)), _robust(()), regularizer='evidence')
  base = _write_eval(tmp_path, 'ft', _rows(range(3)), _robust(()), regularizer='none')
  with open(tmp_path / 'cer' / 'metrics.jsonl', 'w') as f:
    for step, act, swap in ((1, 0.5, 0.2), (10, 0.25, 0.0), (20, 0.0, 0.0), (30, 1.0, 0.4)):
      f.write(json.dumps(dict(split='train', step=step, cer_ev_active=act, swap=swap)) + '\n')
    f.write(json.dumps(dict(split='eval', step=30, em=1.0)) + '\n{"split": "tr')
  with open(tmp_path / 'ft' / 'metrics.jsonl', 'w') as f:
    f.write(json.dumps(dict(split='train', step=1, task_nll=2.0)) + '\n')
  h = cer_eval.hinge_activity(str(tmp_path / 'cer'))
  assert h == {'batches': 4, 'active': 0.75, 'rows': pytest.approx(0.4375),
               'swap': pytest.approx(0.15)}
  assert cer_eval.hinge_activity(str(tmp_path / 'ft')) is None
  text = cer_eval.hinge_table([('ft', base), ('cer', cer)])
  assert text.splitlines()[2:] == ['| cer | 4 | 0.750 | 0.438 | 0.150 |']
