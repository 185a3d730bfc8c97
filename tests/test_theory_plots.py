"""The three theory plots write non-empty PNG and PDF files atomically."""
from __future__ import annotations

import os

import numpy as np

from ceu_jax.theory import lower_bound as t2
from ceu_jax.theory import plots
from ceu_jax.theory import two_channel as tc
from ceu_jax.theory import upper_bound as t3
from ceu_jax.metrics.resampling import Aggregate


def _check(paths, tmp_path):
  assert [os.path.splitext(p)[1] for p in paths] == [".png", ".pdf"]
  for p in paths:
    assert os.path.getsize(p) > 1000
  assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp_")]


def test_plot_t1(tmp_path):
  model = tc.make_two_channel(other_coupling=0.0)
  sweep = tc.t1_sweep(model, np.geomspace(1e-3, 3, 6), num_examples=32)
  paths = plots.plot_t1([r for _, r in sweep], str(tmp_path / "t1"))
  _check(paths, tmp_path)


def test_plot_t2(tmp_path):
  rng = np.random.default_rng(0)
  points = []
  for i, c in enumerate([0.3, 0.6, 0.9]):
    ceu = rng.uniform(c - 0.1, c + 0.1, 200)
    adv = rng.random(200) >= 0.5 * (1 - c)
    points.append(t2.t2_model_point(f"model {i}", ceu, np.ones(200), adv,
                                    n_resamples=100))
  summary = t2.t2_summary(points, n_resamples=100)
  _check(plots.plot_t2(points, str(tmp_path / "t2.png"), summary), tmp_path)


def test_plot_t3_with_gamma_by_delta(tmp_path):
  etas = np.array([0.0, 0.2, 0.4])
  rates = [Aggregate(0.1, 0.05, 0.15, 100), Aggregate(0.5, 0.4, 0.6, 100),
           Aggregate(0.45, 0.4, 0.5, 100)]
  a, c = Aggregate(0.7, 0.6, 0.8, 100), Aggregate(1.0, 0.8, 1.2, 100)
  reps = {f"δ={d}": t3.t3_report(etas, rates, a, Aggregate(g, g - .2, g + .2, 50), c)
          for d, g in [(0.0, 3.0), (0.5, 1.5)]}
  assert any(r.violations for r in reps.values())
  _check(plots.plot_t3(reps, str(tmp_path / "t3")), tmp_path)
