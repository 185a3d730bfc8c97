"""benchmarks/scale_bench.py: the analytic FLOP count, the grid's cost accounting and
the device-hour formula, on small or stubbed inputs (no timing).

Shape legend: B batch, N context length.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

import architectures
from benchmarks import scale_bench as sb


@pytest.mark.parametrize("family", architectures.FAMILIES)
def test_analytic_forward_flops_match_the_compiler_within_2x(family):
  model = architectures.build_model(
      dict(family=family, preset="p100k", overrides=sb.ACCELERATOR_MODEL), vocab_size=60,
      context_len=64, num_passages=4, query_len=5, answer_len=2)
  params = jax.eval_shape(lambda: architectures.init_params(model, jax.random.PRNGKey(0)))
  x = jax.eval_shape(lambda: architectures.dummy_inputs(model.spec, 4))
  compiled = jax.jit(model.apply).lower(params, *x).compile(sb.COST_ONLY)
  ratio = sb._cost(compiled)["flops"] / 4 / sb.analytic_forward_flops(model.spec)
  assert 0.5 <= ratio <= 2.0, ratio


def test_cost_only_compile_keeps_the_cost_analysis():
  model = architectures.build_model(
      dict(family="memory_port", preset="p100k"), vocab_size=60, context_len=32,
      num_passages=4, query_len=5, answer_len=2)
  params = jax.eval_shape(lambda: architectures.init_params(model, jax.random.PRNGKey(0)))
  lowered = jax.jit(model.apply).lower(params, *jax.eval_shape(
      lambda: architectures.dummy_inputs(model.spec, 2)))
  assert sb._cost(lowered.compile(sb.COST_ONLY)) == sb._cost(lowered.compile())


def test_grid_cost_adds_up_per_cell():
  """Stub costs: the totals are the hand-computed sums over the main grid's cells."""
  cells = sb.grid_cells("main")
  assert len(cells) == 972
  step = lambda c: {"flops": 1e9 * (2 if c.cer.regularizer != "none" else 1), "bytes": 1e6}
  fwd = lambda preset, family, n: {"flops": float(n), "bytes": 2.0 * n}
  g = sb.grid_cost(cells, step, fwd)
  assert g["invalid"] == [] and g["total"]["cells"] == 972
  c = cells[0].config
  steps = int(c.train.num_steps)
  n_cer = sum(x.config.cer.regularizer != "none" for x in cells)
  np.testing.assert_allclose(g["total"]["train_flops"], steps * 1e9 * (972 + n_cer), rtol=1e-12)
  evals = steps // int(c.train.eval_every)
  per_eval = int(c.eval.num_examples) * len(c.eval.corruptions) * sb.FWD_PER_AUDITED
  want_eval = sum(evals * per_eval * int(x.config.data.context_len) for x in cells)
  np.testing.assert_allclose(g["total"]["eval_flops"], want_eval, rtol=1e-12)
  assert {f: g[f]["cells"] for f in architectures.FAMILIES} == {f: 324 for f in
                                                                 architectures.FAMILIES}
  hours = g["total"]["hours"]["H100 SXM"]
  assert hours["roofline_h"] >= hours["compute_bound_h"] > 0


def test_device_hours_formula():
  h = sb.device_hours(989e12 * 0.3 * 3600, 0.0)["H100 SXM"]
  assert h == pytest.approx({"compute_bound_h": 1.0, "roofline_h": 1.0})
  h = sb.device_hours(0.0, 819e9 * 0.3 * 7200)["TPU v5e"]
  assert h == pytest.approx({"compute_bound_h": 0.0, "roofline_h": 2.0})
