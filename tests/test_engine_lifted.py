"""Sites inside lifted transforms: clear errors for nn.remat / nn.scan,
paired evaluation ([D+; D−] as one batch) and one scanned layer selected by a
carried layer index (SPEC §9), each against the unrolled, untransformed model.

Shape legend: B batch, T positions, D width, L layers, K probes.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ceu_jax import engine
from ceu_jax.engine import Probes, Site

try:
  from tests.test_engine_toys import toy
except ImportError:  # tests/ not a package
  from test_engine_toys import toy

TOL = 1e-5
B, T, D, LAYERS = 3, 4, 5, 3


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


class Body(nn.Module):
  """One residual layer; ``layer`` is the index the scan carries along."""

  @nn.compact
  def __call__(self, x, layer):
    h = nn.Dense(D, name="mix")(x)                 # the site: 'mix' output
    return x + jnp.tanh(h), None


class Stack(nn.Module):
  mode: str = "plain"        # 'plain' | 'remat' | 'scan'

  @nn.compact
  def __call__(self, x):                           # x [B, T, D]
    if self.mode == "scan":
      layers = nn.scan(Body, variable_axes={"params": 0},
                       split_rngs={"params": True}, length=LAYERS)
      x, _ = layers(name="layers")(x, jnp.arange(LAYERS))
    else:
      cls = nn.remat(Body) if self.mode == "remat" else Body
      for l in range(LAYERS):
        x, _ = cls(name=f"layer_{l}")(x, l)
    return nn.Dense(1, name="head")(x).sum((1, 2))


def setup():
  rng = np.random.default_rng(0)
  x1 = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
  x2 = x1.at[:, 1:3].set(jnp.asarray(rng.normal(size=(B, 2, D)), jnp.float32))
  plain = Stack("plain")
  v = plain.init(jax.random.key(0), x1)
  # The scanned model's parameters: the per-layer ones stacked on axis 0.
  p = v["params"]
  stacked = jax.tree.map(lambda *ws: jnp.stack(ws),
                         *[p[f"layer_{l}"] for l in range(LAYERS)])
  v_scan = {"params": {"layers": stacked, "head": p["head"]}}
  return v, v_scan, x1, x2


def loglik(mode):
  model = Stack(mode)
  return lambda v, x: model.apply(v, x)


LL = {m: loglik(m) for m in ("plain", "remat", "scan")}
OUT = engine.Output(layout="btd")
PROBES = Probes(positions=jnp.array([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 1, 0]],
                                    bool), names=("all", "t_1", "t_2"))


def reference(v, x1, x2, layer):
  return engine.audit(LL["plain"], v, clean=x1, corrupt=x2,
                      site=Site(f"layer_{layer}/mix", adapter=OUT),
                      probes=PROBES)


def test_remat_site_errors_clearly_then_audits_paired():
  v, _, x1, x2 = setup()
  site = Site("layer_1/mix", adapter=OUT)
  with pytest.raises(engine.LiftedSiteError, match="nn.remat.*paired=True"):
    engine.audit(LL["remat"], v, clean=x1, corrupt=x2, site=site,
                 probes=PROBES)
  got = engine.audit(LL["remat"], v, clean=x1, corrupt=x2, site=site,
                     probes=PROBES, paired=True)
  want = reference(v, x1, x2, 1)
  np.testing.assert_allclose(got.L_int, want.L_int, atol=TOL)
  np.testing.assert_allclose(got.L_plus, want.L_plus, atol=TOL)
  assert not np.allclose(want.L_int[0], want.L_minus, atol=1e-3)


def test_scanned_layers_need_a_layer_index():
  _, v_scan, x1, x2 = setup()
  site = Site("layers/mix", adapter=OUT)
  for paired in (False, True):
    with pytest.raises(engine.LiftedSiteError, match="nn.scan.*Scanned"):
      engine.audit(LL["scan"], v_scan, clean=x1, corrupt=x2, site=site,
                   paired=paired)


def _carried_layer(call):
  """The layer index: the second argument of the enclosing scanned body."""
  args, _ = call.enclosing("layers")
  return args[1]


@pytest.mark.parametrize("layer", [0, 2])
def test_one_scanned_layer_selected_by_its_carried_index(layer):
  v, v_scan, x1, x2 = setup()
  site = Site("layers/mix", adapter=engine.Scanned(
      layer=layer, index=_carried_layer, inner=OUT))
  with pytest.raises(engine.LiftedSiteError, match="paired=True"):
    engine.audit(LL["scan"], v_scan, clean=x1, corrupt=x2, site=site)
  got = engine.audit(LL["scan"], v_scan, clean=x1, corrupt=x2, site=site,
                     probes=PROBES, paired=True)
  want = reference(v, x1, x2, layer)
  np.testing.assert_allclose(got.L_plus, want.L_plus, atol=TOL)
  np.testing.assert_allclose(got.L_int, want.L_int, atol=TOL)


def test_paired_evaluation_equals_record_then_patch():
  _, v, clean, corrupt, ll, _ = toy()
  rng = np.random.default_rng(3)
  probes = Probes(span=jnp.asarray(rng.random((5, 3, 8)) < 0.5),
                  ports=jnp.asarray(rng.random((5, 2)) < 0.6),
                  positions=jnp.asarray(rng.random((5, 3, 5)) < 0.7))
  site = Site("block_1/retrieval")
  go = jax.jit(lambda v: [engine.intervened_logliks(
      ll, v, clean=clean, corrupt=corrupt, site=site, probes=probes,
      chunk_size=2, paired=p) for p in (False, True)])
  plain, paired = go(v)
  np.testing.assert_allclose(paired, plain, atol=TOL)


def test_paired_needs_batch_leading_inputs():
  _, v, clean, corrupt, ll, _ = toy(layers=1)
  odd = (clean, jnp.ones((4,)))
  with pytest.raises(engine.EngineError, match="batch axis first"):
    engine.audit(lambda vv, inp: ll(vv, inp[0]), v, clean=odd,
                 corrupt=(corrupt, jnp.ones((4,))),
                 site=Site("block_0/retrieval"), paired=True)
