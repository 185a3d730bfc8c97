"""The chunked selective scans (architectures/ssm_scan.py, issue #37) against the
sequential `lax.scan` reference: values and gradients at 1e-5 (float32), chunk sizes
that do and do not divide the length, one chunk, one position per chunk, restarts.

Shape legend: B batch, L scanned positions, c channels, s state size, P read slots.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import architectures
from architectures import ssm, ssm_scan

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound

TOL = dict(atol=1e-5, rtol=1e-5)
FACTORS = ("dt", "dtx", "b_in", "rate")
CHUNKED_FACTORS = ("dt", "x", "b_in", "rate")   # the chunked readout takes Δ and x apart


def _gates(seed: int, b: int, l: int, c: int, s: int, restarts: bool) -> ssm.Gates:
  k = jax.random.split(jax.random.PRNGKey(seed), 5)
  dt, x = jax.nn.softplus(jax.random.normal(k[0], (b, l, c))), jax.random.normal(k[1], (b, l, c))
  g = ssm.Gates(dt=dt, dtx=dt * x, b_in=jax.random.normal(k[2], (b, l, s)),
                rate=jnp.exp(jax.random.normal(k[3], (c, s))), x=x)
  return g.with_restarts(jax.random.bernoulli(k[4], 0.15, (b, l))) if restarts else g


# ------------------------------------------------------------------ materialised gates

@pytest.mark.parametrize("l,chunk", [(50, None), (50, 7), (48, 8), (13, 20), (5, 1), (1, None)])
@pytest.mark.parametrize("reverse", [False, True])
def test_chunked_scan_equals_sequential_values_and_grads(l, chunk, reverse):
  ka, kb, kw = jax.random.split(jax.random.PRNGKey(l), 3)
  a = jax.random.uniform(ka, (2, l, 3, 4), minval=0.3, maxval=1.0)
  b = jax.random.normal(kb, (2, l, 3, 4))
  w = jax.random.normal(kw, (2, l, 3, 4))
  fast = lambda a, b: jnp.sum(w * ssm_scan.chunked_scan(a, b, reverse, chunk))
  ref = lambda a, b: jnp.sum(w * ssm.sequential_scan(a, b, reverse))
  np.testing.assert_allclose(ssm_scan.chunked_scan(a, b, reverse, chunk),
                             jax.jit(ssm.sequential_scan, static_argnums=2)(a, b, reverse), **TOL)
  for got, want in zip(jax.jit(jax.grad(fast, (0, 1)))(a, b),
                       jax.jit(jax.grad(ref, (0, 1)))(a, b)):
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("l", [50, 2, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_linear_scan_equals_sequential_values_and_grads(l, reverse):
  """The materialised scan with its written-out gradient (the CPU default) against
  autodiff of the sequential `lax.scan`."""
  ka, kb, kw = jax.random.split(jax.random.PRNGKey(l + 7), 3)
  a = jax.random.uniform(ka, (2, l, 3, 4), minval=0.0, maxval=1.0)
  b = jax.random.normal(kb, (2, l, 3, 4))
  w = jax.random.normal(kw, (2, l, 3, 4))
  fast = lambda a, b: jnp.sum(w * ssm_scan.linear_scan(a, b, reverse))
  ref = lambda a, b: jnp.sum(w * ssm.sequential_scan(a, b, reverse))
  np.testing.assert_allclose(jax.jit(ssm_scan.linear_scan, static_argnums=2)(a, b, reverse),
                             jax.jit(ssm.sequential_scan, static_argnums=2)(a, b, reverse), **TOL)
  for got, want in zip(jax.jit(jax.grad(fast, (0, 1)))(a, b),
                       jax.jit(jax.grad(ref, (0, 1)))(a, b)):
    np.testing.assert_allclose(got, want, **TOL)


def test_chunked_scan_broadcast_gates_and_exact_zeros():
  """0/1 gates broadcast over the features (as `segment_suffix` uses them): exact."""
  l = 23
  gate = (jax.random.uniform(jax.random.PRNGKey(0), (2, l, 1)) > 0.3).astype(jnp.float32)
  b = jax.random.uniform(jax.random.PRNGKey(1), (2, l, 5))
  want = ssm.sequential_scan(jnp.broadcast_to(gate, b.shape), b, True)
  np.testing.assert_allclose(ssm_scan.chunked_scan(gate, b, True, 4), want, **TOL)


# ------------------------------------------------------------------ the encoder's readout

def _reference_readout(g: ssm.Gates, c_out: jax.Array) -> jax.Array:
  return jnp.einsum("blcs,bls->blc", ssm.sequential_scan(*g.expand()), c_out)


@pytest.mark.parametrize("l,chunk,gated", [(40, None, True), (40, 6, False), (36, 6, True),
                                            (9, 1, False), (9, 16, True)])
@pytest.mark.parametrize("restarts", [False, True])
def test_chunked_readout_equals_sequential_values_and_grads(l, chunk, gated, restarts):
  """Values and gradients w.r.t. every factor, the readout and the output gate
  (``gated``: y ⊙ gate), 1e-5 (the restart flags are constants: no gradient is
  compared for them)."""
  g = _gates(l, 2, l, 3, 4, restarts)
  c_out = jax.random.normal(jax.random.PRNGKey(7), (2, l, 4))
  w = jax.random.normal(jax.random.PRNGKey(9), (2, l, 3))
  gate = jax.random.normal(jax.random.PRNGKey(11), (2, l, 3)) if gated else jnp.ones((2, l, 3))

  def fast(g, c_out, gate):
    return jnp.sum(w * ssm_scan.chunked_readout(g.dt, g.x, g.b_in, g.rate, g.keep, c_out,
                                                chunk, gate=gate if gated else None))

  ref = lambda g, c_out, gate: jnp.sum(           # Δx from Δ and x: gradients reach both
      w * _reference_readout(g.replace(dtx=g.dt * g.x), c_out) * gate)
  np.testing.assert_allclose(jax.jit(fast)(g, c_out, gate), jax.jit(ref)(g, c_out, gate),
                             **TOL)
  (got_g, got_c, got_gate), (want_g, want_c, want_gate) = (
      jax.jit(jax.grad(fast, (0, 1, 2)))(g, c_out, gate),
      jax.jit(jax.grad(ref, (0, 1, 2)))(g, c_out, gate))
  np.testing.assert_allclose(got_c, want_c, **TOL, err_msg="c_out")
  if gated:
    np.testing.assert_allclose(got_gate, want_gate, **TOL, err_msg="gate")
  for name in CHUNKED_FACTORS:
    np.testing.assert_allclose(getattr(got_g, name), getattr(want_g, name), **TOL,
                               err_msg=name)


def test_chunked_readout_long_decay_underflows_to_zero():
  """Gate products that underflow float32 give 0, never inf or nan (no division)."""
  g = _gates(3, 1, 300, 2, 3, False)
  dt = g.dt + 5.0
  g = g.replace(dt=dt, dtx=dt * g.x, rate=g.rate + 20.0)             # Π A ≈ e^{-100} per step
  c_out = jnp.ones((1, 300, 3))
  y = ssm_scan.chunked_readout(g.dt, g.x, g.b_in, g.rate, None, c_out)
  grads = jax.grad(lambda dt: jnp.sum(ssm_scan.chunked_readout(
      dt, g.x, g.b_in, g.rate, None, c_out)))(g.dt)
  assert bool(jnp.isfinite(y).all()) and bool(jnp.isfinite(grads).all())
  np.testing.assert_allclose(y, jax.jit(_reference_readout)(g, c_out), **TOL)


def test_chunked_readout_under_vmap():
  """The engine vmaps the model over probes: the custom gradient batches."""
  g = _gates(4, 2, 20, 3, 4, True)
  c_out = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 20, 4))       # 3 probes
  f = lambda c: jnp.sum(jnp.sin(ssm_scan.chunked_readout(g.dt, g.x, g.b_in, g.rate,
                                                         g.keep, c)))
  ref = lambda c: jnp.sum(jnp.sin(_reference_readout(g, c)))
  np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(f)))(c_out),
                             jax.jit(jax.vmap(jax.grad(ref)))(c_out), **TOL)


# ------------------------------------------------------------------ the read port's contributions

def _layout(kind: str, b: int, n: int, p: int) -> jax.Array:
  rng = np.random.default_rng(0)
  if kind == "blocks":
    ids = np.broadcast_to(np.repeat(np.arange(p), n // p), (b, n)).copy()
  else:
    ids = np.sort(rng.integers(0, p, (b, n)), axis=1)
    if kind == "padded":
      ids[:, -3:] = -1                    # trailing padding
      ids[:, n // 2: n // 2 + 2] = 0      # passage 0 again: two runs feed slot 0
  return jnp.asarray(ids, jnp.int32)


@pytest.mark.parametrize("loop", [False, True], ids=["chunked_sums", "loop_sums"])
@pytest.mark.parametrize("kind", ["blocks", "ragged", "padded"])
def test_gate_contributions_equal_the_suffix_scan_values_and_grads(kind, loop):
  """u_j from the gate factors (exp of segment sums of Δ, the sums by chunked scans or
  by `linear_scan`, 'linear''s path) against `slot_contributions` (the reverse
  `lax.scan` of the materialised gates); every span's states too."""
  b, n, c, s, p = 2, 32, 3, 4, 4
  pid = _layout(kind, b, n, p)
  g = _gates(11, b, n, c, s, False).with_restarts(ssm.passage_starts(pid))
  span = jax.random.bernoulli(jax.random.PRNGKey(2), 0.5, (b, n))
  w = jax.random.normal(jax.random.PRNGKey(3), (b, p, c, s))

  def fast(g):
    con = ssm.gate_slot_contributions(g, pid, p, loop=loop)
    return jnp.sum(w * con.states()) + jnp.sum(w ** 2 * con.states(span)), con.terms

  def ref(g):
    a, bx = g.expand()
    con = ssm.slot_contributions(a, bx, pid, p, True, "sequential")
    return jnp.sum(w * con.states()) + jnp.sum(w ** 2 * con.states(span)), con.terms

  (v_fast, terms), (v_ref, terms_ref) = jax.jit(fast)(g), jax.jit(ref)(g)
  np.testing.assert_allclose(terms, terms_ref, **TOL)
  np.testing.assert_allclose(v_fast, v_ref, **TOL)
  got = jax.jit(jax.grad(lambda g: fast(g)[0]))(g)
  want = jax.jit(jax.grad(lambda g: ref(g)[0]))(g)
  for name in FACTORS:
    np.testing.assert_allclose(getattr(got, name), getattr(want, name), **TOL, err_msg=name)


# ------------------------------------------------------------------ whole model

@pytest.mark.parametrize("impl", ["chunked", "linear"])
def test_ssm_model_equals_sequential_logits_and_grads(impl):
  sizes = dict(vocab_size=40, context_len=26, num_passages=3, query_len=4, answer_len=2)
  over = dict(ssm_inner=8, ssm_state=4, embed_dim=16, reader_mlp_dim=32, reader_heads=2)
  models = {name: architectures.build_model(
      dict(family="ssm", preset="p100k", overrides=dict(over, scan_impl=scan)), **sizes)
      for name, scan in (("chunked", impl), ("sequential", "sequential"))}
  params = architectures.init_params(models["sequential"], jax.random.PRNGKey(0))
  params = jax.tree.map(lambda v: v + 0.05, params)                  # non-zero FiLM etc.
  r = np.random.default_rng(0)
  pid = np.sort(r.integers(0, 3, (2, 26)), axis=1)                    # ragged passages
  x = (jnp.asarray(r.integers(3, 40, (2, 4)), jnp.int32), jnp.asarray(r.integers(3, 40, (2, 26)),
       jnp.int32), jnp.asarray(pid, jnp.int32), jnp.asarray(r.integers(3, 40, (2, 2)), jnp.int32))
  loss = {k: (lambda m: lambda p: jnp.sum(jnp.tanh(m.apply(p, *x))))(m)
          for k, m in models.items()}
  np.testing.assert_allclose(jax.jit(models["chunked"].apply)(params, *x),
                             jax.jit(models["sequential"].apply)(params, *x), **TOL)
  got, want = (jax.jit(jax.grad(loss["chunked"]))(params),
               jax.jit(jax.grad(loss["sequential"]))(params))
  for path, g_leaf in jax.tree_util.tree_leaves_with_path(got):
    w_leaf = want
    for k in path:
      w_leaf = w_leaf[k.key]
    np.testing.assert_allclose(g_leaf, w_leaf, **TOL, err_msg=jax.tree_util.keystr(path))


def test_chunked_programs_hold_no_loop():
  """No `scan`/`while` in the chunked readout's forward or gradient: XLA's cost
  analysis counts a loop body once, and an accelerator pays a launch per iteration."""
  g = _gates(5, 2, 30, 3, 4, True)
  c_out = jnp.ones((2, 30, 4))
  f = lambda g: jnp.sum(g.chunked_readout(c_out))
  text = str(jax.make_jaxpr(jax.grad(f))(g))
  assert " scan[" not in text and " while[" not in text


def test_chunked_readout_needs_the_input_apart_from_its_product():
  g = _gates(6, 1, 10, 2, 3, False).replace(x=None)
  with pytest.raises(ValueError, match="Gates.x is None"):
    g.chunked_readout(jnp.ones((1, 10, 3)))
