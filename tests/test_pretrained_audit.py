"""NQ knowledge-conflict audit of SmolLM2 (issue #9): pair alignment, probes, outputs, resume.

The pure helpers are tested without the model; the rest needs the pretrained
extra (skipped cleanly without it). The end-to-end test runs
`configs/smollm2_nq.py:tiny` on the first 4 layers (< 60 s on 2 CPU cores); the
slow test runs it on all 30.
"""
from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from ceu_jax.pretrained import audit_nq, gguf_loader

_WHY = gguf_loader.is_available()
needs_model = pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')


def _config(arg: str = 'tiny'):
  from configs import smollm2_nq
  return smollm2_nq.get_config(arg)


# ---------------------------------------------------------------------------
# Pure helpers.
# ---------------------------------------------------------------------------


def test_mentions_whole_words_only():
  text = 'Context: Ann Lee met Ann Leeds and Ann Lee.'
  assert audit_nq._mentions(text, 'Ann Lee', 9, len(text)) == [(9, 16), (35, 42)]
  assert audit_nq._mentions(text, 'Ann Lee', 17, len(text)) == [(35, 42)]


def test_swap_tracks_shifted_ranges():
  ctx = 'Bo met Bo at noon'
  out, ranges = audit_nq._swap(ctx, [(0, 2), (7, 9)], 'Alice')
  assert out == 'Alice met Alice at noon'
  assert [out[s:e] for s, e in ranges] == ['Alice', 'Alice']


def test_windows_avoid_banned_and_stay_in_context():
  assert audit_nq._windows([3, 4, 5, 6, 7], 2, {5}) == [(3, 4), (6, 7)]
  assert audit_nq._windows([3, 4], 3, set()) == []


def _pair(i: int, length: int, answer_tokens: int) -> audit_nq.Pair:
  return audit_nq.Pair(f'nq:{i:05d}', 'q', 'a', 'b', 'dataset', 'p', 'm',
                       length - answer_tokens, answer_tokens, (1,), (2,), 'entity', (3,))


def test_plan_batches_fixed_shapes():
  cfg = _config('full,batch_size=2')
  pairs = [_pair(0, 50, 2), _pair(1, 100, 2), _pair(2, 90, 5), _pair(3, 60, 3),
           _pair(4, 256, 8)]
  plan = audit_nq.plan_batches(pairs, cfg)
  assert sorted(i for b in plan for i in b['ids']) == [p.id for p in pairs]
  for b in plan:
    assert 1 <= len(b['ids']) <= 2 and b['pad_to'] in cfg.length_buckets
    assert b['n_tail'] in cfg.tail_buckets
  by_id = {p.id: p for p in pairs}
  assert all(by_id[i].length <= b['pad_to'] and by_id[i].answer_tokens <= b['n_tail']
             for b in plan for i in b['ids'])


def _rows(gaps, l_int, n_layers=2):
  rows = []
  for i, (g, li) in enumerate(zip(gaps, l_int)):
    for layer in range(n_layers):
      rows.append({'id': f'nq:{i}', 'layer': layer, 'L_plus': g, 'L_minus': 0.0,
                   'L_int_ev': li, 'L_int_dis': 0.0, 'L_int_ctl': 0.0})
  return rows


def test_summary_flags_degenerate_and_clips():
  cfg = _config('tiny')
  rows = _rows(gaps=[2.0, 4.0, 0.0, -1.0], l_int=[1.0, 8.0, 5.0, 0.0])
  audit_nq.add_ceu(rows, audit_nq.SPAN_PROBES, cfg.eps)
  s = audit_nq.summarize(rows, audit_nq.SPAN_PROBES, 2, cfg)
  assert s['n_examples'] == 4 and s['n_degenerate'] == 2
  assert s['degenerate_ids'] == ['nq:2', 'nq:3']
  ev = s['per_layer'][1]['ev']['ceu']
  assert ev['n'] == 2 and ev['value'] == pytest.approx((0.5 + 1.0) / 2)  # 8/4 clipped to 1
  assert all(r['ceu_ev'] is None for r in rows if r['degenerate'])
  assert s['per_layer'][0]['dis']['delta']['value'] == 0.0
  json.dumps(s, allow_nan=False)


# ---------------------------------------------------------------------------
# Pairs on the shipped NQ data with the SmolLM2 tokenizer.
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def tiny_pairs():
  from ceu_jax.pretrained import load_tokenizer
  tok = load_tokenizer()
  cfg = _config('tiny,num_pairs=12')
  pairs, report = audit_nq.build_pairs(tok, cfg)
  return tok, cfg, pairs, report


@needs_model
def test_pairs_token_aligned_with_probe_spans(tiny_pairs):
  tok, cfg, pairs, report = tiny_pairs
  assert pairs and report['audited'] == len(pairs) <= 12
  assert report['kept'] + sum(report['dropped'].values()) == report['items'] == cfg.max_items
  assert report['too_long']['count'] == len(report['too_long']['ids']) > 0
  for p in pairs:
    ids_p = tok.encode(p.clean_prompt, add_special_tokens=False).ids
    ids_m = tok.encode(p.corrupt_prompt, add_special_tokens=False).ids
    assert len(ids_p) == len(ids_m) == p.prompt_tokens
    assert p.length <= cfg.max_len
    diff = {j for j, (a, b) in enumerate(zip(ids_p, ids_m)) if a != b}
    assert diff and diff <= set(p.ev)
    assert p.answer in p.clean_prompt and p.answer not in p.corrupt_prompt
    assert len(p.dis) == len(p.ctl) == len(p.ev)
    assert not set(p.ev) & set(p.dis) and not set(p.ev) & set(p.ctl)
    assert tok.decode([ids_p[j] for j in p.dis]).strip() != p.answer


@needs_model
def test_batch_arrays_masks_and_padding(tiny_pairs):
  tok, cfg, pairs, _ = tiny_pairs
  ps = pairs[:1]
  arr = audit_nq.batch_arrays(tok, ps, batch_size=2, pad_to=cfg.max_len)
  assert arr['spans'].shape == (3, 2, cfg.max_len)
  np.testing.assert_array_equal(arr['clean'][0], arr['clean'][1])  # short batch: repeated row
  assert (arr['spans'].sum(-1) == len(ps[0].ev)).all()
  assert not (arr['spans'] & ~arr['valid']).any()
  changed = arr['clean'] != arr['corrupt']
  assert changed.any() and not (changed & ~arr['spans'][0]).any()


# ---------------------------------------------------------------------------
# End to end: the entry point's library function on the tiny config.
# ---------------------------------------------------------------------------


def _check_outputs(workdir: str, cfg, n_layers: int) -> dict:
  s = json.load(open(os.path.join(workdir, 'summary.json')))
  rows = list(csv.DictReader(open(os.path.join(workdir, 'examples.csv'))))
  assert len(rows) == s['n_examples'] * n_layers and s['n_examples'] == cfg.num_pairs
  assert len(s['per_layer']) == n_layers
  assert s['n_degenerate'] == sum(r['degenerate'] == 'True' for r in rows) // n_layers
  for r in rows:
    for p in s['probes']:
      float(r[f'L_int_{p}'])
      assert (r[f'ceu_{p}'] == '') == (r['degenerate'] == 'True')
  for e in s['per_layer']:
    for p in s['probes']:
      agg = e[p]['ceu']
      assert agg['n'] == s['n_examples'] - s['n_degenerate']
      if agg['n']:
        assert agg['ci_low'] <= agg['value'] <= agg['ci_high']
        assert 0.0 <= agg['value'] <= 1.0
  for ext in ('png', 'pdf'):
    assert os.path.getsize(os.path.join(workdir, 'plots', f'layer_profile.{ext}')) > 1000
  return s


@needs_model
def test_tiny_audit_outputs_and_resume(tmp_path):
  cfg = _config('tiny,n_layers=4')
  workdir = str(tmp_path / 'w')
  s = audit_nq.run_pretrained_audit(cfg, workdir)
  _check_outputs(workdir, cfg, n_layers=4)
  assert s['pairs']['audited'] == cfg.num_pairs and 0 < s['pairs']['share_kept'] <= 1
  batches = sorted(os.listdir(os.path.join(workdir, 'batches')))
  assert len(batches) == len(json.load(open(os.path.join(workdir, 'plan.json'))))
  kept = os.path.join(workdir, 'batches', batches[0])
  mtime = os.path.getmtime(kept)
  os.remove(os.path.join(workdir, 'batches', batches[-1]))
  again = audit_nq.run_pretrained_audit(cfg, workdir)  # resumes: only the missing batch
  assert os.path.getmtime(kept) == mtime
  assert again['per_layer'] == s['per_layer']
  with pytest.raises(ValueError, match='fresh workdir'):
    audit_nq.run_pretrained_audit(_config('tiny,n_layers=4,num_pairs=3'), workdir)


@needs_model
@pytest.mark.slow
def test_tiny_audit_all_layers(tmp_path):
  """All 30 layers: the model reads the passage (L+ > L− on average)."""
  cfg = _config('tiny')
  s = audit_nq.run_pretrained_audit(cfg, str(tmp_path))
  _check_outputs(str(tmp_path), cfg, n_layers=30)
  assert s['L_plus']['value'] > s['L_minus']['value']
  assert s['n_degenerate'] < s['n_examples']
