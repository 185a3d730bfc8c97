"""Retrieval batches → the engine: the gold log-likelihood function and the probe spans.

The one place where a `RetrievalBatch` (docs/conventions.md §1) meets the
engine's contract (docs/engine.md): training (the CER loss), every audit (the
`Auditor`) and the bound measurements all take their `loglik_fn` and their
probe spans from here, so a probe means the same tokens wherever it is used.
No file, plot or training code lives here.

Probes (names are the engine's constants, in this order; `probe_set(k)` takes
the first k):
  ev       S = E(D+), the evidence line;
  dis      one evidence-format non-evidence line of D+ untouched by the
           corruption (a hard negative when there is one): a distractor span of
           identical format;
  control  a random non-evidence window of the evidence's length inside the
           context's lines (scattered tokens, flagged, when no window fits).
Random draws use one key per example, `fold_in(key, example_id)`, so a row's
spans depend only on (key, example) — never on the batch it was evaluated in.

Shape legend: B batch, N context tokens, L line slots, K probes.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ceu_jax import engine
from ceu_jax.data.types import LineKind, RetrievalBatch
from ceu_jax.likelihood import gold_loglik

PROBES = engine.SPAN_PROBES          # probe names, in probe-set order


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


@functools.lru_cache(maxsize=64)
def logits_fn_for(model: nn.Module) -> Callable[[Any, ModelInputs], jax.Array]:
  """`logits_fn(variables, ModelInputs) -> logits [B, A, V]` (the run whose site value
  the CER loss records while it reads L+ and exact match off the same logits)."""
  def logits_fn(variables: Any, inputs: ModelInputs) -> jax.Array:
    if inputs.frozen:
      variables = jax.lax.stop_gradient(variables)
    return model.apply(variables, inputs.query, inputs.context, inputs.passage_ids,
                       inputs.answer)
  return logits_fn


@functools.lru_cache(maxsize=64)
def loglik_fn_for(model: nn.Module) -> LoglikFn:
  """`loglik_fn(variables, ModelInputs) -> L [B]` of a conventions-§2 model.

  One object per model (the engine caches its compiled audit on it)."""
  logits_fn = logits_fn_for(model)

  def loglik_fn(variables: Any, inputs: ModelInputs) -> jax.Array:
    return gold_loglik(logits_fn(variables, inputs), inputs.answer)
  return loglik_fn


def example_keys(key: jax.Array, example_id: jax.Array) -> jax.Array:
  """[B] keys: fold_in(key, example_id) per example."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(example_id.astype(jnp.uint32))


def distractor_line_mask(clean: RetrievalBatch, corrupt: RetrievalBatch,
                         keys: jax.Array) -> jax.Array:
  """[B, N]: one evidence-format non-evidence line per example (a hard negative when
  there is one), untouched by the corruption; all-False when none exists.
  `keys` [B]: one key per example (`example_keys`)."""
  kinds = clean.line_kind                                           # [B, L]
  hard = (kinds == LineKind.HARD_SAME_KEY) | (kinds == LineKind.HARD_SAME_ID)
  plain = kinds == LineKind.DISTRACTOR
  touched = jnp.zeros_like(kinds, bool).at[
      jnp.arange(kinds.shape[0])[:, None], jnp.maximum(clean.line_ids, 0)].max(
          corrupt.changed_mask & (clean.line_ids >= 0))
  gumbel = jax.vmap(lambda k: jax.random.gumbel(k, kinds.shape[1:]))(keys)
  score = gumbel + 10.0 * hard                                      # prefer hard negatives
  score = jnp.where((hard | plain) & ~touched, score, -jnp.inf)
  chosen = jnp.argmax(score, axis=-1)
  exists = jnp.isfinite(jnp.max(score, axis=-1))
  return (clean.line_ids == chosen[:, None]) & exists[:, None]


def control_mask(clean: RetrievalBatch, corrupt: RetrievalBatch,
                 keys: jax.Array) -> tuple[jax.Array, jax.Array]:
  """([B, N] control span, [B] contiguous): `engine.control_span` per example with
  its own key, inside the context's lines and off the tokens the corruption changed (as
  the distractor's line): a control that restored part of D+ − D− would not measure
  ≈ 0 by construction. Where the corruption changes only evidence tokens (value swap)
  the candidates, and so the draws, are those of the lines alone."""
  cand = (clean.line_ids >= 0) & ~corrupt.changed_mask.astype(bool)

  def one(ev, cand, k):
    mask, contiguous = engine.control_span(ev[None], k, cand[None])
    return mask[0], contiguous[0]
  return jax.vmap(one)(clean.evidence_mask, cand, keys)


def probe_set(clean: RetrievalBatch, corrupt: RetrievalBatch, key: jax.Array,
              k: int = 3) -> tuple[engine.Probes, jax.Array]:
  """(the first k of the probes ev, dis, control as span probes, dis_found [B]).

  `key` is the batch-independent base key; example b draws with
  fold_in(fold_in(key, probe index), example_id[b])."""
  if k not in (1, 2, 3):
    raise ValueError(f"probe_set: k must be 1, 2 or 3 (ev, dis, control), got {k}")
  masks = [clean.evidence_mask.astype(bool)]
  dis = distractor_line_mask(
      clean, corrupt, example_keys(jax.random.fold_in(key, 1), clean.example_id))
  if k >= 2:
    masks.append(dis)
  if k >= 3:
    masks.append(control_mask(
        clean, corrupt, example_keys(jax.random.fold_in(key, 2), clean.example_id))[0])
  return engine.span_probes(jnp.stack(masks), names=PROBES[:k]), dis.any(-1)


def empty_context(batch: RetrievalBatch) -> RetrievalBatch:
  """∅: the same example with every context token [PAD] (id 0)."""
  return batch.replace(context=jnp.zeros_like(batch.context))
