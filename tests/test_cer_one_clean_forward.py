"""CER records the port in the same forward on D+ that gives L+ and EM (issue #37, item 3).

`losses.cer_loss` takes the logits on D+ and the probes' L_int from
`engine.clean_run_and_intervened` (one clean forward). The reference is the
earlier two-forward computation (`model.apply` for the logits, then
`engine.intervened_logliks` recording h_f in a second run on D+), swapped in
for `losses.clean_forward_and_probes`; loss, metrics and gradients must agree
at 1e-5 on every family. The engine entry point is also checked on its own,
chunked (K > C, hoisted or not) and unchunked.

Shape legend: B batch, K probes, A answer length, V vocabulary.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import architectures
from ceu_jax import engine
from ceu_jax import retrieval_adapter as adapter
from ceu_jax.engine import runner
from ceu_jax.retrieval_adapter import ModelInputs
from ceu_jax.train import losses
from tests import test_losses_cer

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off

B = 8
SMALL = dict(embed_dim=16, reader_mlp_dim=32, enc_mlp_dim=32, reader_heads=2, reader_layers=2)
FAMILY_OVERRIDES = {   # small widths per family (the read port is reader/block_1)
    "attention": dict(read_heads=2, read_head_dim=8),
    "ssm": dict(ssm_inner=8, ssm_state=4),
    "memory_port": dict(mem_dim=16, mem_heads=4, mem_slots=1),
}
CFG = losses.LossConfig(regularizer="evidence_distractor", k=3, beta_swap=0.4,
                        swap_form="hinge", gamma=2.0)


@functools.lru_cache(maxsize=None)
def _setup(family: str, dtype: str = "float32"):
  """(model, params, D+, D−, site); dtype 'float64' only inside `jax.enable_x64(True)`: the
  float64 model with the float32 setup's parameters (cast) and batches, so that each family
  initialises once (an `init` program costs seconds to compile)."""
  model_cfg = dict(family=family, preset="p100k", bypass=False, dtype=dtype,
                   overrides={**SMALL, **FAMILY_OVERRIDES[family]})
  if dtype == "float32":
    model, params, clean, corrupt, site = test_losses_cer.cer_setup(model_cfg, B)
  else:
    with jax.enable_x64(False):
      m, params, clean, corrupt, site = _setup(family)
    model = architectures.build_model(
        model_cfg, vocab_size=m.spec.vocab_size, context_len=m.spec.context_len,
        num_passages=m.spec.num_passages, query_len=m.spec.query_len,
        answer_len=m.spec.answer_len)
  params = jax.tree.map(lambda p: p.astype(model.spec.compute_dtype), params)
  return model, params, clean, corrupt, site


def two_forward_reference(model, variables, site, clean, corrupt, probes, frozen,
                          allow_approximate):
  """The earlier computation: logits from one forward on D+, L_int from the engine,
  which records h_f in a second forward on D+ (under stop_gradient when frozen), and
  L− from a third, separate run on D−."""
  logits = model.apply(variables, *clean.model_inputs())
  loglik = adapter.loglik_fn_for(model)
  l_int = runner.intervened_logliks(
      loglik, variables, clean=ModelInputs.of(clean, frozen=frozen),
      corrupt=ModelInputs.of(corrupt), site=runner.Site.parse(site), probes=probes,
      chunk_size=probes.num, allow_approximate=allow_approximate)
  return logits, l_int, loglik(variables, ModelInputs.of(corrupt))


def _loss_and_grads(family: str, cfg: losses.LossConfig, dtype: str = "float32"):
  model, params, clean, corrupt, site = _setup(family, dtype)
  fn = lambda p: losses.cer_loss(p, model, site, clean, corrupt, jax.random.PRNGKey(7), cfg,
                                 allow_approximate=family == "memory_port")
  return jax.jit(jax.value_and_grad(fn, has_aux=True))(params)


@pytest.mark.parametrize("family,grad_path", [
    ("attention", "all"), ("ssm", "all"), ("memory_port", "all"),
    ("attention", "numerator")])   # numerator mode is family-independent code
def test_loss_and_grads_equal_two_forward_reference(family, grad_path, monkeypatch):
  """In float64 (the model's compute dtype, inside `jax.enable_x64`): the two computations
  add the same terms in different orders (here the two runs on D+ share one cotangent), and
  in float32 that alone moved a gradient element by 1.7e-5 of its leaf's scale on one host
  (memory_port; 9e-7 on others), so float32 would test the host's rounding, not the algebra.
  The reference's own float32 noise (the batch reversed) was 4e-7 there."""
  cfg = CFG.__class__(**{**CFG.__dict__, "grad_path": grad_path})
  with jax.enable_x64(True):
    (loss, metrics), grads = _loss_and_grads(family, cfg, "float64")
    monkeypatch.setattr(losses, "clean_forward_and_probes", two_forward_reference)
    (want_loss, want_metrics), want_grads = _loss_and_grads(family, cfg, "float64")
  assert {str(g.dtype) for g in jax.tree.leaves(grads)} == {"float64"}

  # The CER terms are live (otherwise the comparison would not test the recording).
  assert float(metrics["cer_valid_frac"]) > 0 and float(metrics["cer_ev"]) > 0, metrics
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-5)
  assert set(metrics) == set(want_metrics)
  for name in metrics:   # the CEU ratios too: float64 L's, so no propagated float32 bound
    np.testing.assert_allclose(metrics[name], want_metrics[name], rtol=1e-5, atol=1e-5,
                               err_msg=name)
  flat, want_flat = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(want_grads)
  assert len(flat) == len(want_flat)
  for (path, g), w in zip(flat, want_flat):
    assert_close_to_scale(g, w, jax.tree_util.keystr(path))
  assert max(float(np.abs(g).max()) for g in want_flat) > 1e-3   # gradients are not ~0


def assert_close_to_scale(got, want, what: str, tol: float = 1e-5) -> None:
  """|got − want| <= tol · max(1, max |want|) elementwise: one gradient leaf is a sum of
  terms of the leaf's scale (the reference backpropagates the two runs on D+ apart and
  adds them; here their cotangents add first), so float32 rounding is relative to that
  scale, not to an element that cancels to near 0."""
  got, want = np.asarray(got), np.asarray(want)
  scale = max(1.0, float(np.abs(want).max()))
  np.testing.assert_allclose(got / scale, want / scale, rtol=0, atol=tol, err_msg=what)


def _engine_inputs():
  model, params, clean, corrupt, site = _setup("attention")
  probes, _ = adapter.probe_set(clean, corrupt, jax.random.PRNGKey(7), 3)
  return (model, {"params": params}, ModelInputs.of(clean), ModelInputs.of(corrupt),
          runner.Site.parse(site), probes)


@pytest.mark.parametrize("chunk_size,hoist", [(3, True), (2, True), (2, False), (1, True)])
def test_engine_entry_equals_separate_runs(chunk_size, hoist):
  """(run_fn(D+), L_int) equal run_fn alone and `intervened_logliks`, chunked or not."""
  model, variables, clean, corrupt, site, probes = _engine_inputs()
  logits_fn, loglik = adapter.logits_fn_for(model), adapter.loglik_fn_for(model)

  @jax.jit
  def both(v):
    return engine.clean_run_and_intervened(logits_fn, loglik, v, clean=clean, corrupt=corrupt,
                                           site=site, probes=probes, chunk_size=chunk_size,
                                           hoist=hoist)

  (logits, l_int), (want_logits, want_l_int, l_minus) = both(variables), _separate_runs()
  assert logits.shape == want_logits.shape and l_int.shape == (3, B)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(l_int, want_l_int, rtol=1e-5, atol=1e-5)
  # The patch moves L_int away from L− (so equal L_int is not trivially L−).
  assert float(jnp.abs(l_int - l_minus).max()) > 1e-2


@functools.lru_cache(maxsize=None)   # the same reference values for every parametrisation
def _separate_runs():
  """run_fn(D+), `intervened_logliks` unchunked and L− on the attention inputs: separate
  programs, the reference of `clean_run_and_intervened`."""
  model, variables, clean, corrupt, site, probes = _engine_inputs()
  logits_fn, loglik = adapter.logits_fn_for(model), adapter.loglik_fn_for(model)

  @jax.jit
  def separate(v):
    return logits_fn(v, clean), engine.intervened_logliks(
        loglik, v, clean=clean, corrupt=corrupt, site=site, probes=probes, chunk_size=3)

  return (*separate(variables), jax.jit(loglik)(variables, corrupt))


def test_engine_entry_full_site_and_clean_grad():
  """Full-site probe (no masks): [1, B]; clean_grad=False keeps run_fn's gradients
  and drops only those through the recorded value."""
  model, variables, clean, corrupt, site, _ = _engine_inputs()
  logits_fn, loglik = adapter.logits_fn_for(model), adapter.loglik_fn_for(model)
  full = engine.full_site()

  def total(v, clean_grad):
    logits, l_int = engine.clean_run_and_intervened(
        logits_fn, loglik, v, clean=clean, corrupt=corrupt, site=site, probes=full,
        clean_grad=clean_grad)
    return logits.sum() + l_int.sum(), l_int

  (_, l_int), g_all = jax.jit(jax.value_and_grad(lambda v: total(v, True), has_aux=True))(
      variables)
  (_, _), g_frozen = jax.jit(jax.value_and_grad(lambda v: total(v, False), has_aux=True))(
      variables)
  want = jax.jit(lambda v: engine.intervened_logliks(loglik, v, clean=clean, corrupt=corrupt,
                                                      site=site, probes=full))(variables)
  assert l_int.shape == (1, B)
  np.testing.assert_allclose(l_int, want, rtol=1e-5, atol=1e-5)

  def reference(v):   # logits with gradients + L_int with the D+ recording frozen
    frozen = ModelInputs(clean.query, clean.context, clean.passage_ids, clean.answer, True)
    return logits_fn(v, clean).sum() + engine.intervened_logliks(
        loglik, v, clean=frozen, corrupt=corrupt, site=site, probes=full).sum()
  g_ref = jax.jit(jax.grad(reference))(variables)
  for g, w in zip(jax.tree.leaves(g_frozen), jax.tree.leaves(g_ref)):
    assert_close_to_scale(g, w, "clean_grad=False")
  assert any(float(jnp.abs(a - b).max()) > 1e-4
             for a, b in zip(jax.tree.leaves(g_all), jax.tree.leaves(g_frozen)))


@pytest.mark.parametrize("family", ["attention", "ssm", "memory_port"])
def test_unpatched_row_is_the_plain_run_on_d_minus(family):
  """`engine.with_unpatched`: the added row edits no port, so its L_int is L− of a plain
  run on D− (1e-5), and the other rows are the probes' L_int without it (1e-5)."""
  model, params, clean, corrupt, site = _setup(family)
  variables = {"params": params}
  probes, _ = adapter.probe_set(clean, corrupt, jax.random.PRNGKey(7), 3)
  rows = engine.with_unpatched(probes, model.spec.num_ports)
  assert rows.names == probes.names + (engine.UNPATCHED,) and rows.num == 4
  assert rows.ports.shape == (4, model.spec.num_ports) and not bool(rows.ports[-1].any())
  assert bool(rows.ports[:-1].all()) and not bool(rows.span[-1].any())
  logits_fn, loglik = adapter.logits_fn_for(model), adapter.loglik_fn_for(model)
  plus, minus = ModelInputs.of(clean), ModelInputs.of(corrupt)
  run = lambda p: jax.jit(lambda v: engine.clean_run_and_intervened(
      logits_fn, loglik, v, clean=plus, corrupt=minus, site=runner.Site.parse(site), probes=p,
      chunk_size=p.num, allow_approximate=family == "memory_port")[1])(variables)
  got, want = run(rows), run(probes)
  l_minus = jax.jit(loglik)(variables, minus)
  np.testing.assert_allclose(got[-1], l_minus, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[:-1], want, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(want[0] - l_minus).max()) > 1e-3    # the ev patch moves L_int


def test_with_unpatched_refuses_a_second_row_and_a_wrong_port_count():
  probes = engine.span_probes(jnp.ones((2, 3, 5), bool), names=("a", "b"))
  rows = engine.with_unpatched(probes, 4)
  with pytest.raises(engine.MaskShapeError, match="already hold"):
    engine.with_unpatched(rows, 4)
  with pytest.raises(engine.MaskShapeError, match="num_ports = 3"):
    engine.with_unpatched(probes.replace(ports=jnp.ones((2, 4), bool)), 3)
