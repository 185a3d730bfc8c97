"""Architectures (issue #3): parameter match, read ports, Π_S references, validation.

Shape legend: B batch, Q query length, N context length, A answer length,
T reader positions, P ports, D port features, l scanned length, c channels, s state.
"""
from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import architectures
from architectures import ssm
from architectures.spec import PRESETS

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


SIZES = dict(vocab_size=60, context_len=32, num_passages=4, query_len=5, answer_len=2)


def _model(family, preset="p100k", **cfg):
  return architectures.build_model(dict(family=family, preset=preset, **cfg), **SIZES)


def _inputs(seed=0, batch=3):
  r = np.random.RandomState(seed)
  q = r.randint(3, SIZES["vocab_size"], (batch, SIZES["query_len"]))
  c = r.randint(3, SIZES["vocab_size"], (batch, SIZES["context_len"]))
  pid = np.repeat(np.arange(SIZES["num_passages"]), SIZES["context_len"] // SIZES["num_passages"])
  a = r.randint(3, SIZES["vocab_size"], (batch, SIZES["answer_len"]))
  return (jnp.asarray(q), jnp.asarray(c), jnp.asarray(np.broadcast_to(pid, c.shape)),
          jnp.asarray(a))


def _site_hook(site, fn):
  """Interceptor running fn(next_fun, args, kwargs) on `site`'s read port."""
  def interceptor(next_fun, args, kwargs, context):
    if context.method_name == "read" and "/".join(context.module.path) == site:
      return fn(next_fun, args, kwargs)
    return next_fun(*args, **kwargs)
  return interceptor


@pytest.fixture(scope="module")
def models():
  out = {}
  for family in architectures.FAMILIES:
    model = _model(family)
    out[family] = (model, architectures.init_params(model, jax.random.PRNGKey(0)))
  return out


# 1. Parameter match -----------------------------------------------------------

@pytest.mark.parametrize("setting", [{}, {"retrieval_layers": "all"}, {"bypass": True},
                                     {"retrieval_layers": "all", "bypass": True}])
def test_presets_parameter_matched_within_3_percent(setting):
  """SPEC §2: at every preset, with the read port at the last reader layer or at every
  one (`spec.ALL_LAYERS_WIDTHS`), with or without the bypass."""
  table = architectures.param_table(**setting)  # reference ATR sizes
  targets = {"p100k": 1e5, "p400k": 4e5, "p1500k": 1.5e6}
  for preset, counts in table.items():
    ref = counts["attention"]
    for family, n in counts.items():
      assert abs(n - ref) <= 0.03 * ref, (setting, preset, family, n, ref)
    if not setting:
      assert abs(ref - targets[preset]) <= 0.1 * targets[preset], (preset, ref)


# 2. Reference tests -----------------------------------------------------------

def test_associative_scan_equals_sequential_scan():
  ka, kb = jax.random.split(jax.random.PRNGKey(1))
  a = jax.random.uniform(ka, (2, 50, 3, 4), minval=0.5, maxval=1.0)
  b = jax.random.normal(kb, (2, 50, 3, 4))
  np.testing.assert_allclose(ssm.associative_scan(a, b), ssm.sequential_scan(a, b),
                             atol=1e-5, rtol=1e-5)


def _random_gates(seed=2, b=2, l=40, c=3, s=4, restarts=True):
  k = jax.random.split(jax.random.PRNGKey(seed), 5)
  starts = jax.random.bernoulli(k[4], 0.15, (b, l)) if restarts else None
  g = ssm.Gates(dt=jax.nn.softplus(jax.random.normal(k[0], (b, l, c))),
                dtx=jax.random.normal(k[1], (b, l, c)),
                b_in=jax.random.normal(k[2], (b, l, s)),
                rate=jnp.exp(jax.random.normal(k[3], (c, s))))
  return g if starts is None else g.with_restarts(starts)


@pytest.mark.parametrize("restarts", [False, True])
def test_fused_scan_equals_sequential_reference_values_and_grads(restarts):
  """The fused readout and states-at-ends (no [b,l,c,s] tensor) against lax.scan over
  the materialised gates, outputs and gradients w.r.t. every factor, 1e-5."""
  gates = _random_gates(restarts=restarts)
  b, l, c = gates.dt.shape
  c_out = jax.random.normal(jax.random.PRNGKey(7), (b, l, gates.rate.shape[1]))
  ends = jax.nn.one_hot(jax.random.randint(jax.random.PRNGKey(8), (b, 3), 0, l), l,
                        axis=1)                                           # [b,l,p]
  w_y = jax.random.normal(jax.random.PRNGKey(9), (b, l, c))

  def fused(g):
    return jnp.sum(w_y * g.scan_readout(c_out)) + jnp.sum(g.scan_states_at(ends) ** 2)

  def reference(g):
    h = ssm.sequential_scan(*g.expand())
    y = jnp.einsum("blcs,bls->blc", h, c_out)
    states = jnp.einsum("blp,blcs->bpcs", ends, h)
    return jnp.sum(w_y * y) + jnp.sum(states ** 2)

  np.testing.assert_allclose(fused(gates), reference(gates), rtol=1e-5)
  got, want = jax.grad(fused)(gates), jax.grad(reference)(gates)
  for name in ("dt", "dtx", "b_in", "rate"):
    np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=1e-5, rtol=1e-5,
                               err_msg=name)


def test_causal_depthwise_conv_equals_flax_grouped_conv():
  """Shifted products == nn.Conv(feature_group_count=c, left padding w−1), same params."""
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 11, 5))
  conv = ssm.CausalDepthwiseConv(4)
  variables = nn.meta.unbox(conv.init(jax.random.PRNGKey(1), x))
  variables = jax.tree.map(lambda t: t + 0.3, variables)             # non-zero bias
  ref = nn.Conv(5, (4,), padding=[(3, 0)], feature_group_count=5)
  assert (jax.tree.map(jnp.shape, variables)
          == jax.tree.map(jnp.shape, ref.init(jax.random.PRNGKey(1), x)))
  np.testing.assert_allclose(conv.apply(variables, x), ref.apply(variables, x), atol=1e-6)


@pytest.mark.parametrize("impl", ["fused", "linear", "chunked"])
def test_ssm_model_same_logits_with_fused_and_sequential_scan(impl):
  ref = _model("ssm", overrides={"scan_impl": "sequential"})
  fused = _model("ssm", overrides={"scan_impl": impl})
  params = architectures.init_params(ref, jax.random.PRNGKey(0))
  x = _inputs()
  np.testing.assert_allclose(jax.jit(fused.apply)(params, *x), jax.jit(ref.apply)(params, *x),
                             atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_ssm_model_same_logits_with_sequential_scan(models):
  model, params = models["ssm"]
  ref = _model("ssm", overrides={"scan_impl": "sequential"})
  x = _inputs()
  np.testing.assert_allclose(jax.jit(model.apply)(params, *x), jax.jit(ref.apply)(params, *x),
                             atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["attention", "ssm"])
def test_exact_span_decomposition(models, family):
  model, params = models[family]
  site = architectures.read_port_site(dict(family=family, preset="p100k")).path
  x = _inputs()
  got = {}

  def probe(next_fun, args, kwargs):
    h = next_fun(*args, **kwargs)
    for seed in range(3):
      s = jax.random.bernoulli(jax.random.PRNGKey(seed), 0.3, x[1].shape)
      got[f"s{seed}"] = (h, next_fun(*args, span_mask=s), next_fun(*args, span_mask=~s))
    got["all"] = next_fun(*args, span_mask=jnp.ones(x[1].shape, bool))
    got["none"] = next_fun(*args, span_mask=jnp.zeros(x[1].shape, bool))
    return h

  @jax.jit
  def run(params, x):
    with nn.intercept_methods(_site_hook(site, probe)):
      model.apply(params, *x)
    return got

  got = run(params, x)
  for seed in range(3):
    h, hs, hc = got[f"s{seed}"]
    np.testing.assert_allclose(hs + hc, h, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(got["all"], h, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(got["none"], 0.0, atol=1e-6)


def _record(model, params, x, site):
  rec = {}

  def keep(next_fun, args, kwargs):
    rec["h"] = next_fun(*args, **kwargs)
    return rec["h"]

  with nn.intercept_methods(_site_hook(site, keep)):
    model.apply(params, *x)
  return rec["h"]


def _patched_retrieval_output(model, params, x, site, h_new, port_mask):
  """Output of the retrieval module (after its projection) with ports in port_mask patched."""
  out = {}

  def interceptor(next_fun, args, kwargs, context):
    path = "/".join(context.module.path)
    y = next_fun(*args, **kwargs)
    if path == site and context.method_name == "read":
      m = port_mask[None, None, :, None]
      return y * (1 - m) + h_new * m
    if path == site and context.method_name == "__call__":
      out["y"] = y
    return y

  with nn.intercept_methods(interceptor):
    model.apply(params, *x)
  return out["y"]


def test_memory_port_per_port_patches_add_up(models):
  model, params = models["memory_port"]
  site = architectures.read_port_site(dict(family="memory_port", preset="p100k")).path
  clean, cor = _inputs(0), _inputs(1)
  cor = (clean[0], cor[1], clean[2], clean[3])  # same query, other context
  h_clean = jax.jit(lambda p, x: _record(model, p, x, site))(params, clean)
  run = jax.jit(lambda p, x, h, m: _patched_retrieval_output(model, p, x, site, h, m))
  spec = model.spec
  base = run(params, cor, h_clean, jnp.zeros((spec.num_ports,)))
  full = run(params, cor, h_clean, jnp.ones((spec.num_ports,)))
  total = jnp.zeros_like(base)
  for p in range(spec.num_ports):
    total += run(params, cor, h_clean, architectures.port_mask(spec, [p])) - base
  np.testing.assert_allclose(total, full - base, atol=1e-5, rtol=1e-5)
  assert float(jnp.abs(full - base).max()) > 1e-3  # the patch does something


def test_memory_port_slot_sees_only_its_passage_and_the_query(models):
  """Changing passage j's tokens changes slot j and no other (FiD-style mask)."""
  model, params = models["memory_port"]
  site = architectures.read_port_site(dict(family="memory_port", preset="p100k")).path
  got = {}

  def keep_slots(next_fun, args, kwargs, context):
    if context.method_name == "read" and "/".join(context.module.path) == site:
      got["slots"] = context.module.write(args[1])
    return next_fun(*args, **kwargs)

  @jax.jit
  def slots(params, x):
    with nn.intercept_methods(keep_slots):
      model.apply(params, *x)
    return got["slots"]

  x = _inputs(0)
  base = slots(params, x)
  per = SIZES["context_len"] // SIZES["num_passages"]
  j = 2
  ctx = x[1].at[:, j * per:(j + 1) * per].set(_inputs(5)[1][:, j * per:(j + 1) * per])
  moved = jnp.abs(slots(params, (x[0], ctx, x[2], x[3])) - base).max(axis=(0, 2))
  assert float(moved[j]) > 1e-3
  np.testing.assert_allclose(np.delete(np.asarray(moved), j), 0.0, atol=1e-6)
  other_query = x[0].at[:, 1:].set(_inputs(6)[0][:, 1:])
  assert float(jnp.abs(slots(params, (other_query,) + x[1:]) - base).min(axis=2).max()) > 1e-4


def test_memory_port_span_is_approximate_but_exact_at_extremes(models):
  model, params = models["memory_port"]
  assert type(model).__name__ == "RetrievalModel"
  site = architectures.read_port_site(dict(family="memory_port", preset="p100k")).path
  x = _inputs()
  got = {}

  def probe(next_fun, args, kwargs):
    got["h"] = next_fun(*args, **kwargs)
    got["all"] = next_fun(*args, span_mask=jnp.ones(x[1].shape, bool))
    got["none"] = next_fun(*args, span_mask=jnp.zeros(x[1].shape, bool))
    return got["h"]

  @jax.jit
  def run(params, x):
    with nn.intercept_methods(_site_hook(site, probe)):
      model.apply(params, *x)
    return got

  got = run(params, x)
  np.testing.assert_allclose(got["all"], got["h"], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(got["none"], 0.0, atol=1e-6)
  assert architectures.span_decomposition("memory_port") == "approximate"


# Read ports, shapes, options --------------------------------------------------

@pytest.mark.parametrize("family", list(architectures.FAMILIES))
@pytest.mark.parametrize("bypass", [False, True])
def test_read_port_shape_and_sites(family, bypass):
  cfg = dict(family=family, preset="p100k", retrieval_layers="all", bypass=bypass)
  model = architectures.build_model(cfg, **SIZES)
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), *_inputs()))
  sites = architectures.read_port_sites(cfg)
  assert [s.path for s in sites] == [f"reader/block_{i}/retrieval" for i in range(2)]
  shapes = {}

  def interceptor(next_fun, args, kwargs, context):
    y = next_fun(*args, **kwargs)
    if context.method_name == "read":
      shapes["/".join(context.module.path)] = (y.shape, type(context.module).span_decomposition)
    return y

  x = _inputs()

  def run(params, x):  # shapes only: trace, do not compute
    with nn.intercept_methods(interceptor):
      return model.apply(params, *x)

  logits = jax.eval_shape(run, params, x)
  assert logits.shape == (3, SIZES["answer_len"], SIZES["vocab_size"])
  spec = model.spec
  for site in (s.path for s in sites):
    shape, decomposition = shapes[site]
    assert shape[:3] == (3, spec.reader_len, spec.num_ports)
    assert decomposition == architectures.span_decomposition(family)


def test_answer_is_shifted_inside_the_model(models):
  model, params = models["attention"]
  q, c, pid, a = _inputs()
  a2 = a.at[:, -1].set((a[:, -1] + 1) % SIZES["vocab_size"])
  apply = jax.jit(model.apply)
  l1, l2 = apply(params, q, c, pid, a), apply(params, q, c, pid, a2)
  np.testing.assert_allclose(l1, l2, atol=1e-6)  # the last answer token is never an input
  a3 = a.at[:, 0].set((a[:, 0] + 1) % SIZES["vocab_size"])
  assert not np.allclose(apply(params, q, c, pid, a3)[:, 1], l1[:, 1])


def test_parameters_carry_logical_axis_names():
  model = _model("ssm")
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), *_inputs())
  leaves = jax.tree_util.tree_leaves(
      variables, is_leaf=lambda v: isinstance(v, nn.LogicallyPartitioned))
  assert leaves and all(isinstance(v, nn.LogicallyPartitioned) for v in leaves)
  assert all(len(v.names) == len(v.value.shape) for v in leaves)


def test_init_params_of_an_equal_model_reuses_its_program_and_bits(models):
  """`init_params` jits one function for every model (the model a static argument): a model
  built again from the same config is equal, so its init compiles nothing new — the seed is
  an argument — and gives `jax.jit(model.init)`'s parameters, bit for bit."""
  model, params = models["attention"]
  again = _model("attention")
  assert again == model and again is not model
  compiled = architectures.api._init._cache_size()
  other_seed = architectures.init_params(again, jax.random.PRNGKey(1))
  same_seed = architectures.init_params(again, jax.random.PRNGKey(0))
  assert architectures.api._init._cache_size() == compiled
  want = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0),
                                           *architectures.dummy_inputs(model.spec, 2)))
  for got in (params, same_seed):
    chex.assert_trees_all_equal(got, want)
  assert any(not np.array_equal(a, b)   # the seed is not baked into the program
             for a, b in zip(jax.tree.leaves(other_seed), jax.tree.leaves(want)))


def test_bfloat16_forward_is_finite():
  model = _model("memory_port", dtype="bfloat16")
  params = architectures.init_params(model, jax.random.PRNGKey(0))
  assert bool(jnp.isfinite(jax.jit(model.apply)(params, *_inputs())).all())


# 4 (fast variant). With bypass off the read port is the only channel ------------

def _mean_ablated_logits(model, params, x, site):
  hook = _site_hook(site, lambda nf, a, k: jnp.broadcast_to(
      nf(*a, **k).mean(0, keepdims=True), nf(*a, **k).shape))
  def run(params, x):
    with nn.intercept_methods(hook):
      return model.apply(params, *x)
  return jax.jit(run)(params, x)


@pytest.mark.parametrize("family", list(architectures.FAMILIES))
def test_port_is_only_channel_without_bypass(family):
  cases = ((False, True), (True, False)) if family == "attention" else ((False, True),)
  for bypass, independent in cases:
    cfg = dict(family=family, preset="p100k", bypass=bypass)
    model = architectures.build_model(cfg, **SIZES)
    params = architectures.init_params(model, jax.random.PRNGKey(0))
    site = architectures.read_port_site(cfg).path
    q, c, pid, a = _inputs(0, batch=4)
    c_other = _inputs(1, batch=4)[1]
    # The batch mean is taken over a batch that holds both contexts, so it is the same.
    both = tuple(jnp.concatenate([u, v]) for u, v in
                 zip((q, c, pid, a), (q, c_other, pid, a)))
    out = _mean_ablated_logits(model, params, both, site)
    same = np.allclose(out[:4], out[4:], atol=1e-5)
    assert same == independent, (family, bypass)


# 6. Bad configurations ------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("family", "rnn"), ("preset", "p42"),
                                         ("retrieval_layers", "first"), ("dtype", "int8"),
                                         ("bypass", "yes")])
def test_bad_model_config_names_field_and_allowed(field, value):
  cfg = dict(family="attention", preset="p100k")
  cfg[field] = value
  with pytest.raises(ValueError, match=rf"model\.{field} must be one of"):
    architectures.build_model(cfg, **SIZES)
  with pytest.raises(ValueError, match=rf"model\.{field}"):
    architectures.read_port_sites(cfg)


def test_float64_needs_64_bit_jax():
  """dtype 'float64' (references) is refused outside `jax.enable_x64`, naming the field;
  inside it the model computes in float64."""
  cfg = dict(family="attention", preset="p100k", dtype="float64")
  with pytest.raises(ValueError, match=r"model.dtype='float64' needs 64-bit JAX"):
    architectures.build_model(cfg, **SIZES)
  with jax.enable_x64(True):
    assert architectures.build_model(cfg, **SIZES).spec.compute_dtype == jnp.float64


def test_bad_override_and_sizes():
  with pytest.raises(ValueError, match="model.overrides: unknown field"):
    _model("ssm", overrides={"widht": 3})
  with pytest.raises(ValueError, match="scan_impl must be one of"):
    _model("ssm", overrides={"scan_impl": "fast"})
  with pytest.raises(ValueError, match="context_len"):
    architectures.build_model(dict(family="ssm", preset="p100k"),
                              **dict(SIZES, context_len=2))


def test_bad_port_index():
  spec = _model("memory_port").spec
  assert architectures.port_mask(spec, [0, 3]).tolist() == [1, 0, 0, 1]
  with pytest.raises(ValueError, match=r"port index must be in range\(0, 4\)"):
    architectures.port_mask(spec, [4])


@pytest.mark.parametrize("family", list(architectures.FAMILIES))
def test_bad_span_mask_shape(models, family):
  model, params = models[family]
  site = architectures.read_port_site(dict(family=family, preset="p100k")).path
  hook = _site_hook(site, lambda nf, a, k: nf(*a, span_mask=jnp.ones((3, 7), bool)))
  with pytest.raises(ValueError, match=r"span_mask must have shape \[B, N\]"):
    with nn.intercept_methods(hook):
      jax.eval_shape(model.apply, params, *_inputs())


def test_bad_input_shape(models):
  model, params = models["attention"]
  q, c, pid, a = _inputs()
  with pytest.raises(ValueError, match=r"context must have shape \[B, context_len\]"):
    jax.eval_shape(model.apply, params, q, c[:, :-1], pid, a)


# describe -------------------------------------------------------------------------

def test_describe_lists_every_family_and_preset():
  text = architectures.describe()
  for family in architectures.FAMILIES:
    assert family in text
  for preset in PRESETS:
    assert preset in text
  assert "reader/block_1/retrieval:read" in text and "approximate" in text
  rows = architectures.describe_rows()
  assert {r["exact"] for r in rows if r["family"] != "memory_port"} == {True}
