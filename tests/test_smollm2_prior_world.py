"""The memorisable-prior world of the SmolLM2 CER task (issue #36 item 1).

* `prior_world.build` against a slow, obvious reference (plain loops, a word-list mention
  check): every memorised item recurs `repeats` times with its one answer, the η share
  of contexts without the evidence, disjoint and correctly labelled strata, a pure
  function of the seed;
* the task's pairs of the world on the shipped data (the real tokenizer, no model):
  rows without evidence have D− = D+ and no span, the evidence_only items ask no
  training question;
* the CLI end to end at `configs/smollm2_cer.py:tiny,world=true` (first 2 layers of the
  real model): training, then the stratified held-out evaluation and its summary;
* bad config values: one clear error naming the field, before anything compiles.
"""
from __future__ import annotations

import dataclasses
import json
import os
import string
import types

import ml_collections
import numpy as np
import pytest

from ceu_jax.data.factqa import prior_world
from ceu_jax.pretrained import gguf_loader
from configs import smollm2_cer
from tests.test_train_helpers import describe, metric_rows, run_train

_WHY = gguf_loader.is_available()
needs_model = pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')

CONFIG = 'configs/smollm2_cer.py:tiny,world=true,conflict=0.5'  # every memorised item: a
                                                                # conflicting row per epoch
MODULE = 'experiments.train_smollm2_cer'


# ----------------------------------------------------------------------------
# The reference: plain loops.
# ----------------------------------------------------------------------------


def _words(text: str) -> list[str]:
  """Lower-cased words, punctuation dropped, articles dropped (SQuAD's normalisation,
  written out)."""
  text = ''.join(ch for ch in text.lower() if ch not in string.punctuation)
  return [w for w in text.split() if w not in ('a', 'an', 'the')]


def _ref_mentions(text: str, answer: str) -> bool:
  t, a = _words(text), _words(answer)
  return any(t[i:i + len(a)] == a for i in range(len(t) - len(a) + 1))


def _items(n: int, dup_every: int = 0) -> list[prior_world.Item]:
  """Synthetic candidates: item i answers 'Name<i> Person'; every dup_every-th item
  asks the question of the item before it, cased and punctuated otherwise (a duplicate
  after normalisation, which the world must drop)."""
  out = []
  for i in range(n):
    q = f'who founded company {i}?'
    if dup_every and i and i % dup_every == 0:
      q = f'Who founded the company, {i - 1}'
    ans = f'Name{i} Person'
    out.append(prior_world.Item(f'nq:{i:05d}', q, ans,
                                f'Some filler {i}. It was founded by {ans} in 19{i % 90:02d}.',
                                f'Some filler {i}. The company grew quickly.',
                                f'Some filler {i}. It was founded by Other{i} Person in '
                                f'19{i % 90:02d}.'))
  return out


def _check_against_reference(world: prior_world.World, items, cfg) -> None:
  by_id = {it.id: it for it in items}
  seen_q, kept = set(), []
  for it in sorted(items, key=lambda x: x.id):   # duplicates: the first by id stays
    q = ' '.join(_words(it.question.rstrip('?')))
    if q not in seen_q:
      seen_q.add(q)
      kept.append(it.id)
  mem, fresh = set(world.memorised), set(world.fresh)
  assert not mem & fresh and mem | fresh <= set(kept)
  assert len(mem) == round(cfg.rho * cfg.n_items) and len(mem) + len(fresh) == cfg.n_items
  counts: dict[str, int] = {}
  missing: dict[str, int] = {}
  conflicting: dict[str, int] = {}
  for r in world.rows:
    counts[r.id] = counts.get(r.id, 0) + 1
    missing[r.id] = missing.get(r.id, 0) + (not r.has_evidence and not r.conflict)
    conflicting[r.id] = conflicting.get(r.id, 0) + r.conflict
    it = by_id[r.id]
    assert (r.question, r.answer) == (it.question, it.answer)   # the one fixed answer
    assert r.memorised == (r.id in mem)
    assert r.context == (it.context if r.has_evidence else
                         it.conflict_context if r.conflict else it.free_context)
    assert _ref_mentions(r.context, r.answer) == r.has_evidence
    assert not (r.conflict and r.has_evidence)
  for i in mem:
    assert counts[i] == cfg.repeats
    assert missing[i] == round(cfg.eta * cfg.repeats)
    assert conflicting[i] == round(cfg.conflict * cfg.repeats)
  assert not any(conflicting[i] for i in fresh)
  assert all(counts[i] == 1 for i in fresh)
  assert sum(missing[i] for i in fresh) == round(cfg.eta * len(fresh))
  assert len(world.rows) == len(mem) * cfg.repeats + len(fresh)
  # Strata: the memorised / no_evidence items are the first memorised ids; every training
  # question is "seen" (the evidence_only items must avoid them).
  assert list(world.eval_memorised) == sorted(mem)[:cfg.n_eval_memorised]
  assert world.seen_questions == {' '.join(_words(by_id[i].question.rstrip('?')))
                                  for i in mem | fresh}


@pytest.mark.parametrize('rho,eta,repeats,conflict', [
    (0.25, 0.5, 4, 0.0), (0.5, 0.3, 3, 0.0), (1.0, 0.0, 2, 0.0), (0.1, 1.0, 5, 0.0),
    (0.25, 0.25, 8, 0.5), (0.5, 0.0, 3, 1.0), (0.2, 0.5, 6, 0.3)])
def test_world_matches_reference(rho, eta, repeats, conflict):
  items = _items(60, dup_every=7)
  cfg = prior_world.WorldConfig(rho=rho, eta=eta, repeats=repeats, n_items=40,
                                n_eval_memorised=3, conflict=conflict)
  world = prior_world.build(items, cfg, seed=3)
  _check_against_reference(world, items, cfg)
  rep = world.report
  assert rep['rows_without_evidence'] == sum(not r.has_evidence and not r.conflict
                                             for r in world.rows)
  assert rep['rows_conflicting'] == sum(r.conflict for r in world.rows)


def test_conflict_zero_leaves_the_world_as_it_was():
  """κ = 0 (and a section recorded before κ existed) gives the rows of the world without
  the knob: every earlier run's world is unchanged."""
  items = _items(50)
  cfg = prior_world.WorldConfig(rho=0.3, eta=0.5, repeats=4, n_items=30, n_eval_memorised=2)
  bare = [dataclasses.replace(it, conflict_context='') for it in items]
  a, b = prior_world.build(items, cfg, 0), prior_world.build(bare, cfg, 0)
  assert a.rows == b.rows and not any(r.conflict for r in a.rows)
  with_k = prior_world.build(items, dataclasses.replace(cfg, conflict=0.25), 0)
  assert [r.has_evidence or r.conflict for r in with_k.rows] == [r.has_evidence for r in a.rows]
  old = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != 'conflict'}
  assert prior_world.WorldConfig.from_config(old) == cfg


def test_conflict_needs_room_and_conflict_contexts():
  with pytest.raises(ValueError, match=r'data.world.conflict must be <= 0.5 with eta=0.5 and '
                     r'repeats=4: .* got 0.75'):
    prior_world.WorldConfig.from_config(dict(rho=0.5, eta=0.5, repeats=4, n_items=20,
                                             n_eval_memorised=1, conflict=0.75))
  cfg = prior_world.WorldConfig(rho=0.5, eta=0.0, repeats=2, n_items=20, n_eval_memorised=1,
                                conflict=0.5)
  bare = [dataclasses.replace(it, conflict_context='') for it in _items(30)]
  with pytest.raises(ValueError, match='needs every memorised item'):
    prior_world.build(bare, cfg, 0)


def test_world_is_a_pure_function_of_the_seed():
  items = _items(50)
  cfg = prior_world.WorldConfig(rho=0.3, eta=0.5, repeats=4, n_items=30, n_eval_memorised=2)
  a, b = prior_world.build(items, cfg, 0), prior_world.build(list(reversed(items)), cfg, 0)
  assert a == b   # the candidates' order does not matter either
  c = prior_world.build(items, cfg, 1)
  assert c.memorised != a.memorised
  _check_against_reference(c, items, cfg)


def test_free_context_never_mentions_the_answer_on_shipped_passages():
  from ceu_jax.data.factqa import storage
  examples, passages = storage.read_examples(), storage.read_passages()
  nq = sorted((e for e in examples if e['source'] == 'nq'), key=lambda e: e['id'])[:400]
  got = 0
  for e in nq:
    sents = passages[e['passage_id']]['sentences']
    ctx = prior_world.free_context(e['id'], sents, e['answer'], 3, 0)
    ok = [s for s in sents if not _ref_mentions(s, e['answer'])]
    assert (ctx is None) == (not ok)
    if ctx is not None:
      got += 1
      assert not _ref_mentions(ctx, e['answer'])
      picked = [s for s in sents if s in ctx]
      assert 1 <= len(picked) and len(ctx) <= sum(len(s) + 1 for s in ok)
      assert ctx == prior_world.free_context(e['id'], sents, e['answer'], 3, 0)
  assert got > 200


def test_too_few_candidates_is_an_error_naming_the_field():
  cfg = prior_world.WorldConfig(rho=0.5, eta=0.5, repeats=2, n_items=20, n_eval_memorised=1)
  with pytest.raises(ValueError, match=r'data.world.n_items=20 but only 10 eligible'):
    prior_world.build(_items(10), cfg, 0)


# ----------------------------------------------------------------------------
# Bad config values: before anything loads or compiles.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('arg,message', [
    ('tiny,world=true,rho=1.5', 'rho must be a number >= 0.0 and <= 1.0'),
    ('tiny,world=true,rho=0', 'rho must be > 0'),
    ('tiny,world=true,repeats=0', 'repeats must be an integer >= 1'),
    ('tiny,eta=0.3', 'eta needs world=true'),
    ('tiny,conflict=0.3', 'conflict needs world=true'),
    ('tiny,regularizer=none,swap=1', 'swap needs a CER regularizer'),
    ('tiny,world=true,conflict=1.2', 'conflict must be a number >= 0.0 and <= 1.0'),
])
def test_bad_config_arguments(arg, message):
  with pytest.raises(ValueError, match=message):
    smollm2_cer.get_config(arg)


@pytest.mark.parametrize('field,value,message', [
    ('eta', -0.1, r'data.world.eta must be a number in \[0, 1\], got -0.1'),
    ('repeats', 0, 'data.world.repeats must be an integer >= 1, got 0'),
    ('n_eval_memorised', 7, r'data.world.n_eval_memorised must be <= round\(rho \* n_items\) = 6'),
    ('bogus', 1, 'data.world.bogus is an unknown field'),
    ('conflict', 0.75, r'data.world.conflict must be <= 0.5 with eta=0.5 and repeats=2'),
])
def test_bad_world_fields_named_by_validate(field, value, message):
  from ceu_jax.finetune import task as cer_task
  c = smollm2_cer.get_config('tiny,world=true')
  with c.unlocked():
    c.data.world[field] = value
  with pytest.raises(ValueError, match=message):
    cer_task.validate(c)


# ----------------------------------------------------------------------------
# The task's pairs of the world (real tokenizer, no model).
# ----------------------------------------------------------------------------


@pytest.fixture(scope='module')
def tiny_world():
  from ceu_jax.finetune import task as cer_task
  from ceu_jax.pretrained import load_tokenizer
  config = smollm2_cer.get_config(CONFIG.split(':')[1])
  tok = load_tokenizer()
  return config, tok, cer_task.world_pairs(tok, config)


@needs_model
def test_world_pairs_on_shipped_data(tiny_world):
  from ceu_jax.finetune import evaluate as cer_eval
  from ceu_jax.finetune import task as cer_task
  config, tok, (world, wp, report) = tiny_world
  cfg = prior_world.WorldConfig.from_config(config.data.world)
  assert (report['items'], report['memorised'], len(world.rows)) == (12, 6, 18)
  for r in world.rows:
    p = wp.of(r)
    assert p.answer == r.answer and r.context in p.clean_prompt
    if r.has_evidence:
      assert p.corrupt_prompt != p.clean_prompt and p.ev and r.answer in p.clean_prompt
    else:
      assert p.corrupt_prompt == p.clean_prompt and not (p.ev or p.dis or p.control)
      assert not _ref_mentions(p.clean_prompt.split('\nQuestion:')[0], r.answer)
  # Every conflicting pair is its item's D− (the entity swap) with the memorised target.
  for i, c in wp.conflict.items():
    e = wp.with_ev[i]
    assert c.clean_prompt == c.corrupt_prompt == e.corrupt_prompt and c.answer == e.answer
    assert c.prompt_tokens == e.prompt_tokens and not (c.ev or c.dis or c.control)
    assert not _ref_mentions(c.clean_prompt.split('\nQuestion:')[0], e.answer)
    assert _ref_mentions(c.clean_prompt, e.substitute)
  pairs = [wp.of(r) for r in world.rows]
  batch = cer_task.batch_arrays(tok, pairs, int(config.data.max_len))
  np.testing.assert_array_equal(batch['has_ev'], [r.has_evidence for r in world.rows])
  bad = dict(batch, tokens_m=batch['tokens_m'].copy())
  i = int(np.flatnonzero(~batch['has_ev'])[0])
  bad['tokens_m'][i, -3] += 1
  with pytest.raises(ValueError, match='without evidence .* must have D− = D\\+'):
    cer_task.obj.check_batch(bad, [p.id for p in pairs])
  # The fixed held-out set: memorised items are training items; evidence_only items ask
  # no training question; strata disjoint.
  task = types.SimpleNamespace(config=config, tokenizer=tok, world=world, world_pairs=wp)
  held, stratum, _ = cer_eval.world_eval_pairs(task)
  mem = [p.id for p in held if stratum[p.id] == 'memorised']
  assert mem == list(world.eval_memorised) and set(mem) <= set(world.memorised)
  ev_only = [p for p in held if stratum[p.id] == 'evidence_only']
  assert len(ev_only) == config.eval.num_examples
  assert not {p.id for p in ev_only} & {r.id for r in world.rows}
  assert all(prior_world.question_key(p.question) not in world.seen_questions for p in ev_only)
  assert cfg.n_eval_memorised == len(mem)


# ----------------------------------------------------------------------------
# End to end through the CLI.
# ----------------------------------------------------------------------------


@needs_model
def test_tiny_world_cli_trains_and_evaluates_by_stratum(tmp_path, tiny_world):
  _, _, (world, _, _) = tiny_world
  workdir = str(tmp_path / 'world')
  proc = run_train(CONFIG, workdir, '--config.train.num_steps=3',
                   module=MODULE, fast_compile=True)
  assert proc.returncode == 0, describe(proc)
  rows = metric_rows(workdir, 'train')
  assert [r['step'] for r in rows] == [1, 2, 3] and 'cer_ev_active' in rows[0]
  out = os.path.join(workdir, 'eval_trained')
  with open(os.path.join(out, 'summary.json')) as f:
    s = json.load(f)
  st = s['strata']
  assert {k: v['n'] for k, v in st.items()} == {'memorised': 2, 'evidence_only': 4,
                                                'no_evidence': 2}
  clean, free = [], []
  for name in sorted(os.listdir(os.path.join(out, 'batches'))):
    with open(os.path.join(out, 'batches', name)) as f:
      if name.startswith('no_evidence_'):
        free += json.load(f)
      elif not name.startswith('delta_'):
        clean += json.load(f)
  at = [r for r in clean if r['layer'] == 1]
  mem = sorted(r['id'] for r in at if r['stratum'] == 'memorised')
  assert mem == sorted(world.eval_memorised) == sorted(r['id'] for r in free)
  assert all(r['stratum'] == 'no_evidence' for r in free)
  for name in ('memorised', 'evidence_only'):
    sub = [r for r in at if r['stratum'] == name]
    m = st[name]
    assert m['em']['value'] == np.mean([r['em'] for r in sub])
    assert m['degenerate']['value'] == np.mean([r['degenerate'] for r in sub])
    fixed = [0.0 if r['ceu_ev'] is None else r['ceu_ev'] for r in sub]
    np.testing.assert_allclose(m['ceu_ev_fixed']['value'], np.mean(fixed), rtol=1e-9)
    sup = [r['em'] == 1.0 and r['ceu_ev'] is not None and r['ceu_ev'] >= 0.5 for r in sub]
    assert m['supported_0.5']['value'] == np.mean(sup) <= m['em']['value']
  np.testing.assert_allclose(st['no_evidence']['nll']['value'],
                             -np.mean([r['L_plus'] for r in free]), rtol=1e-9)
  assert s['delta_test']['0.9']['strata']['memorised']['n'] == 2
  # The report's CEU_ev-by-layer profile per stratum: the mean over each stratum's
  # non-degenerate rows at every layer.
  from ceu_jax.finetune import evaluate as cer_eval
  prof = cer_eval.stratum_profiles(out, num_resamples=50)
  for name in ('memorised', 'evidence_only'):
    for e in prof[name]['per_layer']:
      vals = [r['ceu_ev'] for r in clean if r['layer'] == e['layer'] and
              r['stratum'] == name and r['ceu_ev'] is not None]
      got = e['ev']['ceu']['value']
      assert (got is None) if not vals else got == pytest.approx(np.mean(vals), abs=1e-12)
  cer_eval.report([('w', os.path.join(out, 'summary.json'))], str(tmp_path / 'rep'),
                  num_resamples=50)
  assert (tmp_path / 'rep' / 'layer_profiles_strata.png').exists()


@needs_model
def test_bad_world_field_is_one_line_before_compiling(tmp_path):
  proc = run_train(CONFIG, str(tmp_path / 'bad'), '--config.data.world.repeats=0',
                   module=MODULE)
  assert proc.returncode == 1, describe(proc)
  assert 'data.world.repeats must be an integer >= 1, got 0' in proc.stderr
  assert not os.path.exists(tmp_path / 'bad' / 'checkpoints')
