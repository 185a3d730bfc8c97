"""Nominated evidence spans Ê(q, D+) when span labels are missing (SPEC §1).

Shape legend (einsum letters):
  B batch, Q query length, N context tokens, L line slots, A answer length,
  T reader positions, P ports.

Saliency only chooses where to intervene; the score is still the intervention.

(iii) needs the optional *attention-mass contract*: the port module exposes a
method (default name ``attention_mass``) that takes the same arguments as its
read method (without ``span_mask``) and returns the non-negative mass each
context token receives, [B, T, N] or [B, T, P, N] (summed over P here). A
method with another axis order can be used through ``layout``, e.g.
``method='weights', layout='bptn'`` for weights [B, P, T, N].
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from ceu_jax.engine.adapters import SPAN_KWARG, rewind_compact
from ceu_jax.engine.errors import EngineError
from ceu_jax.engine.sites import LoglikFn, Site, check_site, run_hooked


def by_query_overlap(query: jax.Array, context: jax.Array,
                     line_ids: jax.Array, *, num_lines: int | None = None,
                     ignore_ids: Sequence[int] = (0,),
                     normalize: bool = False) -> jax.Array:
  """(i) The line with the most context tokens that occur in the query.

  ``line_ids`` [B, N] (−1 outside lines). Ties go to the lowest line id;
  ``normalize`` divides by line length. Returns a [B, N] bool mask (all False
  where no line overlaps the query).
  """
  n_lines = num_lines or context.shape[1]
  ignore = jnp.asarray(ignore_ids, context.dtype)
  q_ok = ~jnp.isin(query, ignore)                                # [B, Q]
  in_q = ((context[:, :, None] == query[:, None, :]) & q_ok[:, None]).any(-1)
  in_q = in_q & ~jnp.isin(context, ignore)                       # [B, N]
  onehot = jax.nn.one_hot(line_ids, n_lines, dtype=jnp.float32)  # [B, N, L]
  overlap = jnp.einsum("bn,bnl->bl", in_q.astype(jnp.float32), onehot)
  length = onehot.sum(1)
  if normalize:
    overlap = overlap / jnp.maximum(length, 1.0)
  best = jnp.argmax(jnp.where(length > 0, overlap, -1.0), -1)    # [B]
  found = (overlap.max(-1) > 0)[:, None]
  return (line_ids == best[:, None]) & (line_ids >= 0) & found


def by_passage(passage_ids: jax.Array, passage: jax.Array) -> jax.Array:
  """(ii) Provenance: every token of passage ``passage`` [B]; [B, N] bool."""
  return passage_ids == passage[:, None]


def passage_containing(context: jax.Array, passage_ids: jax.Array,
                       answer: jax.Array, *, num_passages: int | None = None,
                       ignore_ids: Sequence[int] = (0,)) -> jax.Array:
  """The passage [B] holding the most answer tokens (lowest id on ties)."""
  n_p = num_passages or context.shape[1]
  ignore = jnp.asarray(ignore_ids, answer.dtype)
  hit = ((context[:, :, None] == answer[:, None, :])
         & ~jnp.isin(answer, ignore)[:, None]).any(-1)           # [B, N]
  counts = jnp.einsum("bn,bnp->bp", hit.astype(jnp.float32),
                      jax.nn.one_hot(passage_ids, n_p, dtype=jnp.float32))
  return jnp.argmax(counts, -1)


def _to_btn(mass: jax.Array, layout: str | None, site: Site) -> jax.Array:
  if layout is None:
    layout = {3: "btn", 4: "btpn"}.get(mass.ndim)
  if layout is None or len(layout) != mass.ndim or not set("btn") <= set(layout):
    raise EngineError(
        f"site {site}: attention mass of shape {tuple(mass.shape)} does not "
        f"match layout {layout!r} (letters b, t, n and optionally p)")
  return jnp.einsum(f"{layout}->btn", mass)


def attention_mass(loglik_fn: LoglikFn, variables: Any, inputs: Any,
                   site: Site, *, method: str = "attention_mass",
                   layout: str | None = None) -> jax.Array:
  """The port's attention mass [B, T, N] (ports summed) in the run on inputs.

  ``layout``: axis letters of the method's output (default 'btn' / 'btpn').
  """
  site = check_site(site)
  out = []

  def action(call):
    module, args, kwargs = call.module, call.args, call.kwargs
    fn = getattr(module, method, None)
    if fn is None:
      raise EngineError(
          f"site {site} ({type(module).__name__}) has no `{method}` method; "
          "nomination by attention mass needs the port to expose it "
          "(see ceu_jax.engine.nominate)")
    kw = {k: v for k, v in kwargs.items() if k != SPAN_KWARG}
    mass = fn(*args, **kw)
    out.append(_to_btn(mass, layout, site))
    rewind_compact(module)
    return call.run()

  run_hooked(loglik_fn, variables, inputs, {site: action})
  return out[0]


def by_attention(loglik_fn: LoglikFn, variables: Any, inputs: Any,
                 site: Site, top_l: int, *,
                 position: int | jax.Array = -1,
                 valid_mask: jax.Array | None = None,
                 method: str = "attention_mass",
                 layout: str | None = None) -> jax.Array:
  """(iii) The ``top_l`` context tokens by read-port attention mass.

  ``position``: a reader position index (e.g. the answer position) or weights
  over positions, [T] or [B, T]. ``valid_mask`` [B, N] excludes tokens (pads).
  Returns a [B, N] bool mask. Pure; call it inside jit with fixed ``top_l``.
  """
  mass = attention_mass(loglik_fn, variables, inputs, site, method=method,
                        layout=layout)
  if isinstance(position, int):
    m = mass[:, position]                                       # [B, N]
  else:
    w = jnp.asarray(position, mass.dtype)
    m = jnp.einsum("bt,btn->bn", jnp.broadcast_to(w, mass.shape[:2]), mass)
  if valid_mask is not None:
    m = jnp.where(valid_mask, m, -jnp.inf)
  _, idx = jax.lax.top_k(m, top_l)                              # [B, l]
  sel = jnp.zeros(m.shape, bool).at[jnp.arange(m.shape[0])[:, None], idx].set(True)
  return sel if valid_mask is None else sel & valid_mask
