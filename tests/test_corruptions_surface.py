"""Surface statistics are preserved: a bag-of-tokens classifier cannot tell D+ from D−.

For each corruption that swaps the evidence for matched content, a scikit-learn
logistic regression on the token counts of the context (query not shown) is trained
on (D+, D−) pairs of 70% of the examples with evidence and scored on the other 30%;
held-out accuracy must be <= 0.55 (chance 0.5; the standard error is about
0.012-0.015 here). Removal is not one of them: SPEC §3 puts a filler passage where
the evidence passage was, a visible change of the line mix like distractor injection
(tests/test_corruptions_properties.py checks what it puts there).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import ATR_CONFIGS

sklearn_lm = pytest.importorskip("sklearn.linear_model")

NUM = 4096


def _bag(context: np.ndarray, vocab_size: int) -> np.ndarray:
  rows = np.repeat(np.arange(context.shape[0]), context.shape[1])
  counts = np.zeros((context.shape[0], vocab_size), np.float32)
  np.add.at(counts, (rows, context.reshape(-1)), 1.0)
  return counts


def held_out_accuracy(plus_ctx, minus_ctx, vocab_size: int, seed: int = 0) -> float:
  """Accuracy of D+ vs D− on held-out examples (whole pairs held out)."""
  n = plus_ctx.shape[0]
  order = np.random.default_rng(seed).permutation(n)
  train, test = order[: int(0.7 * n)], order[int(0.7 * n):]
  xp, xm = _bag(plus_ctx, vocab_size), _bag(minus_ctx, vocab_size)

  def stack(idx):
    return (np.concatenate([xp[idx], xm[idx]]),
            np.r_[np.zeros(len(idx)), np.ones(len(idx))])

  clf = sklearn_lm.LogisticRegression(max_iter=2000).fit(*stack(train))
  return float(clf.score(*stack(test)))


@pytest.mark.parametrize("corruption", ("value_swap", "evidence_swap"))
@pytest.mark.parametrize("cfg_name", ("vfk_n128", "kfv_n256"))
def test_bag_of_tokens_cannot_detect_corruption(cfg_name, corruption, atr_data,
                                                atr_corrupted):
  cfg = ATR_CONFIGS[cfg_name]
  plus, minus = atr_data(cfg, NUM), atr_corrupted(cfg, NUM, corruption)
  rows = plus.has_evidence
  acc = held_out_accuracy(plus.context[rows], minus.context[rows], cfg.vocab.size)
  assert acc <= 0.55, (cfg_name, corruption, acc)


def test_classifier_detects_a_visible_change(atr_data, atr_corrupted):
  """Sanity check of the probe: distractor injection changes the mix of line
  formats (filler -> evidence format) and must be detected."""
  cfg = ATR_CONFIGS["vfk_n128"]
  plus, minus = atr_data(cfg, NUM), atr_corrupted(cfg, NUM, "distractor_injection")
  assert held_out_accuracy(plus.context, minus.context, cfg.vocab.size) > 0.65
