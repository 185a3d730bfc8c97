"""Gradients of the mean unclipped CEU w.r.t. parameters against central
finite differences in float64 (run in a subprocess: x64 is process-wide).

Shape legend: K probes, B batch, N context tokens.
"""
from __future__ import annotations

import os
import subprocess
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _grad_check() -> None:
  import jax
  jax.config.update("jax_enable_x64", True)
  import jax.numpy as jnp
  import numpy as np
  sys.path.insert(0, ROOT)
  from ceu_jax import engine
  from tests.test_engine_toys import make

  # Seed 9 with D+/D− swapped has gaps of about 1.5 and 1.1 (no ε clamp).
  model, v, corrupt, clean, ll, _ = make("attn", layers=1, b=2, n=6, seed=9)
  v = jax.tree.map(lambda w: w.astype(jnp.float64), v)
  span = jnp.zeros((3, 2, 6), bool).at[0, :, 1:3].set(True)
  span = span.at[1, :, 3:].set(True).at[2].set(True)
  probes = engine.Probes(span=span, ports=jnp.array([[1, 0], [1, 1], [0, 1]],
                                                    bool))

  def loss(variables):   # chunk_size=2: the lax.map + hoisting path
    r = engine.audit(ll, variables, clean, corrupt, "block_0/retrieval",
                     probes, chunk_size=2, eps=1e-3)
    return r.ceu_unclipped.mean(), r.delta_L

  (value, gap), grads = jax.value_and_grad(loss, has_aux=True)(v)
  assert float(jnp.min(gap)) > 1e-2, gap    # no ε-clamped gaps
  leaves, tree = jax.tree.flatten(v)
  rng = np.random.default_rng(0)
  for trial in range(3):
    d = jax.tree.unflatten(tree, [jnp.asarray(rng.normal(size=l.shape))
                                  for l in leaves])
    step = 1e-6
    plus = jax.tree.map(lambda a, b: a + step * b, v, d)
    minus = jax.tree.map(lambda a, b: a - step * b, v, d)
    fd = (loss(plus)[0] - loss(minus)[0]) / (2 * step)
    an = sum(jnp.vdot(g, x) for g, x in zip(jax.tree.leaves(grads),
                                             jax.tree.leaves(d)))
    np.testing.assert_allclose(float(an), float(fd), rtol=1e-6, atol=1e-8)
  assert np.isfinite(float(value))
  print("grad-check-ok")


def test_unclipped_ceu_gradients_match_finite_differences():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env,
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert out.returncode == 0 and "grad-check-ok" in out.stdout, (
      out.stdout[-3000:] + out.stderr[-3000:])


if __name__ == "__main__":
  _grad_check()
