"""SPEC §1 sanity identities, a closed-form check and an independent reference
for the CEU engine, on toy Flax models (tests/test_engine_toys.py).

Shape legend: K probes, B batch, N context tokens, P ports, T reader positions.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ceu_jax import engine
from ceu_jax.engine import Probes, Site
try:
  from tests.test_engine_toys import make, reference_logliks, toy
except ImportError:  # tests/ not a package
  from test_engine_toys import make, reference_logliks, toy

TOL = 1e-5
SITE = Site("block_1/retrieval")


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def _identity_logliks(port):
  """Everything the identities need, in one compiled call."""
  _, v, clean, corrupt, ll, _ = toy(port)
  n = clean[1].shape[1]
  b = clean[1].shape[0]
  ev = jnp.zeros((b, n), bool).at[:, 2:5].set(True)
  spans = Probes(span=jnp.stack([jnp.ones_like(ev), jnp.zeros_like(ev), ev]))
  ports_all = Probes(ports=jnp.ones((1, 2), bool),
                     positions=jnp.ones((1, 5), bool))

  @jax.jit
  def run(v):
    def il(src, dst, probes):
      return engine.intervened_logliks(ll, v, clean=src, corrupt=dst,
                                       site=SITE, probes=probes)
    return dict(
        L_plus=ll(v, clean), L_minus=ll(v, corrupt),
        self_full=il(clean, clean, Probes())[0],
        self_span=il(clean, clean, spans),
        full=il(clean, corrupt, Probes())[0],
        span=il(clean, corrupt, spans),
        masks_all=il(clean, corrupt, ports_all)[0])
  return run(v)


@pytest.mark.parametrize("port", ["attn", "ssm"])
def test_sanity_identities(port):
  r = _identity_logliks(port)
  gap = r["L_plus"] - r["L_minus"]
  assert float(jnp.abs(gap).min()) > 1e-2          # the corruption matters
  # Patching h(D+) into the run on D+ gives L+ (full site and any span).
  np.testing.assert_allclose(r["self_full"], r["L_plus"], atol=TOL)
  for k in range(3):
    np.testing.assert_allclose(r["self_span"][k], r["L_plus"], atol=TOL)
  # S = all tokens equals the full-site patch; S = ∅ gives L−.
  np.testing.assert_allclose(r["span"][0], r["full"], atol=TOL)
  np.testing.assert_allclose(r["span"][1], r["L_minus"], atol=TOL)
  # All ports at all positions equals the full-site patch.
  np.testing.assert_allclose(r["masks_all"], r["full"], atol=TOL)
  # A partial span moves L_int away from both ends.
  assert not np.allclose(r["span"][2], r["L_minus"], atol=1e-4)


# ---------------------------------------------------------------- closed form

class LinearPort(nn.Module):
  """h = Σ_j a_j E[x_j] with fixed weights a: exact and linear in the span."""
  span_decomposition = "exact"

  @nn.compact
  def read(self, emb, span_mask=None):               # emb [B, N, D]
    a = self.param("a", nn.initializers.zeros, (emb.shape[1],))
    if span_mask is not None:
      emb = emb * span_mask[..., None].astype(emb.dtype)
    return jnp.einsum("n,bnd->bd", a, emb)[:, None, None]   # [B, 1, 1, D]


class TwoChannel(nn.Module):
  """gold logit = ⟨w, h_f⟩ + ℓ_par(q) (SPEC §7)."""

  @nn.compact
  def __call__(self, query, context):
    emb = self.param("E", nn.initializers.zeros, (8, 2))
    w = self.param("w", nn.initializers.zeros, (2,))
    u = self.param("u", nn.initializers.zeros, (8,))
    h = LinearPort(name="retrieval").read(emb[context])
    return jnp.einsum("btpd,d->b", h, w) + u[query[:, 0]]


def two_channel():
  model = TwoChannel()
  emb = np.zeros((8, 2), np.float32)
  emb[1], emb[2], emb[3], emb[4] = (1, 9), (3, 7), (5, 5), (2, 0)
  emb[5], emb[6] = (1, -1), (-2, 5)
  params = {"E": jnp.array(emb), "w": jnp.array([1.0, 0.0]),
            "u": jnp.arange(8.0) * 0.5,
            "retrieval": {"a": jnp.array([0.1, 0.2, 0.3, 0.4])}}
  query = jnp.array([[3], [7]])
  clean = (query, jnp.array([[1, 2, 3, 4], [1, 2, 3, 4]]))
  corrupt = (query, jnp.array([[1, 5, 3, 6], [1, 5, 3, 6]]))

  def loglik_fn(v, inputs):
    return model.apply(v, *inputs)

  return {"params": params}, clean, corrupt, loglik_fn


def test_closed_form_two_channel():
  v, clean, corrupt, ll = two_channel()
  # w·(E[2]−E[5]) = 2 at a=0.2, w·(E[4]−E[6]) = 4 at a=0.4 → gap 0.4+1.6 = 2.0.
  spans = jnp.array([[0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1]],
                    bool)
  probes = engine.span_probes(jnp.broadcast_to(spans[:, None], (4, 2, 4)),
                              names=("s1", "s3", "unchanged", "both"))
  res = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=Site("retrieval"), probes=probes)
  np.testing.assert_allclose(res.delta_L, [2.0, 2.0], atol=TOL)
  want = np.array([0.2, 0.8, 0.0, 1.0])[:, None]
  np.testing.assert_allclose(res.ceu, np.broadcast_to(want, (4, 2)), atol=TOL)
  np.testing.assert_allclose(res.attrib, np.broadcast_to(want, (4, 2)), atol=TOL)
  # ℓ_par(q) cancels: L+ carries u[q] = 1.5 and 3.5.
  np.testing.assert_allclose(res.L_plus - res.L_minus, 2.0, atol=TOL)
  assert not bool(res.degenerate.any())
  assert not res.approximate


def test_multi_evidence_on_linear_model_has_no_interaction():
  v, clean, corrupt, ll = two_channel()
  items = jnp.zeros((3, 2, 4), bool)
  items = items.at[0, :, 1].set(True).at[1, :, 3].set(True)
  items = items.at[2, 0, 0].set(True)          # example 1 has only 2 items
  probes, layout = engine.multi_evidence_probes(items, pair_budget=2)
  assert layout.pairs == ((0, 1), (0, 2))
  res = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=Site("retrieval"), probes=probes)
  agg = engine.aggregate(res, layout, items)
  np.testing.assert_allclose(agg.per_item[:2], [[0.2, 0.2], [0.8, 0.8]],
                             atol=TOL)
  np.testing.assert_allclose(agg.max, [0.8, 0.8], atol=TOL)
  np.testing.assert_allclose(agg.mean, [1.0 / 3, 0.5], atol=TOL)
  np.testing.assert_allclose(agg.grouped, [1.0, 1.0], atol=TOL)
  # Linear in the span: inclusion–exclusion interactions vanish.
  np.testing.assert_allclose(agg.interaction[0], [0.0, 0.0], atol=TOL)
  assert bool(agg.pair_valid[1, 0]) and not bool(agg.pair_valid[1, 1])
  assert np.isnan(float(agg.interaction[1, 1]))


# -------------------------------------------------------- independent reference

def _random_probes(seed, k, b, n, t, p):
  rng = np.random.default_rng(seed)
  return Probes(span=jnp.asarray(rng.random((k, b, n)) < 0.5),
                ports=jnp.asarray(rng.random((k, p)) < 0.6),
                positions=jnp.asarray(rng.random((k, b, t)) < 0.7))


@pytest.mark.parametrize("port", ["attn", "ssm"])
def test_engine_matches_python_loop_reference(port):
  model, v, clean, corrupt, ll, _ = toy(port)
  b, n = clean[1].shape
  t = clean[0].shape[1] + clean[2].shape[1]
  probes = _random_probes(7, 5, b, n, t, 2)
  # chunk_size=2: three chunks (one padded), lax.map over vmapped chunks.
  got = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE, probes=probes, chunk_size=2)
  for k in range(5):
    want = reference_logliks(model, v, clean, corrupt, 1,
                             span=probes.span[k], ports=probes.ports[k],
                             positions=probes.positions[k])
    np.testing.assert_allclose(got.L_int[k], want, atol=TOL)


def test_a_span_pair_method_is_called_once_and_equals_the_two_reads():
  """docs/conventions.md §3: a port naming a `span_pair_method` gives h and Π_S h from
  one call of it; L_int equals the hand-written two-read reference, and a pair method
  that does not return a pair is refused naming the attribute."""
  model, v, clean, corrupt, ll, _ = toy("pair")
  b, n = clean[1].shape
  t = clean[0].shape[1] + clean[2].shape[1]
  probes = _random_probes(7, 3, b, n, t, 2)
  got = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE, probes=probes,
                     chunk_size=2)
  for k in range(3):
    want = reference_logliks(model, v, clean, corrupt, 1, span=probes.span[k],
                             ports=probes.ports[k], positions=probes.positions[k])
    np.testing.assert_allclose(got.L_int[k], want, atol=TOL)
  _, bad_v, clean, corrupt, bad_ll, _ = toy("bad_pair")
  with pytest.raises(engine.EngineError, match="span_pair_method.*must return the pair"):
    engine.audit(bad_ll, bad_v, clean=clean, corrupt=corrupt, site=SITE, probes=probes,
                 chunk_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("port", ["attn", "ssm"])
def test_many_probes_any_chunking_matches_reference(port):
  """Larger version of the reference test: 3 layers, 40 probes, 3 chunkings."""
  model, v, clean, corrupt, ll, _ = make(port, layers=3, b=4, n=16, seed=5)
  b, n = clean[1].shape
  t = clean[0].shape[1] + clean[2].shape[1]
  probes = _random_probes(11, 40, b, n, t, 2)
  site = Site("block_1/retrieval")
  results = [engine.audit(ll, v, clean=clean, corrupt=corrupt, site=site, probes=probes, chunk_size=c,
                          hoist=h).L_int
             for c, h in ((1, True), (7, True), (7, False), (64, True))]
  for r in results[1:]:
    np.testing.assert_allclose(r, results[0], atol=TOL)
  for k in range(0, 40, 5):
    want = reference_logliks(model, v, clean, corrupt, 1,
                             span=probes.span[k], ports=probes.ports[k],
                             positions=probes.positions[k])
    np.testing.assert_allclose(results[0][k], want, atol=TOL)
