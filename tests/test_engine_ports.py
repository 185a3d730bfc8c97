"""Ports for models the user did not write: an unmodified
`flax.linen.MultiHeadDotProductAttention` transformer audited with the
`Attention` adapter against a hand-written patched forward (no interceptors),
`Output` / `Input` / `Tap` sites, `check_port`, and prefix hoisting at every
kind of site.

Shape legend: B batch, L sequence (the source tokens N = the reader
positions T = L), D width, H heads, K head features, V vocab, S span.
"""
from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ceu_jax import engine
from ceu_jax.engine import Probes, Site

try:
  from tests.test_engine_toys import make, toy
except ImportError:  # tests/ not a package
  from test_engine_toys import make, toy

TOL = 1e-5
V, D, H, L, B = 11, 16, 2, 7, 3


# ----------------------------------------------- an ordinary linen transformer


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


class Block(nn.Module):
  """Pre-LN block with a stock attention layer (nothing written for the engine)."""

  @nn.compact
  def __call__(self, x, mask):
    y = nn.LayerNorm(name="ln_1")(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=H, name="attn")(
        y, mask=mask)
    y = nn.LayerNorm(name="ln_2")(x)
    return x + nn.Dense(D, name="mlp_out")(nn.gelu(nn.Dense(4 * D, name="mlp_in")(y)))


class TinyLM(nn.Module):
  layers: int = 2
  prefix_callback: object = None     # counts prefix executions (hoisting test)

  @nn.compact
  def __call__(self, tokens):                      # tokens [B, L]
    x = nn.Embed(V, D, name="embed")(tokens)
    if self.prefix_callback is not None:
      jax.debug.callback(self.prefix_callback, x.sum())
    mask = nn.make_causal_mask(tokens)
    for l in range(self.layers):
      x = Block(name=f"block_{l}")(x, mask)
    return nn.Dense(V, name="head")(nn.LayerNorm(name="ln_f")(x))   # [B, L, V]


def lm_setup(seed=0, prefix_callback=None):
  model = TinyLM(prefix_callback=prefix_callback)
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(1, V, (B, L)), jnp.int32)
  gold = jnp.asarray(rng.integers(1, V, (B,)), jnp.int32)
  # D−: the source tokens 1 and 3 replaced (token-aligned).
  corrupt_tokens = tokens.at[:, 1].set((tokens[:, 1] + 3) % V)
  corrupt_tokens = corrupt_tokens.at[:, 3].set((tokens[:, 3] + 5) % V)
  # Parameters drawn with numpy in init's shapes: kernels N(0, (1.5/√fan_in)²),
  # biases N(0, 0.1²) (nonzero, so a bias put in the wrong place shows),
  # LayerNorm scales 1 + N(0, 0.1²), embeddings N(0, 1).
  shapes = jax.eval_shape(model.init, jax.random.key(seed), tokens)
  variables = jax.tree_util.tree_map_with_path(
      lambda path, s: jnp.asarray(_draw(rng, str(path[-1]), s.shape), s.dtype),
      shapes)

  def loglik_fn(v, inputs):                        # next-token log p(gold) [B]
    toks, y = inputs
    logp = jax.nn.log_softmax(model.apply(v, toks)[:, -1])
    return jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]

  return model, variables, (tokens, gold), (corrupt_tokens, gold), loglik_fn


def _draw(rng, name, shape):
  if "embedding" in name:
    return rng.normal(size=shape)
  if "scale" in name:
    return 1.0 + 0.1 * rng.normal(size=shape)
  if "bias" in name:
    return 0.1 * rng.normal(size=shape)
  return 1.5 / np.sqrt(shape[0]) * rng.normal(size=shape)


# ------------------------------------------- the hand-written reference forward

def _ln(p, x):
  mean = x.mean(-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + 1e-6) * p["scale"] + p["bias"]


def _dense(p, x):
  return x @ p["kernel"] + p["bias"]


def manual_logits(params, tokens, layer=None, edit=None):
  """TinyLM by hand. At ``layer`` the per-head read Σ_j a_j v_j [B, L, H, K]
  becomes ``edit(a [B, H, L, L], v [B, L, H, K], read)``; returns (logits,
  list of edit results)."""
  x = params["embed"]["embedding"][tokens]
  causal = jnp.tril(jnp.ones((L, L), bool))
  out = []
  for l in range(2):
    p = params[f"block_{l}"]
    y = _ln(p["ln_1"], x)
    a_p = p["attn"]
    q, k, v = (jnp.einsum("bld,dhk->blhk", y, a_p[n]["kernel"]) + a_p[n]["bias"]
               for n in ("query", "key", "value"))
    q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    s = jnp.einsum("bqhk,bjhk->bhqj", q, k)
    s = jnp.where(causal, s, jnp.finfo(s.dtype).min)
    a = jax.nn.softmax(s, axis=-1)                       # [B, H, L, L]
    read = jnp.einsum("bhqj,bjhk->bqhk", a, v)           # Σ_j a_j v_j
    if l == layer:
      read, rec = edit(a, v, read)
      out.append(rec)
    x = x + jnp.einsum("blhk,hkd->bld", read, a_p["out"]["kernel"]) + a_p["out"]["bias"]
    y = _ln(p["ln_2"], x)
    x = x + _dense(p["mlp_out"], nn.gelu(_dense(p["mlp_in"], y)))
  return _dense(params["head"], _ln(params["ln_f"], x)), out


def manual_loglik(params, inputs, layer=None, edit=None):
  toks, y = inputs
  logits, out = manual_logits(params, toks, layer, edit)
  logp = jax.nn.log_softmax(logits[:, -1])
  return jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0], out


@jax.jit
def manual_span_patch(params, clean, corrupt, span, heads):
  """L_int of one span probe at block_1/attn on heads ``heads`` [H], by hand:
  read(D−) − Σ_{j∈S} a_j v_j(D−) + Σ_{j∈S} a_j v_j(D+), on those heads only."""
  def part(a, v):
    return jnp.einsum("bhqj,bjhk->bqhk", a, v * span[:, :, None, None])

  def rec(a, v, read):
    return read, part(a, v)

  _, (pi_plus,) = manual_loglik(params, clean, 1, rec)

  def put(a, v, read):
    new = read - part(a, v) + pi_plus
    return jnp.where(heads[None, None, :, None], new, read), None

  return manual_loglik(params, corrupt, 1, put)[0]


SITE = Site("block_1/attn", adapter=engine.Attention())


def test_unmodified_mhdpa_span_probes_match_a_hand_written_patch():
  """The demo (docs/engine.md): span probes (all heads, then one head each)
  at a stock attention layer, against the hand-written forward."""
  model, v, clean, corrupt, ll = lm_setup()
  np.testing.assert_allclose(   # the hand-written forward is the model
      jax.jit(manual_logits)(v["params"], clean[0])[0],
      jax.jit(model.apply)(v, clean[0]), rtol=TOL, atol=TOL)
  evidence = jnp.zeros((B, L), bool).at[:, 1].set(True).at[:, 3].set(True)
  other = jnp.zeros((B, L), bool).at[:, 4:6].set(True)
  named = engine.evidence_probes(evidence, distractor_mask=other,
                                 control_key=jax.random.key(5))
  window = jnp.zeros((B, L), bool).at[:, 1:4].set(True)
  span = jnp.concatenate([named.span, jnp.stack(
      [jnp.ones((B, L), bool), jnp.zeros((B, L), bool), window, window])])
  heads = jnp.concatenate([jnp.ones((5, H), bool), jnp.eye(H, dtype=bool)])
  probes = Probes(span=span, ports=heads, names=named.names + (
      "all", "none", "head_0", "head_1"))
  res = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=SITE,
                     probes=probes, chunk_size=2)
  assert float(jnp.abs(res.delta_L).min()) > 1e-2      # the corruption matters
  for i, name in enumerate(res.names):
    want = manual_span_patch(v["params"], clean, corrupt, span[i], heads[i])
    np.testing.assert_allclose(res.L_int_of(name), want, atol=TOL)
  np.testing.assert_allclose(
      res.L_plus, jax.jit(manual_loglik)(v["params"], clean)[0], atol=TOL)
  np.testing.assert_allclose(res.L_int_of("none"), res.L_minus, atol=TOL)
  assert not np.allclose(res.L_int_of("head_0"), res.L_int_of("head_1"),
                         atol=1e-4)
  assert not bool(res.approximate)


# ------------------------------------------------- Output / Input / Tap sites

def test_output_and_input_adapters_equal_the_native_port():
  """ToyReader block_1: the native port's output h [B,T,P,H] is the input of
  `block_1/out` after a reshape to [B, T, P·H]."""
  _, v, clean, corrupt, ll, _ = toy()
  t = clean[0].shape[1] + clean[2].shape[1]
  pos = engine.position_probes(t, [0, 3])
  native = Site("block_1/retrieval")
  as_output = Site("block_1/retrieval", "read", engine.Output(layout="btpd"))
  as_input = Site("block_1/out", adapter=engine.Input(0, layout="btd"))
  go = jax.jit(lambda v: [engine.intervened_logliks(
      ll, v, clean=clean, corrupt=corrupt, site=s, probes=p)
      for s in (native, as_output, as_input) for p in (Probes(), pos)])
  n_full, n_pos, o_full, o_pos, i_full, i_pos = go(v)
  for got in (o_full, i_full):
    np.testing.assert_allclose(got, n_full, atol=TOL)
  for got in (o_pos, i_pos):
    np.testing.assert_allclose(got, n_pos, atol=TOL)
  assert not np.allclose(n_pos[0], n_full[0], atol=1e-3)


def test_tap_names_an_inline_value():
  class Model(nn.Module):
    tap: bool

    @nn.compact
    def __call__(self, x):                          # x [B, T, D]
      h = jnp.tanh(nn.Dense(4, name="a")(x))        # an inline value
      if self.tap:
        h = engine.Tap(name="h")(h)
      return nn.Dense(1, name="b")(h).sum((1, 2))

  x1 = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4)), jnp.float32)
  x2 = x1.at[:, 1].set(0.0)
  tapped, plain = Model(True), Model(False)
  v = plain.init(jax.random.key(0), x1)             # Tap has no parameters
  site = Site("h", adapter=engine.Output(layout="btd"))
  res = engine.audit(lambda vv, x: tapped.apply(vv, x), v, clean=x1,
                     corrupt=x2, site=site,
                     probes=engine.position_probes(3, [1]))
  h_plus, h_minus = (jnp.tanh(nn.Dense(4).apply({"params": v["params"]["a"]}, x))
                     for x in (x1, x2))
  want_h = h_minus.at[:, 1].set(h_plus[:, 1])
  want = nn.Dense(1).apply({"params": v["params"]["b"]}, want_h).sum((1, 2))
  np.testing.assert_allclose(res.L_int[0], want, atol=TOL)


def test_layouts_without_a_port_axis_refuse_port_probes():
  _, v, clean, corrupt, ll, _ = toy(layers=1)
  site = Site("block_0/out", adapter=engine.Input(0, layout="btd"))
  with pytest.raises(engine.MaskShapeError, match="no port axis"):
    engine.audit(ll, v, clean=clean, corrupt=corrupt, site=site,
                 probes=engine.port_probes(2))
  bare = Site("block_0/out", adapter=engine.Input(0))
  with pytest.raises(engine.MaskShapeError, match="layout"):
    engine.audit(ll, v, clean=clean, corrupt=corrupt, site=bare,
                 probes=engine.position_probes(5, [1]))
  with pytest.raises(engine.SpanUnsupportedError, match="adapter"):
    engine.audit(ll, v, clean=clean, corrupt=corrupt, site=bare,
                 probes=engine.span_probes(jnp.ones((3, 8), bool)))
  with pytest.raises(engine.EngineError, match="layout"):
    engine.Output(layout="tbd")


# ---------------------------------------------------------------- check_port

def _span():
  return jnp.zeros((B, L), bool).at[:, 1:5].set(True)


def test_check_port_passes_a_true_decomposition():
  # (The MHDPA `Attention` site is checked by the docs example, which runs in
  # tests/test_engine_api.py.)
  _, tv, tclean, tcorrupt, tll, _ = toy()
  span = jnp.zeros(tclean[1].shape, bool).at[:, 2:5].set(True)
  rep = engine.check_port(tll, tv, clean=tclean, corrupt=tcorrupt,
                          site=Site("block_1/retrieval"), span=span)
  assert rep.ok and rep.decomposition == "exact"
  assert set(rep.errors) == {
      "self_full", "self_span", "span_empty", "span_all", "parts_empty",
      "parts_complement", "parts_all", "parts_union", "masks_all"}
  assert "parts_union" in str(rep)


def _biased_span_fn(call, span):
  """Π_S at the attention layer's OUTPUT: re-run with the values masked. The
  output projection's bias then lands in every part."""
  def mask_values(next_fun, args, kwargs, ctx):
    out = next_fun(*args, **kwargs)
    if ctx.module.name == "value" and ctx.method_name == "__call__":
      return out * span[:, :, None, None]
    return out
  with nn.intercept_methods(mask_values):
    return call.rerun(*call.args, **call.kwargs)


def test_check_port_catches_a_bias_split_that_passes_the_identities():
  _, v, clean, corrupt, ll = lm_setup()
  site = Site("block_1/attn", adapter=engine.Output(
      layout="btd", span_fn=_biased_span_fn, span_decomposition="exact"))
  with pytest.raises(engine.PortCheckError, match="parts_complement") as e:
    engine.check_port(ll, v, clean=clean, corrupt=corrupt, site=site,
                      span=_span())
  rep = e.value.report
  ok = rep.passed
  assert ok["self_full"] and ok["self_span"] and ok["span_empty"] and ok["span_all"]
  assert not ok["parts_empty"] and not ok["parts_complement"]
  assert not ok["parts_union"] and ok["parts_all"]
  bias = float(jnp.abs(v["params"]["block_1"]["attn"]["out"]["bias"]).max())
  assert rep.errors["parts_empty"] == pytest.approx(bias, rel=1e-5)
  assert not rep.ok and set(rep.failures) == {
      "parts_empty", "parts_complement", "parts_union"}


def test_check_port_needs_a_span_where_one_is_declared():
  _, v, clean, corrupt, ll = lm_setup()
  with pytest.raises(engine.EngineError, match="span="):
    engine.check_port(ll, v, clean=clean, corrupt=corrupt, site=SITE)


# ------------------------------------------------------ hoisting, every kind

def _count_prefix(build):
  calls = [0]
  ll, v, clean, corrupt, site, probes = build(lambda _: calls.__setitem__(
      0, calls[0] + 1))
  jax.effects_barrier()
  calls[0] = 0                                 # model.init ran the prefix too
  with warnings.catch_warnings():
    warnings.simplefilter("error")             # a failed split warns: fail
    r = engine.audit(ll, v, clean=clean, corrupt=corrupt, site=site,
                     probes=probes, chunk_size=2)
    jax.block_until_ready(r.L_int)
  jax.effects_barrier()
  return calls[0]


def _toy_build(site, probes):
  def build(cb):
    model, v, clean, corrupt, _, _ = make("attn", layers=2, prefix_callback=cb)
    ll = lambda vv, inputs: jax.nn.log_softmax(model.apply(vv, *inputs))[
        :, 0, 0]
    return ll, v, clean, corrupt, site, probes
  return build


def _lm_build(cb):
  _, v, clean, corrupt, ll = lm_setup(prefix_callback=cb)
  span = jnp.asarray(np.random.default_rng(0).random((5, B, L)) < 0.5)
  return ll, v, clean, corrupt, SITE, Probes(span=span)


@pytest.mark.parametrize("build", [
    _toy_build(Site("block_1/retrieval"),
               Probes(span=jnp.asarray(np.random.default_rng(1).random(
                   (5, 3, 8)) < 0.5))),
    _toy_build(Site("block_1/out", adapter=engine.Input(0, layout="btd")),
               engine.position_probes(5)),
    _lm_build,
], ids=["native", "input_adapter", "mhdpa"])
def test_prefix_is_hoisted_at_every_kind_of_site(build):
  # L+ and L− runs, then one clean and one corrupted prefix for all 3 chunks.
  assert _count_prefix(build) == 4
