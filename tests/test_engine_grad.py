"""Gradients of the mean unclipped CEU w.r.t. parameters against central
finite differences in float64 (inside ``jax.enable_x64``; jit caches are keyed
on it, so nothing leaks into float32 tests).

Shape legend: K probes, B batch, N context tokens.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from ceu_jax import engine
from ceu_jax.engine import Site

try:
  from tests.test_engine_toys import make
except ImportError:  # tests/ not a package
  from test_engine_toys import make


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def test_unclipped_ceu_gradients_match_finite_differences():
  with jax.enable_x64(True):
    _grad_check()


def _grad_check() -> None:
  # Seed 13 has gaps of about 2.1 and 1.5 (no ε clamp).
  model, v, clean, corrupt, ll, _ = make("attn", layers=1, b=2, n=6, seed=13)
  v = jax.jit(lambda v: jax.tree.map(lambda w: w.astype(jnp.float64), v))(v)
  span = np.zeros((3, 2, 6), bool)
  span[0, :, 1:3] = span[1, :, 3:] = span[2] = True
  probes = engine.Probes(span=jnp.asarray(span),
                         ports=jnp.array([[1, 0], [1, 1], [0, 1]], bool))

  def loss(variables):   # chunk_size=2: the lax.map + hoisting path
    r = engine.audit(ll, variables, clean=clean, corrupt=corrupt, site=Site("block_0/retrieval"),
                     probes=probes, chunk_size=2, eps=1e-3)
    return r.ceu_unclipped.mean(), r.delta_L

  flat, unravel = ravel_pytree(v)
  f = jax.jit(lambda x: loss(unravel(x))[0])
  (value, gap), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(v)
  assert float(jnp.min(gap)) > 1e-2, gap    # no ε-clamped gaps
  g = np.asarray(jax.jit(lambda t: ravel_pytree(t)[0])(grads))
  rng = np.random.default_rng(0)
  step = 1e-6
  for _ in range(3):
    d = rng.normal(size=flat.shape)
    fd = (f(flat + step * d) - f(flat - step * d)) / (2 * step)
    np.testing.assert_allclose(g @ d, float(fd), rtol=1e-6, atol=1e-8)
  assert np.isfinite(float(value))
