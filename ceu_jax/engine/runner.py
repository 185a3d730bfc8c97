"""Probe evaluation (vmapped, chunked, prefix hoisted) and the `audit` entry.

Shape legend (einsum letters):
  K probes, C probes per chunk, B batch, A answer tokens (per-token logliks
  only), N context tokens, P ports, T reader positions.

One compiled call evaluates all K probes: ``jax.vmap`` over a chunk of C
probes, ``lax.map`` over the K/C chunks. Everything that does not depend on the
probe (the clean and corrupted runs up to the site, and the site's clean value
for full/port/position patches) is split off by partial evaluation and computed
once, outside the loop (``hoist=True``); the loop body holds only per-probe
work (Π_S on the clean run, the patched site and the suffix after it).
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp

from ceu_jax.engine import scores
from ceu_jax.engine.probes import Probes
from ceu_jax.engine.sites import (APPROXIMATE, EngineError, LoglikFn, Site,
                                  as_site, patch, record, run_hooked,
                                  span_kind)

try:  # Loop-invariant hoisting uses JAX's partial evaluation (internal API).
  from jax._src.interpreters import partial_eval as _pe
  from jax.extend.core import jaxpr_as_fun as _jaxpr_as_fun
except ImportError:  # pragma: no cover
  _pe = None


def one_probe(loglik_fn: LoglikFn, site: Site, variables: Any, clean: Any,
              corrupt: Any, probe: Probes, allow_approximate: bool = False,
              clean_grad: bool = True) -> jax.Array:
  """L_int for a single probe (masks without the K axis). Pure.

  ``clean_grad=False`` stops gradients through the recorded clean value.
  """
  _, rec = record(loglik_fn, variables, clean, site, span_mask=probe.span,
                  allow_approximate=allow_approximate)
  value = rec[site] if clean_grad else jax.lax.stop_gradient(rec[site])
  return patch(loglik_fn, variables, corrupt, site, value,
               span_mask=probe.span, port_mask=probe.ports,
               position_mask=probe.positions,
               allow_approximate=allow_approximate)


def _hoisted(fn: Callable[[Any, Any], Any], consts: Any, chunk: Any
             ) -> Callable[[Any], Any]:
  """Splits ``fn(consts, chunk)`` into a part run now (whatever does not
  depend on ``chunk``) and a returned function of ``chunk`` for the loop."""
  c_leaves, c_tree = jax.tree.flatten(consts)
  p_leaves, p_tree = jax.tree.flatten(chunk)
  nc = len(c_leaves)

  def flat(*leaves):
    return fn(jax.tree.unflatten(c_tree, leaves[:nc]),
              jax.tree.unflatten(p_tree, leaves[nc:]))

  closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(
      *c_leaves, *p_leaves)
  known, unknown, _, res_avals = _pe.partial_eval_jaxpr_nounits(
      closed, [False] * nc + [True] * len(p_leaves), instantiate=True)
  known_out = _jaxpr_as_fun(known)(*c_leaves)
  residuals = list(known_out[len(known_out) - len(res_avals):])
  out_tree = jax.tree.structure(out_shape)

  def body(ch):
    outs = _jaxpr_as_fun(unknown)(*residuals, *jax.tree.leaves(ch))
    return jax.tree.unflatten(out_tree, outs)
  return body


def map_probes(fn: Callable[[Any, Probes], Any], consts: Any, probes: Probes,
               chunk_size: int = 16, hoist: bool = True) -> Any:
  """``fn(consts, probe_chunk)`` (vmapped over its probe axis) over all K
  probes in chunks of ``chunk_size``; outputs stacked on a leading K axis."""
  k = probes.num
  if k <= chunk_size:
    return fn(consts, probes)
  n_chunks = math.ceil(k / chunk_size)
  pad = n_chunks * chunk_size - k

  def to_chunks(m):
    m = jnp.concatenate([m, jnp.repeat(m[:1], pad, axis=0)]) if pad else m
    return m.reshape((n_chunks, chunk_size) + m.shape[1:])

  chunks = jax.tree.map(to_chunks, probes)
  body = None
  if hoist and _pe is not None:
    try:
      body = _hoisted(fn, consts, jax.tree.map(lambda m: m[0], chunks))
    except EngineError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      warnings.warn(f"ceu_jax.engine: prefix hoisting failed ({e!r}); "
                    "evaluating chunks without it")
  if body is None:
    body = functools.partial(fn, consts)
  out = jax.lax.map(body, chunks)
  return jax.tree.map(
      lambda o: o.reshape((n_chunks * chunk_size,) + o.shape[2:])[:k], out)


def intervened_logliks(loglik_fn: LoglikFn, variables: Any, clean: Any,
                       corrupt: Any, site: Site | str, probes: Probes, *,
                       chunk_size: int = 16, allow_approximate: bool = False,
                       hoist: bool = True, clean_grad: bool = True
                       ) -> jax.Array:
  """L_int [K, B(, A)] for every probe. Pure; use inside jit/grad.

  ``clean_grad=False`` puts the clean recording under stop-gradient (only
  the intervened runs carry gradients).
  """
  site = as_site(site)
  probes = probes.validate()
  one = functools.partial(one_probe, loglik_fn, site,
                          allow_approximate=allow_approximate,
                          clean_grad=clean_grad)
  if all(m is None for m in (probes.span, probes.ports, probes.positions)):
    return one(variables, clean, corrupt, probes)[None]

  def fn(consts, chunk):
    v, c, d = consts
    return jax.vmap(one, in_axes=(None, None, None, 0))(v, c, d, chunk)

  bare = probes.replace(names=())
  return map_probes(fn, (variables, clean, corrupt), bare, chunk_size, hoist)


@flax.struct.dataclass
class AuditResult:
  """CEU of K probes at one site. Fields: [B(, A)] or [K, B(, A)]."""
  L_plus: jax.Array
  L_minus: jax.Array
  L_int: jax.Array
  attrib: jax.Array
  ceu: jax.Array
  ceu_unclipped: jax.Array
  degenerate: jax.Array
  n_degenerate: jax.Array
  delta_L: jax.Array
  delta_int: jax.Array
  approximate: jax.Array      # [] bool: span patches at an approximate port
  names: tuple[str, ...] = flax.struct.field(pytree_node=False, default=())
  site: str = flax.struct.field(pytree_node=False, default="")

  def row(self, field: str, name: str) -> jax.Array:
    """One probe's row of a [K, ...] field, by probe name (e.g. 'ev')."""
    if name not in self.names:
      raise KeyError(f"no probe named {name!r}; probes: {self.names}")
    return getattr(self, field)[self.names.index(name)]

  def ceu_of(self, name: str) -> jax.Array:
    return self.row("ceu", name)

  def delta_of(self, name: str) -> jax.Array:
    """Δ_name = L_int,name − L− (Δev, Δdis)."""
    return self.row("delta_int", name)

  def summed(self, eps: float = scores.DEFAULT_EPS) -> "AuditResult":
    """Per-token results summed over the answer axis (sequence-level CEU)."""
    return from_logliks(self.L_plus.sum(-1), self.L_minus.sum(-1),
                        self.L_int.sum(-1), eps, self.names, self.site,
                        self.approximate)


def from_logliks(L_plus: jax.Array, L_minus: jax.Array, L_int: jax.Array,
                 eps: float = scores.DEFAULT_EPS, names: tuple = (),
                 site: str = "", approximate: bool = False) -> AuditResult:
  """Builds every score of an `AuditResult` from L+, L−, L_int."""
  deg = scores.degenerate(L_plus, L_minus, eps)
  return AuditResult(
      L_plus=L_plus, L_minus=L_minus, L_int=L_int,
      attrib=scores.attrib(L_int, L_plus, L_minus),
      ceu=scores.ceu(L_int, L_plus, L_minus, eps),
      ceu_unclipped=scores.ceu_unclipped(L_int, L_plus, L_minus, eps),
      degenerate=deg, n_degenerate=deg.sum(),
      delta_L=scores.delta_L(L_plus, L_minus),
      delta_int=scores.delta_int(L_int, L_minus),
      approximate=jnp.asarray(approximate), names=tuple(names), site=site)


def _observed_loglik(loglik_fn, site, variables, inputs):
  """(loglik, the port's span_decomposition); checks that the site exists."""
  kind = []

  def action(next_fun, args, kwargs, module):
    kind.append(span_kind(module))
    return next_fun(*args, **kwargs)
  out = run_hooked(loglik_fn, variables, inputs, {site: action})
  return out, kind[0]


@functools.partial(jax.jit, static_argnums=(0, 1),
                   static_argnames=("chunk_size", "allow_approximate", "hoist"))
def _audit_jit(loglik_fn, site, variables, clean, corrupt, probes, eps, *,
               chunk_size, allow_approximate, hoist):
  L_plus, kind = _observed_loglik(loglik_fn, site, variables, clean)
  L_minus = loglik_fn(variables, corrupt)
  L_int = intervened_logliks(loglik_fn, variables, clean, corrupt, site,
                             probes, chunk_size=chunk_size,
                             allow_approximate=allow_approximate, hoist=hoist)
  names = probes.names or tuple(f"probe_{i}" for i in range(L_int.shape[0]))
  approx = probes.span is not None and kind == APPROXIMATE
  return from_logliks(L_plus, L_minus, L_int, eps, names, str(site), approx)


def audit(loglik_fn: LoglikFn, variables: Any, clean_inputs: Any,
          corrupt_inputs: Any, site: Site | str,
          probes: Optional[Probes] = None, *, chunk_size: int = 16,
          eps: float = scores.DEFAULT_EPS, allow_approximate: bool = False,
          hoist: bool = True) -> AuditResult:
  """CEU of every probe at ``site`` in one compiled call.

  ``loglik_fn(variables, inputs)`` must call ``model.apply`` and return the
  gold log-likelihood [B] (or per token [B, A]); D+ = ``clean_inputs`` and
  D− = ``corrupt_inputs`` must be token-aligned. ``probes`` default: the full
  site. The compiled function is cached on (loglik_fn, site, chunk_size,
  allow_approximate, hoist) and probe names: keep ``loglik_fn`` the same
  object across calls (not a fresh lambda) to avoid recompiling.
  Differentiable (use ``ceu_unclipped`` for losses).
  """
  site = as_site(site)
  probes = Probes(names=("full",)) if probes is None else probes.validate()
  return _audit_jit(
      loglik_fn, site, variables, clean_inputs, corrupt_inputs, probes, eps,
      chunk_size=chunk_size, allow_approximate=allow_approximate, hoist=hoist)


@flax.struct.dataclass
class Profile:
  """CEU at several sites (layers / ports), in the order given."""
  results: tuple[AuditResult, ...]
  sites: tuple[str, ...] = flax.struct.field(pytree_node=False, default=())

  def __getitem__(self, site: Site | str) -> AuditResult:
    return self.results[self.sites.index(str(as_site(site)))]

  def stacked(self, field: str = "ceu", name: Optional[str] = None) -> jax.Array:
    """[S, ...] of one field (one probe row when ``name`` is given)."""
    rows = [r.row(field, name) if name else getattr(r, field)
            for r in self.results]
    return jnp.stack(rows)


def profile(loglik_fn: LoglikFn, variables: Any, clean_inputs: Any,
            corrupt_inputs: Any, sites: Sequence[Site | str],
            probes: Optional[Probes | Mapping[str, Probes]] = None,
            **kwargs) -> Profile:
  """`audit` at every site; ``probes`` is one set or a {site: set} mapping."""
  sites = [as_site(s) for s in sites]
  results = []
  for s in sites:
    p = probes
    if isinstance(probes, Mapping):
      p = probes.get(s, probes.get(str(s), probes.get(s.path)))
    results.append(audit(loglik_fn, variables, clean_inputs, corrupt_inputs,
                         s, p, **kwargs))
  return Profile(tuple(results), tuple(str(s) for s in sites))
