"""T3 (upper bound): the formula, the α/γ/c estimators and violation listing."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ceu_jax.metrics.resampling import Aggregate
from ceu_jax.theory import upper_bound as t3


def test_bound_formula_hand_computed():
  # η=0.1, α=0.5, γ=2, c=1: 0.1 + 0.9 e^{-1}
  assert t3.t3_bound(0.1, 0.5, 2.0, 1.0) == pytest.approx(0.1 + 0.9 * math.exp(-1))
  assert t3.t3_bound(0.0, 1.0, 1.0, math.log(4)) == pytest.approx(0.25)
  assert t3.t3_bound(1.0, 0.3, 5.0, 2.0) == pytest.approx(1.0)
  assert t3.t3_bound(0.5, 0.0, 3.0, 1.0) == pytest.approx(1.0)   # no usage
  assert t3.t3_bound(0.2, 0.0, 3.0, math.inf) == pytest.approx(1.0)
  assert t3.t3_bound(0.2, 0.5, 3.0, math.inf) == pytest.approx(0.2)
  etas = np.array([0.0, 0.2, 0.4])
  np.testing.assert_allclose(t3.t3_bound(etas, 0.8, 1.5, 2.0),
                             etas + (1 - etas) * math.exp(-2.4))


def test_bound_band_orders():
  a, g, c = (Aggregate(v, v - 0.1, v + 0.1, 100) for v in (0.6, 2.0, 1.0))
  point, lo, hi = t3.t3_bound_band(np.linspace(0, 1, 5), a, g, c)
  assert np.all(lo <= point) and np.all(point <= hi)
  np.testing.assert_allclose(hi, t3.t3_bound(np.linspace(0, 1, 5), 0.5, 1.9, 0.9))


def test_alpha_recovers_mean_and_excludes():
  rng = np.random.default_rng(0)
  ceu = np.clip(rng.beta(4, 2, size=4000), 0, 1)       # mean 2/3
  present = rng.random(4000) < 0.8
  ceu_with_junk = np.where(present, ceu, 0.0)
  degenerate = rng.random(4000) < 0.05
  est = t3.estimate_alpha(ceu_with_junk, present, degenerate)
  assert est.contains(2 / 3)
  assert est.ci_high - est.ci_low < 0.03
  assert est.n == int((present & ~degenerate).sum())
  assert est.n + est.n_excluded == 4000


def test_gamma_recovers_swap_margin_and_by_delta():
  rng = np.random.default_rng(1)
  n = 3000
  deltas = rng.choice([0.0, 0.25, 0.5], size=n)
  true_gamma = {0.0: 3.0, 0.25: 2.0, 0.5: 1.0}
  drop = np.array([true_gamma[d] for d in deltas]) + rng.normal(0, 0.5, n)
  clean = rng.normal(2.0, 1.0, n)
  est = t3.gamma_by_delta(clean, clean - drop, deltas)
  for d, g in true_gamma.items():                      # 4 standard errors
    assert abs(est[d].value - g) < 4 * 0.5 / math.sqrt(est[d].n), (d, est[d])
    assert est[d].ci_low < est[d].value < est[d].ci_high
  pooled = t3.estimate_gamma(clean, clean - drop, level=0.999)
  assert pooled.contains(2.0)


def test_logit_margin():
  z = np.array([[2.0, 1.0, -1.0], [0.0, 3.0, 1.0]])
  np.testing.assert_allclose(t3.logit_margin(z, [0, 0]), [1.0, -3.0])
  zz = np.stack([z, z[::-1]], axis=1)                  # [2, A=2, 3]
  np.testing.assert_allclose(t3.logit_margin(zz, [[0, 1], [0, 1]]),
                             [1.0, -3.0])


@pytest.mark.parametrize("true_c", [0.4, 1.0, 2.5])
def test_c_mle_recovers_known_constant(true_c):
  rng = np.random.default_rng(int(10 * true_c))
  m = rng.uniform(0.05, 4.0 / true_c, size=3000)
  err = rng.random(3000) < np.exp(-true_c * m)
  est = t3.estimate_c(m, err, n_resamples=300, level=0.999)
  assert est.contains(true_c), est
  assert abs(est.value - true_c) < 0.1 * true_c


def test_c_excludes_nonpositive_margins_and_envelope_is_conservative():
  rng = np.random.default_rng(5)
  m = np.concatenate([rng.uniform(0.05, 3, 2000), -rng.uniform(0, 1, 50)])
  err = rng.random(m.size) < np.exp(-np.maximum(m, 0))
  mle = t3.estimate_c(m, err, n_resamples=200)
  env = t3.estimate_c(m, err, method="envelope", n_resamples=200)
  assert mle.n_excluded == 50 and mle.n == 2000
  assert env.value <= mle.value * 1.05
  assert 0.5 < env.value < 1.5


def test_c_edge_cases():
  assert t3.fit_c_mle([1.0, 2.0], [0, 0]) == math.inf
  assert t3.fit_c_mle([1.0, 2.0], [1, 1]) == 0.0
  # one error at m=1, one success at m=1: p = 1/2 -> c = log 2
  assert t3.fit_c_mle([1.0, 1.0], [1, 0]) == pytest.approx(math.log(2))


def test_unsupported_indicator():
  flags = t3.unsupported(correct=[1, 1, 0, 1], ceu_ev=[0.9, 0.2, 0.9, 0.9],
                         evidence_present=[1, 1, 1, 0], tau=0.5)
  np.testing.assert_array_equal(flags, [False, True, True, True])


def test_violations_are_all_listed():
  etas = np.array([0.0, 0.1, 0.2, 0.3])
  bounds = t3.t3_bound(etas, 0.8, 2.0, 1.0)            # 0.2019 at η=0
  rates = [Aggregate(0.10, 0.08, 0.12, 500),            # below
           Aggregate(0.40, 0.35, 0.45, 500),            # above, significant
           Aggregate(0.37, 0.30, 0.45, 500),            # above, not significant
           Aggregate(0.20, 0.15, 0.25, 500)]            # below
  viol = t3.bound_violations(etas, rates, bounds)
  assert [v.eta for v in viol] == [0.1, 0.2]
  assert viol[0].significant and not viol[1].significant
  assert viol[1].excess == pytest.approx(0.37 - bounds[2])
  assert viol[0].rate == 0.40
  rep = t3.t3_report(etas, rates, *(Aggregate(v, v, v, 10) for v in (0.8, 2.0, 1.0)))
  assert len(rep.violations) == 2 and "η=0.1" in rep.summary()
  by_delta = t3.t3_reports_by_delta(
      etas, {0.0: rates, 0.5: rates}, Aggregate(0.8, 0.8, 0.8, 10),
      {0.0: Aggregate(2.0, 2.0, 2.0, 10), 0.5: Aggregate(0.5, 0.5, 0.5, 10)},
      Aggregate(1.0, 1.0, 1.0, 10))
  assert list(by_delta) == ["δ=0", "δ=0.5"]
  assert len(by_delta["δ=0.5"].violations) <= len(by_delta["δ=0"].violations)


def test_synthetic_pipeline_respects_bound():
  """Data drawn from the bound's own model: no significant violation."""
  rng = np.random.default_rng(7)
  alpha, gamma, c = 0.7, 2.0, 1.2
  etas = np.array([0.0, 0.1, 0.3, 0.5])
  flags = []
  for eta in etas:
    present = rng.random(2000) >= eta
    err = rng.random(2000) < math.exp(-c * alpha * gamma) * 0.9
    flags.append(~present | err)
  rates = t3.rate_by_eta(flags)
  est = [Aggregate(v, v, v, 1) for v in (alpha, gamma, c)]
  rep = t3.t3_report(etas, rates, *est)
  assert not any(v.significant for v in rep.violations)


def test_estimators_give_the_numbers_they_gave_before_the_one_aggregate_type():
  """ĉ, means and the T2 slope on fixed inputs equal, to the last bit, what the theory's
  own bootstrap (`theory.stats.Estimate`, `bootstrap_ci`, before #34) gave."""
  from ceu_jax.theory import lower_bound, stats
  rng = np.random.default_rng(123)
  m = rng.gamma(2.0, 0.5, size=300)
  e = (rng.random(300) < np.exp(-1.3 * m)).astype(float)
  m[:7], m[7] = -0.1, np.nan
  few = np.zeros(300)
  few[[3, 50, 120]] = 1.0                    # resamples without an error: ĉ = inf
  got = lambda a: (a.value, a.ci_low, a.ci_high, a.n, a.n_excluded, a.note)
  assert got(t3.estimate_c(m, e, n_resamples=500, seed=3)) == (
      1.2409507116036111, 1.0455179683781384, 1.465067160331417, 292, 8, "method=mle")
  assert got(t3.estimate_c(m, few, n_resamples=400)) == (
      15.202855364599566, 9.704737939139207, math.inf, 292, 8, "method=mle")
  assert got(t3.estimate_c(m, e, method="envelope", n_resamples=500, seed=3)) == (
      1.0924222076134846, 0.3107943098830785, 1.1452989176014186, 292, 8, "method=envelope")
  assert got(t3.estimate_c(m, few, method="envelope", n_resamples=400)) == (
      7.712986111518713, 4.343926190251031, math.inf, 292, 8, "method=envelope")
  assert got(t3.estimate_c([0.5, -1.0], [1, 0])) == (0.0, None, None, 1, 1, "method=mle")
  x = rng.random(4000)
  x[::17] = np.nan
  assert got(stats.mean_estimate(x, rng.random(4000) < 0.8, n_resamples=300, seed=5)) == (
      0.4937248687565373, 0.4843501649589227, 0.5032827418198734, 3061, 939, "")
  assert got(stats.mean_estimate([0.3, 0.5], [True, False])) == (0.3, None, None, 1, 1, "")
  assert got(stats.mean_estimate([np.nan, 0.5], [True, False])) == (
      None, None, None, 0, 2, "no examples")
  assert got(stats.rate_estimate(rng.random(900) < 0.3, seed=1)) == (
      0.3011111111111111, 0.2733333333333333, 0.33111111111111113, 900, 0, "")
  xs, ys = [0.2, 0.45, 0.5, 0.71, 0.9], [0.1, 0.3, 0.2, 0.5, 0.65]
  point = lambda i, a, b: lower_bound.ModelPoint(
      f"m{i}", stats.mean_estimate([a, a]), stats.mean_estimate([b, b]), 0.5, 0.4)
  s = lower_bound.t2_summary([point(i, a, b) for i, (a, b) in enumerate(zip(xs, ys))],
                             n_resamples=700, seed=2)
  assert (s["slope"], s["slope_lo"], s["slope_hi"]) == (
      0.6614635226392118, 0.4792332268370607, 0.715743161384939)
  xs[1] = np.nan                             # a model without a CEU mean: NaN resamples left out
  s = lower_bound.t2_summary([point(i, a, b) for i, (a, b) in enumerate(zip(xs, ys))], seed=4)
  assert math.isnan(s["slope"])
  assert (s["slope_lo"], s["slope_hi"]) == (0.43902439024390255, 0.7169449130358908)
