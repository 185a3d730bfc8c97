"""Tests of ceu_jax.metrics: SQuAD EM/F1, calibration, bootstrap, CEU summaries."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ceu_jax import metrics as m
from ceu_jax.metrics import resampling as bs

NAN = float("nan")


# ---------------------------------------------------------------- EM / F1 --

@pytest.mark.parametrize("text, normalised", [
    ("The Cat", "cat"),
    ("a cat!", "cat"),
    ("An apple, the pear.", "apple pear"),
    ("  cat \t sat\n", "cat sat"),
    ("Theatre anthem", "theatre anthem"),    # articles only as whole words
    ("U.S.A.", "usa"),                       # punctuation removed, no space
    ("rock-n-roll", "rocknroll"),
    ("A, b; the C.", "b c"),
    ("the a an", ""),
    ("“cat”", "“cat”"),                      # only ASCII punctuation stripped
])
def test_normalize_answer(text, normalised):
  assert m.normalize_answer(text) == normalised


@pytest.mark.parametrize("prediction, golds, em, f1", [
    ("The Cat", "cat", 1.0, 1.0),
    ("cat.", ["dog", "the cat"], 1.0, 1.0),            # max over golds
    ("the cat sat", "cat sat on mat", 0.0, 2 / 3),     # P = 1, R = 1/2
    ("cat cat", "cat", 0.0, 2 / 3),                    # bags: P = 1/2, R = 1
    ("cat sat", ["dog", "cat sat on mat"], 0.0, 2 / 3),
    ("Paris France", ["london", "paris"], 0.0, 2 / 3),
    ("dog", "cat", 0.0, 0.0),
    ("the", "a", 1.0, 0.0),   # both empty: EM 1, F1 0 (SQuAD v1.1 rule)
    ("cat", "the", 0.0, 0.0),
])
def test_em_f1_table(prediction, golds, em, f1):
  assert m.exact_match(prediction, golds) == em
  assert m.token_f1(prediction, golds) == pytest.approx(f1)


def test_em_f1_batch_and_errors():
  preds = ["the cat", "dog"]
  golds = [["cat"], "a dog!"]
  np.testing.assert_array_equal(m.exact_match_batch(preds, golds), [1, 1])
  np.testing.assert_allclose(m.token_f1_batch(preds, golds), [1, 1])
  with pytest.raises(ValueError):
    m.exact_match("x", [])
  with pytest.raises(ValueError):
    m.token_f1_batch(["x"], [])


def test_token_exact_match_ignores_gold_padding():
  gold = np.array([[5, 6, 0], [5, 6, 0], [5, 0, 0], [7, 8, 9]])
  pred = np.array([[5, 6, 3], [5, 7, 0], [5, 9, 9], [7, 8, 9]])
  np.testing.assert_array_equal(m.token_exact_match(pred, gold),
                                [True, False, True, True])
  logits = np.full((4, 3, 10), -1.0)
  np.put_along_axis(logits, pred[..., None], 1.0, axis=-1)
  np.testing.assert_array_equal(m.teacher_forced_exact_match(logits, gold),
                                [True, False, True, True])
  with pytest.raises(ValueError):
    m.token_exact_match(pred[:, :2], gold)


# ------------------------------------------------------ NLL / ECE / Brier --

def test_nll():
  np.testing.assert_allclose(m.nll(np.array([-2.0, -4.0])), [2.0, 4.0])
  np.testing.assert_allclose(m.nll(np.array([-2.0, -4.0]), np.array([2, 4])),
                             [1.0, 1.0])


def test_ece_hand_computed():
  conf = np.array([0.9, 0.9, 0.7, 0.7, 0.1])
  correct = np.array([1, 0, 1, 1, 0])
  # Bins of width 0.2: (0.8,1]: |0.5-0.9|·2/5; (0.6,0.8]: |1-0.7|·2/5;
  # (0,0.2]: |0-0.1|·1/5.
  assert m.ece(conf, correct, num_bins=5) == pytest.approx(0.16 + 0.12 + 0.02)
  assert m.ece(np.full(4, 0.75), np.array([1, 1, 1, 0])) == pytest.approx(0.0)
  # One bin: |accuracy − mean confidence|.
  assert m.ece(conf, correct, num_bins=1) == pytest.approx(abs(0.6 - 0.66))


def test_ece_bins_are_right_closed():
  bins = m.reliability_bins(np.array([0.0, 0.25, 0.5, 0.75, 1.0]),
                            np.array([1, 1, 0, 0, 1]), num_bins=4)
  assert bins["count"] == [2, 1, 1, 1]   # 0 and 0.25 in (0, 0.25]
  assert bins["accuracy"] == [1.0, 0.0, 0.0, 1.0]
  assert bins["confidence"][0] == pytest.approx(0.125)
  empty = m.reliability_bins(np.array([0.9]), np.array([1]), num_bins=2)
  assert empty["count"] == [0, 1] and empty["accuracy"][0] is None
  with pytest.raises(ValueError):
    m.ece(np.array([1.2]), np.array([1]))


def test_confidence_from_probs():
  probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.5, 0.4]])
  conf, correct = m.confidence_from_probs(probs, np.array([0, 2]))
  np.testing.assert_allclose(conf, [0.7, 0.5])
  np.testing.assert_array_equal(correct, [True, False])
  conf, correct = m.confidence_from_probs(probs, np.array([0, 2]),
                                          predictions=np.array([1, 2]))
  np.testing.assert_allclose(conf, [0.2, 0.4])
  np.testing.assert_array_equal(correct, [False, True])


def test_teacher_forced_confidence():
  probs = np.array([[[0.3, 0.6, 0.1], [0.2, 0.5, 0.3]],
                    [[0.1, 0.8, 0.1], [0.4, 0.4, 0.2]]])
  answer = np.array([[1, 2], [1, 0]])                    # row 1: one token
  conf = m.teacher_forced_confidence(np.log(probs) + 3.0, answer)
  np.testing.assert_allclose(conf, [0.6 * 0.5, 0.8])


def test_brier_hand_computed():
  probs = np.array([[0.7, 0.2, 0.1], [0.7, 0.2, 0.1], [1.0, 0.0, 0.0]])
  np.testing.assert_allclose(m.brier_multiclass(probs, np.array([0, 2, 1])),
                             [0.09 + 0.04 + 0.01, 0.49 + 0.04 + 0.81, 2.0])
  np.testing.assert_allclose(
      m.brier_binary(np.array([0.8, 0.8, 0.5]), np.array([1, 0, 1])),
      [0.04, 0.64, 0.25])


# -------------------------------------------------------------- bootstrap --

def test_bootstrap_mean_ci_covers_at_nominal_rate():
  rng = np.random.default_rng(123)
  hits = 0
  for _ in range(200):
    agg = m.mean_ci(rng.normal(1.0, 2.0, size=100))
    hits += agg.contains(1.0)
  assert 0.90 <= hits / 200 <= 0.99


def test_paired_difference_ci_covers_at_nominal_rate():
  rng = np.random.default_rng(7)
  hits = 0
  for _ in range(200):
    shared = rng.normal(0.0, 3.0, size=80)   # strong per-example pairing
    a = shared + 0.3 + rng.normal(0.0, 0.5, size=80)
    b = shared + rng.normal(0.0, 0.5, size=80)
    hits += m.paired_difference_ci(a, b).contains(0.3)
  assert 0.90 <= hits / 200 <= 0.99


def test_bootstrap_properties():
  x = np.random.default_rng(0).normal(size=50)
  agg = m.mean_ci(x)
  assert agg.value == pytest.approx(x.mean()) and agg.n == 50
  assert agg.ci_low < agg.value < agg.ci_high
  assert m.mean_ci(x) == agg                       # fixed seed: reproducible
  assert m.mean_ci(x, seed=1) != agg
  wide = m.mean_ci(x, level=0.99)
  assert wide.ci_low <= agg.ci_low and wide.ci_high >= agg.ci_high
  assert m.mean_ci(np.array([])) == m.Aggregate(None, None, None, 0)
  assert m.mean_ci(np.array([3.0])) == m.Aggregate(3.0, 3.0, 3.0, 1)
  assert json.loads(json.dumps(agg.to_dict())) == agg.to_dict()
  with pytest.raises(ValueError):
    m.mean_ci(np.array([1.0, NAN]))


def test_lenient_bootstrap_and_the_optional_fields():
  """strict=False (the theory's estimators): inf values kept, NaN resamples left out,
  no CI below 2 examples; n_excluded and note are written only when set."""
  assert bs.bootstrap(lambda x: x.max(axis=1) * np.inf, np.ones(5), method="inverted_cdf",
                      strict=False) == \
      m.Aggregate(np.inf, np.inf, np.inf, 5)
  assert m.mean_ci(np.array([3.0]), strict=False) == m.Aggregate(3.0, None, None, 1)
  x = np.array([1.0, 2.0, NAN])                          # resamples without the NaN remain
  assert m.mean_ci(x, strict=False).value is None
  assert m.mean_ci(x, strict=False).ci_low is not None
  agg = m.Aggregate(0.5, 0.4, 0.6, 10)
  assert agg.to_dict() == {"value": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 10}
  full = m.Aggregate(0.5, None, None, 10, n_excluded=3, note="why")
  assert bs.Aggregate.from_dict(full.to_dict()) == full
  assert bs.Aggregate.from_dict(None) == bs.EMPTY
  assert full.floats()[0] == 0.5 and np.isnan(full.floats()[1])
  old_theory = {"value": 0.5, "lo": 0.4, "hi": 0.6, "n": 10, "n_excluded": 0, "level": 0.95,
                "note": ""}                              # bounds.json before the one type
  assert bs.Aggregate.from_dict(old_theory) == agg


def test_fmt_ci_styles():
  agg = m.Aggregate(0.52149, 0.4951, 0.548, 224)
  assert bs.fmt_ci(agg) == "0.521 [0.495, 0.548]"
  assert bs.fmt_ci(agg, 2, signed=True, with_n=True) == "+0.52 [+0.50, +0.55] (n=224)"
  assert bs.fmt_ci(agg, style="g", scale=100.0) == "52.1 [49.5, 54.8]"
  assert bs.fmt_ci(m.Aggregate(-0.0, -0.0, 0.0, 3), style="g") == "0 [0, 0]"
  assert bs.fmt_ci(m.Aggregate(-0.0, -0.0, 0.0, 3)) == "-0.000 [-0.000, 0.000]"
  assert bs.fmt_ci(m.Aggregate(np.inf, 9.7, np.inf, 3), style="g") == "inf [9.7, inf]"
  assert bs.fmt_ci(m.Aggregate(NAN, None, None, 0), missing="n/a", with_n=True) == "n/a (n=0)"
  assert bs.fmt_ci({"value": 1.0, "ci_low": None, "ci_high": 2.0, "n": 1}) == "1.000"


def test_bootstrap_chunking_does_not_change_result(monkeypatch):
  x = np.random.default_rng(1).normal(size=64)
  full = m.quantile_ci(x, 0.25, num_resamples=300)
  monkeypatch.setattr(bs, "_CHUNK_ELEMENTS", 64 * 7)
  assert m.quantile_ci(x, 0.25, num_resamples=300) == full


def test_bootstrap_scalar_matches_vectorised():
  rng = np.random.default_rng(2)
  conf, correct = rng.random(40), rng.random(40) < 0.6
  vec = m.bootstrap(m.ece_resampled, conf, correct, num_resamples=50)
  loop = m.bootstrap_scalar(m.ece, conf, correct, num_resamples=50)
  assert vec.value == pytest.approx(loop.value)
  assert vec.ci_low == pytest.approx(loop.ci_low)
  assert vec.ci_high == pytest.approx(loop.ci_high)


def test_paired_difference_and_delta_causal():
  rng = np.random.default_rng(3)
  placebo = rng.normal(size=30)
  agg = m.delta_causal(placebo + 0.5, placebo)
  assert agg.value == pytest.approx(0.5) and agg.n == 30
  assert agg.ci_low == pytest.approx(0.5) and agg.ci_high == pytest.approx(0.5)
  med = m.paired_difference_ci(placebo + 1.0, placebo, statistic="median")
  assert med.value == pytest.approx(1.0)
  with pytest.raises(ValueError):
    m.paired_difference_ci(placebo, placebo[:5])
  with pytest.raises(ValueError):
    m.paired_difference_ci(placebo, placebo, statistic="mode")


def test_stratified_paired_mean_against_a_loop_and_its_coverage():
  """Σ_s w_s mean(a_s − b_s) over independent sets: one set is paired_difference_ci
  (same indices); two sets equal a resample-by-resample loop drawing each set's indices
  from its own generator (seed + s); the 95% CI covers the true value ~95% of the time."""
  rng = np.random.default_rng(11)
  a, b = rng.normal(size=40), rng.normal(size=40)
  one = bs.stratified_paired_mean([(a, b, 1.0)], num_resamples=300, seed=5)
  ref = m.paired_difference_ci(a, b, num_resamples=300, seed=5)
  for x, y in zip(one.floats(), ref.floats()):
    assert x == pytest.approx(y, abs=1e-12)
  c, d = rng.normal(size=25), rng.normal(size=25)
  got = bs.stratified_paired_mean([(a, b, -1.0), (c, d, 0.5)], num_resamples=300, seed=5)
  gens = [np.random.default_rng(5), np.random.default_rng(6)]
  loop = []
  for _ in range(300):
    i, j = gens[0].integers(0, 40, size=40), gens[1].integers(0, 25, size=25)
    loop.append(-np.mean(a[i] - b[i]) + 0.5 * np.mean(c[j] - d[j]))
  want = [-np.mean(a - b) + 0.5 * np.mean(c - d), *np.quantile(loop, [0.025, 0.975])]
  assert np.allclose(got.floats()[:3], want, rtol=0, atol=1e-12) and got.n == 65
  hits = 0
  for _ in range(200):
    shared1, shared2 = rng.normal(0, 3, 60), rng.normal(0, 3, 30)   # strong pairing
    sets = [(shared1 + 0.2 + rng.normal(0, .5, 60), shared1 + rng.normal(0, .5, 60), -1.0),
            (shared2 + rng.normal(0, .5, 30), shared2 + rng.normal(0, .5, 30), 1.0)]
    hits += bs.stratified_paired_mean(sets, num_resamples=300).contains(-0.2)
  assert 0.90 <= hits / 200 <= 0.99
  assert bs.stratified_paired_mean([]) == bs.EMPTY
  with pytest.raises(ValueError, match="set 1"):
    bs.stratified_paired_mean([(a, b, 1.0), (c, d[:3], 1.0)])


# ---------------------------------------------------------- CEU summaries --

def test_stabilised_ceu_and_degenerate_flag():
  l_plus = np.zeros(5)
  l_minus = np.array([-2.0, -2.0, -2.0, -2.0, -0.0005])
  l_int = np.array([-1.0, 1.0, -3.0, 0.0, 0.0])
  ceu, degenerate = m.stabilised_ceu(l_int, l_minus, l_plus, eps=1e-3)
  np.testing.assert_allclose(ceu[:4], [0.5, 1.0, 0.0, 1.0])
  assert np.isnan(ceu[4])
  np.testing.assert_array_equal(degenerate, [False] * 4 + [True])


def _hand_rows():
  return {
      "correct": np.array([True, True, True, False, True, True]),
      "ceu_ev": np.array([0.9, 0.5, 0.3, 0.95, NAN, 0.74]),
      "degenerate": np.array([False, False, False, False, True, False]),
  }


def test_supported_answer_rate_hand_built():
  r = _hand_rows()
  rates = m.supported_answer_rate(r["correct"], r["ceu_ev"], r["degenerate"])
  assert list(rates) == ["0.25", "0.5", "0.75"]
  assert rates["0.25"]["value"] == pytest.approx(4 / 6)
  assert rates["0.5"]["value"] == pytest.approx(3 / 6)   # CEU = τ counts
  assert rates["0.75"]["value"] == pytest.approx(1 / 6)
  assert all(v["n"] == 6 for v in rates.values())        # degenerate in denom


def test_degenerate_never_supported_even_with_high_ceu():
  flags = m.supported(np.array([True, True]), np.array([1.0, 1.0]),
                      np.array([True, False]), tau=0.5)
  np.testing.assert_array_equal(flags, [False, True])


def test_ceu_distribution_conditioning():
  ceu = np.array([0.1, 0.2, 0.3, 0.4, 0.9, NAN])
  correct = np.array([True, True, False, False, True, True])
  degenerate = np.array([False] * 5 + [True])
  dist = m.ceu_distribution(ceu, degenerate, correct, num_resamples=200)
  assert dist["all"]["mean"]["value"] == pytest.approx(0.38)
  assert dist["all"]["mean"]["n"] == 5
  assert dist["all"]["q10"]["value"] == pytest.approx(0.14)
  assert dist["all"]["q25"]["value"] == pytest.approx(0.2)
  assert dist["correct"]["mean"]["value"] == pytest.approx(0.4)
  assert dist["correct"]["median"]["value"] == pytest.approx(0.2)
  assert dist["correct"]["median"]["n"] == 3
  assert dist["incorrect"]["mean"]["value"] == pytest.approx(0.35)
  assert dist["n_degenerate"] == {"all": 1, "correct": 1, "incorrect": 0}


def test_ceu_distribution_empty_group_and_unflagged_nan():
  dist = m.ceu_distribution(np.array([0.5, 0.7]), np.array([False, False]),
                            np.array([True, True]))
  assert dist["incorrect"]["mean"] == {"value": None, "ci_low": None,
                                       "ci_high": None, "n": 0}
  with pytest.raises(ValueError, match="degenerate"):
    m.ceu_distribution(np.array([0.5, NAN]), np.array([False, False]))


# -------------------------------------------------------- summarize_audit --

def _simulated_rows(n=300, seed=0):
  rng = np.random.default_rng(seed)
  l_plus = rng.normal(-1.0, 0.5, n)
  gap = np.abs(rng.normal(2.0, 1.0, n))
  gap[:10] = 0.0                                   # 10 degenerate examples
  l_minus = l_plus - gap
  return {
      "correct": rng.random(n) < 0.7,
      "f1": rng.random(n),
      "L_plus": l_plus,
      "L_minus": l_minus,
      "L_int_ev": l_minus + rng.uniform(0, 1.2, n) * gap,
      "L_int_dis": l_minus + rng.uniform(-0.1, 0.3, n) * gap,
      "confidence": rng.random(n),
      "num_tokens": np.full(n, 2),
  }


def test_summarize_audit_keys_and_json():
  rows = _simulated_rows()
  out = m.summarize_audit(rows, num_resamples=200)
  assert set(out) == {"n", "n_degenerate", "accuracy", "calibration",
                      "deltas", "nll", "nll_per_token", "ceu",
                      "supported_answer_rate", "settings"}
  assert out["n"] == 300 and out["n_degenerate"] == 10
  assert set(out["accuracy"]) == {"em", "f1"}
  assert set(out["calibration"]) == {"ece", "brier_binary", "num_bins"}
  assert set(out["deltas"]) == {"delta_L", "delta_ev", "delta_dis"}
  assert set(out["ceu"]) == {"ev", "dis"}
  assert set(out["ceu"]["ev"]) == {"all", "correct", "incorrect",
                                   "n_degenerate", "n_without_span", "fixed_denominator"}
  assert out["ceu"]["ev"]["n_without_span"] == 0
  assert out["ceu"]["ev"]["all"]["mean"]["n"] == 290
  assert out["ceu"]["ev"]["n_degenerate"]["all"] == 10
  assert out["deltas"]["delta_L"]["mean"]["n"] == 300
  assert list(out["supported_answer_rate"]) == ["0.25", "0.5", "0.75"]
  json.dumps(out, allow_nan=False)


def test_summarize_audit_agrees_with_parts():
  rows = _simulated_rows()
  out = m.summarize_audit(rows, num_resamples=100, taus=(0.5,))
  ceu, degenerate = m.stabilised_ceu(rows["L_int_ev"], rows["L_minus"],
                                     rows["L_plus"])
  given = dict(rows, ceu_ev=ceu, degenerate=degenerate)
  assert m.summarize_audit(given, num_resamples=100, taus=(0.5,)) == out
  expected = np.mean(rows["correct"] & ~degenerate & (np.nan_to_num(ceu) >= .5))
  assert out["supported_answer_rate"]["0.5"]["value"] == pytest.approx(expected)
  assert out["nll"]["value"] == pytest.approx(-rows["L_plus"].mean())
  assert out["calibration"]["ece"]["value"] == pytest.approx(
      m.ece(rows["confidence"], rows["correct"]))


def test_summarize_audit_partial_rows_and_errors():
  out = m.summarize_audit({"correct": np.array([1, 0, 1, 1])},
                          num_resamples=50)
  assert set(out) == {"n", "accuracy", "settings"}
  assert out["accuracy"]["em"]["value"] == 0.75
  with pytest.raises(ValueError, match="degenerate"):
    m.summarize_audit({"ceu_ev": np.array([0.5]), "correct": np.array([1])})
  with pytest.raises(ValueError, match="aligned"):
    m.summarize_audit({"correct": np.ones(3), "f1": np.ones(2)})


def test_summarize_groups():
  rows = _simulated_rows(n=120)
  rows["stratum"] = np.repeat(np.array(["0->0", "1->1"]), 60)
  out = m.summarize_groups(rows, "stratum", num_resamples=50)
  assert list(out) == ["0->0", "1->1"]
  assert out["1->1"]["n"] == 60 and out["0->0"]["n_degenerate"] == 10


def test_summarize_audit_ceu_over_examples_with_the_probe_span():
  """CEU statistics exclude examples without evidence (and, for dis, without a
  distractor); accuracy counts every example; an example without evidence is
  never supported; counts of what was excluded are reported."""
  rows = _simulated_rows()
  n = len(rows["correct"])
  rng = np.random.default_rng(3)
  has_ev = rng.random(n) < 0.8
  dis_found = rng.random(n) < 0.6
  out = m.summarize_audit({**rows, "has_evidence": has_ev, "dis_found": dis_found},
                          num_resamples=50)
  deg = (rows["L_plus"] - rows["L_minus"]) < 1e-3
  ceu_ev = np.clip((rows["L_int_ev"] - rows["L_minus"])
                   / np.maximum(rows["L_plus"] - rows["L_minus"], 1e-3), 0, 1)
  keep = has_ev & ~deg
  assert out["ceu"]["ev"]["all"]["mean"]["n"] == keep.sum()
  np.testing.assert_allclose(out["ceu"]["ev"]["all"]["mean"]["value"], ceu_ev[keep].mean())
  assert out["ceu"]["dis"]["all"]["mean"]["n"] == (keep & dis_found).sum()
  assert out["ceu"]["ev"]["n_without_span"] == (~has_ev).sum()
  assert out["ceu"]["dis"]["n_without_span"] == (~(has_ev & dis_found)).sum()
  assert out["n_without_evidence"] == (~has_ev).sum()
  assert out["n_degenerate"] == (deg & has_ev).sum()
  assert out["accuracy"]["em"]["n"] == n
  sup = rows["correct"] & keep & (ceu_ev >= 0.5)
  np.testing.assert_allclose(out["supported_answer_rate"]["0.5"]["value"], sup.mean())



def test_fixed_denominator_counts_degenerate_gaps_as_zero():
  """SPEC §5a: the §1 mean is over non-degenerate examples; the fixed-denominator mean
  counts degenerate ones as 0, so a larger degenerate share lowers it."""
  ceu = np.array([1.0, 0.5, np.nan, np.nan])
  degenerate = np.array([False, False, True, True])
  fixed = m.summary.ceu_fixed_denominator(ceu, degenerate, num_resamples=50)
  assert fixed["value"] == pytest.approx(1.5 / 4) and fixed["n"] == 4
  rows = dict(correct=np.ones(4, bool), has_evidence=np.ones(4, bool), ceu_ev=ceu,
              degenerate=degenerate, L_plus=np.zeros(4), L_minus=-np.ones(4))
  out = m.summarize_audit(rows, num_resamples=50)
  assert out["ceu"]["ev"]["all"]["mean"]["value"] == pytest.approx(0.75)
  assert out["ceu"]["ev"]["fixed_denominator"]["value"] == pytest.approx(0.375)
