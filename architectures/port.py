"""What every family's context encoder hands its read port, and the read port's base.

Shape legend (einsum letters):
  b batch, n context positions, t reader positions, e embed,
  p ports, d port features.

`ContextMemory` is the one structure passed from the context encoder to the read
port(s) of every family (the same fields whatever the family; a port reads the
ones it needs). `ReadPort` is the base of every family's read-port module: its
`read` method is the engine's site (docs/conventions.md §3). The base owns what
is the same for every port — the span-mask check, the compute dtype and the
activation's logical sharding constraint [batch, length, ports, kv] — and a
family supplies only `port_values` (h_f, or Π_S h_f given a span mask) and the
output projection `out_proj`.
"""
from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from architectures import layers
from architectures.spec import ArchSpec

# Logical axes of h_f [b, t, p, d] (docs/conventions.md §4).
PORT_AXES: tuple[str, ...] = ("batch", "length", "ports", "kv")
SPAN_DECOMPOSITIONS: tuple[str, ...] = ("exact", "approximate")


@flax.struct.dataclass
class ContextMemory:
  """The encoded context, as every family's encoder writes it and its port reads it."""
  encoded: jax.Array        # [b,n,e] per-context-position values (compute dtype or float32)
  query_summary: jax.Array  # [b,e] float32 summary of the query (query conditioning of the read)
  passage_ids: jax.Array    # [b,n] int32 passage of each context position
  ctx_mask: jax.Array       # [b,n] bool: the position holds a token (not PAD)

  @property
  def batch(self) -> int:
    """B."""
    return self.encoded.shape[0]

  @property
  def context_len(self) -> int:
    """N."""
    return self.encoded.shape[1]

  def check_span_mask(self, span_mask: jax.Array | None) -> None:
    """ValueError unless span_mask is None or covers the context tokens, [B, N]."""
    if span_mask is None:
      return
    want = (self.batch, self.context_len)
    if tuple(span_mask.shape) != want:
      raise ValueError(f"span_mask must have shape [B, N] = {want} "
                       f"(batch, context length), got {tuple(span_mask.shape)}")


class ReadPort(nn.Module):
  """Base of the read-port modules (site `reader/block_{i}/retrieval`, method `read`).

  A family defines `span_decomposition` ('exact' | 'approximate', how its Π_S is
  computed), `port_values` and an `out_proj` submodule; the base's `__call__`
  projects Σ_p h_f[:, :, p] (override `project` for another reduction).
  """
  spec: ArchSpec  # static sizes
  span_decomposition: ClassVar[str | None] = None  # set by every family

  def port_values(self, x: jax.Array, memory: ContextMemory,
                  span_mask: jax.Array | None) -> jax.Array:
    """h_f [b, t, p, d] of reader states x [b, t, e]; Π_S h_f with span_mask [b, n]."""
    raise NotImplementedError(f"{type(self).__name__} must define port_values")

  def read(self, x: jax.Array, memory: ContextMemory,
           span_mask: jax.Array | None = None) -> jax.Array:
    """h_f [b, t, p, d] (the engine's site); with span_mask [b, n] its part Π_S h_f."""
    memory.check_span_mask(span_mask)
    return self.as_port(self.port_values(x, memory, span_mask))

  def read_and_span(self, x: jax.Array, memory: ContextMemory,
                    span_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(read(x, memory), read(x, memory, span_mask)) from `pair_values`: the engine's one
    call for both where a family names it as its `span_pair_method` (docs/conventions.md
    §3; a family sets that only when its `pair_values` shares work)."""
    memory.check_span_mask(span_mask)
    h, pi = self.pair_values(x, memory, span_mask)
    return self.as_port(h), self.as_port(pi)

  def pair_values(self, x: jax.Array, memory: ContextMemory,
                  span_mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """(h_f, Π_S h_f) as `port_values` gives them: two calls (override to share work)."""
    return self.port_values(x, memory, None), self.port_values(x, memory, span_mask)

  def as_port(self, h: jax.Array) -> jax.Array:
    """`port_values`' output as `read` returns it: compute dtype, logical sharding."""
    return layers.constrain(h.astype(self.spec.compute_dtype), PORT_AXES)

  def project(self, h: jax.Array) -> jax.Array:
    """The port's output [b, t, e] added to the reader's residual stream."""
    return self.out_proj(jnp.sum(h, axis=2))

  def __call__(self, x: jax.Array, memory: ContextMemory) -> jax.Array:
    return self.project(self.read(x, memory))
