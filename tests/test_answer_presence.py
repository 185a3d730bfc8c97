"""Answer-presence audit and sentinel panel (SPEC §8.1): oracle readers, properties, fixture, bad input."""
from __future__ import annotations

import collections
import random

import numpy as np
import pytest

from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.audits.answer_presence import sentinels as sp
from ceu_jax.readers.oracles import ClosedBookOracle, CopyOracle, context_of, question_of

_LETTERS = 'bcdefghijlnoprtuvwxyz'  # no letter of '[mask]': a sentinel can never spell a gold


def _word(rng, lo=3, hi=7):
  return ''.join(rng.choice(_LETTERS) for _ in range(rng.randint(lo, hi)))


def _sentences(rng, words):
  out, k = [], 0
  while k < len(words):
    n = rng.randint(3, 8)
    out.append(' '.join(words[k:k + n]) + '.')
    k += n
  return ' '.join(out)


def make_records(n, seed=0, p_raw=0.7, p_keep=0.8):
  """Generated records: golds of 1-3 words planted 1-3 times (random case) or absent."""
  rng = random.Random(seed)
  recs = []
  for i in range(n):
    gold = ' '.join(_word(rng) for _ in range(rng.randint(1, 3)))
    filler = [_word(rng) for _ in range(rng.randint(12, 40))]
    raw_has = rng.random() < p_raw
    comp_has = rng.random() < (p_keep if raw_has else 0.2)

    def plant(words, has):
      words = list(words)
      if has:
        for _ in range(rng.randint(1, 3)):
          g = gold.upper() if rng.random() < 0.3 else gold
          words.insert(rng.randint(0, len(words)), g)
      return _sentences(rng, words)
    raw, comp = plant(filler, raw_has), plant(filler[::-1], comp_has)
    recs.append(ap.Record(id=f'q{i}', question=f'what is item {i}', golds=(gold,),
                          context=comp, raw_context=raw))
  return recs


def _copy_reader(recs, **kw):
  return CopyOracle(candidates={r.id: list(r.golds) for r in recs}, **kw)


class _MaskOracle(CopyOracle):
  """Answers the gold whenever its context holds '[MASK]', else copies."""

  def answer(self, prompt, id_):
    if '[MASK]' in context_of(prompt):
      return self.candidates[id_][0]
    return super().answer(prompt, id_)


def _strip_sentinels(prompt):
  ctx = context_of(prompt)
  for s in sp.SENTINELS.values():
    ctx = ctx.replace(s, ' ')
  return ctx


# ---------------------------------------------------------------- acceptance 1

def test_gold_when_present_reader_known_answers():
  recs = ap.validate(make_records(200, seed=1)).kept
  rows = ap.run_audit(_copy_reader(recs), recs)
  eff = {(x['edit'], x['bucket']): x for x in ap.effects(rows)}
  rem, pla = eff[('remove', '1→1')], eff[('placebo', '1→1')]
  assert rem['delta'].value == -100.0 and (rem['delta'].ci_low, rem['delta'].ci_high) == (-100, -100)
  assert pla['delta'].value == 0.0 and (pla['delta'].ci_low, pla['delta'].ci_high) == (0, 0)
  causal = ap.delta_causal(rows)
  assert causal.n > 10 and (causal.value, causal.ci_low, causal.ci_high) == (-100, -100, -100)
  ins = eff[('insert_prepend', '0→0')]
  assert ins['delta'].value == 100.0 and ins['n'] > 10
  assert eff[('insert_mid', '0→0')]['delta'].value == 100.0
  assert all(x['delta'] == 0.0 for x in rows if x['edit'] == 'identity')
  table = ap.effects_table(ap.effects(rows), causal)
  assert '| remove | 1→1 |' in table and 'Δcausal' in table


def test_context_blind_reader_has_zero_effects():
  recs = ap.validate(make_records(150, seed=2)).kept
  table = {question_of(ap.default_prompt('x', r.question)): r.golds[0] for r in recs[::2]}
  rows = ap.run_audit(ClosedBookOracle(table=table), recs)
  assert rows and all(x['delta'] == 0.0 for x in rows)
  assert {x['f1_orig'] for x in rows} == {0.0, 100.0}  # it does answer (half the table)
  assert ap.delta_causal(rows).value == 0.0


def test_mask_reader_fails_c2a_and_stripping_reader_passes():
  recs = ap.validate(make_records(120, seed=3)).kept
  _, v = sp.panel(sp.panel_f1(_MaskOracle(candidates={r.id: list(r.golds) for r in recs}), recs))
  assert not v.c2a_pass and v.n_pass == 0
  rows, v = sp.panel(sp.panel_f1(_copy_reader(recs, context=_strip_sentinels), recs))
  assert v.c2a_pass and v.n_pass == 4
  assert v.E == -100.0
  assert '[REMOVED]' in sp.panel_table(rows, v)


# ---------------------------------------------------------------- acceptance 2

@pytest.fixture(scope='module')
def many():
  return ap.validate(make_records(1200, seed=7)).kept


def test_remove_leaves_no_gold_and_changes_nothing_else(many):
  checked = 0
  for r in many:
    out = ap.remove(r.context, r.golds)
    assert not ap.present(out, r.golds)
    spans = ap.occurrences(r.context, r.golds)
    golds = {g.lower() for g in r.golds}
    assert all(r.context[a:b].lower() in golds for a, b in spans)
    edges = [0] + [x for s in spans for x in s] + [len(r.context)]
    pieces = [r.context[edges[k]:edges[k + 1]] for k in range(0, len(edges), 2)]
    assert out.split('[MASK]') == pieces
    checked += bool(spans)
  assert checked > 500


def test_placebo_spans_disjoint_same_word_count_order_independent(many):
  first = {r.id: ap.placebo_spans(r.context, r.golds, r.id) for r in many}
  shuffled = list(many)
  random.Random(0).shuffle(shuffled)
  assert {r.id: ap.placebo_spans(r.context, r.golds, r.id) for r in shuffled} == first
  n_full = 0
  for r in many:
    occ, sp_ = ap.occurrences(r.context, r.golds), first[r.id]
    assert len(sp_) <= len(occ)
    for a, b in sp_:
      assert not any(a < y and x < b for x, y in occ)  # never overlaps a gold
      assert r.context[a:b] == r.context[a:b].strip() and (a == 0 or r.context[a - 1].isspace())
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(sp_, sp_[1:]))  # disjoint
    if occ and len(sp_) == len(occ):
      n_full += 1
      assert (collections.Counter(len(r.context[a:b].split()) for a, b in sp_)
              == collections.Counter(len(r.context[a:b].split()) for a, b in occ))
  assert n_full > 500


def test_buckets_partition_and_identity_is_exact(many):
  counts = ap.bucket_counts(many)
  assert sum(counts.values()) == len(many) and all(counts[b] > 0 for b in ap.BUCKETS)
  rows = ap.run_audit(_copy_reader(many), many)
  ident = np.array([x['delta'] for x in rows if x['edit'] == 'identity'])
  assert len(ident) == len(many) and np.median(np.abs(ident)) == 0 and np.all(ident == 0)


def test_insert_mid_nearest_boundary():
  text, flag = ap.insert_mid('Aa bb. Cc dd. Ee ff gg hh ii jj.', 'XX')
  assert not flag and text == 'Aa bb. Cc dd. XX. Ee ff gg hh ii jj.'
  text, flag = ap.insert_mid('no boundary here', 'XX')
  assert flag and text == 'no boundary here XX.'
  assert ap.insert_prepend('c.', 'g') == 'Note: g. c.'


# ---------------------------------------------------------------- acceptance 3

def test_fixture_table2_verdicts():
  hotpot = sp.decide_from_means({'B2': 54.38, '[MASK]': 19.95, '[REMOVED]': 15.08,
                                 'natural': 17.25, 'word': 14.86, 'symbol': 17.34,
                                 'PLACEBO': 50.64})
  assert hotpot.c2a_pass and hotpot.n_pass == 4 and hotpot.c2b_pass
  wiki = sp.decide_from_means({'B2': 62.15, '[MASK]': 21.63, '[REMOVED]': 13.21,
                               'natural': 11.16, 'word': 9.71, 'symbol': 14.19,
                               'PLACEBO': 60.22})
  assert not wiki.c2a_pass and wiki.passed == {'[REMOVED]': False, 'natural': False,
                                                'word': False, 'symbol': True}
  assert wiki.c2b_pass
  assert wiki.summary() == 'C2a FAIL (1/4), C2b PASS'


# ---------------------------------------------------------------- acceptance 6

def test_bad_input_is_counted_never_silent():
  good = make_records(3, seed=4)
  limit = max(len(r.context) for r in good) + 40  # 'Note: ⟨g⟩. ' (≤ 31 chars) fits every good record
  bad = [ap.Record('short', 'q', ('x',), 'some context.'),
         ap.Record('nogold', 'q', (), 'some context.'),
         ap.Record('empty', 'q', ('gold',), '   '),
         ap.Record('long', 'q', ('gold',), 'y' * (limit - 5))]
  v = ap.validate(good + bad, max_context_chars=limit)
  assert len(v.kept) == 3
  assert v.skipped == collections.Counter(gold_too_short=2, empty_context=1,
                                          cannot_hold_insert=1)
  assert v.skipped_ids['cannot_hold_insert'] == ['long']


def test_audit_package_never_imports_architectures():
  import subprocess
  import sys
  code = ('import sys, ceu_jax.audits.answer_presence.audit, ceu_jax.audits.answer_presence.sentinels, ceu_jax.audits.answer_presence.job,'
          ' ceu_jax.audits.answer_presence.atr_world, ceu_jax.audits.answer_presence.factqa_world, ceu_jax.audits.answer_presence.worlds,'
          ' ceu_jax.audits.answer_presence.report, ceu_jax.audits.answer_presence.plots;'
          'print(sorted(m for m in sys.modules if m.split(".")[0] == "architectures"))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == '[]'


def test_remove_residual_is_flagged():
  r = ap.Record('m', 'q', ('mask',), 'a mask here. more words follow here.')
  rows = {x['edit']: x for x in ap.edit_rows([r])}
  assert rows['remove']['context'] == 'a [MASK] here. more words follow here.'
  assert rows['remove']['residual'] and not rows['placebo']['residual']
  ok = ap.Record('k', 'q', ('gold',), 'a gold here. more words follow here.')
  assert not {x['edit']: x for x in ap.edit_rows([ok])}['remove']['residual']


def test_panel_needs_records_and_placebo_without_room_is_absent():
  with pytest.raises(ValueError, match='at least one record'):
    sp.panel({c: np.zeros(0) for c in ('B1', 'B2', *sp.SENTINELS, 'PLACEBO')})
  r = ap.Record('x', 'q', ('gold',), 'gold gold')  # no non-answer word to mask
  edits = [x['edit'] for x in ap.edit_rows([r])]
  assert edits == ['remove']


def test_edits_find_the_gold_where_lowering_changes_the_length():
  """'İ' lowers to two code points: spans found in the lowered text must land on the
  original one (remove took 'ar' out of 'Paris' and left both golds before)."""
  text = 'İstanbul lies east of Paris. Paris is big.'
  assert ap.remove(text, ['Paris']) == 'İstanbul lies east of [MASK]. [MASK] is big.'
  for id_ in range(50):
    spans = ap.placebo_spans(text, ['Paris'], id_)
    assert spans and all(text[a:b] != 'Paris' and 'Paris' not in text[a:b] for a, b in spans)
  assert ap.present('ΑΣ Β', ['σ']) == bool(ap.occurrences('ΑΣ Β', ['σ']))


def test_the_causal_row_and_the_panel_count_use_every_chunk():
  """Seed 001's Table-1 row: Δremove and Δplacebo over Δcausal's own pairs (so their
  difference is Δcausal); records without room for a placebo are counted in every chunk,
  also one whose panel has no usable record."""
  import json
  from ceu_jax.audits.answer_presence import job, report, worlds
  good = [r for r in ap.validate(make_records(60, seed=3)).kept if ap.bucket(r) == '1→1']
  bad = [ap.Record(f'b{i}', f'what is b{i}', ('gold',), 'gold gold', 'raw gold text.')
         for i in range(len(good))]              # 1→1, no room for a placebo span

  class Memory(CopyOracle):                       # answers the 'b' records from memory
    def answer(self, prompt, id_):
      return 'gold' if str(id_).startswith('b') else super().answer(prompt, id_)
  reader = Memory(candidates={r.id: list(r.golds) for r in good + bad})
  parts = []
  for recs in (good, bad):
    by = {'B1': [ap.Record(r.id, r.question, r.golds, r.raw_context, r.raw_context)
                 for r in recs], 'B2': recs}
    parts.append(worlds.audit_chunk(reader, ap.TEXT, by, loglik=False,
                                    identity_baselines=('B2',)))
  s = json.loads(json.dumps(job._summarise_reader(parts, ('B1', 'B2'), 42)))
  assert s['panel']['no_placebo'] == len(bad) == s['cells']['B2']['placebo_missing']
  row = report.causal_table({'copy': s}).splitlines()[2]
  assert row.startswith(f'| copy | B2 | {len(good)} | -100.00 [-100.00, -100.00] | +0.00 ')
  assert '**-100.00 [-100.00, -100.00]**' in row


def test_containment_rates_carry_their_n():
  from ceu_jax.audits.answer_presence import worlds
  from ceu_jax.metrics.resampling import mean_ci
  world = worlds.FactQAWorld.__new__(worlds.FactQAWorld)
  agg = mean_ci(np.array([1, 0, 1, 1, 0, 1.]), seed=42).to_dict()
  text = '\n'.join(world.extra_report(dict(containment={'B2': agg},
                                            compile_words={'B2': 30.0})))
  assert '0.667 [0.333, 1.000] (n=6)' in text


def test_presence_substring_vs_normalized():
  g = ('The Beatles',)
  assert ap.present('songs by the beatles.', g) and ap.present_normalized('songs by the beatles.', g)
  assert not ap.present('songs by Beatles!', g) and ap.present_normalized('songs by Beatles!', g)
  assert ap.present('often', ('ten',)) and not ap.present_normalized('often', ('ten',))
  r = ap.Record('b', 'q', g, 'by Beatles.', raw_context='by the Beatles.')
  assert ap.bucket(r) == '1→0' and ap.bucket_normalized(r) == '1→1'


def test_b4_is_a_compile_verified_by_the_model():
  """SPEC §8.1: B4 = A's compile, then a verification pass by rewriter B (the model):
  the sentences B answers 'yes' for are kept, in order; none kept -> an empty compile."""
  from ceu_jax.audits.answer_presence import factqa_world as fw
  from ceu_jax.readers import base

  class Judge(base.Reader):   # 'yes' exactly for sentences that mention 'Paris'
    def __init__(self):
      self.asked = []

    def _generate(self, prompts, forced, budget, stops, ids):
      self.asked += [p[-1][1] for p in prompts]
      return [base.Generation(id=i, text=' yes' if 'Paris' in p[-1][1].split('Sentence:')[1]
                              else ' no', tokens=(), stop_reason=base.END)
              for p, i in zip(prompts, ids)]

    def _loglik(self, prompts, answers, ids):
      raise NotImplementedError
  items = [fw.Item(id='a', source='squad', question='where is the Louvre', answer='Paris',
                   raw='', gold_in_raw=True),
           fw.Item(id='b', source='squad', question='who', answer='x', raw='',
                   gold_in_raw=True)]
  judge = Judge()
  out = fw.verify_with_model(judge, items, ['The Louvre is in Paris. It is big. Paris is old.',
                                            'Nothing here. Nor here.'])
  assert out == ['The Louvre is in Paris. Paris is old.', '']
  assert len(judge.asked) == 5 and 'Question: Where is the Louvre?' in judge.asked[0]
