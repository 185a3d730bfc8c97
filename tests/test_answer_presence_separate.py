"""World A with answer string and evidence apart (`world='atr_separate'`, separate.py):
token-level edits and rewriters, oracle readers with exact expected scores, the job wiring."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from ceu_jax import claims
from ceu_jax.audits.answer_presence import atr_world as aw
from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.audits.answer_presence import separate as se
from ceu_jax.audits.answer_presence import worlds as wo
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.readers.oracles import CopyOracle, Oracle, context_of, question_of

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: 13 -> 9 CPU-s

SMOKE = ATRConfig(num_passages=4, context_len=64, eta=0.2, delta=0.3, rho=0.3, overlap_rate=0.25,
                  filler_rate=0.5, paraphrase_rate=0.1, n_ids=16, n_keys=16, n_values=16)
LONG = ATRConfig(num_passages=4, context_len=96, value_len=3, eta=0.3, delta=0.5,
                 paraphrase_rate=0.5, overlap_rate=0.25, n_ids=8, n_keys=8, n_values=8)
KW = dict(p_drop=0.2, p_surface=1.0, seed=3)


@dataclasses.dataclass
class BindingOracle(Oracle):
  """Reads the binding: answers the VALUE of the first line stating (query ID, query KEY)
  in either format ("ID #q KEY k VALUE v ." / "KEY k OF #q IS v ."), else abstains."""
  cfg: ATRConfig = SMOKE
  miss_loglik: float = -30.0

  def answer(self, prompt, id_):
    v, q, x = self.cfg.vocab, question_of(prompt), context_of(prompt)
    m = aw.ATRMedium(self.cfg)
    for line in m.lines(x):
      if line[:5] == (v.tok('ID'), q[2], v.tok('KEY'), q[4], v.tok('VALUE')):
        return tuple(line[5:5 + self.cfg.value_len])
      if line[:5] == (v.tok('KEY'), q[4], v.tok('OF'), q[2], v.tok('IS')):
        return tuple(line[5:5 + self.cfg.value_len])
    return ()


def _copy(recs):
  return CopyOracle(candidates={r.id: [tuple(g) for g in r.golds] for r in recs})


@pytest.fixture(scope='module', params=[SMOKE, LONG], ids=['smoke', 'value_len3'])
def world(request):
  cfg = request.param
  m = aw.ATRMedium(cfg)
  raw = aw.raw_records(cfg, 800, seed=5)
  return cfg, m, raw, se.compiled(m, raw, **KW)


def _diff(a, b):
  return [p for p in range(len(a)) if a[p] != b[p]]


# ---------------------------------------------------------------- rewriters
def test_surface_rewriters_differ_in_one_line_only(world):
  cfg, m, raw, by = world
  v = cfg.vocab
  in_lines = {s + o for s in m.line_starts() for o in range(cfg.line_len)}
  n_surf = 0
  for r1, base, ev, val in zip(by['B1'], by['B2'], by['Bev'], by['Bval']):
    assert len(ev.context) == len(val.context) == len(base.context) == cfg.context_len
    lacks = not m.evidence_lines(base.context, base)
    if not lacks:
      assert ev.context == val.context == base.context
      continue
    n_surf += 1
    q, gold = tuple(r1.question), tuple(r1.golds[0])
    d_ev, d_val = _diff(base.context, ev.context), _diff(base.context, val.context)
    assert set(d_ev) | set(d_val) <= in_lines
    changed = {k for k, (a, b, c) in enumerate(zip(*(m.lines(x) for x in (
        base.context, ev.context, val.context)))) if a != b or a != c}
    assert len(changed) == 1  # one line slot, the same for both rewriters
    (k,) = changed
    old, new_ev, new_val = (m.lines(x)[k] for x in (base.context, ev.context, val.context))
    assert m.is_free(old)  # a free filler slot
    assert new_ev == (v.tok('ID'), q[2], v.tok('KEY'), q[4], v.tok('VALUE'), *gold, v.tok('.'))
    assert new_val == old[:1] + gold + old[1 + len(gold):]  # "NOTE v* w .. ."
    start = m.line_starts()[k]
    assert d_val == list(range(start + 1, start + 1 + len(gold)))  # only the gold tokens
    # the companion tells them apart, present() does not
    assert m.present(ev.context, ev.golds) and m.present(val.context, val.golds)
    assert m.evidence_lines(ev.context, ev) == [k] and not m.evidence_lines(val.context, val)
    assert q[2] not in new_val and q[4] not in new_val
  assert n_surf > 150
  off = se.compiled(m, raw, p_drop=0.2, p_surface=0.0, seed=3)
  assert all(a.context == b.context == c.context for a, b, c in zip(off['B2'], off['Bev'],
                                                                    off['Bval']))
  shuffled = list(raw)
  random.Random(0).shuffle(shuffled)
  again = se.compiled(m, shuffled, **KW)
  for b in ('Bev', 'Bval'):
    assert {r.id: r.context for r in again[b]} == {r.id: r.context for r in by[b]}


# ---------------------------------------------------------------- edits
def test_unbind_placebo_and_remove_change_only_their_tokens(world):
  cfg, m, _, by = world
  v = cfg.vocab
  mask = v.tok('[MASK]')
  n = n_par = 0
  for r in by['B2']:
    x = r.context
    ev = m.evidence_lines(x, r)
    if not ev:
      continue
    n += 1
    q = tuple(r.question)
    pos = se.binding_positions(m, x, r)
    assert len(pos) == 2 * len(ev) and sorted(x[p] for p in pos) == sorted([q[2], q[4]] * len(ev))
    n_par += any(m.lines(x)[k][0] == v.tok('KEY') for k in ev)
    out = se.unbind(m, x, r)
    assert len(out) == len(x) and _diff(x, out) == pos and all(out[p] == mask for p in pos)
    assert not m.evidence_lines(out, r)
    assert m.occurrences(out, r.golds) == m.occurrences(x, r.golds)  # every VALUE kept
    pl = se.unbind_placebo(m, x, r)
    d = _diff(x, pl)
    ev_pos = {m.line_starts()[k] + o for k in ev for o in range(cfg.line_len)}
    gold_pos = {p for a, b in m.occurrences(x, r.golds) for p in range(a, b)}
    # a placebo token equal to [MASK] already would not show as a change: none is
    assert len(d) == len(pos) and not set(d) & (ev_pos | gold_pos)
    assert m.evidence_lines(pl, r) == ev
    rem = m.remove(x, r.golds, m.sentinels['[MASK]'])
    assert set(_diff(x, rem)) == gold_pos and not m.present(rem, r.golds)
    fill = v.tok('[FILL]')
    for s in se.SPAN_SENTINELS:
      out = se.remove_span(m, x, r.golds, m.sentinels[s])
      assert set(_diff(x, out)) == gold_pos
      for a, b in m.occurrences(x, r.golds):
        assert out[a:b] == m.sentinels[s] + (fill,) * (b - a - 1)  # padded inside the span
  assert n > 300 and n_par > 5
  r = next(r for r in by['B2'] if m.present(r.context, r.golds))
  if cfg.value_len < 3:  # the 3-token phrase does not fit a shorter span: refused, never widened
    with pytest.raises(ValueError, match='does not fit'):
      se.remove_span(m, r.context, r.golds, m.sentinels['natural'])
  else:
    out = se.remove_span(m, r.context, r.golds, m.sentinels['natural'])
    assert set(_diff(r.context, out)) == {p for a, b in m.occurrences(r.context, r.golds)
                                          for p in range(a, b)}


# ---------------------------------------------------------------- oracle readers
def _run(reader, m, by):
  scorer = ap.Scorer(reader, m)
  return se.separation(scorer, {b: ap.validate(by[b], medium=m).kept for b in by})


def _exact(a, value):
  return (a['value'], a['ci_low'], a['ci_high']) == (value, value, value)


def test_answer_string_reader_shows_the_answer_string_pattern(world):
  cfg, m, raw, by = world
  out = _run(_copy(raw), m, by)
  s = se.reader_summary('copy', [dict(separation=out)], seed=42)
  coincidental = sum(m.present(by['B2'][i].context, by['B2'][i].golds) for i in range(len(raw))
                     if by['Bev'][i].context != by['B2'][i].context)
  assert s['n_surfaced'] > 150 and s['not_surfaced'] == 0
  assert _exact(s['surfaced']['Bev'], 100.0) and _exact(s['surfaced']['Bval'], 100.0)
  assert _exact(s['surfaced']['Bev − Bval'], 0.0)
  assert s['surfaced']['Bval − B2']['value'] == pytest.approx(
      100.0 * (1 - coincidental / s['n_surfaced']))
  e = s['edits']
  assert s['n_edits'] > 300
  for k in ('orig', 'unbind', 'unbind_placebo'):
    assert _exact(e[k], 100.0)
  assert _exact(e['remove'], 0.0) and _exact(e['Δunbind'], 0.0) and _exact(e['Δremove'], -100.0)
  verdicts = {c['name']: c['verdict'] for c in s['claims']}
  assert verdicts == {'copy: gain = answer string': claims.SUPPORTED,
                      'copy: gain = better evidence': claims.NOT_SUPPORTED}


def test_binding_reader_shows_the_evidence_pattern(world):
  cfg, m, raw, by = world
  out = _run(BindingOracle(cfg=cfg), m, by)
  s = se.reader_summary('binding', [dict(separation=out)], seed=42)
  assert all(x['B2'] == 0.0 and x['Bev'] == 100.0 and x['Bval'] == 0.0 for x in out['surfaced'])
  assert _exact(s['surfaced']['Bev − Bval'], 100.0) and _exact(s['surfaced']['Bval − B2'], 0.0)
  e = s['edits']
  assert _exact(e['orig'], 100.0) and _exact(e['unbind_placebo'], 100.0)
  assert _exact(e['Δunbind'], -100.0) and _exact(e['Δremove'], -100.0)
  verdicts = {c['name']: c['verdict'] for c in s['claims']}
  assert verdicts == {'binding: gain = answer string': claims.NOT_SUPPORTED,
                      'binding: gain = better evidence': claims.SUPPORTED}


def _claims_of(frac_val, frac_unbind, n=400, seed=0):
  """Synthetic reader: the evidence line always answers (B2 never), the bare value with
  probability frac_val; unbinding loses the answer with probability frac_unbind."""
  rng = np.random.default_rng(seed)
  sur = [dict(B2=0.0, Bev=100.0, Bval=100.0 * (u < frac_val)) for u in rng.random(n)]
  edits = [dict(orig=100.0, unbind=100.0 * (u >= frac_unbind), unbind_placebo=100.0, remove=0.0)
           for u in rng.random(n)]
  return {c.name.split(': ')[1]: c for c in se.hypothesis_claims('r', sur, edits)}


@pytest.mark.parametrize('frac_val,frac_unbind,answer,evidence', [
    (0.97, 0.03, claims.SUPPORTED, claims.NOT_SUPPORTED),   # inside the band, though CI ≠ 0
    (1.00, 0.00, claims.SUPPORTED, claims.NOT_SUPPORTED),
    (0.05, 0.95, claims.NOT_SUPPORTED, claims.SUPPORTED),
    (0.60, 0.40, claims.NOT_SUPPORTED, claims.SUPPORTED),  # 40% of the gain needs the binding
    (0.75, 0.25, claims.NOT_SUPPORTED, claims.NOT_SUPPORTED),  # CIs straddle the band: neither
    (0.97, 0.95, claims.NOT_SUPPORTED, claims.NOT_SUPPORTED),  # the two contrasts disagree
])
def test_band_rule_decides_at_most_one_hypothesis(frac_val, frac_unbind, answer, evidence):
  c = _claims_of(frac_val, frac_unbind)
  assert (c['gain = answer string'].verdict, c['gain = better evidence'].verdict) == (
      answer, evidence)
  assert 'inside the band' in c['gain = answer string'].numbers


def test_band_rule_without_items_is_untested():
  a, e = se.hypothesis_claims('r', [], [])
  assert a.verdict == e.verdict == claims.UNTESTED


# ---------------------------------------------------------------- the job (:tiny, oracle readers)
def test_job_tiny_separate_with_oracle_readers(tmp_path, monkeypatch):
  """`:tiny,world=atr_separate` end to end in seconds: the two families' readers replaced by
  the two oracles (attention → copies the gold string, ssm → reads the binding)."""
  import csv
  import os
  from ceu_jax.audits.answer_presence import job
  from configs import answer_presence as cfg
  c = cfg.get_config('tiny,world=atr_separate,n_records=200')
  c.atr.families = ('attention', 'ssm')
  c.items_per_chunk = 100
  c.plots = False
  built = []

  def build(self, family):
    built.append(family)
    return _copy(self.raw) if family == 'attention' else BindingOracle(cfg=self.data_cfg)
  monkeypatch.setattr(wo.SeparateWorld, '_build_reader', build)
  s = job.run_answer_presence(c, str(tmp_path), log=lambda m: None)
  assert sorted(built) == ['attention', 'ssm'] and s['world'] == 'atr_separate'
  assert set(s['baselines']) == set(se.BASELINES)
  b = s['baselines']
  # present() cannot tell Bev from Bval; the evidence-line companion can
  assert b['Bev']['buckets'] == b['Bval']['buckets']
  assert b['Bval']['buckets_companion']['0→1'] == 0 < b['Bev']['buckets_companion']['0→1']
  verdicts = {x['name']: x['verdict'] for x in s['claims']}
  assert verdicts['attention: gain = answer string'] == claims.SUPPORTED
  assert verdicts['attention: gain = better evidence'] == claims.NOT_SUPPORTED
  assert verdicts['ssm: gain = answer string'] == claims.NOT_SUPPORTED
  assert verdicts['ssm: gain = better evidence'] == claims.SUPPORTED
  sep = s['readers']['ssm']['separation']
  # surfaced = the compiles without the evidence line: raw lacked it (0→0) or B2 dropped it (1→0)
  c2 = b['B2']['buckets_companion']
  assert c2['0→1'] == 0 and sep['n_surfaced'] == c2['0→0'] + c2['1→0'] > 20
  assert b['Bev']['buckets_companion']['0→1'] == c2['0→0']
  assert _exact(sep['surfaced']['Bev − Bval'], 100.0) and _exact(sep['edits']['Δunbind'], -100.0)
  for r in s['readers'].values():
    assert all(cell['identity_max_abs'] == 0.0 for cell in r['cells'].values())
  report = open(os.path.join(tmp_path, 'report.md')).read()
  for head in ('Answer string vs evidence', 'Removing the binding vs removing the VALUE',
               'gold span only', 'ssm: gain = better evidence'):
    assert head in report
  scores = list(csv.DictReader(open(os.path.join(tmp_path, 'scores.csv'))))
  assert {x['baseline'] for x in scores} == set(se.BASELINES)
