"""Issue #14 item 5: the families share one context prologue, one memory structure and
one read-port base — and the refactor changed no number.

Against the frozen pre-refactor models (tests/_architectures_pre14.py), at the same
parameters: the same parameter tree (so existing checkpoints load), the same logits
and the same h_f and Π_S h_f at every read port, to 1e-5.

Shape legend: B batch, Q query length, N context length, A answer length,
T reader positions, P ports, D port features, E embed.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import architectures
from architectures import model as model_lib
from architectures import port as port_lib
from architectures import prologue as prologue_lib
from architectures.spec import make_spec
from tests import _architectures_pre14 as pre14


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


SIZES = dict(vocab_size=50, context_len=24, num_passages=3, query_len=4, answer_len=2)
SMALL = dict(embed_dim=16, enc_mlp_dim=24, reader_mlp_dim=24, reader_heads=2, reader_layers=2,
             enc_layers=2, read_heads=2, read_head_dim=8, ssm_inner=8, ssm_state=4,
             mem_dim=16, mem_heads=2)
# (family, bypass, extra overrides): every family, both fusion modes, and the options
# that change a port's layout (memory slots per passage, SSM without passage resets);
# one case per family by default, the rest under -m slow.
CASES = [("attention", False, {}), ("ssm", True, {}), ("memory_port", False, {"mem_slots": 2}),
         pytest.param("attention", True, {}, marks=pytest.mark.slow),
         pytest.param("ssm", False, {"ssm_reset_at_passages": False}, marks=pytest.mark.slow),
         pytest.param("memory_port", True, {}, marks=pytest.mark.slow)]


def _cfg(family, bypass, extra):
  return dict(family=family, preset="p100k", retrieval_layers="all", bypass=bypass,
              overrides=dict(SMALL, **extra))


def _inputs(seed, batch=3):
  """Passages with PAD tails of random length (one passage all PAD), queries with PAD tails."""
  r = np.random.RandomState(seed)
  n, m, nq = SIZES["context_len"], SIZES["num_passages"], SIZES["query_len"]
  l = n // m
  c = r.randint(3, SIZES["vocab_size"], (batch, m, l))
  lengths = r.randint(1, l + 1, (batch, m))
  lengths[0, 1] = 0
  c = np.where(np.arange(l)[None, None] < lengths[..., None], c, 0).reshape(batch, n)
  q = r.randint(3, SIZES["vocab_size"], (batch, nq))
  q = np.where(np.arange(nq)[None] < r.randint(1, nq + 1, (batch, 1)), q, 0)
  pid = np.broadcast_to(np.arange(n) // l, (batch, n))
  a = r.randint(3, SIZES["vocab_size"], (batch, SIZES["answer_len"]))
  return tuple(jnp.asarray(x, jnp.int32) for x in (q, c, pid, a))


def _noisy_params(model, seed):
  """Initialised parameters plus noise (so zero-initialised weights such as FiLM matter)."""
  params = architectures.init_params(model, jax.random.PRNGKey(seed))
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 100), len(leaves))
  return jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape)
                                   for x, k in zip(leaves, keys)])


def _run(model, params, x, span):
  """(logits, {port path: (h_f, Π_S h_f)}) of one forward pass."""
  got = {}

  def hook(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == "read" and "span_mask" not in kwargs:
      got["/".join(context.module.path)] = (out, next_fun(*args, span_mask=span))
    return out

  with nn.intercept_methods(hook):
    logits = model.apply(params, *x)
  return logits, got


def _shapes(model, x):
  return jax.tree.map(lambda a: (a.shape, a.dtype), jax.eval_shape(
      lambda: nn.meta.unbox(model.init(jax.random.PRNGKey(0), *x))))


@pytest.mark.parametrize("family,bypass,extra", CASES)
def test_refactored_model_equals_pre_refactor_model(family, bypass, extra):
  cfg = _cfg(family, bypass, extra)
  new = architectures.build_model(cfg, **SIZES)
  old = pre14.RetrievalModel(make_spec(cfg, **SIZES))
  x = _inputs(0)
  assert _shapes(new, x) == _shapes(old, x)           # stable names: checkpoints load
  params = _noisy_params(new, 0)
  span = jnp.asarray(np.random.RandomState(7).rand(*x[1].shape) < 0.5)
  run = jax.jit(lambda model, p, x, s: _run(model, p, x, s), static_argnums=0)
  want_logits, want = run(old, params, x, span)
  got_logits, got = run(new, params, x, span)
  np.testing.assert_allclose(got_logits, want_logits, atol=1e-5, rtol=1e-5, err_msg="logits")
  sites = [s.path for s in architectures.read_port_sites(cfg)]
  assert sorted(got) == sorted(want) == sorted(sites)
  for path in sites:
    for name, g, w in zip(("h_f", "Π_S h_f"), got[path], want[path]):
      np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5, err_msg=f"{path} {name}")
  # The comparison can fail: the span part differs from h_f, the logits from the context.
  h, h_span = got[sites[-1]]
  assert float(jnp.abs(h - h_span).max()) > 1e-3
  other = (x[0], _inputs(1)[1], x[2], x[3])
  assert float(jnp.abs(run(new, params, other, span)[0] - got_logits).max()) > 1e-4


# The shared pieces ------------------------------------------------------------------

def _memories(cfg, x):
  """{family encoder output}: the ContextMemory the encoder hands the read port."""
  model = architectures.build_model(cfg, **SIZES)
  got = {}

  def keep(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == "__call__" and context.module.name == "context_encoder":
      got["memory"] = out
    return out

  def run():
    params = model.init(jax.random.PRNGKey(0), *x)
    with nn.intercept_methods(keep):
      model.apply(params, *x)
    return got["memory"]
  return jax.eval_shape(run)


@pytest.mark.parametrize("family", list(architectures.FAMILIES))
def test_every_encoder_writes_the_same_memory_structure(family):
  x = _inputs(0)
  memory = _memories(_cfg(family, False, {}), x)
  assert type(memory) is port_lib.ContextMemory
  b, n = x[1].shape
  e = SMALL["embed_dim"]
  shapes = {k: (v.shape, v.dtype) for k, v in vars(memory).items()}
  assert shapes == {"encoded": ((b, n, e), jnp.float32),
                    "query_summary": ((b, e), jnp.float32),
                    "passage_ids": ((b, n), jnp.int32),
                    "ctx_mask": ((b, n), jnp.bool_)}


def test_attention_and_memory_port_encoders_are_the_one_prologue():
  layouts = {}
  for family in architectures.FAMILIES:
    spec = make_spec(_cfg(family, False, {}), **SIZES)
    encoder = model_lib.context_encoder(spec, name="context_encoder")
    if isinstance(encoder, prologue_lib.ContextPrologue):
      layouts[family] = type(encoder.layout).__name__
  assert layouts == {"attention": "FlatContext", "memory_port": "PassageBlocks"}


@pytest.mark.parametrize("family", list(architectures.FAMILIES))
def test_every_port_is_a_read_port(family):
  """Every family's port inherits `read` (the span-mask check and the constraint)
  from the base and declares how its Π_S is computed."""
  cls = model_lib.RETRIEVALS[family]
  assert issubclass(cls, port_lib.ReadPort)
  assert "read" not in vars(cls) and "port_values" in vars(cls)
  assert cls.span_decomposition in port_lib.SPAN_DECOMPOSITIONS
  assert cls.span_decomposition == architectures.span_decomposition(family)


class _ScalePort(port_lib.ReadPort):
  """A toy port: h_f[b, t, p, :] = x_t * Σ_{n∈S} encoded_n (P = 1), in float32."""
  span_decomposition = "exact"

  def port_values(self, x, memory, span_mask):
    w = jnp.ones(memory.ctx_mask.shape) if span_mask is None else span_mask.astype(jnp.float32)
    pooled = jnp.einsum("bn,bne->be", w, memory.encoded.astype(jnp.float32))
    return (x.astype(jnp.float32) * pooled[:, None, :])[:, :, None, :]

  def setup(self):
    self.out_proj = lambda h: 2.0 * h


def test_read_port_base_checks_the_span_and_casts_to_the_compute_dtype():
  spec = make_spec(dict(family="attention", preset="p100k", dtype="bfloat16",
                        overrides=SMALL), **SIZES)
  b, n, t, e = 2, SIZES["context_len"], 3, 4
  r = np.random.RandomState(0)
  memory = port_lib.ContextMemory(
      encoded=jnp.asarray(r.normal(size=(b, n, e)), jnp.float32),
      query_summary=jnp.zeros((b, e)), passage_ids=jnp.zeros((b, n), jnp.int32),
      ctx_mask=jnp.ones((b, n), bool))
  x = jnp.asarray(r.normal(size=(b, t, e)), jnp.float32)
  port = _ScalePort(spec)
  h = port.apply({}, x, memory, method="read")
  assert h.shape == (b, t, 1, e) and h.dtype == jnp.bfloat16
  want = x * memory.encoded.sum(1)[:, None, :]
  np.testing.assert_allclose(np.asarray(h[:, :, 0], np.float32), want, rtol=1e-2, atol=1e-2)
  span = jnp.asarray(r.rand(b, n) < 0.5)
  parts = [port.apply({}, x, memory, s, method="read") for s in (span, ~span)]
  np.testing.assert_allclose(np.asarray(parts[0] + parts[1], np.float32),
                             np.asarray(h, np.float32), rtol=2e-2, atol=2e-2)
  np.testing.assert_allclose(np.asarray(port.apply({}, x, memory), np.float32),
                             2.0 * np.asarray(h[:, :, 0], np.float32), rtol=1e-2)
  for bad in ((b, n + 1), (b + 1, n), (n,)):
    with pytest.raises(ValueError, match=r"span_mask must have shape \[B, N\] = \(2, 24\)"):
      port.apply({}, x, memory, jnp.ones(bad, bool), method="read")


def test_read_port_base_constrains_the_activation():
  """Under a mesh and logical rules, every family's read applies the [batch, length,
  ports, kv] constraint (the live behaviour is tests/test_sharding_live.py)."""
  from jax.sharding import Mesh  # pylint: disable=g-import-not-at-top
  spec = make_spec(dict(family="attention", preset="p100k", overrides=SMALL), **SIZES)
  b, n, t, e = 2, SIZES["context_len"], 3, 4
  memory = port_lib.ContextMemory(
      encoded=jnp.ones((b, n, e)), query_summary=jnp.zeros((b, e)),
      passage_ids=jnp.zeros((b, n), jnp.int32), ctx_mask=jnp.ones((b, n), bool))
  x = jnp.ones((b, t, e))
  read = lambda x: _ScalePort(spec).apply({}, x, memory, method="read")
  mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
  rules = [("batch", "data"), ("length", None), ("ports", None), ("kv", None)]
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    live = str(jax.make_jaxpr(read)(x))
  off = str(jax.make_jaxpr(read)(x))
  assert "sharding_constraint" in live and "sharding_constraint" not in off
