"""The pure-Python reference generator and the JAX generator agree in distribution.

Two-sample tests (chi-square on contingency tables, two-proportion z) on 2,048
examples from each, for both variants; p-value threshold 1e-4 per statistic.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ceu_jax.data import reference_atr
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import LineKind
from tests.conftest import ATR_CONFIGS

NUM = 2048
P_MIN = 1e-4
FIELDS = ("query", "context", "passage_ids", "answer", "has_evidence", "evidence_mask",
          "value_mask", "distractor_mask", "hard_negative_mask", "passage_start",
          "line_ids", "line_kind", "changed_mask", "example_id")


@pytest.fixture(scope="module", params=["vfk_n128", "kfv_n256"])
def pair(request, atr_data):
  cfg = ATR_CONFIGS[request.param]
  return cfg, atr_data(cfg, NUM), reference_atr.generate(cfg, seed=1, num_examples=NUM)


def _same_counts(a: np.ndarray, b: np.ndarray, length: int) -> float:
  """p-value of a chi-square test that two samples of categories share a law."""
  table = np.stack([np.bincount(a.ravel(), minlength=length),
                    np.bincount(b.ravel(), minlength=length)])
  table = table[:, table.sum(0) > 0]
  return float(stats.chi2_contingency(table).pvalue)


def _same_rate(a: np.ndarray, b: np.ndarray) -> float:
  """p-value of a two-proportion z-test."""
  k1, n1, k2, n2 = a.sum(), a.size, b.sum(), b.size
  p = (k1 + k2) / (n1 + n2)
  if p in (0.0, 1.0):
    return 1.0 if k1 / n1 == k2 / n2 else 0.0
  z = (k1 / n1 - k2 / n2) / np.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
  return float(2 * stats.norm.sf(abs(z)))


def test_same_fields_shapes_and_layout(pair):
  cfg, jx, ref = pair
  for name in FIELDS:
    j = np.asarray(getattr(jx, name))
    assert ref[name].shape == j.shape and ref[name].dtype == j.dtype, name
  for name in ("passage_ids", "passage_start", "line_ids", "changed_mask", "example_id"):
    np.testing.assert_array_equal(ref[name], getattr(jx, name), err_msg=name)


def test_kind_frequencies_and_miss_rate(pair):
  cfg, jx, ref = pair
  assert _same_counts(jx.line_kind, ref["line_kind"], len(LineKind)) > P_MIN
  assert _same_rate(~jx.has_evidence, ~ref["has_evidence"]) > P_MIN
  ev = int(LineKind.EVIDENCE)
  slot = lambda k: np.where((k == ev).any(1), (k == ev).argmax(1), cfg.num_lines)
  assert _same_counts(slot(jx.line_kind), slot(ref["line_kind"]), cfg.num_lines + 1) > P_MIN


def _same_per_example(a: np.ndarray, b: np.ndarray) -> float:
  """p-value of a two-sample KS test on per-example statistics (tokens within
  one example are dependent, so token-pooled tests would be anti-conservative)."""
  return float(stats.ks_2samp(a, b).pvalue)


def test_token_statistics(pair):
  """Per-example counts of each token block and mask, paraphrased evidence-format
  lines, query overlap in fillers; the answer distribution."""
  cfg, jx, ref = pair
  v = cfg.vocab
  jx = {f: np.asarray(getattr(jx, f)) for f in FIELDS}
  assert _same_counts(jx["answer"], ref["answer"], v.size) > P_MIN
  blocks = [(0, v.filler_base), (v.filler_base, v.id_base), (v.id_base, v.key_base),
            (v.key_base, v.value_base), (v.value_base, v.size)]
  statistics = {f"block_{lo}": lambda b, lo=lo, hi=hi: ((b["context"] >= lo)
                                                       & (b["context"] < hi)).sum(1)
                for lo, hi in blocks}
  statistics.update({name: lambda b, name=name: b[name].sum(1)
                     for name in ("evidence_mask", "value_mask", "distractor_mask",
                                  "hard_negative_mask")})
  statistics["paraphrased"] = lambda b: (b["context"] == v.tok("OF")).sum(1)
  statistics["query_id_outside_evidence"] = lambda b: (
      (b["context"] == b["query"][:, 2:3]) & ~b["evidence_mask"]).sum(1)
  for name, statistic in statistics.items():
    assert _same_per_example(statistic(jx), statistic(ref)) > P_MIN, name


def test_reference_prior_fixes_values():
  """With ρ = 1 every (ID, KEY) pair has one value, also in the reference."""
  cfg = ATRConfig(num_passages=2, context_len=16, rho=1.0, n_ids=4, n_keys=4)
  ref = reference_atr.generate(cfg, seed=0, num_examples=400)
  seen: dict = {}
  for q, a in zip(map(tuple, ref["query"]), map(tuple, ref["answer"])):
    assert seen.setdefault(q, a) == a
