"""Strength from the trace's own steps (issue #32, SPEC §8.2): the arithmetic domain aligns
stated steps to the problem's operations by content, follows the values they state, and
leaves Strength unknown (counted by reason) where it cannot — never a guess. Every
expected number below is computed by hand in the comment beside it."""
import pytest

from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import chain_world as tw
from ceu_jax.audits.traces import summary as tsum
from ceu_jax.audits.traces import text as tt
from ceu_jax.readers import base

# 5, + 3, × 2, − 1: the gold trace 5 + 3 = 8, 8 * 2 = 16, 16 - 1 = 15
X = ar.ArithItem('t:0', 'Tom has 5 apples. ...', 5, (('+', 3), ('*', 2), ('-', 1)), delta=2)
DOMAIN = ar.ArithmeticDomain([ar.make_arith_item(99, 0)])


def _answer(steps):
  return ar.implied(X, steps).answer


def test_implied_answer_of_gold_skipped_merged_and_reordered_traces():
  assert _answer(X.steps) == 15 and _answer(X.steps[:1]) == 15  # 8 → ×2 → −1 = 15
  # skip: +3 and −1 stated, ×2 still to do: 7 × 2 = 14 (not 7 − 1 = 6)
  assert _answer(['5 + 3 = 8', '8 - 1 = 7']) == 14
  # merge: one step performs +3 and ×2 (its stated result is the value): 16 − 1 = 15
  assert _answer(['5 + 3 * 2 = 16']) == 15
  assert _answer(['5 + 3 * 2 = 11']) == 10  # the stated result counts, right or wrong
  assert _answer(['5 + 3 × 2 = 16', '16 - 1 = 15']) == 15
  # reorder: ×2 before +3: 5 * 2 = 10, 10 + 3 = 13, then −1 = 12
  assert _answer(['5 * 2 = 10', '10 + 3 = 13']) == 12
  # two lines swapped, values still chained (5 → 8 → 16): 16 − 1 = 15
  assert _answer(['8 * 2 = 16', '5 + 3 = 8']) == 15
  # a mis-stated operator aligns by its operand (the − 3 stands for + 3): 2 × 2 − 1 = 3
  assert _answer(['5 - 3 = 2']) == 3
  # an arithmetic error is the trace's own: 8 * 2 = 17 → 17 − 1 = 16
  assert _answer(['5 + 3 = 8', '8 * 2 = 17']) == 16
  imp = ar.implied(X, ['5 + 3 = 8', '8 - 1 = 7'])
  assert (imp.value, imp.remaining) == (7, (('*', 2),))


def test_unknown_is_counted_by_reason_never_guessed():
  cases = {
      ('Tom has 5 apples.',): 'step_not_an_equation',
      ('5 + 4 = 9',): 'unaligned_step',  # the problem has no operand 4
      ('5 + 3 = 8', '8 * 2 = 16', '16 - 1 = 15', '15 + 3 = 18'): 'unaligned_step',  # + 3 twice
      ('5 + 3 = 8', '9 * 2 = 18'): 'values_do_not_chain',  # 9 is no stated result
      ('6 + 3 = 9',): 'values_do_not_chain',  # does not start from the start quantity 5
  }
  for steps, reason in cases.items():
    imp = ar.implied(X, steps)
    assert (imp.answer, imp.reason) == (None, reason), steps
  # 5 − 2 = 3 aligns at cost 1 to + 2 or to × 2; taking the problem's operations in order
  # decides: it is the + 2 (then × 2: 6), not the × 2 (then + 2: 5)
  y = ar.ArithItem('t:1', 'q', 5, (('+', 2), ('*', 2)), 1)
  assert ar.implied(y, ['5 - 2 = 3']).answer == 6
  assert ar.implied(y, ['5 + 2 = 7']).answer == 14  # the exact operator
  # two operations with the same content: a step in problem order performs the earlier
  z = ar.ArithItem('t:2', 'q', 2, (('*', 2), ('+', 1), ('*', 2)), 1)
  assert ar.implied(z, ['2 * 2 = 4']).answer == 10  # (4 + 1) × 2, not 4 × 2 + 1 = 9
  # ambiguous: 5, + 3, − 3, + 3 with 5 * 3 = 7, 7 + 3 = 10. Least cost (1): the * 3 is one
  # of the three, the + 3 an exact + 3. Execution orders with one inversion: (− 3, + 3₁,
  # then + 3₂) → 10 + 3 = 13 and (+ 3₁, + 3₂, then − 3) → 10 − 3 = 7: they disagree
  w = ar.ArithItem('t:3', 'q', 5, (('+', 3), ('-', 3), ('+', 3)), 1)
  assert ar.implied(w, ['5 * 3 = 7', '7 + 3 = 10']) == ar.Implied(None, 'ambiguous')


def _trace(*steps, answer):
  return tt.parse_text(tt.render(1, steps) + f'Answer: {answer}')


def _edit(trace, k, tau):
  got = ts.intervene(DOMAIN, X, trace, k, tau)
  return got if isinstance(got, ts.Undefined) else got[0]


def test_edits_of_a_trace_that_skips_an_operation():
  tr = _trace('5 + 3 = 8', '8 - 1 = 7', answer='7')
  e = _edit(tr, 1, ts.FACT_REVERSAL)  # 5 + 3 = 10 (δ = 2): 10 × 2 − 1 = 19 vs 8 × 2 − 1 = 15
  assert (e.block, e.implied_before, e.implied_after, e.strength) == (
      ('5 + 3 = 10',), '15', '19', 1.0)
  e = _edit(tr, 2, ts.FACT_REVERSAL)  # 8 - 1 = 9, × 2 still to do: 18 vs 7 × 2 = 14
  assert (e.block, e.implied_before, e.implied_after, e.strength) == (
      ('8 - 1 = 9',), '14', '18', 1.0)
  e = _edit(tr, 2, ts.LOGIC_FLIP)  # 8 + 1 = 9 (operand 1: the − 1): 9 × 2 = 18
  assert (e.block, e.implied_after, e.strength) == (('8 + 1 = 9',), '18', 1.0)
  e = _edit(tr, 1, ts.CAUSAL_INVERSION)  # 8 - 1 = 7 then 5 + 3 = 8: 5 → 8 → 7, × 2 = 14
  assert (e.block, e.implied_before, e.implied_after, e.strength) == (
      ('8 - 1 = 7', '5 + 3 = 8'), '14', '14', 0.0)
  assert _edit(tr, 2, ts.CAUSAL_INVERSION) == ts.LAST_STEP


def test_edits_of_reordered_and_merged_traces():
  tr = _trace('5 * 2 = 10', '10 + 3 = 13', '13 - 1 = 12', answer='12')
  e = _edit(tr, 1, ts.FACT_REVERSAL)  # 5 * 2 = 12: + 3 − 1 → 14; before 10 + 3 − 1 = 12
  assert (e.implied_before, e.implied_after, e.strength) == ('12', '14', 1.0)
  e = _edit(tr, 1, ts.CAUSAL_INVERSION)  # 10 + 3 = 13, 5 * 2 = 10: still 5 → 10 → 13 → 12
  assert (e.implied_before, e.implied_after, e.strength) == ('12', '12', 0.0)
  tr = _trace('5 + 3 * 2 = 16', '16 - 1 = 15', answer='15')
  assert _edit(tr, 1, ts.LOGIC_FLIP) == ts.Undefined('merged_step')
  e = _edit(tr, 1, ts.FACT_REVERSAL)  # 5 + 3 * 2 = 18 → 18 − 1 = 17
  assert (e.block, e.implied_before, e.implied_after) == (('5 + 3 * 2 = 18',), '15', '17')
  e = _edit(tr, 2, ts.FACT_REVERSAL)  # 16 - 1 = 17
  assert (e.implied_before, e.implied_after) == ('15', '17')


def test_strength_unknown_where_the_prefix_cannot_be_aligned():
  tr = _trace('5 + 4 = 9', '9 * 2 = 18', answer='18')
  e = _edit(tr, 2, ts.FACT_REVERSAL)
  assert e.strength is None and e.unknown_reason == 'unaligned_step'
  tr = _trace('Tom has 5 apples', '5 + 3 = 8', answer='8')
  assert _edit(tr, 1, ts.FACT_REVERSAL) == ts.Undefined('step_not_an_equation')
  e = _edit(tr, 2, ts.FACT_REVERSAL)
  assert e.strength is None and e.unknown_reason == 'step_not_an_equation'


class Fixed(tw.TraceOracle):
  """A following oracle whose own output is a fixed raw trace."""

  def __init__(self, domain, items, raw):
    super().__init__(domain, items, lambda item: True)
    self.raw = raw

  def _generate(self, prompts, forced, budget, stops, ids):
    if forced is None:
      return [base.Generation(i, self.raw[len(DOMAIN.primer):], (), base.END) for i in ids]
    return super()._generate(prompts, forced, budget, stops, ids)


def test_unknown_strength_is_counted_in_the_summary():
  raw = 'Step 1: 5 + 3 = 8\nStep 2: 8 * 2 = 16\nStep 3: 16 + 4 = 20\nAnswer: 20'
  rows = ts.run_traces(Fixed(DOMAIN, [X], raw), DOMAIN, [X])
  s = tsum.summarize(rows)
  by = {(r['k'], r['tau']): r for r in rows if r['applied']}
  # steps 1–2 align (k = 1, 2 with one-step blocks); anything reaching step 3 does not
  assert by[(1, ts.FACT_REVERSAL)]['strength'] == 1.0
  assert by[(3, ts.FACT_REVERSAL)]['strength_unknown'] == 'unaligned_step'
  assert by[(2, ts.CAUSAL_INVERSION)]['strength_unknown'] == 'unaligned_step'
  n_unknown = sum(r['strength'] is None for r in by.values() if r['tau'] != ts.IDENTITY)
  assert s['all']['strength_unknown'] == {'unaligned_step': n_unknown} and n_unknown == 3
  assert s['all']['n'] == 8 and s['all']['rho']['n'] == 5  # 3 LF + 3 FR + 2 CI; 3 unknown
  assert tsum.table(s).count('unaligned_step 1') == 3  # one per τ


def test_arithmetic_oracles_follow_rate():
  items = [ar.make_arith_item(0, i) for i in range(40)]
  rows = ts.run_traces(tw.following_oracle(DOMAIN, items), DOMAIN, items)
  e = [r for r in rows if r['tau'] != ts.IDENTITY and r['applied']]
  known = [r for r in e if r['follows'] is not None]
  assert len(known) > 0.9 * len(e) and all(r['follows'] for r in known)
  assert all(r['implied_after'] == r['answer_after'] for r in known)
  s = tsum.summarize(rows)
  assert s['all']['follow']['value'] == 1.0
  # every CausalInversion of a gold trace keeps its values chained: Strength 0, followed by
  # staying (the answer must not move)
  ci = [r for r in e if r['tau'] == ts.CAUSAL_INVERSION]
  assert ci and all(r['strength'] == 0.0 and r['phi'] == 0.0 for r in ci)
  rows = ts.run_traces(tw.ignoring_oracle(DOMAIN, items), DOMAIN, items)
  s = tsum.summarize(rows)
  assert s['all']['follow_strong']['value'] == 0.0 and s['all']['follow_strong']['n'] > 50
  assert s['by_tau'][ts.CAUSAL_INVERSION]['follow']['value'] == 1.0  # staying is following


def test_carries_edit_reads_the_regenerated_steps():
  # FactReversal 5 + 3 = 10, then the reader's own (wrong) steps from 10: carries the edit
  assert ar.carries_edit(['5 + 3 = 10'], ['10 * 2 = 21', '21 - 1 = 20'], '20') is True
  assert ar.carries_edit(['5 + 3 = 10'], [], '10') is True  # the answer right after the block
  assert ar.carries_edit(['5 + 3 = 10'], ['8 * 2 = 16'], '16') is False  # back to the old 8
  assert ar.carries_edit(['5 + 3 = 10'], ['10 * 2 = 20'], '15') is False  # answer elsewhere
  assert ar.carries_edit(['5 + 3 = 10'], ['double it'], '20') is None
  assert ar.carries_edit(['5 + 3 = 10'], [], 'ten') is None


def test_carries_edit_script_counts():
  import csv
  import importlib.util
  import os
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location(
      'trace_carries_edit', os.path.join(root, 'scripts', 'trace_carries_edit.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  rows = [dict(domain='arithmetic', applied='True', regen_parsed='True', tau='fact_reversal',
               forced='Step 1: 5 + 3 = 10\n', continuation='Step 2: 10 * 2 = 20\nAnswer: 20',
               follows='False'),
          dict(domain='arithmetic', applied='True', regen_parsed='True', tau='fact_reversal',
               forced='Step 1: 5 + 3 = 10\n', continuation='Step 2: 8 * 2 = 16\nAnswer: 16',
               follows=''),
          dict(domain='arithmetic', applied='True', regen_parsed='False', tau='fact_reversal',
               forced='Step 1: 5 + 3 = 10\n', continuation='', follows='')]
  out = mod.counts(rows)
  assert dict(out['fact_reversal']) == {'n': 2, 'carries_edit=True': 1, 'carries_edit=False': 1,
                                        'follows=False': 1, 'follows=unknown': 1}
