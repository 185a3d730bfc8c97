"""memory_port's blocked passage encoder ([b m, q + l, e]) against the dense reference.

The reference is the earlier encoder layout and pooling (one (q+n)^2 self-attention
under a passage block mask, in the shared ContextPrologue; pooling over all n
positions under a passage mask), built with the same module names, so both models
share one parameter tree.

Shape legend: B batch, Q query length, N context length, A answer length,
m passages, l positions per passage (= N / m), T reader positions, P ports, D port width.
"""
from __future__ import annotations

import contextlib
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import architectures
from architectures import layers, memory
from architectures import model as model_lib

SIZES = dict(vocab_size=60, context_len=48, num_passages=4, query_len=5, answer_len=2)
OVERRIDES = dict(embed_dim=16, enc_mlp_dim=24, reader_mlp_dim=24, reader_heads=2, reader_layers=2,
                 enc_layers=2, mem_dim=16, mem_heads=4, mem_slots=2)
SITE = "reader/block_1/retrieval"


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


@dataclasses.dataclass(frozen=True)
class DensePassageLayout:
  """The reference layout: one [query; context] sequence under a dense (q+n)^2 block mask."""
  num_passages: int
  passage_local_mixer: bool = True

  @classmethod
  def of_spec(cls, spec):
    return cls(spec.num_passages)

  def pack(self, x, embed, query, context, passage_ids):
    n, nq, e = context.shape[1], query.shape[1], x.shape[-1]
    xq = embed(query) + layers.sinusoid_positions(n + nq, e)[None, n:].astype(x.dtype)
    same = passage_ids[:, :, None] == passage_ids[:, None, :]              # [B,N,N]
    q_ok, c_ok = query != 0, context != 0
    ctx_rows = jnp.concatenate([jnp.broadcast_to(q_ok[:, None, :], same.shape[:2] + (nq,)),
                                same & c_ok[:, None, :]], axis=2)
    q_rows = jnp.concatenate([jnp.broadcast_to(q_ok[:, None, :], q_ok.shape + (nq,)),
                              jnp.zeros(q_ok.shape + (n,), bool)], axis=2)
    mask = jnp.concatenate([q_rows, ctx_rows], axis=1)[:, None]           # [B,1,Q+N,Q+N]
    return jnp.concatenate([xq.astype(x.dtype), x], axis=1), mask

  def unpack(self, seqs, query, context):
    del context
    return seqs[:, query.shape[1]:]


class DenseMemoryPortRetrieval(memory.MemoryPortRetrieval):
  """The reference pooling: softmax over all N positions under a passage mask."""

  def pooling(self, memory_):
    e = memory_.encoded.astype(jnp.float32)
    q = self._heads(self.pool_q(self.pool_norm(memory_.query_summary))[:, None, :]
                    + self.slot_query[None])
    k = self._heads(self.pool_k(e))                                       # [B,N,h,k]
    logits = jnp.einsum("bshk,bnhk->bshn", q, k) / np.sqrt(k.shape[-1])
    in_passage = (memory_.passage_ids[:, None, :]
                  == jnp.arange(self.spec.num_passages)[None, :, None])
    ok = (in_passage & memory_.ctx_mask[:, None, :])[:, :, None, None, :]
    logits = jnp.where(ok, logits[:, None], layers.NEG_INF)              # [B,m,s,h,N]
    return jax.nn.softmax(logits, axis=-1) * ok, jax.nn.logsumexp(logits, axis=-1)

  def _slots(self, memory_, alpha, span_mask):
    v = self._heads(self.pool_v(memory_.encoded.astype(jnp.float32)))  # [B,N,h,k]
    present = jnp.ones(alpha.shape[:3], jnp.float32)
    if span_mask is not None:
      alpha = alpha * span_mask.astype(jnp.float32)[:, None, None, None, :]
      present = (alpha.sum((-2, -1)) > 0).astype(jnp.float32)
    pooled = jnp.einsum("bmshn,bnhk->bmshk", alpha, v)
    pooled = pooled.reshape(*pooled.shape[:3], -1)
    slots = (pooled + self.slot_mlp(pooled)) * present[..., None]
    b, m, s, d = slots.shape
    return slots.reshape(b, m * s, d)


def _model():
  return architectures.build_model(
      dict(family="memory_port", preset="p100k", retrieval_layers="all", overrides=OVERRIDES),
      **SIZES)


def _random_params(model, seed):
  """Initialised parameters plus noise (so zero-initialised weights matter too)."""
  params = architectures.init_params(model, jax.random.PRNGKey(seed))
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 100), len(leaves))
  return jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape)
                                   for x, k in zip(leaves, keys)])


def _inputs(seed, batch=3):
  """Passages of unequal lengths (PAD tails of random length, one passage all PAD),
  queries with PAD tails (at least one token)."""
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


def _run(model, params, x, span_mask):
  """(logits, encoded, h_f, Π_S h_f, slots) of every read port."""
  got, busy = {}, []

  def hook(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == "read" and not busy:
      busy.append(True)  # the extra read/write calls below pass through
      path = "/".join(context.module.path)
      got[path] = dict(h=out, h_span=context.module.read(*args, span_mask=span_mask),
                       slots=context.module.write(args[1]), encoded=args[1].encoded)
      busy.pop()
    return out

  with nn.intercept_methods(hook):
    logits = model.apply(params, *x)
  return logits, got


@pytest.fixture(scope="module")
def runs():
  """(model, blocked run, dense-reference run): jitted once for both seeds."""
  model = _model()
  blocked = jax.jit(lambda p, x, s: _run(model, p, x, s))
  dense_jit = jax.jit(lambda p, x, s: _run(model, p, x, s))

  def dense(params, x, span_mask):
    with dense_reference():
      return dense_jit(params, x, span_mask)
  return model, blocked, dense


@contextlib.contextmanager
def dense_reference():
  """Models traced inside use the reference modules (same parameter tree)."""
  enc, ret = model_lib.LAYOUTS["memory_port"], model_lib.RETRIEVALS["memory_port"]
  model_lib.LAYOUTS["memory_port"] = DensePassageLayout
  model_lib.RETRIEVALS["memory_port"] = DenseMemoryPortRetrieval
  try:
    yield
  finally:
    model_lib.LAYOUTS["memory_port"], model_lib.RETRIEVALS["memory_port"] = enc, ret


@pytest.mark.parametrize("seed", [0, 1])
def test_blocked_encoder_equals_dense_reference(runs, seed):
  model, blocked, dense = runs
  params = _random_params(model, seed)
  x = _inputs(seed)
  span = jnp.asarray(np.random.RandomState(seed + 7).rand(*x[1].shape) < 0.5)
  want = dense(params, x, span)
  got = blocked(params, x, span)
  ctx_ok = np.asarray(x[1] != 0)[..., None]
  np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=1e-5, err_msg="logits")
  assert set(got[1]) == set(want[1]) == {"reader/block_0/retrieval", SITE}
  for path in got[1]:
    for key in ("h", "h_span", "slots", "encoded"):
      g, w = np.asarray(got[1][path][key]), np.asarray(want[1][path][key])
      if key == "encoded":  # PAD positions are never read (pooling masks them)
        g, w = g * ctx_ok, w * ctx_ok
      np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5, err_msg=f"{path} {key}")
  assert float(jnp.abs(got[1][SITE]["h_span"] - got[1][SITE]["h"]).max()) > 1e-3


def test_blocked_encoder_gradients_equal_dense_reference():
  """Training follows the gradients (issue #37: the blocked encoder moved the slow
  memory_port training run): every parameter's gradient of the answer NLL agrees with
  the dense reference at 1e-5 of the leaf's largest gradient, on padded inputs."""
  model = _model()
  params, x = _random_params(model, 0), _inputs(0)

  def nll(p):
    logp = jax.nn.log_softmax(model.apply(p, *x).astype(jnp.float32))     # [B,A,V]
    return -jnp.take_along_axis(logp, x[3][..., None], axis=-1).sum()

  got = jax.jit(jax.grad(nll))(params)
  with dense_reference():
    want = jax.jit(jax.grad(nll))(params)
  flat_got, flat_want = jax.tree.leaves_with_path(got), jax.tree.leaves(want)
  assert len(flat_got) == len(flat_want)
  for (path, g), w in zip(flat_got, flat_want):
    w = np.asarray(w)
    scale = max(float(np.abs(w).max()), 1e-3)
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5 * scale,
                               err_msg=jax.tree_util.keystr(path))


def test_parameter_tree_unchanged():
  """The blocked model has exactly the reference's parameter paths and shapes."""
  model = _model()
  shapes = jax.tree.map(lambda a: a.shape, jax.eval_shape(
      lambda: nn.meta.unbox(model.init(jax.random.PRNGKey(0), *_inputs(0)))))
  enc = model_lib.LAYOUTS["memory_port"]
  model_lib.LAYOUTS["memory_port"] = DensePassageLayout
  try:
    ref = jax.tree.map(lambda a: a.shape, jax.eval_shape(
        lambda: nn.meta.unbox(model.init(jax.random.PRNGKey(0), *_inputs(0)))))
  finally:
    model_lib.LAYOUTS["memory_port"] = enc
  assert shapes == ref


def test_block_mask_shape_and_isolation():
  """Unit: one [query; passage] block per (example, passage); no cross-passage entries."""
  q, c, pid, _ = _inputs(3, batch=2)
  mask = memory.PassageBlocks.block_mask(q, c, pid, SIZES["num_passages"])
  l, nq = SIZES["context_len"] // SIZES["num_passages"], SIZES["query_len"]
  assert mask.shape == (2 * SIZES["num_passages"], 1, nq + l, nq + l)
  assert not bool(mask[:, :, :nq, nq:].any())            # query rows never see a passage
  qok = np.repeat(np.asarray(q != 0), SIZES["num_passages"], axis=0)
  np.testing.assert_array_equal(mask[:, 0, nq:, :nq], np.broadcast_to(qok[:, None], (len(qok), l, nq)))


def test_bad_layout_and_length_raise():
  _, _, pid, _ = _inputs(0)
  with pytest.raises(ValueError, match=r"passage_ids must be position // \(context_len"):
    memory.check_passage_layout(jnp.roll(pid, 1, axis=1), SIZES["num_passages"])
  with pytest.raises(ValueError, match="context_len .* multiple of num_passages"):
    memory.passage_len(50, 4)
  model = architectures.build_model(dict(family="memory_port", preset="p100k"),
                                    **{**SIZES, "context_len": 50})
  with pytest.raises(ValueError, match="context_len .* multiple of num_passages"):
    jax.eval_shape(model.init, jax.random.PRNGKey(0), *architectures.dummy_inputs(model.spec, 1))


def test_data_tasks_produce_the_block_layout():
  """The layout the blocked encoder assumes is the one every data task writes:
  an ATR-insert batch, and the factual-QA row layout (its stream writes rows
  from `layout.Row.empty`, whose passage_ids no later step changes)."""
  from ceu_jax.data import tasks  # pylint: disable=g-import-not-at-top
  from ceu_jax.data.factqa import layout  # pylint: disable=g-import-not-at-top
  from configs import atr_insert, factqa  # pylint: disable=g-import-not-at-top
  cfg = atr_insert.get_config("tiny")
  spec = tasks.of_config(cfg.data)
  data_cfg = spec.config_cls.from_config(cfg.data)
  batch = spec.generate_batch(data_cfg, 0, 0, 4, "train")
  memory.check_passage_layout(batch.passage_ids, data_cfg.num_passages)
  cfg = factqa.get_config("tiny")
  data_cfg = tasks.of_config(cfg.data).config_cls.from_config(cfg.data)
  row = layout.Row.empty(data_cfg)
  memory.check_passage_layout(row.passage_ids[None], data_cfg.num_passages)
