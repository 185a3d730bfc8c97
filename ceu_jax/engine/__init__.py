"""The CEU engine: interchange interventions at a named site.

Knows only Flax/JAX. A site is a module path, a method and an adapter
(`Site`); adapters supplied from outside the model (`Native`, `Output`,
`Input`, `Attention` for stock ``nn.MultiHeadDotProductAttention``,
`Scanned`) say what h_f is there and how to compute its span part Π_S. The
user supplies ``loglik_fn(variables, inputs) -> log-likelihood [B]`` (or per
token [B, A]) that calls ``model.apply``. The engine records h_f on the source
run D+ (``clean=``) and patches it (fully, by source-token span through Π_S, by
port, by reader position) into the base run D− (``corrupt=``), for a whole
probe set in one compiled call; `check_port` verifies a declared
decomposition on the user's own model. See docs/engine.md for the contract
and worked examples (an unmodified MultiHeadDotProductAttention transformer
among them).

Example (a toy model with one exact cross-attention read port; the same
example, explained, is in docs/engine.md)::

  import flax.linen as nn, jax, jax.numpy as jnp
  from ceu_jax import engine

  class Port(nn.Module):
    span_decomposition = 'exact'                  # Π_S h + Π_S̄ h = h

    @nn.compact
    def read(self, x, ctx, span_mask=None):       # -> h [B, T, P=1, D]
      a = jax.nn.softmax(jnp.einsum('btd,bnd->btn', x, ctx), axis=-1)
      v = ctx if span_mask is None else ctx * span_mask[..., None]
      return jnp.einsum('btn,bnd->btd', a, v)[:, :, None]

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x, ctx):                   # x [B, T, D], ctx [B, N, D]
      h = Port(name='retrieval').read(x, ctx)
      return nn.Dense(5)(h[:, -1, 0])             # logits [B, 5]

  model = Model()
  x = jax.random.normal(jax.random.key(0), (2, 3, 4))
  ctx_pos = jax.random.normal(jax.random.key(1), (2, 6, 4))
  ctx_neg = ctx_pos.at[:, 2].set(-3.0 * ctx_pos[:, 2])   # corrupt token 2
  variables = model.init(jax.random.key(2), x, ctx_pos)
  gold = jnp.array([1, 3])

  def loglik_fn(v, inputs):                       # gold log-likelihood [B]
    logp = jax.nn.log_softmax(model.apply(v, *inputs))
    return logp[jnp.arange(2), gold]

  evidence = jnp.zeros((2, 6), bool).at[:, 2].set(True)
  probes = engine.evidence_probes(evidence, control_key=jax.random.key(3))
  res = engine.audit(loglik_fn, variables, clean=(x, ctx_pos),
                     corrupt=(x, ctx_neg), site=engine.Site('retrieval'),
                     probes=probes)
  res.ceu_of(engine.EV), res.ceu_of(engine.CONTROL), res.degenerate
"""
from ceu_jax.engine.adapters import (Adapter, Attention, Call, Input, Native,
                                     Output, Scanned, Tap)
from ceu_jax.engine.check import PortCheck, check_port
from ceu_jax.engine.errors import (EngineError, LiftedSiteError,
                                   MaskShapeError, PortCheckError,
                                   SiteNotFoundError, SpanUnsupportedError)
from ceu_jax.engine.multi import (MultiEvidenceLayout, MultiEvidenceScores,
                                  aggregate, choose_pairs,
                                  multi_evidence_probes)
from ceu_jax.engine.nominate import (attention_mass, by_attention, by_passage,
                                     by_query_overlap, passage_containing)
from ceu_jax.engine.probes import (CONTROL, DIS, EV, FULL, SPAN_PROBES, UNPATCHED, Probes,
                                   control_span, evidence_probes, full_site,
                                   port_probes, position_probes, span_probes,
                                   stack, with_unpatched)
from ceu_jax.engine.runner import (AuditResult, Profile, audit, audit_lowered,
                                   clean_run_and_intervened, from_logliks,
                                   intervened_logliks, map_probes, one_probe,
                                   profile, recorded_probe)
from ceu_jax.engine.scores import (attrib, ceu, ceu_unclipped, degenerate,
                                   delta_int, delta_L, hinge_below, tokenwise)
from ceu_jax.engine.sites import Site, patch, record

__all__ = [
    "Adapter", "Attention", "AuditResult", "CONTROL", "Call", "DIS", "EV",
    "EngineError", "FULL", "Input", "LiftedSiteError", "MaskShapeError",
    "MultiEvidenceLayout", "MultiEvidenceScores", "Native", "Output",
    "PortCheck", "PortCheckError", "Probes", "Profile", "SPAN_PROBES", "Scanned", "Site",
    "UNPATCHED",
    "SiteNotFoundError", "SpanUnsupportedError", "Tap", "aggregate",
    "attention_mass", "attrib", "audit", "audit_lowered", "by_attention", "by_passage",
    "by_query_overlap", "ceu", "ceu_unclipped", "check_port", "choose_pairs",
    "clean_run_and_intervened",
    "control_span", "degenerate", "delta_L", "delta_int", "evidence_probes",
    "from_logliks", "full_site", "hinge_below", "intervened_logliks",
    "map_probes", "multi_evidence_probes", "one_probe", "passage_containing",
    "patch", "port_probes", "position_probes", "profile", "record",
    "recorded_probe",
    "span_probes", "stack", "tokenwise", "with_unpatched",
]
