"""The CER training objective (SPEC §4), as pure, differentiable jnp functions.

Per example (B rows):
  ℓ = ℓ_task + λ_ev [α − CEU_ev]_+ + λ_dis [CEU_dis]_+ + β ℓ_swap (+ λ_noret ℓ_noret)
  ℓ_task  = −L+ = −log p(y* | q, D+)
  ℓ_swap  = −(L+ − L−) (contrastive) or [γ − (L+ − L−)]_+ (hinge)
  ℓ_noret = [log p(y* | q, ∅) − β_0]_+ with ∅ the all-[PAD] context
and the batch loss is the mean over the B rows. CEU in the loss is the
*unclipped* score (L_int − L−) / (L+ − L−) so that gradients flow; the clipped
engine CEU (denominator max(gap, ε)) is reported in the metrics. The CER terms
apply only to rows whose D+ holds the evidence and whose gap L+ − L− ≥ ε (others
are degenerate: their CEU is undefined, SPEC §1); their share is the metric
`cer_valid_frac`. The swap term applies to every row whose D+ holds the evidence,
a degenerate one included: a gap below the margin is what the hinge pushes up. The distractor term uses [CEU_dis]_+ so
that a negative CEU_dis earns nothing.

Conditioning (`cer.gap_floor`, γ₀): a CEU ratio with a gap just above ε turns
float noise and gradients into 1/gap-sized numbers (training blows up, and the
loss is not reproducible across device layouts). The terms are written as
  [α·gap − Δ_ev]_+ / max(gap, γ₀)   and   [Δ_dis]_+ / max(gap, γ₀),   Δ = L_int − L−,
which equal [α − CEU_ev]_+ and [CEU_dis]_+ exactly when gap ≥ γ₀, and below γ₀
are those terms scaled by gap/γ₀: continuous, bounded and well-conditioned.

Intervened runs (L_int) come from the engine (`ceu_jax.engine.runner.
clean_run_and_intervened`): k probes per example, 'ev' (S = E(D+)), 'dis' (one
evidence-format non-evidence line of D+) and 'control' (a random non-evidence
span of the evidence's length), evaluated in one vmapped chunk. The port's
value on D+ is recorded in the same forward whose logits give L+ and exact
match (one clean forward per step, not two), and L− is read from one more row of
that chunk that edits no port (`engine.with_unpatched`): one run on D− per step.

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
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ceu_jax import retrieval_adapter as adapter
from ceu_jax.data import tasks
from ceu_jax.data.types import RetrievalBatch
from ceu_jax.engine import probes as engine_probes
from ceu_jax.engine import runner
from ceu_jax.engine.probes import CONTROL, DIS, EV
from ceu_jax.engine.sites import Site
from ceu_jax.engine import scores as engine_scores
from ceu_jax.likelihood import answer_correct, gold_loglik
from ceu_jax.retrieval_adapter import ModelInputs
from ceu_jax import fields as F

REGULARIZERS = ("none", "evidence", "evidence_distractor")
SWAP_FORMS = ("contrastive", "hinge")
GRAD_PATHS = ("all", "numerator")
CER_CORRUPTIONS = tuple(dict.fromkeys(tasks.ATR_CORRUPTIONS + tasks.FACTQA_CORRUPTIONS))


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The `cer` config section: the one definition of its fields, defaults and checks."""
  regularizer: str = F.field("none", F.one_of(*REGULARIZERS),
                             "none | evidence | evidence_distractor")
  lambda_ev: float = F.field(1.0, F.ge(0), "λ_ev weight of [α − CEU_ev]_+")
  alpha: float = F.field(0.6, F.unit_open_closed, "α target evidence CEU, in (0, 1]")
  lambda_dis: float = F.field(0.5, F.ge(0), "λ_dis weight of [CEU_dis]_+")
  beta_swap: float = F.field(0.0, F.ge(0), "β weight of the swap term (0 = off)")
  swap_form: str = F.field("hinge", F.one_of(*SWAP_FORMS), "contrastive | hinge")
  gamma: float = F.field(2.0, F.ge(0), "γ hinge margin of the swap term (nats)")
  lambda_noret: float = F.field(0.0, F.ge(0), "λ_noret no-retrieval penalty (0 = off)")
  beta0: float = F.field(-3.0, F.any_num, "β_0 allowed log p(y*|q, ∅) (nats)")
  k: int = F.field(2, F.one_of(1, 2, 3),
                   "intervened runs per example: 1 ev, 2 +dis, 3 +control")
  grad_path: str = F.field("all", F.one_of(*GRAD_PATHS),
                           "all | numerator (clean recording under stop_gradient)")
  corruption: str = F.field("value_swap", F.one_of(*CER_CORRUPTIONS),
                            "corruption giving D− for CER and the swap term")
  eps: float = F.field(1e-3, F.gt(0), "ε of the stabilised CEU (degenerate below)")
  gap_floor: float = F.field(0.25, F.gt(0),
                             "γ₀ (nats): CER terms scaled by gap/γ₀ below it")

  @classmethod
  def from_config(cls, cer: Any) -> "LossConfig":
    return F.from_section(cls, cer)

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


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  m = mask.astype(jnp.float32)
  return (x * m).sum() / jnp.maximum(m.sum(), 1.0)


def clean_forward_and_probes(model: nn.Module, variables: Any, site: Site,
                             clean: RetrievalBatch, corrupt: RetrievalBatch,
                             probes: Any, frozen: bool, allow_approximate: bool
                             ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(logits [B, A, V] on D+, L_int [K, B], L− [B]) from one forward on D+ and one on D−.

  The port's value (Π_S h_f per probe) is recorded in the same run whose logits give
  L+ and exact match (`engine.clean_run_and_intervened`); all K probes form one
  vmapped chunk, with one more row that edits no port (`engine.with_unpatched`): its
  L_int is L−, so the run on D− whose port the probes patch is also the one that gives
  L−, and its probe-independent part is differentiated once. XLA had merged a separate
  run on D− with the probes' in the forward, not in the backward: the CER k = 1 loss
  gradient at the smoke grid's shapes (2 cores, 2026-11-29), separate run → this row,
  attention 50.2 → 36.2 ms, memory_port 46.1 → 40.3, ssm 141 → 110. `frozen` (grad_path
  numerator): the recorded value is under stop_gradient, the logits keep their
  gradients.
  """
  rows = engine_probes.with_unpatched(probes, model.spec.num_ports)
  logits, l_all = runner.clean_run_and_intervened(
      adapter.logits_fn_for(model), adapter.loglik_fn_for(model), variables,
      clean=ModelInputs.of(clean), corrupt=ModelInputs.of(corrupt),
      site=runner.Site.parse(site), probes=rows, chunk_size=rows.num,
      allow_approximate=allow_approximate, clean_grad=not frozen)
  return logits, l_all[:-1], l_all[-1]


def cer_loss(params: Any, model: nn.Module, site: Site, clean: RetrievalBatch,
             corrupt: RetrievalBatch | None, key: jax.Array, cfg: LossConfig,
             nan_scale: jax.Array | None = None, allow_approximate: bool = False
             ) -> tuple[jax.Array, dict]:
  """(scalar loss, metrics) of one batch; differentiable in `params`.

  `clean` is D+, `corrupt` its token-aligned D− (needed iff cfg.uses_corrupt);
  `key` draws the distractor and control spans; `nan_scale` (test only)
  multiplies the loss; `allow_approximate` permits span patches at a port with
  an approximate decomposition (memory_port).
  """
  loglik = adapter.loglik_fn_for(model)
  variables = {"params": params}
  if cfg.uses_corrupt and corrupt is None:
    raise ValueError("cer_loss: this objective needs the corrupted batch D−")
  frozen = cfg.grad_path == "numerator"
  l_int = l_minus = None
  if cfg.uses_probes:
    probes, dis_found = adapter.probe_set(clean, corrupt, key, cfg.k)
    logits, l_int, l_minus = clean_forward_and_probes(
        model, variables, site, clean, corrupt, probes, frozen,
        allow_approximate)                                             # [B,A,V], [K,B], [B]
  else:
    logits = adapter.logits_fn_for(model)(variables, ModelInputs.of(clean))
  l_plus = gold_loglik(logits, clean.answer)                   # [B]
  correct = answer_correct(logits, clean.answer)
  per_example = -l_plus
  metrics = {"task_nll": -l_plus.mean(), "train_em": correct.mean()}

  if cfg.uses_corrupt:
    if l_minus is None:                         # the swap term alone: no probe run on D−
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
      gap_g = gap_c if frozen else gap     # numerator mode: the gap is a constant
      delta = engine_scores.delta_int(l_int, l_minus)                  # [K, B]
      den = jnp.maximum(gap_g, cfg.gap_floor)
      ceu = engine_scores.ceu(l_int, l_plus, l_minus, cfg.eps)         # [K, B]
      row = lambda x, name: x[probes.index(name)]
      # [α − CEU_ev]_+ for gap ≥ gap_floor; scaled by gap/gap_floor below it.
      ev_term = jnp.where(
          valid, jnp.maximum(cfg.alpha * gap_g - row(delta, EV), 0.0) / den, 0.0)
      per_example = per_example + cfg.lambda_ev * ev_term
      metrics.update(cer_ev=ev_term.mean(), ceu_ev=_masked_mean(row(ceu, EV), valid))
      if DIS in probes.names:
        dis_ok = valid & dis_found
        metrics["ceu_dis"] = _masked_mean(row(ceu, DIS), dis_ok)
        if cfg.uses_dis:
          dis_term = jnp.where(dis_ok, jnp.maximum(row(delta, DIS), 0.0) / den, 0.0)
          per_example = per_example + cfg.lambda_dis * dis_term
          metrics["cer_dis"] = dis_term.mean()
      if CONTROL in probes.names:
        metrics["ceu_control"] = _masked_mean(row(ceu, CONTROL), valid)

  if cfg.lambda_noret > 0:
    l_empty = loglik(variables, ModelInputs.of(adapter.empty_context(clean)))
    noret = jnp.maximum(l_empty - cfg.beta0, 0.0)
    per_example = per_example + cfg.lambda_noret * noret
    metrics["noret"] = noret.mean()

  loss = per_example.mean()
  if nan_scale is not None:
    loss = loss * nan_scale
  metrics["loss"] = loss
  return loss, metrics
