"""The ρ prior: with ρ = 0 the query alone predicts the answer at chance; with
ρ > 0 a query-only predictor fit on 10k training examples beats chance.

The predictor is a lookup table: query tokens (ID, KEY) [or (ID, VALUE)] -> the
most frequent gold answer seen with that query in training, falling back to the
most frequent answer overall. It sees no context.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest

from ceu_jax.data.atr_config import ATRConfig

TRAIN, TEST = 10 * 1024, 4 * 1024


def _cfg(variant: str, rho: float) -> ATRConfig:
  return ATRConfig(variant=variant, num_passages=2, context_len=16, rho=rho,
                   n_ids=32, n_keys=32, n_values=16)


def lookup_accuracy(query: np.ndarray, answer: np.ndarray) -> float:
  """Fit the lookup table on the first TRAIN examples, score the rest."""
  counts: dict = collections.defaultdict(collections.Counter)
  overall: collections.Counter = collections.Counter()
  for q, a in zip(map(tuple, query[:TRAIN]), map(tuple, answer[:TRAIN])):
    counts[q][a] += 1
    overall[a] += 1
  default = overall.most_common(1)[0][0]
  hits = [(counts[q].most_common(1)[0][0] if q in counts else default) == a
          for q, a in zip(map(tuple, query[TRAIN:]), map(tuple, answer[TRAIN:]))]
  return float(np.mean(hits))


def _chance(cfg: ATRConfig) -> float:
  return 1 / cfg.n_values ** cfg.value_len if cfg.variant == "value_for_key" else 1 / cfg.n_keys


@pytest.mark.parametrize("variant", ["value_for_key", "key_for_value"])
def test_rho_zero_query_only_is_at_chance(variant, atr_data):
  cfg = _cfg(variant, 0.0)
  b = atr_data(cfg, TRAIN + TEST)
  acc, p = lookup_accuracy(b.query, b.answer), _chance(cfg)
  assert abs(acc - p) <= 3 * np.sqrt(p * (1 - p) / TEST), (acc, p)


def test_rho_positive_query_only_beats_chance(atr_data):
  cfg = _cfg("value_for_key", 0.5)
  b = atr_data(cfg, TRAIN + TEST)
  acc, p = lookup_accuracy(b.query, b.answer), _chance(cfg)
  assert acc > p + 10 * np.sqrt(p * (1 - p) / TEST), (acc, p)
  # About ρ + (1 - ρ)/|V|: the fixed pairs are memorised, the rest at chance.
  assert acc > 0.35, acc


def test_memorisable_flags_the_pairs_whose_answer_never_varies(atr_data):
  """atr.memorisable against an independent reading of the data (ρ = 0.5): a flagged
  pair has one answer in every example that asks it, an unflagged pair asked ≥ 6 times
  has several; ρ = 0 flags nothing (key_for_value takes no prior); the strata split by
  has_evidence."""
  from ceu_jax.data import atr  # pylint: disable=g-import-not-at-top
  cfg = _cfg("value_for_key", 0.5)
  b = atr_data(cfg, TRAIN)
  mem = atr.memorisable(cfg, b.query)
  answers: dict = collections.defaultdict(set)
  flags: dict = collections.defaultdict(set)
  for q, a, m in zip(map(tuple, b.query), map(tuple, b.answer), mem):
    answers[q].add(a)
    flags[q].add(bool(m))
  seen = collections.Counter(map(tuple, b.query))
  for q, fs in flags.items():
    assert len(fs) == 1, q                           # a pair's flag is a function of it
    if fs == {True}:                                 # memorisable: one answer, always
      assert len(answers[q]) == 1, (q, answers[q])
    elif seen[q] >= 6:                               # else random: 6 equal draws of 16
      assert len(answers[q]) > 1, (q, answers[q])    # values has chance 16^-5
  assert abs(mem.mean() - 0.5) < 0.05, mem.mean()
  strata = atr.strata(cfg, b)
  assert set(strata) == {"memorised", "evidence_only", "no_evidence"}
  np.testing.assert_array_equal(strata["no_evidence"], ~b.has_evidence)
  np.testing.assert_array_equal(strata["memorised"], mem & b.has_evidence)
  np.testing.assert_array_equal(strata["evidence_only"], ~mem & b.has_evidence)
  assert not atr.memorisable(_cfg("value_for_key", 0.0), b.query).any()
  assert atr.strata(_cfg("value_for_key", 0.0), b) == {}
  kfv = _cfg("key_for_value", 0.0)
  assert not atr.memorisable(kfv, atr_data(kfv, 64).query).any()
  with pytest.raises(ValueError, match="data.rho must be 0 with data.variant 'key_for_value'"):
    _cfg("key_for_value", 0.5)        # the prior fixes VALUEs, which kfv does not ask
