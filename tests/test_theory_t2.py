"""T2 (lower bound): the adversarial search on toy scorers, and summaries."""
from __future__ import annotations

import numpy as np
import pytest

from ceu_jax.theory import lower_bound as t2


def _additive_scorer(weights, base=5.0):
  return lambda cand: base + sum(weights[j] for j in cand)


def test_greedy_finds_worst_set_of_additive_scorer():
  w = np.array([0.3, -1.2, 0.1, -0.4, -2.0, 0.8, -0.05, -0.7])
  res = t2.adversarial_search(_additive_scorer(w), len(w), budget=3)
  assert res.worst_set == (1, 4, 7)
  assert res.worst_score == pytest.approx(5.0 - 3.9)
  assert res.drop == pytest.approx(3.9)
  exact = t2.exhaustive_search(_additive_scorer(w), len(w), budget=3)
  assert exact.worst_set == res.worst_set


def test_search_stops_adding_harmless_candidates():
  w = np.array([-1.0, 0.5, 0.7])                       # only one helps
  res = t2.adversarial_search(_additive_scorer(w), 3, budget=3)
  assert res.worst_set == (0,)
  assert res.best_by_size == pytest.approx((5.0, 4.0, 4.5, 5.2))


def _trap_scorer(cand):
  """Greedy trap: 0 is the best single, but {1, 2} together are far worse."""
  singles = {0: -1.0, 1: -0.9, 2: -0.9, 3: -0.2}
  s = sum(singles[j] for j in cand)
  if 1 in cand and 2 in cand:
    s -= 1.2
  return np.array([s, s + 0.5])                        # array: reduced by mean


def test_beam_escapes_greedy_trap_and_matches_exhaustive():
  greedy = t2.adversarial_search(_trap_scorer, 4, budget=2)
  beam = t2.adversarial_search(_trap_scorer, 4, budget=2, beam_width=3)
  exact = t2.exhaustive_search(_trap_scorer, 4, budget=2)
  assert exact.worst_set == (1, 2)
  assert greedy.worst_set == (0, 1)
  assert beam.worst_set == exact.worst_set
  assert beam.worst_score == pytest.approx(exact.worst_score)
  assert beam.n_evals < 4 + 6 + 1 + 2                  # fewer than all sets + slack


def test_adversarial_correct_from_margin_scorers():
  margins = [np.array([0.5, -0.2, -0.1]), np.array([-1.0, -0.1, 0.0])]
  res = [t2.adversarial_search(_additive_scorer(w, base=b), 3, budget=2)
         for w, b in zip(margins, [0.25, 2.0])]
  np.testing.assert_array_equal(t2.adversarial_correct(res), [False, True])


def test_admissible_and_max_evals_are_respected():
  w = np.array([-1.0, -2.0, -3.0, -4.0])
  res = t2.adversarial_search(_additive_scorer(w), 4, budget=2,
                              admissible=lambda c: 3 not in c)
  assert 3 not in res.worst_set and res.worst_set == (1, 2)
  capped = t2.adversarial_search(_additive_scorer(w), 4, budget=4, max_evals=3)
  assert capped.n_evals <= 3


def test_ordered_search_distinguishes_order():
  score = lambda cand: 0.0 if cand == () else (-2.0 if cand == (1, 0) else -1.0)
  res = t2.adversarial_search(score, 2, budget=2, ordered=True, beam_width=2)
  assert res.worst_set == (1, 0)


def test_model_points_and_summary_recover_known_slope():
  rng = np.random.default_rng(0)
  points = []
  for i, mean_ceu in enumerate([0.2, 0.4, 0.6, 0.8, 0.95]):
    n = 4000
    ceu = np.clip(rng.normal(mean_ceu, 0.05, n), 0, 1)
    clean = np.ones(n, bool)
    adv = rng.random(n) >= 0.5 * (1 - mean_ceu)        # drop = 0.5 (1 − CEU)
    points.append(t2.t2_model_point(f"m{i}", ceu, clean, adv))
  for p in points:
    assert p.drop.ci_low < p.drop.value < p.drop.ci_high
    assert p.clean_accuracy == 1.0
  summary = t2.t2_summary(points)
  assert summary["slope"] == pytest.approx(0.5, abs=0.05)
  assert summary["slope_lo"] <= summary["slope"] <= summary["slope_hi"]
  assert summary["spearman"] == pytest.approx(1.0)
  assert summary["n_models"] == 5


def test_model_point_excludes_unsupported_and_degenerate():
  ceu = np.array([0.5, 0.5, 0.0, 1.0])
  sup = np.array([True, True, True, False])
  deg = np.array([False, False, True, False])
  p = t2.t2_model_point("m", ceu, [1, 1, 1, 1], [1, 0, 1, 1], sup, deg)
  assert p.one_minus_ceu.value == pytest.approx(0.5)
  assert p.one_minus_ceu.n == 2 and p.one_minus_ceu.n_excluded == 2
  assert p.drop.value == pytest.approx(1 / 3) and p.drop.n == 3
