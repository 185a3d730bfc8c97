"""Probe sets: which part of the site each intervened run restores.

Shape legend (einsum letters):
  K probes, B batch, N context tokens, P ports, T reader positions,
  M evidence items.

A `Probes` set holds up to three stacked masks over the probe axis K:
``span`` [K, B, N] (tokens S whose contribution Π_S h is restored), ``ports``
[K, P] or [K, B, P], ``positions`` [K, T] or [K, B, T]. A missing field means
"everything" along that axis. Builders take plain boolean masks, never a
project batch type.
"""
from __future__ import annotations

from typing import Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp

from ceu_jax.engine.errors import MaskShapeError

# Probe names (rows of an AuditResult are read by these, never by position).
EV = "ev"            # the evidence span E(D+)
DIS = "dis"          # a distractor span of matched format
CONTROL = "control"  # a random non-evidence span of the evidence's length
FULL = "full"        # the whole site
UNPATCHED = "unpatched"  # no port edited: the plain run on D− (its L_int is L−)
SPAN_PROBES = (EV, DIS, CONTROL)  # the standard span probes, in `evidence_probes` order


@flax.struct.dataclass
class Probes:
  """K probes. ``names`` label the rows (static: changing them recompiles)."""
  span: Optional[jax.Array] = None
  ports: Optional[jax.Array] = None
  positions: Optional[jax.Array] = None
  names: tuple[str, ...] = flax.struct.field(pytree_node=False, default=())

  @property
  def num(self) -> int:
    for m in (self.span, self.ports, self.positions):
      if m is not None:
        return int(m.shape[0])
    return 1

  def index(self, name: str) -> int:
    if name not in self.names:
      raise KeyError(f"no probe named {name!r}; probes: {self.names}")
    return self.names.index(name)

  def validate(self) -> "Probes":
    """Checks ranks and that every field has the same K; returns self."""
    want = {"span": (3,), "ports": (2, 3), "positions": (2, 3)}
    ks = {}
    for field, ranks in want.items():
      m = getattr(self, field)
      if m is None:
        continue
      if m.ndim not in ranks:
        raise MaskShapeError(
            f"probe field `{field}` has shape {tuple(m.shape)}; expected rank "
            f"{' or '.join(map(str, ranks))} with the probe axis K first "
            "(span [K,B,N], ports [K,P]|[K,B,P], positions [K,T]|[K,B,T])")
      ks[field] = m.shape[0]
    if len(set(ks.values())) > 1:
      raise MaskShapeError(f"probe fields disagree on K: {ks}")
    if self.names and ks and len(self.names) != next(iter(ks.values())):
      raise MaskShapeError(
          f"probe `names` has {len(self.names)} entries for K={ks}")
    return self


def full_site() -> Probes:
  """One probe: the full-site patch (h(D−) ← h(D+) everywhere)."""
  return Probes(names=(FULL,))


def stack(*probes: Probes) -> Probes:
  """Concatenates probe sets along K (fields must be all present or absent)."""
  def cat(field):
    ms = [getattr(p, field) for p in probes]
    if all(m is None for m in ms):
      return None
    if any(m is None for m in ms):
      raise MaskShapeError(f"cannot stack probe sets: some lack `{field}`")
    return jnp.concatenate(ms, axis=0)
  names = sum((p.names or tuple(f"probe_{i}" for i in range(p.num))
               for p in probes), ())
  return Probes(cat("span"), cat("ports"), cat("positions"), names).validate()


def with_unpatched(probes: Probes, num_ports: int) -> Probes:
  """`probes` plus a last row `UNPATCHED` whose port mask is all False: the site keeps
  h(D−), so that row's L_int is L− of the same run on D− that the probes patch. A loss
  that needs L− beside L_int then differentiates one run on D− (its probe-independent
  part hoisted and shared) instead of a second, separate one. The other rows get an
  all-True port mask where they had none (`jnp.where(True, h', h)` is h' bit for bit).
  ``num_ports``: P, the site's port axis (the layout's p)."""
  probes = probes.validate()
  if UNPATCHED in probes.names:
    raise MaskShapeError(f"probes already hold a {UNPATCHED!r} row: {probes.names}")
  k = probes.num
  if probes.ports is None:
    ports = jnp.ones((k, num_ports), jnp.bool_)
  elif probes.ports.dtype != jnp.bool_:
    raise MaskShapeError("with_unpatched: soft (float) port masks are not supported")
  else:
    ports = probes.ports
  if ports.shape[-1] != num_ports:
    raise MaskShapeError(f"with_unpatched: ports [..., {ports.shape[-1]}] for "
                         f"num_ports = {num_ports}")
  row = lambda m, fill: jnp.concatenate([m, jnp.full((1,) + m.shape[1:], fill, m.dtype)])
  names = (probes.names or tuple(f"probe_{i}" for i in range(k))) + (UNPATCHED,)
  return Probes(span=None if probes.span is None else row(probes.span, False),
                ports=row(ports, False),
                positions=None if probes.positions is None else row(probes.positions, True),
                names=names).validate()


def span_probes(masks: Sequence[jax.Array] | jax.Array,
                names: Sequence[str] = ()) -> Probes:
  """Span probes from masks [B, N] (a list) or [K, B, N] (stacked)."""
  span = masks if hasattr(masks, "ndim") else jnp.stack(list(masks))
  if span.ndim == 2:
    span = span[None]
  return Probes(span=jnp.asarray(span), names=tuple(names)).validate()


def port_probes(num_ports: int, ports: Optional[Sequence[int]] = None) -> Probes:
  """One probe per port (one-hot [K, P]); ``ports`` picks a subset."""
  idx = list(range(num_ports)) if ports is None else list(ports)
  m = jax.nn.one_hot(jnp.array(idx), num_ports, dtype=jnp.bool_)
  return Probes(ports=m, names=tuple(f"port_{i}" for i in idx))


def position_probes(num_positions: int,
                    positions: Optional[Sequence[int]] = None) -> Probes:
  """One probe per reader position t (one-hot [K, T]) for token-wise CEU(t)."""
  idx = list(range(num_positions)) if positions is None else list(positions)
  m = jax.nn.one_hot(jnp.array(idx), num_positions, dtype=jnp.bool_)
  return Probes(positions=m, names=tuple(f"t_{i}" for i in idx))


def control_span(evidence_mask: jax.Array, key: jax.Array,
                 candidate_mask: Optional[jax.Array] = None
                 ) -> tuple[jax.Array, jax.Array]:
  """A random non-evidence span with the evidence span's length, per example.

  Returns (mask [B, N] bool, contiguous [B] bool). The span is a contiguous
  window inside ``candidate_mask`` (default: all tokens) that avoids the
  evidence; where no such window exists, the same number of random
  non-evidence candidate tokens is taken instead and ``contiguous`` is False.
  """
  ev = evidence_mask.astype(jnp.bool_)
  cand = jnp.ones_like(ev) if candidate_mask is None else candidate_mask.astype(jnp.bool_)
  free = cand & ~ev
  b, n = ev.shape
  length = ev.sum(-1)                                          # [B]
  bad = jnp.concatenate([jnp.zeros((b, 1), jnp.int32),
                         jnp.cumsum(~free, -1, dtype=jnp.int32)], -1)  # [B, N+1]
  start = jnp.arange(n)                                        # [N]
  end = start[None] + length[:, None]                          # [B, N]
  in_range = end <= n
  n_bad = jnp.take_along_axis(bad, jnp.minimum(end, n), -1) - bad[:, :n]
  valid = in_range & (n_bad == 0) & (length[:, None] > 0)      # [B, N]
  k_win, k_tok = jax.random.split(key)
  g = jax.random.gumbel(k_win, (b, n))
  s0 = jnp.argmax(jnp.where(valid, g, -jnp.inf), -1)           # [B]
  window = (start[None] >= s0[:, None]) & (start[None] < (s0 + length)[:, None])
  # Fallback: random free tokens, as many as the evidence has.
  g2 = jnp.where(free, jax.random.gumbel(k_tok, (b, n)), -jnp.inf)
  rank = jnp.argsort(jnp.argsort(-g2, -1), -1)
  scattered = free & (rank < length[:, None])
  contiguous = valid.any(-1)
  return jnp.where(contiguous[:, None], window, scattered), contiguous


def evidence_probes(evidence_mask: jax.Array, *,
                    distractor_mask: Optional[jax.Array] = None,
                    control_key: Optional[jax.Array] = None,
                    candidate_mask: Optional[jax.Array] = None,
                    port_mask: Optional[jax.Array] = None) -> Probes:
  """The standard probe set: `EV`, then `DIS` and `CONTROL` when asked for.

  ``distractor_mask`` [B, N] is a distractor span of matched format;
  ``control_key`` draws a random non-evidence span of the evidence's length
  (inside ``candidate_mask``, e.g. the non-padding context tokens).
  ``port_mask`` [P] restricts every probe to those ports as well.
  """
  masks, names = [evidence_mask.astype(jnp.bool_)], [EV]
  if distractor_mask is not None:
    masks.append(distractor_mask.astype(jnp.bool_))
    names.append(DIS)
  if control_key is not None:
    masks.append(control_span(evidence_mask, control_key, candidate_mask)[0])
    names.append(CONTROL)
  span = jnp.stack(masks)
  ports = None if port_mask is None else jnp.broadcast_to(
      port_mask, (len(masks),) + port_mask.shape)
  return Probes(span=span, ports=ports, names=tuple(names)).validate()
