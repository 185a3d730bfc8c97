"""T1–T3 verdict rules (ceu_jax/theory/verdicts.py) on synthetic bounds.json numbers
with known verdicts, each with a borderline case either way (milliseconds)."""
from __future__ import annotations

import numpy as np
import pytest

from ceu_jax import claims
from ceu_jax.theory import stats, verdicts


def _agg(value, lo, hi, n=256):
  return {"value": value, "ci_low": lo, "ci_high": hi, "n": n}


def _report(etas, rates, bounds):
  return {"etas": list(etas), "rates": [_agg(*r) for r in rates], "bound": list(bounds)}


# --------------------------------------------------------------- T3

BOUND = (0.30, 0.45, 0.60, 0.75)
ETAS = (0.0, 0.2, 0.4, 0.6)


def _t3(rates, bounds=BOUND):
  return verdicts.t3_verdict({"δ=0.3": _report(ETAS, rates, bounds)})


def test_t3_every_rate_ci_below_the_bound_is_supported():
  v = _t3([(b - 0.1, b - 0.15, b - 0.05) for b in BOUND])
  assert v.verdict == claims.SUPPORTED
  assert "4 with the rate's CI below the bound" in v.numbers


def test_t3_borderline_supported_bound_at_the_ci_edge():
  # rate above the bound at one point, but its CI's lower end reaches the bound exactly
  rates = [(b - 0.1, b - 0.15, b - 0.05) for b in BOUND]
  rates[2] = (BOUND[2] + 0.03, BOUND[2], BOUND[2] + 0.06)
  v = _t3(rates)
  assert v.verdict == claims.SUPPORTED
  assert "1 with the bound inside the CI" in v.numbers


def test_t3_borderline_not_supported_one_significant_violation():
  rates = [(b - 0.1, b - 0.15, b - 0.05) for b in BOUND]
  rates[2] = (BOUND[2] + 0.03, BOUND[2] + 1e-6, BOUND[2] + 0.06)   # CI just above the bound
  v = _t3(rates)
  assert v.verdict == claims.NOT_SUPPORTED
  assert "1 significant violations" in v.numbers and "η=0.4" in v.numbers


def test_t3_half_of_the_points_violated_is_not_supported_more_is_opposite():
  above = [(b + 0.1, b + 0.05, b + 0.15) for b in BOUND]
  below = [(b - 0.1, b - 0.15, b - 0.05) for b in BOUND]
  assert _t3(above[:2] + below[2:]).verdict == claims.NOT_SUPPORTED   # 2 of 4 = MAJORITY
  assert _t3(above[:3] + below[3:]).verdict == claims.OPPOSITE        # 3 of 4 > MAJORITY
  assert _t3(above).verdict == claims.OPPOSITE


def test_t3_vacuous_or_undefined_bounds_are_not_counted():
  rates = [(0.9, 0.85, 0.95)] * 4
  assert _t3(rates, (1.0, None, 1.2, 1.0)).verdict == claims.UNTESTED
  v = _t3(rates, (1.0, None, 1.2, 0.8))        # one defined point, a violation
  assert v.verdict == claims.OPPOSITE and v.numbers.startswith("1 points")


def test_t3_points_span_every_delta():
  reps = {"δ=0": _report(ETAS, [(b - 0.1, b - 0.15, b - 0.05) for b in BOUND], BOUND),
          "δ=0.9": _report(ETAS, [(b + 0.1, b + 0.05, b + 0.15) for b in BOUND], BOUND)}
  assert len(verdicts.t3_points(reps)) == 8
  assert verdicts.t3_verdict(reps).verdict == claims.NOT_SUPPORTED   # 4 of 8


# --------------------------------------------------------------- T2


def _t2(drops, pair_diff, ceu=((0.5, 0.45, 0.55), (0.1, 0.05, 0.15))):
  points = [{"name": n, "one_minus_ceu": _agg(*c), "drop": _agg(*d)}
            for n, c, d in zip(("low_ceu", "high_ceu"), ceu, drops)]
  return verdicts.t2_verdict({"points": points,
                              "paired": {"low": "low_ceu", "high": "high_ceu",
                                         "diff": _agg(*pair_diff)}})


def test_t2_drops_and_their_dependence_on_ceu_supported():
  assert _t2([(0.4, 0.3, 0.5), (0.1, 0.05, 0.15)], (0.3, 0.2, 0.4)).verdict == claims.SUPPORTED


def test_t2_borderline_each_way_on_the_smallest_drop():
  pair = (0.3, 0.2, 0.4)
  assert _t2([(0.4, 0.3, 0.5), (0.05, 1e-3, 0.1)], pair).verdict == claims.SUPPORTED
  assert _t2([(0.4, 0.3, 0.5), (0.05, -1e-3, 0.1)], pair).verdict == claims.NOT_SUPPORTED


def test_t2_dependence_not_shown_or_reversed():
  drops = [(0.4, 0.3, 0.5), (0.1, 0.05, 0.15)]
  assert _t2(drops, (0.1, -0.01, 0.2)).verdict == claims.NOT_SUPPORTED
  assert _t2(drops, (-0.2, -0.3, -0.1)).verdict == claims.NOT_SUPPORTED   # drops still > 0


def test_t2_untested_when_the_models_ceu_overlaps():
  drops = [(0.4, 0.3, 0.5), (0.1, 0.05, 0.15)]
  overlap = ((0.5, 0.3, 0.55), (0.35, 0.25, 0.45))
  assert _t2(drops, (0.3, 0.2, 0.4), overlap).verdict == claims.UNTESTED
  touching = ((0.5, 0.15, 0.55), (0.1, 0.05, 0.15))                      # shares an endpoint
  assert _t2(drops, (0.3, 0.2, 0.4), touching).verdict == claims.UNTESTED
  apart = ((0.5, 0.150001, 0.55), (0.1, 0.05, 0.15))
  assert _t2(drops, (0.3, 0.2, 0.4), apart).verdict == claims.SUPPORTED


# --------------------------------------------------------------- T1


def _t1(spearmans, sweep=(1e-5, 1e-3, 0.1, 0.6), scales=(1e-4, 1e-2, 1.0, 10.0)):
  return verdicts.t1_verdict({
      "trained": {f"m{i}": {"spearman": _agg(*s, n=128)} for i, s in enumerate(spearmans)},
      "synthetic": {"coupling 0": {"scales": list(scales), "max_abs_diff": list(sweep)}}})


def test_t1_error_grows_with_the_perturbation_supported():
  assert _t1([(0.6, 0.5, 0.7), (0.4, 0.2, 0.6)]).verdict == claims.SUPPORTED


def test_t1_borderline_each_way_on_the_spearman_ci():
  assert _t1([(0.6, 0.5, 0.7), (0.2, 1e-3, 0.4)]).verdict == claims.SUPPORTED
  assert _t1([(0.6, 0.5, 0.7), (0.2, -1e-3, 0.4)]).verdict == claims.NOT_SUPPORTED
  assert _t1([(-0.6, -0.7, -0.5), (-0.4, -0.6, -0.2)]).verdict == claims.OPPOSITE


def test_t1_two_channel_condition():
  ok = [(0.6, 0.5, 0.7)]
  assert _t1(ok, sweep=(1e-5, 1e-3, 0.1, 0.1)).verdict == claims.SUPPORTED     # flat is fine
  assert _t1(ok, sweep=(1e-5, 1e-2, 1e-3, 0.6)).verdict == claims.NOT_SUPPORTED
  # scales out of order are sorted first
  assert _t1(ok, sweep=(0.6, 1e-5), scales=(10.0, 1e-4)).verdict == claims.SUPPORTED
  assert _t1(ok, sweep=()).verdict == claims.UNTESTED


def test_spearman_estimate_matches_scipy_and_covers_the_truth():
  from scipy.stats import spearmanr
  rng = np.random.default_rng(0)
  x = rng.normal(size=200)
  y = x + rng.normal(size=200)
  est = stats.spearman_estimate(np.r_[x, np.nan], np.r_[y, 1.0], n_resamples=200)
  assert est.value == pytest.approx(spearmanr(x, y)[0])
  assert est.n == 200 and est.n_excluded == 1 and est.ci_low < est.value < est.ci_high
  assert stats.spearman_estimate(x, np.ones_like(x), n_resamples=50).value is None   # constant


def test_all_verdicts_reads_a_bounds_json_dict():
  rep = _report(ETAS, [(b - 0.1, b - 0.15, b - 0.05) for b in BOUND], BOUND)
  res = {"t1": {"trained": {"m": {"spearman": _agg(0.5, 0.3, 0.7)}},
                "synthetic": {"coupling 0": {"scales": [1.0], "max_abs_diff": [0.1]}}},
         "t2": {"points": [], "paired": {}},
         "t3": {"reports": {"δ=0": rep}, "reports_alt_c": {"δ=0": rep}}}
  out = verdicts.as_json(verdicts.all_verdicts(res))
  assert [v["claim"] for v in out] == ["T1", "T2", "T3", "T3 (alternative ĉ)"]
  assert [v["verdict"] for v in out] == [claims.SUPPORTED, claims.UNTESTED,
                                         claims.SUPPORTED, claims.SUPPORTED]
  # a markdown row per claim: no '|' inside a cell
  rows = [r for r in claims.table(verdicts.all_verdicts(res)).splitlines() if r.startswith("| T")]
  assert len(rows) == 4 and all(r.count("|") == 5 for r in rows), rows
