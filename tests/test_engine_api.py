"""CEU engine API: caching, leaks, hoisting, errors, builders, nomination,
profiles, token-wise CEU (toy Flax models in tests/test_engine_toys.py).

Shape legend: K probes, B batch, N context tokens, P ports, T reader
positions, A answer tokens.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ceu_jax import engine
from ceu_jax.engine import Probes, Site
from ceu_jax.likelihood import gold_loglik

try:
  from tests.test_engine_toys import make, toy
except ImportError:  # tests/ not a package
  from test_engine_toys import make, toy

SITE = Site("block_1/retrieval")
SITE0 = Site("block_0/retrieval")         # the site of the one-layer toys
B, N, T, PORTS = 3, 8, 5, 2


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def _span_probes(seed, k=3):
  rng = np.random.default_rng(seed)
  return Probes(span=jnp.asarray(rng.random((k, B, N)) < 0.5))


# ------------------------------------------------------ compilation and leaks

def test_new_probe_values_do_not_retrace_and_nothing_leaks():
  model, v, clean, corrupt, _, _ = make("attn", layers=1, seed=3)
  traces = [0]

  def loglik_fn(variables, inputs):
    traces[0] += 1
    return gold_loglik(model.apply(variables, *inputs), inputs[2])

  with jax.checking_leaks():
    r1 = engine.audit(loglik_fn, v, clean=clean, corrupt=corrupt, site=Site("block_0/retrieval"),
                      probes=_span_probes(0, 5), chunk_size=2)
  n = traces[0]
  assert n > 0
  r2 = engine.audit(loglik_fn, v, clean=clean, corrupt=corrupt, site=Site("block_0/retrieval"),
                    probes=_span_probes(1, 5), chunk_size=2)
  assert traces[0] == n                    # same shapes: no retrace
  assert not np.allclose(r1.L_int, r2.L_int)
  # Other inputs of the same shapes do not retrace either.
  engine.audit(loglik_fn, v, clean=corrupt, corrupt=clean, site=Site("block_0/retrieval"),
               probes=_span_probes(2, 5), chunk_size=2)
  assert traces[0] == n


def test_prefix_runs_once_whatever_the_number_of_chunks():
  calls = [0]

  def count(_):
    calls[0] += 1

  model, v, clean, corrupt, _, _ = make("attn", layers=1, prefix_callback=count)
  def loglik_fn(variables, inputs):
    return gold_loglik(model.apply(variables, *inputs), inputs[2])

  def executions(k, **kw):
    calls[0] = 0
    r = engine.audit(loglik_fn, v, clean=clean, corrupt=corrupt, site=Site("block_0/retrieval"),
                     probes=_span_probes(0, k), chunk_size=2, **kw)
    jax.block_until_ready(r.L_int)
    jax.effects_barrier()
    return calls[0], r

  # L+ and L− runs, then one clean and one corrupted prefix for all probes.
  hoisted, r = executions(6)               # 3 chunks (one padded)
  assert hoisted == 4
  looped, r_plain = executions(6, hoist=False)
  assert looped == 2 + 2 * 3               # without hoisting: per chunk
  np.testing.assert_allclose(r.L_int, r_plain.L_int, atol=1e-5)


# ------------------------------------------------------------------- errors

def test_unknown_site_lists_the_sites_seen():
  _, v, clean, corrupt, ll, _ = toy()
  with pytest.raises(engine.SiteNotFoundError) as e:
    engine.audit(ll, v, clean=clean, corrupt=corrupt, site=Site("block_9/retrieval"))
  assert "block_1/retrieval:read" in str(e.value)
  assert "block_0/retrieval:read" in str(e.value)
  with pytest.raises(engine.SiteNotFoundError):
    engine.audit(ll, v, clean=clean, corrupt=corrupt, site=Site("block_1/retrieval", "write"))


def test_span_patch_needs_a_declared_decomposition():
  _, v, clean, corrupt, ll, _ = toy("plain", layers=1)
  with pytest.raises(engine.SpanUnsupportedError, match="span_decomposition"):
    engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE0, probes=_span_probes(0))
  # Port patches are fine there.
  r = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE0, probes=engine.port_probes(PORTS))
  assert r.ceu.shape == (PORTS, B)


def test_approximate_span_needs_explicit_permission():
  _, v, clean, corrupt, ll, _ = toy("memory", layers=1)
  with pytest.raises(engine.SpanUnsupportedError, match="allow_approximate"):
    engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE0, probes=_span_probes(0))
  r = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE0, probes=_span_probes(0, 2),
                   allow_approximate=True)
  assert r.approximate
  # Port-restricted patches at a memory port are exact: all ports == full.
  both, full = jax.jit(lambda v: [engine.intervened_logliks(
      ll, v, clean=clean, corrupt=corrupt, site=SITE0, probes=p) for p in (
          Probes(ports=jnp.ones((1, PORTS), bool)), Probes())])(v)
  np.testing.assert_allclose(both, full, atol=1e-5)


@pytest.mark.parametrize("probes, field", [
    (Probes(ports=jnp.ones((2, PORTS + 1), bool)), "ports"),
    (Probes(positions=jnp.ones((2, T + 2), bool)), "positions"),
    (Probes(positions=jnp.ones((2, B + 1, T), bool)), "positions"),
    (Probes(span=jnp.ones((2, B + 1, N), bool)), "span"),
    (Probes(span=jnp.ones((2, B, N + 3), bool)), "span"),
    (Probes(span=jnp.ones((2, N), bool)), "span"),
    (Probes(span=jnp.ones((2, B, N), bool), ports=jnp.ones((3, PORTS), bool)),
     "K"),
])
def test_mask_shape_errors_name_the_field(probes, field):
  _, v, clean, corrupt, ll, _ = toy(layers=1)
  with pytest.raises(engine.MaskShapeError, match=field):
    engine.intervened_logliks(ll, v, clean=clean, corrupt=corrupt, site=SITE0, probes=probes)


def test_a_site_called_twice_is_an_error():
  class Twice(nn.Module):
    span_decomposition = "exact"

    @nn.compact
    def read(self, x, span_mask=None):
      return nn.Dense(2)(x)[:, None, None]

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      port = Twice(name="port")
      return (port.read(x) + port.read(2 * x)).sum((1, 2, 3))

  m = Model()
  x = jnp.ones((2, 3))
  v = m.init(jax.random.key(0), x)
  with pytest.raises(engine.EngineError, match="more than once"):
    engine.audit(lambda vv, xx: m.apply(vv, xx), v, clean=x, corrupt=x,
                 site=Site("port"))


def test_compact_port_with_inline_submodules_can_be_span_patched():
  class Port(nn.Module):
    span_decomposition = "exact"

    @nn.compact
    def read(self, ctx, span_mask=None):           # ctx [B, N, D]
      v = nn.Dense(3)(ctx)
      if span_mask is not None:
        v = v * span_mask[..., None]
      return v.sum(1)[:, None, None]

  class Model(nn.Module):
    @nn.compact
    def __call__(self, ctx):
      return jnp.tanh(nn.Dense(1)(Port(name="p").read(ctx))).sum((1, 2, 3))

  m = Model()
  c1 = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4, 3)), jnp.float32)
  c2 = c1.at[:, 1].set(0.5)
  v = m.init(jax.random.key(1), c1)
  ll = lambda vv, c: m.apply(vv, c)
  probes = Probes(span=jnp.stack([jnp.ones((2, 4), bool),
                                  jnp.zeros((2, 4), bool)]))
  r = engine.audit(ll, v, clean=c1, corrupt=c2, site=Site("p"), probes=probes)
  full = engine.audit(ll, v, clean=c1, corrupt=c2, site=Site("p"))
  np.testing.assert_allclose(r.L_int[0], full.L_int[0], atol=1e-5)
  np.testing.assert_allclose(r.L_int[1], r.L_minus, atol=1e-5)


# ------------------------------------------------------------ record / patch

def test_record_and_patch_compose_under_jit():
  model, v, clean, corrupt, ll, _ = toy()
  sites = [Site("block_0/retrieval"), SITE]

  @jax.jit
  def go(v):
    l_plus, hs = engine.record(ll, v, clean, sites)
    l_int = engine.patch(ll, v, corrupt, SITE, hs[SITE])
    return l_plus, hs, l_int, ll(v, clean)

  l_plus, hs, l_int, ref = go(v)
  assert hs[sites[0]].shape == (B, T, PORTS, 4)
  np.testing.assert_allclose(l_plus, ref, atol=1e-6)
  full = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE)
  np.testing.assert_allclose(l_int, full.L_int[0], atol=1e-5)


# ------------------------------------------------------------- probe builders

def test_control_span_matches_length_and_avoids_evidence():
  ev = np.zeros((4, 12), bool)
  ev[0, 2:5] = ev[1, 0:2] = ev[2, 9:12] = True
  ev[3, 1:10] = True                              # no room for a window
  cand = np.ones((4, 12), bool)
  cand[:, 11] = False
  mask, contiguous = engine.control_span(jnp.array(ev), jax.random.key(0),
                                         jnp.array(cand))
  mask, contiguous = np.asarray(mask), np.asarray(contiguous)
  np.testing.assert_array_equal(mask.sum(1), [3, 2, 3, 2])   # row 3: only 2 free
  assert not (mask & ev).any() and not (mask & ~cand).any()
  np.testing.assert_array_equal(contiguous, [True, True, True, False])
  for b in range(3):
    idx = np.flatnonzero(mask[b])
    assert (np.diff(idx) == 1).all()


def test_evidence_probes_layout():
  ev = jnp.zeros((2, 6), bool).at[:, 1:3].set(True)
  dis = jnp.zeros((2, 6), bool).at[:, 4:6].set(True)
  p = engine.evidence_probes(ev, distractor_mask=dis,
                             control_key=jax.random.key(1),
                             port_mask=jnp.array([True, False]))
  assert p.names == ("ev", "dis", "control")
  assert p.span.shape == (3, 2, 6) and p.ports.shape == (3, 2)
  np.testing.assert_array_equal(p.span[2].sum(1), [2, 2])
  both = engine.stack(p, engine.port_probes(2).replace(
      span=jnp.ones((2, 2, 6), bool)))
  assert both.num == 5 and both.names[-1] == "port_1"


# --------------------------------------------------------------- nomination

def test_nominate_by_query_overlap_and_passage():
  query = jnp.array([[5, 6, 0], [9, 0, 0]])
  context = jnp.array([[1, 5, 2, 5, 6, 3], [9, 2, 2, 3, 3, 3]])
  line_ids = jnp.array([[0, 0, 1, 1, 1, -1], [0, 0, 1, 1, 2, 2]])
  got = engine.by_query_overlap(query, context, line_ids)
  np.testing.assert_array_equal(got, [[0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]])
  pid = jnp.array([[0, 0, 0, 1, 1, 1], [0, 1, 1, 2, 2, 2]])
  np.testing.assert_array_equal(engine.by_passage(pid, jnp.array([1, 2])),
                                [[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1]])
  np.testing.assert_array_equal(
      engine.passage_containing(context, pid, jnp.array([[6, 3], [2, 0]])),
      [1, 1])


def test_nominate_by_attention_mass():
  model, v, clean, _, ll, _ = toy(layers=1)
  got, mass, by_weights = jax.jit(lambda v: (
      engine.by_attention(ll, v, clean, SITE0, 2, position=2),
      engine.attention_mass(ll, v, clean, SITE0),          # [B, T, N]
      engine.by_attention(ll, v, clean, SITE0, 2, position=2,
                          method="weights", layout="btpn")))(v)
  assert got.shape == (B, N) and (np.asarray(got).sum(1) == 2).all()
  np.testing.assert_array_equal(by_weights, got)
  np.testing.assert_allclose(mass.sum(-1), PORTS, atol=1e-5)
  top = np.argsort(-np.asarray(mass[:, 2]), axis=1)[:, :2]
  for b in range(B):
    assert set(np.flatnonzero(got[b])) == set(top[b])
  _, vs, cs, _, lls, _ = toy("ssm", layers=1)
  with pytest.raises(engine.EngineError, match="attention_mass"):
    jax.eval_shape(lambda v: engine.by_attention(lls, v, cs, SITE0, 2), vs)


# ------------------------------------------- profiles, token-wise, scores

def test_profile_over_layers_and_ports():
  _, v, clean, corrupt, ll, _ = toy()
  sites = [Site("block_0/retrieval"), SITE]
  prof = engine.profile(ll, v, clean=clean, corrupt=corrupt, sites=sites,
                        probes=engine.port_probes(PORTS))
  assert prof.stacked("ceu").shape == (2, PORTS, B)
  assert prof.stacked("ceu", "port_1").shape == (2, B)
  np.testing.assert_allclose(prof[Site("block_0/retrieval")].L_plus,
                             prof[SITE].L_plus)


def test_tokenwise_ceu_with_per_token_logliks():
  _, v, clean, corrupt, _, tll = toy(layers=1)
  q, a = clean[0].shape[1], clean[2].shape[1]
  # Answer token i is predicted at reader position q - 1 + i.
  probes = engine.position_probes(T, [q - 1 + i for i in range(a)])
  r = engine.audit(tll, v, clean=clean, corrupt=corrupt, site=SITE0, probes=probes)
  assert r.L_int.shape == (a, B, a) and r.L_plus.shape == (B, a)
  ceu_t, deg_t = engine.tokenwise(r.L_int, r.L_plus, r.L_minus, range(a))
  assert ceu_t.shape == (a, B) and deg_t.shape == (a, B)
  # Each position only feeds its own token: the other tokens stay at L−.
  np.testing.assert_allclose(r.L_int[0, :, 1], r.L_minus[:, 1], atol=1e-5)
  seq = r.summed()
  assert seq.ceu.shape == (a, B)


def test_scores_flag_degenerate_gaps_instead_of_hiding_them():
  lp = jnp.array([0.0, -1.0, -2.0])
  lm = jnp.array([-2.0, -1.0, -1.0])
  li = jnp.array([[-1.0, -0.5, -3.0]])
  r = engine.from_logliks(lp, lm, li, eps=1e-3, names=("ev",))
  np.testing.assert_array_equal(r.degenerate, [False, True, True])
  assert int(r.n_degenerate) == 2
  np.testing.assert_allclose(r.ceu_of("ev"), [0.5, 1.0, 0.0])
  assert np.isnan(float(r.attrib[0, 1]))          # flagged, not hidden
  np.testing.assert_allclose(r.ceu_unclipped[0, 0], 0.5)
  np.testing.assert_allclose(r.delta_of("ev"), [1.0, 0.5, -2.0])
  g = jax.grad(lambda x: engine.ceu_unclipped(x, lp, lm).sum())(li)
  assert np.isfinite(np.asarray(g)).all()


def test_docs_examples_run():
  import pathlib
  import re
  text = (pathlib.Path(__file__).parents[1] / "docs" / "engine.md").read_text()
  blocks = re.findall(r"## Example: [^\n]*\n\n```python\n(.*?)```", text, re.S)
  assert len(blocks) == 2
  results = []
  for code in blocks:
    ns: dict = {}
    exec(compile(code, "docs/engine.md", "exec"), ns)  # pylint: disable=exec-used
    results.append(ns["res"])
  mhdpa, native = results
  assert mhdpa.names == (engine.EV, engine.CONTROL) and mhdpa.ceu.shape == (2, 4)
  assert native.names == (engine.EV, engine.CONTROL) and native.ceu.shape == (2, 2)
  # The native toy corrupts only the evidence token: restoring it restores all.
  np.testing.assert_allclose(native.ceu_of(engine.EV)[0], 1.0, atol=1e-5)


# ------------------------------------------------- names, keywords, shapes

def test_clean_and_corrupt_are_keyword_only_and_sites_are_site_objects():
  _, v, clean, corrupt, ll, _ = toy(layers=1)
  with pytest.raises(TypeError):
    engine.audit(ll, v, clean, corrupt, SITE0)  # pylint: disable=too-many-function-args
  with pytest.raises(TypeError):
    engine.intervened_logliks(ll, v, clean, corrupt, SITE0, Probes())
  with pytest.raises(engine.EngineError, match="Site.parse"):
    engine.audit(ll, v, clean=clean, corrupt=corrupt, site="block_0/retrieval")
  assert Site.parse("block_0/retrieval") == SITE0
  assert Site.parse("a/b:write") == Site("a/b", "write")
  assert Site.parse(SITE0) is SITE0
  assert Site("x", adapter=engine.Attention()).method == "__call__"
  assert str(SITE0) == "block_0/retrieval:read"


def test_audit_refuses_logits_instead_of_logliks():
  model, v, clean, corrupt, _, tll = toy(layers=1)
  logits = lambda vv, inputs: model.apply(vv, *inputs)           # [B, A, V]
  with pytest.raises(engine.EngineError, match="logits"):
    engine.audit(logits, v, clean=clean, corrupt=corrupt, site=SITE0)
  last = lambda vv, inputs: model.apply(vv, *inputs)[:, -1]       # [B, V]
  with pytest.raises(engine.EngineError, match=r"\[B\]"):
    engine.audit(last, v, clean=clean, corrupt=corrupt, site=SITE0,
                 per_token=False)
  ints = lambda vv, inputs: jnp.argmax(model.apply(vv, *inputs)[:, -1], -1)
  with pytest.raises(engine.EngineError, match="floats"):
    engine.audit(ints, v, clean=clean, corrupt=corrupt, site=SITE0)
  # Per-token log-likelihoods [B, A] are fine (and can be demanded).
  r = engine.audit(tll, v, clean=clean, corrupt=corrupt, site=SITE0,
                   per_token=True)
  assert r.L_plus.shape == (B, 2)


def test_probe_names_are_exported_constants():
  ev = jnp.zeros((2, 6), bool).at[:, 1].set(True)
  p = engine.evidence_probes(ev, distractor_mask=~ev,
                             control_key=jax.random.key(0))
  assert p.names == (engine.EV, engine.DIS, engine.CONTROL)
  assert engine.full_site().names == (engine.FULL,)


def test_auto_chunk_size_matches_fixed_chunks_and_follows_the_rule():
  from ceu_jax.engine import chunking
  _, v, clean, corrupt, ll, _ = toy()
  probes = _span_probes(4, 6)
  auto = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE,
                      probes=probes)
  fixed = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE,
                       probes=probes, chunk_size=2)
  np.testing.assert_allclose(auto.L_int, fixed.L_int, atol=1e-5)
  mib = chunking.MiB
  budget = chunking.BUDGET["cpu"]
  assert chunking.rule(budget // 3, 64, "cpu") == 2
  assert chunking.rule(budget * 2, 64, "cpu") == 1
  assert chunking.rule(1, 64, "cpu") == 64
  assert chunking.rule(1, 5, "cpu") == 5              # all K fit: one chunk, no padding
  assert chunking.rule(budget // 3, 3, "cpu") == 3    # an audit's ev, dis, control
  assert chunking.rule(budget // 2, 3, "cpu") == 2    # else a power of two
  assert chunking.rule(mib, 1000, "gpu") == chunking.MAX_CHUNK
  # The measured per-probe working set grows with the suffix after the site.
  w1, w0 = (chunking.per_probe_bytes(
      engine.runner.probe_fn(ll, s, allow_approximate=False),
      (v, clean, corrupt), probes) for s in (SITE, SITE0))
  assert 0 < w1 < w0
  for bad in (0, -1, 2.5, True, "big"):
    with pytest.raises(engine.EngineError, match="chunk_size"):
      engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE,
                   probes=probes, chunk_size=bad)


def test_engine_uses_no_private_jax_modules():
  import pathlib
  import re
  root = pathlib.Path(engine.__file__).parent
  private = re.compile(r"^\s*(from|import)\s+jax\._src", re.M)
  for f in root.glob("*.py"):
    assert not private.search(f.read_text()), f
