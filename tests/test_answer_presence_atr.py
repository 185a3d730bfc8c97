"""World A of the answer-presence audit (ATR tokens): oracle readers, properties, rewriters, bad input."""
from __future__ import annotations

import collections
import dataclasses
import random

import numpy as np
import pytest

from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.audits.answer_presence import atr_world as aw
from ceu_jax.audits.answer_presence import sentinels as sp
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.readers.oracles import ClosedBookOracle, CopyOracle, context_of

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: 13 -> 9 CPU-s

SMOKE = ATRConfig(num_passages=4, context_len=64, eta=0.2, delta=0.3, rho=0.3, overlap_rate=0.25,
                  filler_rate=0.5, paraphrase_rate=0.1, n_ids=16, n_keys=16, n_values=16)
LONG = ATRConfig(num_passages=4, context_len=96, value_len=3, eta=0.3, delta=0.5,
                 paraphrase_rate=0.5, overlap_rate=0.25, n_ids=8, n_keys=8, n_values=8)
KW = dict(p_drop=0.2, p_surface=0.5, seed=3)


@pytest.fixture(scope='module')
def world():
  m = aw.ATRMedium(SMOKE)
  raw = aw.raw_records(SMOKE, 1200, seed=5)
  return m, raw, {b: aw.compiled_records(m, raw, b, **KW) for b in ('B2', 'B3', 'B4')}


def _copy(recs, **kw):
  return CopyOracle(candidates={r.id: [tuple(g) for g in r.golds] for r in recs}, **kw)


@dataclasses.dataclass
class _MaskOracle(CopyOracle):
  """Answers the gold whenever the context holds the [MASK] token, else copies."""
  mask: int = -1

  def answer(self, prompt, id_):
    if self.mask in context_of(prompt):
      return tuple(self.candidates[id_][0])
    return super().answer(prompt, id_)


# ---------------------------------------------------------------- acceptance 1 (tokens)
def test_gold_when_present_reader_known_answers(world):
  m, _, comp = world
  recs = ap.validate(comp['B2'], medium=m).kept
  rows = ap.run_audit(_copy(recs), recs, medium=m, loglik=True)
  eff = {(x['edit'], x['bucket']): x for x in ap.effects(rows)}
  rem, pla = eff[('remove', '1→1')]['delta'], eff[('placebo', '1→1')]['delta']
  assert (rem.value, rem.ci_low, rem.ci_high) == (-100, -100, -100)
  assert (pla.value, pla.ci_low, pla.ci_high) == (0, 0, 0)
  c = ap.delta_causal(rows)
  assert c.n > 500 and (c.value, c.ci_low, c.ci_high) == (-100, -100, -100)
  for e in ('insert_prepend', 'insert_mid'):
    assert eff[(e, '0→0')]['delta'].value == 100.0 and eff[(e, '0→0')]['n'] > 30
  ll = ap.delta_causal(rows, key='dll')  # oracle log-lik: 0 for its own answer, -30 otherwise
  assert (ll.value, ll.ci_low, ll.ci_high) == (-30, -30, -30)
  assert all(x['delta'] == 0 and x['dll'] == 0 for x in rows if x['edit'] == 'identity')


def test_context_blind_reader_has_zero_effects(world):
  m, _, comp = world
  recs = ap.validate(comp['B3'], medium=m).kept
  table = {tuple(r.question): tuple(r.golds[0]) for r in recs[::3]}
  rows = ap.run_audit(ClosedBookOracle(table=table), recs, medium=m)
  assert rows and all(x['delta'] == 0.0 for x in rows)
  assert {x['f1_orig'] for x in rows} == {0.0, 100.0}


def test_mask_reader_fails_c2a_and_stripping_reader_passes(world):
  m, _, comp = world
  recs = ap.validate(comp['B2'], medium=m).kept[:300]
  mask = SMOKE.vocab.tok('[MASK]')
  f1 = sp.panel_f1(_MaskOracle(candidates={r.id: list(r.golds) for r in recs}, mask=mask), recs,
                   medium=m)
  _, v = sp.panel(f1)
  assert not v.c2a_pass and v.n_pass == 0 and len(f1['ids']) > 100
  drop = {t for s in m.sentinels.values() for t in s}

  def strip(prompt):
    return tuple(t for t in context_of(prompt) if t not in drop)
  _, v = sp.panel(sp.panel_f1(_copy(recs, context=strip), recs, medium=m))
  assert v.c2a_pass and v.n_pass == 4 and v.E == -100.0


# ---------------------------------------------------------------- acceptance 2 (tokens)
@pytest.mark.parametrize('cfg', [SMOKE, LONG], ids=['smoke', 'value_len3'])
def test_edits_preserve_everything_outside_their_regions(cfg):
  m = aw.ATRMedium(cfg)
  pm = m.for_panel()
  raw = aw.raw_records(cfg, 1000, seed=11)
  n_present = n_insert = 0
  fill = cfg.vocab.tok('[FILL]')
  in_lines = {q for s in m.line_starts() for q in range(s, s + cfg.line_len)}
  markers = [p for p in range(cfg.context_len) if p not in in_lines]
  for r in aw.compiled_records(m, raw, 'B2', **KW):
    x = r.context
    occ = m.occurrences(x, r.golds)
    if occ:
      n_present += 1
      out = m.remove(x, r.golds, m.sentinels['[MASK]'])
      assert len(out) == len(x) and not m.present(out, r.golds)
      inside = {p for a, b in occ for p in range(a, b)}
      assert all(out[p] == x[p] for p in range(len(x)) if p not in inside)
      # panel: every arm edits the same positions (padded to 3 tokens), lengths match
      arms = {s: pm.remove(x, r.golds, tok) for s, tok in pm.sentinels.items()}
      changed = {s: {p for p in range(len(x)) if a[p] != x[p]} for s, a in arms.items()}
      regions = pm._regions(x, r.golds)  # noqa: SLF001
      region_pos = {p for a, b in regions for p in range(a, b)}
      assert all(b - a == max(3, len(r.golds[0])) for a, b in regions)
      assert all(c <= region_pos for c in changed.values()) and inside <= region_pos
      assert all(not pm.present(a, r.golds) for a in arms.values())
      assert tuple(arms['natural'][regions[0][0]:regions[0][0] + 3]) == pm.sentinels['natural']
      assert arms['[MASK]'][regions[0][0] + 1:regions[0][0] + 3] == (fill, fill)
    else:
      n_insert += 1
      for out in (m.insert_prepend(x, r.golds[0]), m.insert_mid(x, r.golds[0])[0]):
        assert len(out) == len(x) and m.present(out, r.golds)
        before, after = collections.Counter(m.lines(x)), collections.Counter(m.lines(out))
        gone, new = before - after, after - before
        assert sum(gone.values()) == 1 and sum(new.values()) == 1
        (old,), (note,) = list(gone), list(new)
        assert m.is_free(old) and note[1:1 + len(r.golds[0])] == r.golds[0]
        assert all(out[p] == x[p] for p in markers)
      assert m.lines(m.insert_prepend(x, r.golds[0]))[0][:1 + len(r.golds[0])] == (
          cfg.vocab.tok('NOTE'),) + tuple(r.golds[0])
  assert n_present > 500 and n_insert > 30


def test_placebo_windows_disjoint_same_width_and_order_independent(world):
  m, _, comp = world
  recs = [r for r in comp['B2'] if m.present(r.context, r.golds)]
  assert len(recs) > 800
  for med in (m, m.for_panel()):
    first = {r.id: med.placebo_spans(r.context, r.golds, r.id) for r in recs}
    shuffled = list(recs)
    random.Random(1).shuffle(shuffled)
    assert {r.id: med.placebo_spans(r.context, r.golds, r.id) for r in shuffled} == first
    starts = med.line_starts()
    for r in recs:
      regions, spans = med._regions(r.context, r.golds), first[r.id]  # noqa: SLF001
      assert len(spans) == len(regions)
      assert sorted(b - a for a, b in spans) == sorted(b - a for a, b in regions)
      for a, b in spans:
        assert not any(a < y and x < b for x, y in regions)
        assert any(s <= a and b <= s + SMOKE.line_len for s in starts)  # inside one line
      assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))
      out, k = med.placebo(r.context, r.golds, r.id, med.sentinels['[MASK]'])
      assert k == len(spans) and med.present(out, r.golds)


def test_buckets_partition_and_identity_exact(world):
  m, raw, comp = world
  for b, recs in comp.items():
    counts = ap.bucket_counts(recs, medium=m)
    assert sum(counts.values()) == len(recs) and all(counts[k] > 0 for k in ap.BUCKETS)
    ev = ap.bucket_counts(recs, medium=m, normalized=True)
    assert sum(ev.values()) == len(recs)
  recs = comp['B4'][:400]
  rows = ap.run_audit(_copy(recs), recs, medium=m)
  ident = [x['delta'] for x in rows if x['edit'] == 'identity']
  assert len(ident) == len(recs) and not any(ident)


# ---------------------------------------------------------------- rewriters
def test_rewriters_keep_their_lines_and_nothing_else(world):
  m, raw, _ = world
  in_lines = {s + o for s in m.line_starts() for o in range(SMOKE.line_len)}
  marks = [p for p in range(SMOKE.context_len) if p not in in_lines]
  for name, need in aw.REWRITERS.items():
    for r, c in zip(raw, aw.compiled_records(m, raw, name, p_drop=0.0, p_surface=0.0, seed=1)):
      q = {'id': r.question[2], 'key': r.question[4]}
      for line_raw, line_c in zip(m.lines(r.raw_context), m.lines(c.context)):
        if all(q[f] in line_raw for f in need):
          assert line_c == line_raw
        else:
          assert m.is_free(line_c)
      assert all(c.context[p] == r.raw_context[p] for p in marks)
      # the evidence line (when in raw) is kept by every rewriter without errors
      assert bool(m.evidence_lines(r.raw_context, r)) == bool(m.evidence_lines(c.context, c))


def test_rewriter_error_knobs():
  m = aw.ATRMedium(SMOKE)
  raw = aw.raw_records(SMOKE, 1000, seed=2)
  has = [bool(m.evidence_lines(r.raw_context, r)) for r in raw]
  dropped = aw.compiled_records(m, raw, 'B2', p_drop=1.0, p_surface=0.0, seed=1)
  assert not any(m.evidence_lines(c.context, c) for c in dropped)
  surfaced = aw.compiled_records(m, raw, 'B2', p_drop=0.0, p_surface=1.0, seed=1)
  assert all(bool(m.evidence_lines(c.context, c)) for c in surfaced)  # B2 always leaves a blank
  assert 0.7 < np.mean(has) < 0.9  # η = 0.2
  half = aw.compiled_records(m, raw, 'B3', p_drop=0.5, p_surface=0.0, seed=1)
  kept = np.mean([bool(m.evidence_lines(c.context, c)) for c, h in zip(half, has) if h])
  assert 0.4 < kept < 0.6
  shuffled = list(raw)
  random.Random(0).shuffle(shuffled)
  again = {c.id: c.context for c in aw.compiled_records(m, shuffled, 'B3', p_drop=0.5,
                                                         p_surface=0.5, seed=1)}
  assert again == {c.id: c.context for c in aw.compiled_records(m, raw, 'B3', p_drop=0.5,
                                                                p_surface=0.5, seed=1)}


def test_b4_is_b2s_compile_verified_by_b(world):
  """SPEC §8.1: B4 = A's compile (B2) then a verification pass by B (B3's KEY filter, with
  B's drop error): every line of B4 is B2's own line or a filler, so B4 never holds the
  evidence (or the gold) where B2 lacks it; B2's filler lines pass through verbatim; the
  lines B2 kept that hold the KEY stay, the evidence line among them dropped at p_drop."""
  m, raw, comp = world
  b4_more, dropped, had = 0, 0, 0
  for r, b2, b4 in zip(raw, comp['B2'], comp['B4']):
    key = r.question[4]
    for l2, l4 in zip(m.lines(b2.context), m.lines(b4.context)):
      assert l4 == l2 or (m.is_free(l4) and not m.is_free(l2)), (r.id, l2, l4)
      if m.is_free(l2):
        assert l4 == l2
    ev2, ev4 = m.evidence_lines(b2.context, b2), m.evidence_lines(b4.context, b4)
    assert not ev4 or ev2
    b4_more += bool(m.present(b4.context, r.golds)) and not m.present(b2.context, r.golds)
    if ev2 and key in m.lines(b2.context)[ev2[0]]:
      had += 1
      dropped += not ev4
  assert b4_more == 0
  assert had > 500 and 0.12 < dropped / had < 0.28      # p_drop = 0.2 (KW)
  again = aw.compiled_records(m, raw[:50], 'B4', **KW)
  assert [c.context for c in again] == [c.context for c in comp['B4'][:50]]


# ---------------------------------------------------------------- acceptance 6 (tokens)
def test_bad_token_records_are_counted(world):
  m, raw, comp = world
  r = comp['B2'][0]
  v = SMOKE.vocab
  no_room = m.with_lines(r.context, [(v.tok('ID'), v.id_base, v.tok('KEY'), v.key_base,
                                      v.tok('VALUE'), v.value_base + 1, v.tok('.'))] * 8)
  gold = (v.value_base + 2,)
  bad = [dataclasses.replace(r, id='empty_gold', golds=((),)),
         dataclasses.replace(r, id='no_gold', golds=()),
         dataclasses.replace(r, id='pad', context=(0,) * 64),
         dataclasses.replace(r, id='no_room', context=no_room, golds=(gold,))]
  out = ap.validate(comp['B2'][:5] + bad, medium=m)
  assert len(out.kept) == 5
  assert out.skipped == collections.Counter(gold_too_short=2, empty_context=1,
                                            cannot_hold_insert=1)
  assert out.skipped_ids['cannot_hold_insert'] == ['no_room']
  with pytest.raises(ValueError, match='value_for_key'):
    aw.ATRMedium(dataclasses.replace(SMOKE, variant='key_for_value', rho=0.0))
  with pytest.raises(ValueError, match='for_panel'):
    m.remove(r.context if m.present(r.context, r.golds) else m.insert_prepend(r.context, r.golds[0]),
             r.golds, m.sentinels['natural'])
