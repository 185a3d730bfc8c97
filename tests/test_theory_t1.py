"""T1 (identifiability) on the exact two-channel model."""
from __future__ import annotations

import numpy as np
import pytest

from ceu_jax.theory import identifiability as t1
from ceu_jax.theory import two_channel as tc

SCALES = np.geomspace(1e-3, 3.0, 8)


def test_t1_difference_vanishes_as_perturbation_shrinks():
  model = tc.make_two_channel(num_classes=8, dim=16, other_coupling=0.0)
  sweep = tc.t1_sweep(model, SCALES, num_examples=256)
  err = tc.sweep_max_abs_diff(sweep)
  assert err[0] <= 1e-3
  assert np.all(np.diff(err) > 0), err          # grows with the perturbation
  assert err[-1] > 10 * err[0]
  for _, res in sweep:                            # logit space is exact
    assert res.n_degenerate == 0
    np.testing.assert_allclose(res.calibration, 0.0, atol=1e-9)


def test_t1_logit_fraction_is_the_true_share():
  model = tc.make_two_channel(other_coupling=0.5, seed=3)
  swaps = tc.sample_swaps(model, 64, seed=1)
  z_plus, z_minus, z_int = tc.run_swaps(model, swaps, 0.7)
  res = t1.t1_from_logits(z_plus, z_minus, z_int, np.zeros(64, int))
  np.testing.assert_allclose(res.r_logit, swaps.r_true, atol=1e-9)
  np.testing.assert_allclose(res.perturbation,
                             np.abs(z_plus - z_minus).max(axis=-1))


@pytest.mark.parametrize("coupling", [0.0, 0.3, 1.0])
def test_t1_decomposition_and_remainder_bound(coupling):
  model = tc.make_two_channel(other_coupling=coupling, seed=1)
  for _, res in tc.t1_sweep(model, SCALES, num_examples=128, seed=2):
    np.testing.assert_allclose(res.diff, res.calibration + res.remainder,
                               atol=1e-12)
    assert np.all(np.abs(res.remainder) <= res.remainder_bound + 1e-12)


def test_t1_with_coupled_logits_converges_to_calibration_term():
  model = tc.make_two_channel(other_coupling=1.0, seed=0)
  sweep = tc.t1_sweep(model, SCALES, num_examples=128)
  rem = [np.nanmax(np.abs(r.remainder)) for _, r in sweep]
  assert rem[0] < 1e-3 and np.all(np.diff(rem) > 0)
  cal = sweep[0][1].calibration
  assert np.nanmax(np.abs(cal)) > 1e-2           # a real, non-vanishing term
  np.testing.assert_allclose(sweep[0][1].diff, cal, atol=1e-3)


def test_scalar_interface_matches_logit_interface_and_flags_degenerate():
  rng = np.random.default_rng(0)
  zp, zm, zi = (rng.normal(size=(5, 2, 6)) for _ in range(3))
  zp[0] = zm[0]                                    # zero gap: degenerate
  gold = rng.integers(0, 6, size=(5, 2))
  full = t1.t1_from_logits(zp, zm, zi, gold)
  scal = t1.t1_from_scalars(
      t1.gold_logit(zp, gold), t1.gold_logit(zm, gold), t1.gold_logit(zi, gold),
      t1.gold_loglik(zp, gold), t1.gold_loglik(zm, gold),
      t1.gold_loglik(zi, gold))
  assert full.degenerate[0] and full.n_degenerate == 1
  assert np.isnan(full.diff[0]) and np.isnan(scal.diff[0])
  np.testing.assert_allclose(full.diff[1:], scal.diff[1:], atol=1e-12)


def test_gold_loglik_matches_jax_likelihood():
  import jax.numpy as jnp
  from ceu_jax import likelihood
  rng = np.random.default_rng(1)
  z = rng.normal(size=(3, 4, 7)).astype(np.float32)
  y = rng.integers(1, 7, size=(3, 4))   # token 0 is [PAD] for ceu_jax.likelihood (not counted)
  ref = np.asarray(likelihood.gold_loglik(jnp.asarray(z), jnp.asarray(y)))
  np.testing.assert_allclose(t1.gold_loglik(z, y), ref, rtol=1e-5)


def test_error_curve_bins():
  pert = np.geomspace(1e-3, 1.0, 100)
  curve = t1.t1_error_curve(pert, 0.1 * pert, n_bins=5)
  assert curve["n"].sum() == 100
  assert np.all(np.diff(curve["median"]) > 0)
