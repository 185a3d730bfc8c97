"""Edge cases of the trace audit (SPEC §8.2, review 823): the τ_sim boundary, World A's
Strength and regeneration budget, positions beyond a trace, the identity prefix."""
from fractions import Fraction

import pytest

from ceu_jax.audits.traces import audit as ts
from ceu_jax.audits.traces import text as tt
from ceu_jax.readers import base


def _fact_violation(orig: str, alt: str) -> dict:
  """The FactReversal row of one factual item whose reader answers `orig`, then `alt`
  after the edit (Strength 1: the quote now names the swap entity)."""
  item = tt.FactItem('nq:x', 'Who?', orig, f'P {orig}.', orig, 'Zed')

  class R(base.Reader):
    def _generate(self, prompts, forced, budget, stops, ids):
      t = (f' The passage says: "{orig}"\nAnswer: {orig}' if forced is None
           else f'Answer: {alt}')
      return [base.Generation(i, t, (), base.STOP_STRING, '\n\n') for i in ids]

    def _loglik(self, *a):
      raise NotImplementedError

  return ts.run_traces(R(), tt.FactualDomain([]), [item], taus=(ts.FACT_REVERSAL,))[-1]


@pytest.mark.parametrize('orig,alt', [
    ('red green', 'red green blue'),                       # P 2/3, R 1
    ('t1 t2 t3 t4 t5', 't1 t2 t3 t4 u5'),                  # P 4/5, R 4/5
    ('t1 t2 t3 t4 t5 t6 u7 u8', 't1 t2 t3 t4 t5 t6 v7'),   # P 6/7, R 6/8
])
def test_token_f1_of_exactly_four_fifths_is_at_tau_sim(orig, alt):
  # SPEC §8.2 offline: S is exact match and token F1 ≥ τ_sim; F1 = 4/5 = τ_sim in all three,
  # whatever the float rounding of 2PR / (P + R)
  r = _fact_violation(orig, alt)
  assert r['strength'] == 1.0 and r['S'] == 0.8
  assert r['same'] is True and r['violation'] == 1.0
  assert tt.exact_similarity(orig, alt) == Fraction(4, 5)
  assert ts.at_least(Fraction(4, 5), 0.8) and not ts.at_least(Fraction(79, 100), 0.8)
