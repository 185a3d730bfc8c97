"""The CER training objective (SPEC §4), as pure, differentiable jnp functions.

Per example (B rows):
  ℓ = ℓ_task + λ_ev [α − CEU_ev]_+ + λ_dis [CEU_dis]_+ + β ℓ_swap (+ λ_noret ℓ_noret)
  ℓ_task  = −L+ = −log p(y* | q, D+)
  ℓ_swap  = −(L+ − L−) (contrastive) or [γ − (L+ − L−)]_+ (hinge)
  ℓ_noret = [log p(y* | q, ∅) − β_0]_+ with ∅ the all-[PAD] context
and the batch loss is the mean over the B rows. CEU in the loss is the
*unclipped* score (L_int − L−) / (L+ − L−) so that gradients flow; the clipped
engine CEU (denominator max(gap, ε)) is reported in the metrics. CER and swap
terms apply only to rows whose D+ holds the evidence and whose gap
L+ − L− ≥ ε (others are degenerate: their CEU is undefined, SPEC §1); their
share is the metric `cer_valid_frac`. The distractor term uses [CEU_dis]_+ so
that a negative CEU_dis earns nothing.

Conditioning (`cer.gap_floor`, γ₀): a CEU ratio with a gap just above ε turns
float noise and gradients into 1/gap-sized numbers (training blows up, and the
loss is not reproducible across device layouts). The terms are written as
  [α·gap − Δ_ev]_+ / max(gap, γ₀)   and   [Δ_dis]_+ / max(gap, γ₀),   Δ = L_int − L−,
which equal [α − CEU_ev]_+ and [CEU_dis]_+ exactly when gap ≥ γ₀, and below γ₀
are those terms scaled by gap/γ₀: continuous, bounded and well-conditioned.

Intervened runs (L_int) come from the engine (`ceu_jax.engine.runner.
intervened_logliks`): k probes per example, 'ev' (S = E(D+)), 'dis' (one
evidence-format non-evidence line of D+) and 'control' (a random non-evidence
span of the evidence's length), evaluated in one vmapped chunk.

`grad_path`:
  all        gradients flow through L+, L−, the clean recording Π_S h(D+) and
             the patched run (every term of the score);
  numerator  the clean recording is taken under stop_gradient and the gap
             L+ − L− (denominator and α·gap) is a constant: gradients reach the
             parameters only through the numerator L_int − L− (the patched and
             corrupted runs). The model then cannot learn to write the evidence
             into the port from the clean side; on ATR-insert with bypass it
             raised CEU_ev far less than `all` (see the issue #5 report).

Shape legend: K probes, B batch, N context tokens, L line slots.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ceu_jax import audit as audit_lib
from ceu_jax.data.types import RetrievalBatch
from ceu_jax.engine import probes as probes_lib
from ceu_jax.engine import runner
from ceu_jax.engine import scores as engine_scores
from ceu_jax.scores import answer_correct, gold_loglik

REGULARIZERS = ("none", "evidence", "evidence_distractor")
SWAP_FORMS = ("contrastive", "hinge")
GRAD_PATHS = ("all", "numerator")
PROBE_NAMES = ("ev", "dis", "control")


@flax.struct.dataclass
class ModelInputs:
  """Arguments of `model.apply`; `frozen` (static) = run under stop_gradient."""
  query: jax.Array        # [B, Q]
  context: jax.Array      # [B, N]
  passage_ids: jax.Array  # [B, N]
  answer: jax.Array       # [B, A]
  frozen: bool = flax.struct.field(pytree_node=False, default=False)

  @classmethod
  def of(cls, batch: RetrievalBatch, frozen: bool = False) -> "ModelInputs":
    return cls(batch.query, batch.context, batch.passage_ids, batch.answer, frozen)


LoglikFn = Callable[[Any, ModelInputs], jax.Array]


@functools.lru_cache(maxsize=32)
def loglik_fn_for(model: nn.Module) -> LoglikFn:
  """`loglik_fn(variables, inputs) -> L [B]` for the engine; one object per model
  (the engine's compiled audit is cached on it)."""
  def loglik_fn(variables: Any, inputs: ModelInputs) -> jax.Array:
    if inputs.frozen:
      variables = jax.lax.stop_gradient(variables)
    logits = model.apply(variables, inputs.query, inputs.context, inputs.passage_ids,
                         inputs.answer)
    return gold_loglik(logits, inputs.answer)
  return loglik_fn


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The `cer` config section, validated (see ceu_jax.train.config)."""
  regularizer: str = "none"
  lambda_ev: float = 1.0
  alpha: float = 0.6
  lambda_dis: float = 0.5
  beta_swap: float = 0.0
  swap_form: str = "hinge"
  gamma: float = 2.0
  lambda_noret: float = 0.0
  beta0: float = -3.0
  k: int = 2
  grad_path: str = "all"
  corruption: str = "value_swap"
  eps: float = 1e-3
  gap_floor: float = 0.25

  @classmethod
  def from_config(cls, cer: Any) -> "LossConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(cer).items() if k in names})

  @property
  def uses_probes(self) -> bool:
    return self.regularizer != "none"

  @property
  def uses_corrupt(self) -> bool:
    """D− is needed (CER terms or the swap term)."""
    return self.uses_probes or self.beta_swap > 0

  @property
  def uses_dis(self) -> bool:
    return self.regularizer == "evidence_distractor"


def probe_set(clean: RetrievalBatch, corrupt: RetrievalBatch, k: int, key: jax.Array
              ) -> tuple[probes_lib.Probes, jax.Array]:
  """The first k of ('ev', 'dis', 'control') span probes, and dis_found [B].

  Same spans as the audit (`ceu_jax.audit.batch_probes`): the distractor is one
  evidence-format non-evidence line untouched by the corruption (a hard negative
  when there is one); the control a random non-evidence span inside the lines.
  """
  k_dis, k_ctrl = jax.random.split(key)
  dis = audit_lib.distractor_line_mask(clean, corrupt, k_dis)
  probes = probes_lib.evidence_probes(
      clean.evidence_mask,
      distractor_mask=dis if k >= 2 else None,
      control_key=k_ctrl if k >= 3 else None,
      candidate_mask=clean.line_ids >= 0)
  return probes, dis.any(-1)


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  m = mask.astype(jnp.float32)
  return (x * m).sum() / jnp.maximum(m.sum(), 1.0)


def empty_context(batch: RetrievalBatch) -> RetrievalBatch:
  """∅: the same example with every context token [PAD] (id 0)."""
  return batch.replace(context=jnp.zeros_like(batch.context))


def cer_loss(params: Any, model: nn.Module, site: str, clean: RetrievalBatch,
             corrupt: RetrievalBatch | None, key: jax.Array, cfg: LossConfig,
             nan_scale: jax.Array | None = None, allow_approximate: bool = False
             ) -> tuple[jax.Array, dict]:
  """(scalar loss, metrics) of one batch; differentiable in `params`.

  `clean` is D+, `corrupt` its token-aligned D− (needed iff cfg.uses_corrupt);
  `key` draws the distractor and control spans; `nan_scale` (test only)
  multiplies the loss; `allow_approximate` permits span patches at a port with
  an approximate decomposition (memory_port).
  """
  loglik = loglik_fn_for(model)
  variables = {"params": params}
  logits = model.apply(variables, *clean.model_inputs())
  l_plus = gold_loglik(logits, clean.answer)                   # [B]
  correct = answer_correct(logits, clean.answer)
  per_example = -l_plus
  metrics = {"task_nll": -l_plus.mean(), "train_em": correct.mean()}

  if cfg.uses_corrupt:
    if corrupt is None:
      raise ValueError("cer_loss: this objective needs the corrupted batch D−")
    l_minus = loglik(variables, ModelInputs.of(corrupt))
    gap = l_plus - l_minus
    gap_c = jax.lax.stop_gradient(gap)
    valid = clean.has_evidence & (gap_c >= cfg.eps)
    metrics.update(gap=_masked_mean(gap_c, clean.has_evidence), cer_valid_frac=valid.mean())
    if cfg.beta_swap > 0:
      swap = -gap if cfg.swap_form == "contrastive" else jnp.maximum(cfg.gamma - gap, 0.0)
      swap = jnp.where(clean.has_evidence, swap, 0.0)
      per_example = per_example + cfg.beta_swap * swap
      metrics["swap"] = _masked_mean(swap, clean.has_evidence)
    if cfg.uses_probes:
      probes, dis_found = probe_set(clean, corrupt, cfg.k, key)
      frozen = cfg.grad_path == "numerator"
      l_int = runner.intervened_logliks(
          loglik, variables, clean=ModelInputs.of(clean, frozen=frozen), corrupt=ModelInputs.of(corrupt),
          site=runner.Site.parse(site), probes=probes, chunk_size=cfg.k, allow_approximate=allow_approximate)  # [K, B]
      gap_g = gap_c if frozen else gap     # numerator mode: the gap is a constant
      delta = engine_scores.delta_int(l_int, l_minus)                  # [K, B]
      den = jnp.maximum(gap_g, cfg.gap_floor)
      ceu = jnp.clip(engine_scores.ceu(l_int, l_plus, l_minus, cfg.eps), 0.0, 1.0)
      # [α − CEU_ev]_+ for gap ≥ gap_floor; scaled by gap/gap_floor below it.
      ev_term = jnp.where(valid, jnp.maximum(cfg.alpha * gap_g - delta[0], 0.0) / den, 0.0)
      per_example = per_example + cfg.lambda_ev * ev_term
      metrics.update(cer_ev=ev_term.mean(), ceu_ev=_masked_mean(ceu[0], valid))
      if cfg.k >= 2:
        dis_ok = valid & dis_found
        metrics["ceu_dis"] = _masked_mean(ceu[1], dis_ok)
        if cfg.uses_dis:
          dis_term = jnp.where(dis_ok, jnp.maximum(delta[1], 0.0) / den, 0.0)
          per_example = per_example + cfg.lambda_dis * dis_term
          metrics["cer_dis"] = dis_term.mean()
      if cfg.k >= 3:
        metrics["ceu_ctrl"] = _masked_mean(ceu[2], valid)

  if cfg.lambda_noret > 0:
    l_empty = loglik(variables, ModelInputs.of(empty_context(clean)))
    noret = jnp.maximum(l_empty - cfg.beta0, 0.0)
    per_example = per_example + cfg.lambda_noret * noret
    metrics["noret"] = noret.mean()

  loss = per_example.mean()
  if nan_scale is not None:
    loss = loss * nan_scale
  metrics["loss"] = loss
  return loss, metrics
