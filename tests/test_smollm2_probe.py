"""The §8.4 answer-position probe of World B (`audits.traces.smollm2_probe`, issue #35 item 3):
the moved start, token alignment and the question span on the real tokenizer; the batched
fast path against the engine's record / patch run item by item, unpadded (2 SmolLM2 layers);
the summary and the probe claims on hand-made numbers whose answers are known exactly."""
from __future__ import annotations

import numpy as np
import pytest

from ceu_jax import claims
from ceu_jax.audits import layer_probe
from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.audits.traces import smollm2_probe as sp
from ceu_jax.audits.traces import verdicts
from ceu_jax.pretrained import gguf_loader

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: 27 -> 11 CPU-s

_WHY = gguf_loader.is_available()
needs_model = pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')


def _domain():
  return ar.ArithmeticDomain([ar.make_arith_item(7919, i, hops=(2 + i % 3,)) for i in range(2)])


def test_moved_start_changes_only_the_start_and_the_answer():
  for i in range(300):
    x = ar.make_arith_item(0, i)
    y = sp.moved_start(x)
    assert y.ops == x.ops and y.id == x.id
    assert len(str(y.start)) == len(str(x.start)) and 1 <= abs(y.start - x.start) <= 3
    assert y.answer != x.answer
    assert abs(y.start - x.start) == x.delta
    # the texts differ in the start's digits only
    diff = [j for j, (a, b) in enumerate(zip(x.question, y.question)) if a != b]
    assert len(x.question) == len(y.question) and diff
    lo = x.question.index(' has ') + len(' has ')
    assert all(lo <= j < lo + len(str(x.start)) for j in diff)
  bad = ar.ArithItem('arith:x', 'Tom owns 3 cards.', 3, (('+', 2),), 1)
  with pytest.raises(ValueError, match="item arith:x: the start quantity 3 is not stated once"):
    sp.moved_start(bad)


def test_question_chars():
  dom = _domain()
  x = ar.make_arith_item(0, 3)
  p = dom.prompt(x)
  lo, hi = sp.question_chars(p, dom.primer)
  assert p[lo:hi] == x.question
  with pytest.raises(ValueError, match='does not end with the question'):
    sp.question_chars(p + ' 4', dom.primer)


@needs_model
def test_pairs_are_token_aligned_and_differ_in_the_question_only():
  from ceu_jax.pretrained import load_tokenizer
  tok, dom = load_tokenizer(None), _domain()
  items = [ar.make_arith_item(0, i) for i in range(12)]
  pairs, skipped = sp.probe_pairs(tok, dom, items)
  assert skipped == {} and [p.id for p in pairs] == [x.id for x in items]
  for x, p in zip(items, pairs):
    p.check()   # aligned, different, inside the question span only
    plus, minus = sp.probe_rows(dom, x)
    assert plus.target.endswith(f'Answer: {x.answer}') and minus.target == plus.target
    assert minus.prompt == dom.prompt(sp.moved_start(x))
    q = [t for t, m in zip(p.plus, p.spans[1]) if m]
    assert tok.decode(list(q)).strip() == x.question   # the span is the question's tokens
    assert tok.decode(list(p.plus[-p.answer_len:])).strip() == x.answer   # the answer ends it
    assert p.spans[0] is None
  bad = layer_probe.ProbePair('b', (1, 2, 3, 4), (1, 9, 3, 4), 1, (None, (False,) * 4))
  with pytest.raises(AssertionError, match=r"item b: D\+ and D− differ outside a probe's span"):
    bad.check()
  with pytest.raises(AssertionError, match='differ in the forced output or answer'):
    layer_probe.ProbePair('c', (1, 2, 3, 4), (1, 2, 3, 5), 1, (None,)).check()
  assert bad.problem() == "item b: D+ and D− differ outside a probe's span"
  assert all(p.problem() is None for p in pairs)


@needs_model
def test_batched_probe_equals_the_engine_item_by_item():
  """layer_probe.per_item (batches of 2, left-padded, the last batch filled with a repeat)
  against `patching.reference_audit` (engine.record on D+, engine.patch on D−, one full
  forward per layer and probe) of each item alone, unpadded: log-likelihoods at 1e-5, CEU
  within what they propagate to."""
  import jax.numpy as jnp
  from ceu_jax import engine
  from ceu_jax.pretrained import load_smollm2, load_tokenizer
  from ceu_jax.pretrained.patching import answer_positions, reference_audit
  mc, variables = load_smollm2(None, n_layers=2)
  tok, dom = load_tokenizer(None), _domain()
  items = [ar.make_arith_item(0, i) for i in range(3)]
  pairs, _ = sp.probe_pairs(tok, dom, items)
  got = layer_probe.per_item(variables['params'], mc, pairs, sp.PROBES, batch_size=2)
  assert got['ids'] == [x.id for x in items] and got['layers'] == 2
  for i, p in enumerate(pairs):
    n = len(p.plus)
    inp = lambda ids: {'tokens': np.asarray([ids], np.int32), 'valid': np.ones((1, n), bool),
                       'answer_mask': np.asarray([[k >= n - p.answer_len for k in range(n)]])}
    clean, corrupt = inp(p.plus), inp(p.minus)
    pos = answer_positions(clean['answer_mask'])
    span = np.stack([np.ones((1, n - 1), bool), np.asarray([p.spans[1][:-1]])])
    probes = engine.Probes(span=jnp.asarray(span), positions=jnp.asarray(
        np.broadcast_to(pos, span.shape).copy()), names=sp.PROBES)
    ref = reference_audit(variables, mc, clean=clean, corrupt=corrupt, probes=probes,
                          n_tail=p.answer_len)
    r0 = ref.results[0]
    np.testing.assert_allclose(got['L_plus'][i], float(r0.L_plus[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got['L_minus'][i], float(r0.L_minus[0]), rtol=1e-5, atol=1e-5)
    assert got['degenerate'][i] == bool(r0.degenerate[0])
    for q in sp.PROBES:
      for layer, res in enumerate(ref.results):
        np.testing.assert_allclose(got['L_int'][q][layer][i], float(res.L_int_of(q)[0]),
                                   rtol=1e-5, atol=1e-5)
        # CEU = (L_int − L−) / ΔL: the log-likelihoods' 1e-5 (three of them) over this
        # 2-layer model's small ΔL is the most the math allows it to differ by
        tol = 3e-5 / max(abs(float(r0.delta_L[0])), 1e-3)
        np.testing.assert_allclose(got['ceu'][q][layer][i], float(res.ceu_of(q)[0]),
                                   rtol=0, atol=tol)


def _items(dl, ceu_a, ceu_q, deg):
  n = len(dl)
  return dict(ids=[f'i{j}' for j in range(n)], layers=len(ceu_a),
              L_plus=[0.0] * n, L_minus=[-v for v in dl], delta_L=dl, degenerate=deg,
              ceu={'answer': ceu_a, 'question': ceu_q}, L_int={})


def test_summarize_means_by_stratum_over_non_degenerate_items():
  it = _items([0.5, 1.5, 0.0, 2.0], [[0.1, 0.3, 0.0, 0.5], [1.0, 0.0, 0.0, 0.2]],
              [[0.0, 0.1, 0.0, 0.1], [0.5, 0.5, 0.0, 0.5]], [False, False, True, False])
  strata = {'i0': 'memorised', 'i1': 'memorised', 'i2': 'fresh', 'i3': 'fresh'}
  s = layer_probe.summarize(it, strata, seed=0)
  assert s['n'] == 4 and s['n_degenerate'] == 1
  assert s['delta_L']['value'] == pytest.approx(1.0)
  assert s['layers'][0]['ceu_answer']['value'] == pytest.approx(0.3)   # (0.1 + 0.3 + 0.5) / 3
  assert s['layers'][1]['ceu_question']['value'] == pytest.approx(0.5)
  assert s['layers'][0]['ceu_answer']['n'] == 3
  m, f = s['by_stratum']['memorised'], s['by_stratum']['fresh']
  assert m['delta_L']['value'] == pytest.approx(1.0) and f['delta_L']['value'] == pytest.approx(1.0)
  assert f['n_degenerate'] == 1 and f['layers'][0]['ceu_answer']['value'] == pytest.approx(0.5)
  assert m['layers'][1]['ceu_answer']['value'] == pytest.approx(0.5)
  assert layer_probe.peak(s, 'ceu_answer')['layer'] == 1
  assert layer_probe.peak(s, 'ceu_question')['layer'] == 1
  assert s['delta_L_by_item'] == {'i0': 0.5, 'i1': 1.5, 'i2': 0.0, 'i3': 2.0}
  assert layer_probe.summarize(it, None)['by_stratum'] == {}
  table = sp.table({'r': s})
  assert '| r | memorised | 2 | 0 |' in table and '| r | all | 4 | 1 |' in table



def test_layer_figure_legend_names_how_many_items_each_line_averages(tmp_path, monkeypatch):
  """Each line's label says over how many of the reader's probed items its CEU is taken (the
  non-degenerate ones), per stratum too."""
  from matplotlib.figure import Figure
  it = _items([0.5, 1.5, 0.0, 2.0], [[0.1, 0.3, 0.0, 0.5], [1.0, 0.0, 0.0, 0.2]],
              [[0.0, 0.1, 0.0, 0.1], [0.5, 0.5, 0.0, 0.5]], [False, False, True, False])
  s = layer_probe.summarize(it, {'i0': 'memorised', 'i1': 'memorised', 'i2': 'fresh',
                                 'i3': 'fresh'}, seed=0)
  seen = []
  monkeypatch.setattr(Figure, 'legend', lambda self, h, labels, **kw: seen.extend(labels))
  layer_probe.layer_figure({'r': s}, ('answer',), ('t',), str(tmp_path / 'f'), 'title')
  assert seen == ['r (CEU over 3 of 4)', 'r [fresh] (CEU over 1 of 2)',
                  'r [memorised] (CEU over 2 of 2)']

def _summary(dl, strata):
  it = _items(dl, [[0.0] * len(dl)], [[0.0] * len(dl)], [False] * len(dl))
  return layer_probe.summarize(it, strata, seed=0)


def test_probe_claims_decided_by_rule():
  strata = {f'i{j}': ('memorised' if j < 10 else 'fresh') for j in range(20)}
  rng = np.random.default_rng(0)
  follow = list(rng.normal(0.0, 0.01, 20))
  short = [v + (1.0 if j < 10 else 0.0) for j, v in enumerate(follow)]   # memorised only
  probes = {'smollm2_following': _summary(follow, strata),
            'smollm2_shortcut': _summary(short, strata)}
  beh = [claims.Claim('smollm2_following vs smollm2_shortcut: separates', '', claims.SUPPORTED, ''),
         claims.Claim('smollm2_following vs smollm2_shortcut [memorised]: separates', '',
                      claims.NOT_SUPPORTED, '')]
  got = {c.name: c for c in verdicts.probe_claims(
      ['smollm2', 'smollm2_following', 'smollm2_shortcut'], probes, beh, seed=0)}
  pre = 'smollm2_following vs smollm2_shortcut'
  assert got[f'{pre}: probe separates'].verdict == claims.SUPPORTED
  assert got[f'{pre} [memorised]: probe separates'].verdict == claims.SUPPORTED
  assert got[f'{pre} [fresh]: probe separates'].verdict == claims.NOT_SUPPORTED
  assert got[f'{pre}: probe agrees'].verdict == claims.SUPPORTED            # both separate
  assert got[f'{pre} [memorised]: probe agrees'].verdict == claims.NOT_SUPPORTED
  assert got[f'{pre} [fresh]: probe agrees'].verdict == claims.UNTESTED     # no behavioural
  assert '+0.5' in got[f'{pre}: probe separates'].numbers                   # 10 of 20 moved by 1
  # reversed readers: the shortcut reader's answer depends less on the problem -> opposite
  rev = {'smollm2_following': probes['smollm2_shortcut'],
         'smollm2_shortcut': probes['smollm2_following']}
  got = {c.name: c for c in verdicts.probe_claims(['smollm2_following', 'smollm2_shortcut'],
                                                  rev, [], seed=0)}
  assert got[f'{pre}: probe separates'].verdict == claims.OPPOSITE
  # no pair, no claims
  assert verdicts.probe_claims(['smollm2', 'smollm2_following'], probes, beh, seed=0) == []


@pytest.mark.parametrize('names', [('decision',), ('decision', 'input')])
def test_table_rows_have_as_many_cells_as_the_header(names):
  """One probe (mediator probe_names = follow_input) or two: header, rule and rows agree."""
  from ceu_jax.audits import layer_probe
  rng = np.random.default_rng(0)
  items = dict(ids=[f'i{k}' for k in range(6)], layers=2, delta_L=[0.5] * 6,
               degenerate=[False] * 6,
               ceu={q: rng.uniform(size=(2, 6)).tolist() for q in names})
  text = layer_probe.table({'r': layer_probe.summarize(items)}, names, unit='checklists')
  lines = text.splitlines()
  assert len(lines) == 3 and len({ln.count('|') for ln in lines}) == 1, lines
  assert lines[0].count('|') == 7 + 2 * (len(names) - 1)
