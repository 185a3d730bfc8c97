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
