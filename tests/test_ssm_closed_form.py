"""SSM read port in closed form (issue #23): Π_S of the slot states as a masked sum
of per-token contributions, against the masked re-scan and the sequential
`lax.scan` reference; SPEC §1 identities through the engine; the read scan runs
once per call whatever the number of probes.

Shape legend: K probes, B batch, N context tokens, P read slots, c inner
channels, s state size, T reader positions.
"""
from __future__ import annotations

import collections
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import architectures
from architectures import ssm
from architectures import ssm_scan
from architectures.port import ContextMemory
from architectures.spec import SCAN_IMPLS, make_spec
from ceu_jax import engine
from ceu_jax.retrieval_adapter import ModelInputs, loglik_fn_for as make_loglik_fn


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


# ------------------------------------------------------------------ references

def masked_rescan_states(a, bx, passage_ids, num_slots, span_mask, impl):
  """The pre-#23 path: the recurrence re-run with inputs outside S zeroed
  (gates kept), the states read at passage ends. [B, P, c, s]."""
  if span_mask is not None:
    bx = bx * span_mask.astype(bx.dtype)[..., None, None]
  h = ssm.run_scan(a, bx, impl)
  ends = ssm.passage_end_onehot(passage_ids, num_slots).astype(bx.dtype)
  return jnp.einsum("bpn,bncs->bpcs", ends, h)


def _layout(kind: str, b: int, n: int, p: int, seed: int) -> np.ndarray:
  """[B, N] passage ids: equal blocks, ragged sorted blocks, or a layout with
  padding ids (-1 and p, outside the slots) and a passage split in two runs."""
  rng = np.random.default_rng(seed)
  if kind == "blocks":
    return np.broadcast_to(np.repeat(np.arange(p), n // p), (b, n)).copy()
  if kind == "ragged":
    return np.sort(rng.integers(0, p, (b, n)), axis=1)
  ids = np.sort(rng.integers(0, p, (b, n)), axis=1)
  ids[:, : n // 8] = p                 # a leading run outside the slots
  ids[:, -(n // 8):] = -1              # trailing padding
  ids[:, n // 2: n // 2 + 3] = 0       # passage 0 again: two runs feed slot 0
  return ids


def _gates(key, b, n, c, s, dtype, lo=0.3, hi=1.0):
  ka, kb = jax.random.split(key)
  a = jax.random.uniform(ka, (b, n, c, s), dtype, minval=lo, maxval=hi)
  bx = jax.random.normal(kb, (b, n, c, s), dtype)
  return a, bx


def _spans(key, b, n, pid):
  """Named [B, N] masks: random, empty, full, windows crossing a passage boundary."""
  first_end = np.argmax(pid != pid[:, :1], axis=1)          # first boundary
  pos = np.arange(n)[None]
  cross = (pos >= first_end[:, None] - 3) & (pos < first_end[:, None] + 4)
  return {"random": jax.random.bernoulli(key, 0.4, (b, n)),
          "empty": jnp.zeros((b, n), bool), "full": jnp.ones((b, n), bool),
          "crossing": jnp.asarray(cross),
          "soft": jax.random.uniform(key, (b, n))}            # float masks interpolate


# One small program per (impl, span kind): the spans are arguments, so the programs are
# compiled once and reused across spans (one program holding every pair compiled ~5x slower).
@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _closed_states(a, bx, pid, p, reset, impl, span):
  return ssm.slot_contributions(a, bx, pid, p, reset, impl).states(span)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _rescan_states(a, bx, pid, p, impl, span):
  return masked_rescan_states(a, bx, pid, p, span, impl)


def _closed_and_references(a, bx, pid, p, reset, spans):
  """{(impl, span name): (closed form, [re-scan with each impl])}."""
  if reset:
    a = a * (1.0 - ssm.passage_starts(pid))[..., None, None].astype(a.dtype)
  out = {}
  for impl in SCAN_IMPLS:
    for name, span in list(spans.items()) + [("none", None)]:
      out[impl, name] = (_closed_states(a, bx, pid, p, reset, impl, span),
                         [_rescan_states(a, bx, pid, p, r, span) for r in SCAN_IMPLS])
    out[impl, "complement"] = (_closed_states(a, bx, pid, p, reset, impl, spans["random"])
                               + _closed_states(a, bx, pid, p, reset, impl, ~spans["random"]),
                               [_closed_states(a, bx, pid, p, reset, impl, None)])
  return out


def _check_against_references(a, bx, pid, p, reset, tol):
  spans = _spans(jax.random.PRNGKey(5), pid.shape[0], pid.shape[1], np.asarray(pid))
  got = _closed_and_references(a, bx, pid, p, reset, spans)
  assert len(got) == len(SCAN_IMPLS) * (len(spans) + 2)
  for (impl, name), (closed, refs) in got.items():
    assert closed.dtype == a.dtype and closed.shape == (a.shape[0], p) + a.shape[2:]
    for ref in refs:
      np.testing.assert_allclose(closed, ref, atol=tol, rtol=tol, err_msg=f"{impl}, {name}")
    if name == "empty":
      assert float(jnp.abs(closed).max()) == 0.0


# ------------------------------------------------------------------ closed form vs references

@pytest.mark.parametrize("reset", [True, False])
@pytest.mark.parametrize("kind", ["blocks", "ragged", "padded"])
def test_closed_form_equals_rescan_float32(reset, kind):
  b, n, c, s, p = 3, 48, 3, 4, 4
  a, bx = _gates(jax.random.PRNGKey(0), b, n, c, s, jnp.float32)
  pid = jnp.asarray(_layout(kind, b, n, p, seed=1), jnp.int32)
  _check_against_references(a, bx, pid, p, reset, tol=1e-5)


@pytest.mark.parametrize("reset", [True, False])
def test_closed_form_equals_rescan_float64(reset):
  with jax.enable_x64(True):
    b, n, c, s, p = 2, 40, 2, 3, 4
    a, bx = _gates(jax.random.PRNGKey(2), b, n, c, s, jnp.float64)
    pid = jnp.asarray(_layout("padded", b, n, p, seed=3), jnp.int32)
    _check_against_references(a, bx, pid, p, reset, tol=1e-10)


@pytest.mark.parametrize("reset", [True, False])
def test_long_context_gate_products_underflow(reset):
  """Passages of 512 tokens with gates ≤ 0.6: Π A underflows float32 (0.6^200
  ≈ 1e-44) within a passage; the suffix products come out 0, never 0/0."""
  b, n, c, s, p = 1, 1024, 2, 2, 2
  a, bx = _gates(jax.random.PRNGKey(4), b, n, c, s, jnp.float32, lo=0.3, hi=0.6)
  pid = jnp.asarray(_layout("blocks", b, n, p, seed=0), jnp.int32)
  a_r = a * (1.0 - ssm.passage_starts(pid))[..., None, None] if reset else a
  terms = jax.jit(lambda a, bx: ssm.slot_contributions(a, bx, pid, p, reset, "associative").terms)(
      a_r, bx)
  assert bool(jnp.isfinite(terms).all())
  first = terms[:, 0] if reset else terms[:, 0, 0]
  assert float(jnp.abs(first).max()) == 0.0        # Π over ~1000 gates underflowed
  _check_against_references(a, bx, pid, p, reset, tol=1e-5)


def test_gradients_equal_the_rescan_gradients_float64():
  """CER training differentiates through Π_S: same gradients as the re-scan."""
  with jax.enable_x64(True):
    b, n, c, s, p = 2, 24, 2, 2, 3
    a, bx = _gates(jax.random.PRNGKey(6), b, n, c, s, jnp.float64)
    pid = jnp.asarray(_layout("ragged", b, n, p, seed=7), jnp.int32)
    span = jax.random.bernoulli(jax.random.PRNGKey(8), 0.5, (b, n))
    w = jax.random.normal(jax.random.PRNGKey(9), (b, p, c, s), jnp.float64)

    keep = (1.0 - ssm.passage_starts(pid))[..., None, None]          # resets inside both

    def closed(a, bx):
      con = ssm.slot_contributions(a * keep, bx, pid, p, True, "associative")
      return jnp.sum(w * con.states(span))

    def rescan(a, bx):
      return jnp.sum(w * masked_rescan_states(a * keep, bx, pid, p, span, "sequential"))

    grads = jax.jit(lambda a, bx: (jax.grad(closed, (0, 1))(a, bx),
                                   jax.grad(rescan, (0, 1))(a, bx)))(a, bx)
    for g, r in zip(*grads):
      assert g.dtype == jnp.float64 and float(jnp.abs(g).max()) > 0
      np.testing.assert_allclose(g, r, atol=1e-10, rtol=1e-10)


# ------------------------------------------------------------------ the module's port

SIZES = dict(vocab_size=40, context_len=24, num_passages=3, query_len=4, answer_len=2)


def _port(reset: bool = True, impl: str = "associative", layout: str = "ragged"):
  spec = make_spec(dict(family="ssm", preset="p100k",
                        overrides=dict(ssm_reset_at_passages=reset, scan_impl=impl,
                                       ssm_inner=8, ssm_state=4, embed_dim=16)), **SIZES)
  port = ssm.SSMRetrieval(spec)
  r = np.random.default_rng(0)
  b, n, t = 2, SIZES["context_len"], 5
  pid = jnp.asarray(_layout(layout, b, n, 3, seed=2), jnp.int32)
  memory = ContextMemory(encoded=jnp.asarray(r.normal(size=(b, n, 16)), jnp.float32),
                         query_summary=jnp.asarray(r.normal(size=(b, 16)), jnp.float32),
                         passage_ids=pid, ctx_mask=jnp.ones((b, n), bool))
  x = jnp.asarray(r.normal(size=(b, t, 16)), jnp.float32)
  variables = port.init(jax.random.PRNGKey(1), x, memory)
  # Non-zero FiLM so that the query path is exercised too.
  variables = jax.tree.map(lambda v: v + 0.1 * jnp.ones_like(v), variables)
  return port, variables, x, memory


@pytest.mark.parametrize("reset", [True, False])
@pytest.mark.parametrize("impl,layout", [("associative", "ragged"), ("fused", "ragged"),
                                         ("fused", "padded"), ("chunked", "ragged"),
                                         ("chunked", "padded"), ("linear", "ragged"),
                                         ("linear", "padded")])
def test_port_read_equals_masked_rescan(reset, impl, layout):
  """Every read — the fused scan's unmasked one and the chunked path's contributions
  from the gate factors included — equals the masked re-scan (padded: ids outside
  the slots and a passage split in two runs)."""
  port, variables, x, memory = _port(reset, impl, layout)
  b, n = memory.passage_ids.shape
  spans = _spans(jax.random.PRNGKey(3), b, n, np.asarray(memory.passage_ids))

  read = jax.jit(lambda variables, x, memory, span: port.apply(variables, x, memory, span,
                                                                method="read"))
  a, bx, c = jax.jit(lambda variables, x, memory: (
      *port.apply(variables, memory, method="gates_and_inputs"),
      port.apply(variables, x, method=lambda m, x: m.c_proj(x))))(variables, x, memory)
  for name, span in list(spans.items()) + [("none", None)]:
    got = read(variables, x, memory, span)
    for impl in SCAN_IMPLS:
      want = jnp.einsum("bts,bpcs->btpc", c, _rescan_states(a, bx, memory.passage_ids, 3, impl,
                                                            span))
      np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=f"{name}, {impl}")
  with pytest.raises(ValueError, match="span_mask must have shape"):
    port.apply(variables, x, memory, jnp.ones((b, n + 1), bool), method="read")


# ------------------------------------------------------------------ through the engine

@functools.lru_cache(maxsize=None)   # one init per scan: every test gets immutable arrays
def _model_and_batch(impl: str = "associative"):
  cfg = dict(family="ssm", preset="p100k",
             overrides=dict(scan_impl=impl, ssm_inner=8, ssm_state=4, embed_dim=16,
                            reader_mlp_dim=32, reader_heads=2, reader_layers=1))
  model = architectures.build_model(cfg, **SIZES)
  variables = architectures.init_params(model, jax.random.PRNGKey(0))
  r = np.random.default_rng(1)
  b, n = 3, SIZES["context_len"]
  q = jnp.asarray(r.integers(3, 40, (b, SIZES["query_len"])), jnp.int32)
  ctx = r.integers(3, 40, (b, n))
  pid = jnp.asarray(_layout("blocks", b, n, 3, seed=0), jnp.int32)
  ans = jnp.asarray(r.integers(3, 40, (b, SIZES["answer_len"])), jnp.int32)
  bad = ctx.copy()
  bad[:, 5:12] = 3 + (bad[:, 5:12] + 7) % 37                     # corrupt across a boundary
  clean = ModelInputs(q, jnp.asarray(ctx, jnp.int32), pid, ans)
  corrupt = ModelInputs(q, jnp.asarray(bad, jnp.int32), pid, ans)
  return model, variables, clean, corrupt, architectures.read_port_site(cfg)


def test_spec_identities_through_the_engine():
  """SPEC §1: D+ into D+ gives L+; S = all equals the full patch; S = ∅ gives L−."""
  model, variables, clean, corrupt, site = _model_and_batch()
  ll = make_loglik_fn(model)
  b, n = clean.context.shape
  ev = jnp.zeros((b, n), bool).at[:, 5:12].set(True)
  spans = engine.Probes(span=jnp.stack([jnp.ones_like(ev), jnp.zeros_like(ev), ev, ~ev]))

  @jax.jit
  def run(v):
    il = lambda c, d, p: engine.intervened_logliks(ll, v, clean=c, corrupt=d, site=site,
                                                   probes=p, chunk_size=2)
    return dict(L_plus=ll(v, clean), L_minus=ll(v, corrupt),
                self_span=il(clean, clean, spans), full=il(clean, corrupt, engine.Probes())[0],
                span=il(clean, corrupt, spans))
  r = run(variables)
  assert float(jnp.abs(r["L_plus"] - r["L_minus"]).min()) > 1e-4
  for k in range(4):
    np.testing.assert_allclose(r["self_span"][k], r["L_plus"], atol=1e-5)
  np.testing.assert_allclose(r["span"][0], r["full"], atol=1e-5)
  np.testing.assert_allclose(r["span"][1], r["L_minus"], atol=1e-5)
  assert not np.allclose(r["span"][2], r["L_minus"], atol=1e-4)   # the patch does something


def _scan_count(jaxpr) -> int:
  """`scan` primitives in a jaxpr, nested ones included."""
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == "scan"
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):   # ClosedJaxpr
          n += _scan_count(sub.jaxpr)
        elif hasattr(sub, "eqns"):                              # Jaxpr
          n += _scan_count(sub)
  return n


def _probe_loop(jaxpr, n_chunks: int):
  """The body of the engine's `lax.map` over chunks (a scan of length n_chunks)."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan" and eqn.params["length"] == n_chunks:
      return eqn.params["jaxpr"].jaxpr
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        inner = sub.jaxpr if hasattr(sub, "consts") else sub
        if hasattr(inner, "eqns"):
          found = _probe_loop(inner, n_chunks)
          if found is not None:
            return found
  return None


@pytest.mark.parametrize("hoist", [True, False])
def test_read_scan_is_outside_the_probe_loop(hoist):
  """With the sequential scan (a `scan` primitive per recurrence), the engine's
  loop over probe chunks holds no scan: the contributions are loop-invariant."""
  model, variables, clean, corrupt, site = _model_and_batch("sequential")
  ll = make_loglik_fn(model)
  b, n = clean.context.shape
  spans = jax.random.bernoulli(jax.random.PRNGKey(0), 0.3, (6, b, n))
  closed = jax.make_jaxpr(lambda v, s: engine.intervened_logliks(
      ll, v, clean=clean, corrupt=corrupt, site=site, probes=engine.Probes(span=s),
      chunk_size=2, hoist=hoist))(
          variables, spans)
  body = _probe_loop(closed.jaxpr, n_chunks=3)
  assert body is not None
  # The per-probe work holds the reader's suffix but no recurrence; without
  # hoisting both runs (encoder and read scans) are inside the loop.
  if hoist:
    assert _scan_count(body) == 0
    assert _scan_count(closed.jaxpr) >= 4      # encoder + read scans, clean and corrupt
  else:
    assert _scan_count(body) >= 4


@pytest.mark.parametrize("impl,name,unmasked", [("associative", "slot_contributions", True),
                                                ("chunked", "gate_slot_contributions", True),
                                                ("linear", "gate_slot_contributions", False)])
def test_contributions_computed_once_whatever_the_number_of_probes(monkeypatch, impl, name,
                                                                   unmasked):
  """Executions of the contributions (counted by a host callback inside them)
  do not grow with K: L+ and L− runs, then one on the clean and one on the
  corrupted run, shared by every chunk (`unmasked`: the impl reads h from the
  contributions too, so the port's `read_and_span` gives h and Π_S h from one set;
  the linear scan reads h by its scan, so only the two Π_S h count)."""
  calls = [0]
  inner = getattr(ssm, name)

  def counted(a, *args, **kw):
    leaf = jax.tree.leaves(a)[0]
    jax.debug.callback(lambda _: calls.__setitem__(0, calls[0] + 1), leaf.sum())
    return inner(a, *args, **kw)

  monkeypatch.setattr(ssm, name, counted)
  model, variables, clean, corrupt, site = _model_and_batch(impl)
  ll = make_loglik_fn(model)
  b, n = clean.context.shape

  def executions(k, **kw):
    calls[0] = 0
    spans = jax.random.bernoulli(jax.random.PRNGKey(k), 0.3, (k, b, n))
    r = engine.audit(ll, variables, clean=clean, corrupt=corrupt, site=site,
                     probes=engine.Probes(span=spans), chunk_size=2, **kw)
    jax.block_until_ready(r.L_int)
    jax.effects_barrier()
    return calls[0]

  per_run = 1                                             # (h, Π_S h) at once, or Π_S h
  plain = 2 if unmasked else 0                            # the L+ and L− runs
  assert executions(4) == executions(12) == plain + 2 * per_run     # 2 and 6 chunks
  assert executions(12, hoist=False) == plain + 2 * per_run * 6     # per chunk, no hoisting


@pytest.mark.parametrize("impl", ["chunked", "associative", "linear"])
def test_one_call_for_h_and_its_span_part_equals_two_reads(monkeypatch, impl):
  """The port's `read_and_span` (the engine's `span_pair_method`): the engine's L_int and
  its gradients equal those of the two reads (`read`, then `read` with the span) at 1e-5
  of each leaf's scale; the port is entered once per run (the site method not at all);
  on 'linear' it is the two reads themselves, bit for bit."""
  model, variables, clean, corrupt, site = _model_and_batch(impl)
  ll = make_loglik_fn(model)
  b, n = clean.context.shape
  spans = jax.random.bernoulli(jax.random.PRNGKey(3), 0.4, (3, b, n))

  def value_and_grads():
    fresh = lambda v, inputs: ll(v, inputs)   # a new function: no program of the other mode

    def l_int(v):
      return engine.audit(fresh, v, clean=clean, corrupt=corrupt, site=site,
                          probes=engine.Probes(span=spans), chunk_size=3).L_int
    def weighted(v):   # L_int as the aux output: the values come from the same programs
      values = l_int(v)
      return jnp.sum(values * jnp.arange(1.0, 4.0)[:, None]), values
    (total, values), grads = jax.value_and_grad(weighted, has_aux=True)(variables)
    return (total, grads), values

  entered = collections.Counter()
  for method in ("contributions", "read_and_span"):
    original = getattr(ssm.SSMRetrieval, method)

    def spy(self, *a, _name=method, _f=original, **kw):
      entered[_name] += 1
      return _f(self, *a, **kw)
    monkeypatch.setattr(ssm.SSMRetrieval, method, spy)
  (total, grads), got = value_and_grads()
  pairs, sets = entered["read_and_span"], entered["contributions"]
  assert pairs > 0, entered
  monkeypatch.setattr(ssm.SSMRetrieval, "span_pair_method", None)   # the two reads
  entered.clear()
  (want_total, want_grads), want = value_and_grads()
  # with two reads each patched run makes a second set (not on 'linear': h by its scan)
  assert entered == {"contributions": sets + (0 if impl == "linear" else pairs)}, entered
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(total, want_total, rtol=1e-5, atol=1e-5)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grads),
                          jax.tree.leaves(want_grads)):
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(np.asarray(g) / scale, np.asarray(w) / scale, rtol=0,
                               atol=1e-5, err_msg=jax.tree_util.keystr(path))
    if impl == "linear":
      np.testing.assert_array_equal(g, w)
  assert max(float(np.abs(w).max()) for w in jax.tree.leaves(want_grads)) > 1e-4


def test_masked_sum_gradient_by_slot_sums_equals_autodiffs_dot():
  """`ssm_scan.masked_sum`'s written-out gradient (the slot sum per element) against
  autodiff of the einsum: values, ∂terms and ∂w at 1e-5, with the weights batched over
  probes (vmap) and the terms shared, as the engine runs it."""
  kw, kt, kg = jax.random.split(jax.random.PRNGKey(4), 3)
  w = jax.random.normal(kw, (3, 2, 4, 10))                    # 3 probes x [b,p,n]
  terms = jax.random.normal(kt, (2, 10, 5, 6))                # [b,n,c,s]
  g = jax.random.normal(kg, (3, 2, 4, 5, 6))
  ref = lambda w, t: jnp.sum(g * jax.vmap(lambda wi: jnp.einsum("bpn,bncs->bpcs", wi, t))(w))
  fast = lambda w, t: jnp.sum(g * jax.vmap(lambda wi: ssm_scan.masked_sum(wi, t))(w))
  np.testing.assert_allclose(jax.jit(fast)(w, terms), jax.jit(ref)(w, terms),
                             rtol=1e-5, atol=1e-5)
  for got, want, name in zip(jax.jit(jax.grad(fast, (0, 1)))(w, terms),
                             jax.jit(jax.grad(ref, (0, 1)))(w, terms), ("w", "terms")):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("impl,flag", [("chunked", True), ("associative", True),
                                       ("linear", False), ("fused", False)])
def test_masked_sums_gradient_form_follows_the_scan(impl, flag):
  """The slot-sum gradient is on where both reads go through the contributions, off for
  'linear' / 'fused' (the CPU's recorded numbers keep their float rounding)."""
  port, variables, _, memory = _port(impl=impl)
  con = port.apply(variables, memory, method=lambda m, mem: m.contributions(mem))
  assert con.slot_sum_grad is flag
