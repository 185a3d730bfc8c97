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

from ceu_jax import engine
from ceu_jax.pretrained import audit_nq, gguf_loader, probe_spans

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: 11 -> 7 CPU-s

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
  assert probe_spans.windows([3, 4, 5, 6, 7], 2, {5}) == [(3, 4), (6, 7)]
  assert probe_spans.windows([3, 4], 3, set()) == []


def _pair(i: int, length: int, answer_tokens: int, dis=(2,), control=(3,)) -> audit_nq.Pair:
  return audit_nq.Pair(f'nq:{i:05d}', 'q', 'a', 'b', 'dataset', 'p', 'm',
                       length - answer_tokens, answer_tokens, (1,), dis,
                       'entity' if dis else 'none', control)


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
  other = [_pair(0, 50, 2, dis=(4,))] + pairs[1:]  # other spans: another plan
  assert audit_nq.plan_batches(other, cfg) != plan


# ---------------------------------------------------------------------------
# Distractor and control spans are never the answer in another spelling (#22).
# ---------------------------------------------------------------------------

SISYPHUS = ('In Greek mythology Sisyphus or Sisyphos ( / ˈsɪsɪfəs / ; Greek : Σίσυφος , '
            'Sísuphos ) was the king of Ephyra ( now known as Corinth ) . Tasks that are '
            'futile are described as Sisyphean ( / ˌsɪsɪˈfiːən / ) .')


def _like(text, targets):
  return [text[s:e] for s, e in probe_spans.answer_like_ranges(text, 0, len(text), targets)]


def test_answer_like_words():
  got = set(_like(SISYPHUS, ['Sisyphus', 'Elio Petri']))
  assert {'Sisyphus', 'Sisyphos', 'Sisyphean', 'Sísuphos', 'Σίσυφος', 'ˈsɪsɪfəs',
          'ˌsɪsɪˈfiːən'} <= got
  assert not got & {'Greek', 'mythology', 'king', 'Ephyra', 'Corinth', 'Tasks', 'futile'}
  # Case, punctuation, diacritics, stems, the substitute, multi-word targets.
  text = ('SISYPHUS met sisyphus\'s friend Sísyphus-like Petri and PETRIS near the U.S. '
          'border, in the US, where New Yorkers live; Paris is far.')
  got = _like(text, ['Sisyphus', 'Elio Petri', 'U.S.', 'New York'])
  for w in ('SISYPHUS', 'sisyphus', 'Sísyphus', 'Petri', 'PETRIS', 'U.S', 'US', 'New',
            'Yorkers'):
    assert w in got, w
  for w in ('met', 'friend', 'like', 'near', 'the', 'border', 'where', 'live', 'Paris', 'far'):
    assert w not in got, w


@pytest.mark.parametrize('word,key,want', [
    ('sisyphos', 'sisyphus', True),  # common prefix ≥ 5
    ('sisuphos', 'sisyphus', True),  # transliteration: difflib ratio 0.75
    ('roman', 'rome', True),  # prefix 3 = 75% of the shorter word
    ('corinth', 'sisyphus', False), ('an', 'and', False),
    ('ii', 'ii', True), ('is', 'iii', False),  # < 3 characters: equal only
])
def test_related_rule(word, key, want):
  assert probe_spans.related(word, key) is want


def _word_offsets(text):
  """One 'token' per whitespace-separated word, with a leading space like BPE."""
  import re
  out = []
  for m in re.finditer(r'\S+', text):
    out.append((m.start() - 1 if m.start() else 0, m.end()))
  return out


def _chosen(text, ev_word, targets, seed=0):
  offs = _word_offsets(text)
  ev = probe_spans.positions(offs, [(text.index(ev_word), text.index(ev_word) + len(ev_word))])
  rng = np.random.default_rng(seed)
  dis, kind, ctl = probe_spans.choose_spans(text, offs, 0, len(text), ev, targets, rng)
  word = lambda pos: ' '.join(text[offs[j][0]:offs[j][1]].strip() for j in pos)
  return word(dis), kind, word(ctl)


@pytest.mark.parametrize('seed', range(5))
def test_choose_spans_elsewhere(seed):
  # The only other capitalised one-word mentions spell the answer differently.
  text = 'Sisyphus or SISYPHOS or Sisyphean or Sísuphos and the boulder rolled down Corinth'
  dis, kind, ctl = _chosen(text, 'Sisyphus', ['Sisyphus', 'Elio'], seed)
  assert (dis, kind) == ('Corinth', 'entity')
  assert ctl in {'and', 'the', 'boulder', 'rolled', 'down', 'or'}
  # The substitute's variants are excluded too; no entity left: a context window.
  text = 'Paris is where Elio and Elios met the king'
  dis, kind, ctl = _chosen(text, 'Paris', ['Paris', 'Elio'], seed)
  assert kind == 'context' and dis in {'is', 'where', 'and', 'met', 'the', 'king'}
  assert ctl in {'is', 'where', 'and', 'met', 'the', 'king'} and ctl != dis


def test_choose_spans_absent_never_filled():
  # No other entity: a context window; no room left for a disjoint control: the same one.
  assert _chosen('Sisyphus or Sisyphos', 'Sisyphus', ['Sisyphus']) == ('or', 'context', 'or')
  text = 'Sisyphus Sisyphos'
  assert _chosen(text, 'Sisyphus', ['Sisyphus']) == ('', 'none', '')


# ---------------------------------------------------------------------------
# Rows and summary from the engine's scores.
# ---------------------------------------------------------------------------


def _profile(gaps, l_int, n_layers=2):
  """An engine Profile of synthetic log-likelihoods (L− = 0; probes by name)."""
  import jax.numpy as jnp
  lp = jnp.asarray(gaps, jnp.float32)
  li = jnp.asarray(l_int, jnp.float32)
  l_int = jnp.stack([li, jnp.zeros_like(li), jnp.full_like(li, 0.5)])  # ev, dis, control
  sites = [f'layers_{i}/attn:read' for i in range(n_layers)]
  return engine.Profile(tuple(engine.from_logliks(lp, jnp.zeros_like(lp), l_int,
                                                  names=engine.SPAN_PROBES, site=s)
                              for s in sites), tuple(sites))


def test_summary_flags_degenerate_clips_and_counts_missing_spans():
  cfg = _config('tiny')
  pairs = [_pair(0, 50, 2), _pair(1, 50, 2, dis=(), control=()), _pair(2, 50, 2),
           _pair(3, 50, 2), _pair(4, 50, 2, control=())]
  prof = _profile(gaps=[2.0, 4.0, 0.0, -1.0, 1.0], l_int=[1.0, 8.0, 5.0, 0.0, 0.25])
  rows = audit_nq.batch_rows(pairs, prof, engine.SPAN_PROBES)
  s = audit_nq.summarize(rows, engine.SPAN_PROBES, 2, cfg)
  assert s['n_examples'] == 5 and s['n_degenerate'] == 2
  assert s['degenerate_ids'] == ['nq:00002', 'nq:00003']
  assert s['no_valid_span'] == {'dis': {'count': 1, 'ids': ['nq:00001']},
                                'control': {'count': 2, 'ids': ['nq:00001', 'nq:00004']}}
  ev = s['per_layer'][1]['ev']['ceu']
  assert ev['n'] == 3 and ev['value'] == pytest.approx((0.5 + 1.0 + 0.25) / 3)  # 8/4 clipped
  ctl = s['per_layer'][1]['control']['ceu']
  assert ctl['n'] == 1 and ctl['value'] == pytest.approx(0.25)  # only nq:00000 (0.5 / 2)
  assert s['per_layer'][0]['dis']['ceu']['n'] == 2
  assert all(r['ceu_ev'] is None for r in rows if r['degenerate'])
  assert all(r['L_int_dis'] is None and r['ceu_dis'] is None for r in rows if not r['has_dis'])
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
    for span in (p.dis, p.control):
      assert len(span) in (0, len(p.ev)) and not set(p.ev) & set(span)
      text = tok.decode([ids_p[j] for j in span])
      assert not probe_spans.answer_like_ranges(text, 0, len(text), [p.answer, p.substitute])


@needs_model
def test_sisyphus_item_spans_chosen_elsewhere():
  """nq:03274 (#22): the distractor was 'Sisyphos' and the control overlapped
  'Sisyphean'; now neither touches any spelling of the answer."""
  from ceu_jax.pretrained import load_tokenizer
  tok = load_tokenizer()
  cfg = _config('full')
  recs = audit_nq.nq_records('test')
  rec, ctx = next((r, c) for r, c in recs if r['id'] == 'nq:03274')
  pair, why = audit_nq.make_pair(tok, rec, ctx, audit_nq.drawn_pool(tok, recs), cfg)
  assert why == 'kept' and pair.answer == 'Sisyphus'
  enc = tok.encode(pair.clean_prompt, add_special_tokens=False)
  lo = len(audit_nq.CONTEXT_PREFIX)
  for variant in ('Sisyphos', 'Sisyphean', 'Sísuphos', 'Σίσυφος', 'ˈsɪsɪfəs'):
    s = pair.clean_prompt.index(variant, lo)
    hit = set(probe_spans.positions(enc.offsets, [(s, s + len(variant))]))
    assert hit and not hit & set(pair.dis) and not hit & set(pair.control), variant
  assert pair.dis and pair.control and len(pair.dis) == len(pair.control) == len(pair.ev)
  for span in (pair.dis, pair.control):
    text = tok.decode([enc.ids[j] for j in span])
    assert 'isyph' not in text.lower() and 'suph' not in text.lower(), text


@needs_model
def test_batch_arrays_masks_and_padding(tiny_pairs):
  tok, cfg, pairs, _ = tiny_pairs
  ps = pairs[:1]
  arr = audit_nq.batch_arrays(tok, ps, batch_size=2, pad_to=cfg.max_len)
  clean, corrupt = arr['clean'], arr['corrupt']
  np.testing.assert_array_equal(clean['tokens'][0], clean['tokens'][1])  # short batch: repeated
  for name in engine.SPAN_PROBES:
    m = arr['spans'][name]
    assert m.shape == (2, cfg.max_len - 1)
    assert (m.sum(-1) == len(getattr(ps[0], name))).all()
    assert not (m & ~clean['valid'][:, :-1]).any()
  changed = clean['tokens'] != corrupt['tokens']
  assert changed.any() and not (changed[:, :-1] & ~arr['spans']['ev']).any()
  probes = audit_nq.batch_probes(arr, engine.SPAN_PROBES + (audit_nq.SITE,))
  assert probes.names == ('ev', 'dis', 'control', 'site')
  assert probes.span[probes.index('site')].all()
  np.testing.assert_array_equal(probes.positions[0], clean['answer_mask'][:, 1:])


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
      has = r[f'has_{p}'] == 'True'
      assert (r[f'L_int_{p}'] == '') == (not has)
      assert (r[f'ceu_{p}'] == '') == (r['degenerate'] == 'True' or not has)
  for e in s['per_layer']:
    for p in s['probes']:
      agg = e[p]['ceu']
      missing = s['no_valid_span'].get(p, {'ids': []})['ids']
      assert agg['n'] == sum(r['layer'] == str(e['layer']) and r['degenerate'] == 'False'
                             and r['id'] not in missing for r in rows)
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
  batches = sorted(os.listdir(os.path.join(workdir, 'units')))
  assert len(batches) == len(json.load(open(os.path.join(workdir, 'plan.json'))))
  kept = os.path.join(workdir, 'units', batches[0])
  mtime = os.path.getmtime(kept)
  os.remove(os.path.join(workdir, 'units', batches[-1]))
  again = audit_nq.run_pretrained_audit(cfg, workdir)  # resumes: only the missing batch
  assert os.path.getmtime(kept) == mtime and again['produced_by']['units_this_run'] == 1
  assert again['per_layer'] == s['per_layer']
  for arg, field in (('tiny,n_layers=4,num_pairs=3', 'num_pairs 4 -> 3'),
                     ('tiny,n_layers=3', 'n_layers 4 -> 3'),
                     ('tiny,n_layers=4,site_probe=false', 'site_probe True -> False')):
    with pytest.raises(ValueError, match=f'another config: {field}'):   # eps, gguf_path too
      audit_nq.run_pretrained_audit(_config(arg), workdir)
  c = _config('tiny,n_layers=4')
  c.eps = 0.01
  with pytest.raises(ValueError, match='another config: eps 0.001 -> 0.01'):
    audit_nq.run_pretrained_audit(c, workdir)


@needs_model
@pytest.mark.slow
def test_tiny_audit_all_layers(tmp_path):
  """All 30 layers: the model reads the passage (L+ > L− on average)."""
  cfg = _config('tiny')
  s = audit_nq.run_pretrained_audit(cfg, str(tmp_path))
  _check_outputs(str(tmp_path), cfg, n_layers=30)
  assert s['L_plus']['value'] > s['L_minus']['value']
  assert s['n_degenerate'] < s['n_examples']


def test_pretrained_package_is_on_the_engine():
  """#14: the pretrained audit imports the engine, has no interceptor of its
  own and no copy of the CEU formula (scores come from engine.from_logliks)."""
  import pathlib

  from ceu_jax import engine
  from ceu_jax.pretrained import patching
  assert patching.engine is engine and audit_nq.engine is engine
  src = {p.name: p.read_text() for p in pathlib.Path(patching.__file__).parent.glob('*.py')}
  for name, text in src.items():
    assert 'intercept_methods' not in text, name
    assert 'clip(' not in text and 'stabilised_ceu' not in text, name
