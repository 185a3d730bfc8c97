"""The batch every retrieval task yields (docs/conventions.md §1).

Shape legend: B batch, Q query length, N context length, A answer length,
L line slots in the context.
"""
from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
from flax import struct


class LineKind(enum.IntEnum):
  """What a line slot of the context holds."""
  FILLER = 0          # non-evidence format ("NOTE w w w .")
  EVIDENCE = 1        # the evidence line (query ID and KEY)
  DISTRACTOR = 2      # evidence format, other ID and other KEY
  HARD_SAME_KEY = 3   # evidence format, same KEY, other ID
  HARD_SAME_ID = 4    # evidence format, same ID, other KEY


@struct.dataclass
class RetrievalBatch:
  query: jax.Array               # [B, Q] int32
  context: jax.Array             # [B, N] int32
  passage_ids: jax.Array         # [B, N] int32
  answer: jax.Array              # [B, A] int32
  has_evidence: jax.Array        # [B] bool
  evidence_mask: jax.Array       # [B, N] bool
  value_mask: jax.Array          # [B, N] bool
  distractor_mask: jax.Array     # [B, N] bool
  hard_negative_mask: jax.Array  # [B, N] bool
  passage_start: jax.Array       # [B, N] bool
  line_ids: jax.Array            # [B, N] int32, -1 outside lines
  line_kind: jax.Array           # [B, L] int32 (LineKind)
  changed_mask: jax.Array        # [B, N] bool
  example_id: jax.Array          # [B] int32

  @property
  def batch_size(self) -> int:
    return self.context.shape[0]

  @property
  def context_len(self) -> int:
    return self.context.shape[-1]

  def model_inputs(self) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(query, context, passage_ids, answer): the arguments of model.apply."""
    return self.query, self.context, self.passage_ids, self.answer


def kind_mask(batch: RetrievalBatch, *kinds: LineKind) -> jax.Array:
  """Token mask [B, N] of all lines whose kind is in `kinds`."""
  per_line = jnp.isin(batch.line_kind, jnp.asarray([int(k) for k in kinds]))  # [B, L]
  safe_ids = jnp.maximum(batch.line_ids, 0)
  per_token = jnp.take_along_axis(per_line, safe_ids, axis=-1)
  return per_token & (batch.line_ids >= 0)
