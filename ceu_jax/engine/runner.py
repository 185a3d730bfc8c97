"""Probe evaluation (vmapped, chunked, prefix hoisted) and the `audit` entry.

Shape legend (einsum letters):
  K probes, C probes per chunk, B batch, A answer tokens (per-token logliks
  only), N context tokens, P ports, T reader positions.

One compiled call evaluates all K probes: ``jax.vmap`` over a chunk of C
probes, ``lax.map`` over the K/C chunks. Everything that does not depend on the
probe (the clean and corrupted runs up to the site, and the site's clean value
for full/port/position patches) is split off by partial evaluation
(`ceu_jax.engine.hoist`) and computed once, outside the loop (``hoist=True``);
the loop body holds only per-probe work (Π_S on the clean run, the patched
site and the suffix after it). The chunk size C is chosen by `chunking.choose`
from the measured per-probe working set unless given.
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp

from ceu_jax.engine import chunking, hoist as hoist_lib, placement, scores
from ceu_jax.engine.probes import FULL, Probes
from ceu_jax.engine.sites import (APPROXIMATE, EngineError, LoglikFn,
                                  MaskShapeError, Site, check_site,
                                  edit_action, patch, patched_value, record,
                                  run_hooked)

ChunkSize = int | str
AUTO = "auto"


def one_probe(loglik_fn: LoglikFn, site: Site, variables: Any, *, clean: Any,
              corrupt: Any, probe: Probes, allow_approximate: bool = False,
              clean_grad: bool = True, paired: bool = False) -> jax.Array:
  """L_int for a single probe (masks without the K axis). Pure.

  ``clean_grad=False`` stops gradients through the clean value. ``paired``:
  one run on D+ and D− concatenated along the batch (see `paired_probe`).
  """
  if paired:
    return paired_probe(loglik_fn, site, variables, clean=clean,
                        corrupt=corrupt, probe=probe,
                        allow_approximate=allow_approximate,
                        clean_grad=clean_grad)
  return recorded_probe(loglik_fn, loglik_fn, site, variables, clean=clean,
                        corrupt=corrupt, probe=probe,
                        allow_approximate=allow_approximate,
                        clean_grad=clean_grad)[1]


def recorded_probe(run_fn: Callable[[Any, Any], Any], loglik_fn: LoglikFn,
                   site: Site, variables: Any, *, clean: Any, corrupt: Any,
                   probe: Probes, allow_approximate: bool = False,
                   clean_grad: bool = True) -> tuple[Any, jax.Array]:
  """(run_fn(variables, clean), L_int) of one probe. Pure.

  The site's value (Π_S h_f with a span) is recorded in the run of ``run_fn``
  on D+ itself, whose output (any pytree, e.g. logits) is returned beside the
  patched run's L_int; `one_probe` is this with ``run_fn = loglik_fn`` and the
  output dropped.
  """
  out, rec = record(run_fn, variables, clean, site, span_mask=probe.span,
                    allow_approximate=allow_approximate)
  value = rec[site] if clean_grad else jax.lax.stop_gradient(rec[site])
  return out, patch(loglik_fn, variables, corrupt, site, value,
                    span_mask=probe.span, port_mask=probe.ports,
                    position_mask=probe.positions,
                    allow_approximate=allow_approximate)


def _batch_size(tree: Any, what: str) -> int:
  sizes = {getattr(x, "shape", (None,))[:1] for x in jax.tree.leaves(tree)}
  if len(sizes) != 1 or () in sizes or (None,) in sizes:
    raise EngineError(
        f"paired=True concatenates D+ and D− along axis 0, so every leaf of "
        f"`{what}` must have the batch axis first with one size; got leading "
        f"sizes {sorted(map(str, sizes))}")
  return next(iter(sizes))[0]


def paired_probe(loglik_fn: LoglikFn, site: Site, variables: Any, *,
                 clean: Any, corrupt: Any, probe: Probes,
                 allow_approximate: bool = False,
                 clean_grad: bool = True) -> jax.Array:
  """L_int of one probe from a single run on [D+; D−] (batch 2B).

  At the site, h = [h+; h−] and Π_S h come from the same call; the D− half
  becomes h− − Π_S h− + Π_S h+ (h+ without a span) on the masked ports and
  positions, the D+ half is left alone. Nothing recorded leaves the run, so
  this works inside lifted transforms (nn.remat, nn.scan with `Scanned`).
  Every input leaf must carry the batch axis first, and the model must treat
  examples independently (no batch statistics).
  """
  b = _batch_size(clean, "clean")
  if _batch_size(corrupt, "corrupt") != b:
    raise EngineError("paired=True: clean and corrupt batch sizes differ")
  both = jax.tree.map(lambda x, y: jnp.concatenate([x, y]), clean, corrupt)
  span = None if probe.span is None else jnp.concatenate([probe.span] * 2)

  def edit(h, pi):
    if h.shape[0] != 2 * b:
      raise MaskShapeError(
          f"site {site}: paired evaluation needs h with the batch axis first "
          f"(2B = {2 * b}), got h of shape {tuple(h.shape)}")
    h_plus, h_minus = h[:b], h[b:]
    value = h_plus if pi is None else pi[:b]
    if not clean_grad:
      value = jax.lax.stop_gradient(value)
    new = patched_value(site, h_minus, None if pi is None else pi[b:], value,
                        probe.span, probe.ports, probe.positions)
    return jnp.concatenate([h_plus, new])

  out = run_hooked(loglik_fn, variables, both,
                   {site: edit_action(site, edit, span, allow_approximate)},
                   paired=True)
  return out[b:]


def map_probes(fn: Callable[[Any, Probes], Any], consts: Any, probes: Probes,
               chunk_size: ChunkSize = AUTO, hoist: bool = True,
               batch_shards: int = 1, shared: bool = False) -> Any:
  """``fn(consts, probe_chunk)`` (vmapped over its probe axis) over all K
  probes in chunks of ``chunk_size`` (``'auto'``: `chunking.choose`, with the
  working set per device when the batch is split into ``batch_shards``);
  outputs stacked on a leading K axis. ``shared``: ``fn`` returns
  ``(common, per_probe)`` where ``common`` has no probe axis (it depends on
  ``consts`` alone); the result is ``(common, per_probe stacked)``, ``common``
  from the first chunk (computed once, outside the loop, when hoisted)."""
  k = probes.num
  if chunk_size == AUTO:
    chunk_size = chunking.choose(fn, consts, probes, batch_shards)
  chunking.check(chunk_size)
  if k <= chunk_size:
    return fn(consts, probes)
  n_chunks = math.ceil(k / chunk_size)
  pad = n_chunks * chunk_size - k

  def to_chunks(m):
    m = jnp.concatenate([m, jnp.repeat(m[:1], pad, axis=0)]) if pad else m
    return m.reshape((n_chunks, chunk_size) + m.shape[1:])

  chunks = jax.tree.map(to_chunks, probes)
  body = None
  if hoist:
    try:
      body = hoist_lib.split(fn, consts, jax.tree.map(lambda m: m[0], chunks)).body
    except EngineError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      warnings.warn(f"ceu_jax.engine: prefix hoisting failed ({e!r}); "
                    "evaluating chunks without it")
  if body is None:
    body = functools.partial(fn, consts)
  out = jax.lax.map(body, chunks)
  common = None
  if shared:
    common, out = jax.tree.map(lambda o: o[0], out[0]), out[1]
  out = jax.tree.map(
      lambda o: o.reshape((n_chunks * chunk_size,) + o.shape[2:])[:k], out)
  return (common, out) if shared else out


def probe_fn(loglik_fn: LoglikFn, site: Site, *, allow_approximate: bool,
             clean_grad: bool = True, paired: bool = False
             ) -> Callable[[Any, Probes], jax.Array]:
  """``fn((variables, clean, corrupt), probe_chunk) -> L_int [C, B(, A)]``."""
  def one(variables, clean, corrupt, probe):
    return one_probe(loglik_fn, site, variables, clean=clean, corrupt=corrupt,
                     probe=probe, allow_approximate=allow_approximate,
                     clean_grad=clean_grad, paired=paired)

  def fn(consts, chunk):
    v, c, d = consts
    return jax.vmap(one, in_axes=(None, None, None, 0))(v, c, d, chunk)
  return fn


def intervened_logliks(loglik_fn: LoglikFn, variables: Any, *, clean: Any,
                       corrupt: Any, site: Site, probes: Probes,
                       chunk_size: ChunkSize = AUTO,
                       allow_approximate: bool = False, hoist: bool = True,
                       clean_grad: bool = True, paired: bool = False,
                       batch_shards: int = 1) -> jax.Array:
  """L_int [K, B(, A)] for every probe. Pure; use inside jit/grad.

  ``clean_grad=False`` puts the clean recording under stop-gradient (only
  the intervened runs carry gradients). ``paired``: see `paired_probe`.
  ``batch_shards``: devices the batch is split over (the 'auto' chunk rule
  budgets per device).
  """
  site = check_site(site)
  probes = probes.validate()
  bare = probes.replace(names=())
  if all(m is None for m in (probes.span, probes.ports, probes.positions)):
    return one_probe(loglik_fn, site, variables, clean=clean, corrupt=corrupt,
                     probe=bare, allow_approximate=allow_approximate,
                     clean_grad=clean_grad, paired=paired)[None]
  fn = probe_fn(loglik_fn, site, allow_approximate=allow_approximate,
                clean_grad=clean_grad, paired=paired)
  return map_probes(fn, (variables, clean, corrupt), bare, chunk_size, hoist,
                    batch_shards)


def clean_run_and_intervened(run_fn: Callable[[Any, Any], Any],
                             loglik_fn: LoglikFn, variables: Any, *,
                             clean: Any, corrupt: Any, site: Site,
                             probes: Probes, chunk_size: ChunkSize = AUTO,
                             allow_approximate: bool = False,
                             hoist: bool = True, clean_grad: bool = True,
                             batch_shards: int = 1) -> tuple[Any, jax.Array]:
  """(run_fn(variables, clean), L_int [K, B(, A)]) from ONE forward on D+.

  As `intervened_logliks`, but the clean run that records the site's value
  is the caller's own forward: ``run_fn(variables, inputs)`` calls
  ``model.apply`` and returns any pytree (e.g. the logits that give L+ and
  exact match), and that output is returned with the probes' L_int, so a
  training loss needs no second forward on D+. Inside the probe vmap the run
  on D+ does not depend on the probe (only Π_S h_f does), so it is traced
  once, unbatched (``out_axes=None``). ``clean_grad=False`` stops gradients
  through the recorded value only; ``run_fn``'s output keeps its gradients.
  Pure; use inside jit / grad. No paired mode.
  """
  site = check_site(site)
  probes = probes.validate()
  bare = probes.replace(names=())

  def one(v, c, d, probe):
    return recorded_probe(run_fn, loglik_fn, site, v, clean=c, corrupt=d,
                          probe=probe, allow_approximate=allow_approximate,
                          clean_grad=clean_grad)

  if all(m is None for m in (probes.span, probes.ports, probes.positions)):
    out, l_int = one(variables, clean, corrupt, bare)
    return out, l_int[None]

  def fn(consts, chunk):
    return jax.vmap(one, in_axes=(None, None, None, 0), out_axes=(None, 0))(
        *consts, chunk)
  return map_probes(fn, (variables, clean, corrupt), bare, chunk_size, hoist,
                    batch_shards, shared=True)


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
    """One probe's row of a [K, ...] field, by probe name (e.g. engine.EV)."""
    if name not in self.names:
      raise KeyError(f"no probe named {name!r}; probes: {self.names}")
    return getattr(self, field)[self.names.index(name)]

  def ceu_of(self, name: str) -> jax.Array:
    return self.row("ceu", name)

  def delta_of(self, name: str) -> jax.Array:
    """Δ_name = L_int,name − L− (Δev, Δdis)."""
    return self.row("delta_int", name)

  def L_int_of(self, name: str) -> jax.Array:
    return self.row("L_int", name)

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


def observed_loglik(loglik_fn, site, variables, inputs):
  """(loglik, the site's span decomposition); checks that the site exists."""
  kind = []

  def action(call):
    kind.append(site.adapter.decomposition(call.module))
    return call.run()
  out = run_hooked(loglik_fn, variables, inputs, {site: action},
                   lifted_ok=True)
  return out, kind[0]


def check_loglik_shape(out: Any, per_token: Optional[bool], what: str) -> None:
  """``loglik_fn`` must give the gold log-likelihood [B] (or [B, A])."""
  shape = getattr(out, "shape", None)
  dtype = getattr(out, "dtype", None)
  ranks = {None: (1, 2), False: (1,), True: (2,)}[per_token]
  if shape is None or len(shape) not in ranks or not jnp.issubdtype(
      dtype, jnp.floating):
    want = {None: "[B] (or per answer token [B, A])", False: "[B]",
            True: "[B, A] (per_token=True)"}[per_token]
    raise EngineError(
        f"loglik_fn returned {type(out).__name__} of shape "
        f"{None if shape is None else tuple(shape)} and dtype {dtype} on "
        f"{what}; audit needs the gold log-likelihood {want} as floats. A "
        "shape like [B, V] or [B, A, V] is logits: take log_softmax and pick "
        "the gold tokens (ceu_jax.likelihood.gold_loglik). Pass per_token=False "
        "to have any 2-D output rejected")


@functools.partial(jax.jit, static_argnums=(0, 1),
                   static_argnames=("chunk_size", "allow_approximate", "hoist",
                                    "paired", "per_token", "batch_shards",
                                    "out_sharding"))
def _audit_jit(loglik_fn, site, variables, clean, corrupt, probes, eps, *,
               chunk_size, allow_approximate, hoist, paired, per_token,
               batch_shards=1, out_sharding=None):
  L_plus, kind = observed_loglik(loglik_fn, site, variables, clean)
  check_loglik_shape(L_plus, per_token, "clean")
  L_minus = loglik_fn(variables, corrupt)
  if getattr(L_minus, "shape", None) != L_plus.shape:
    raise EngineError(
        f"loglik_fn gave shape {tuple(L_plus.shape)} on clean and "
        f"{getattr(L_minus, 'shape', None)} on corrupt inputs (D+ and D− must "
        "be token-aligned pytrees of the same shapes)")
  L_int = intervened_logliks(
      loglik_fn, variables, clean=clean, corrupt=corrupt, site=site,
      probes=probes, chunk_size=chunk_size,
      allow_approximate=allow_approximate, hoist=hoist, paired=paired,
      batch_shards=batch_shards)
  names = probes.names or tuple(f"probe_{i}" for i in range(L_int.shape[0]))
  approx = probes.span is not None and kind == APPROXIMATE
  out = from_logliks(L_plus, L_minus, L_int, eps, names, str(site), approx)
  if out_sharding is not None:   # small [K, B] results: every process reads them
    out = jax.lax.with_sharding_constraint(out, out_sharding)
  return out


def audit(loglik_fn: LoglikFn, variables: Any, *, clean: Any, corrupt: Any,
          site: Site, probes: Optional[Probes] = None,
          chunk_size: ChunkSize = AUTO, eps: float = scores.DEFAULT_EPS,
          allow_approximate: bool = False, hoist: bool = True,
          paired: bool = False, per_token: Optional[bool] = None,
          batch_sharding: Optional[jax.sharding.NamedSharding] = None
          ) -> AuditResult:
  """CEU of every probe at ``site`` in one compiled call.

  - ``loglik_fn(variables, inputs)`` calls ``model.apply`` and returns the
    log-likelihood of the target (the gold answer) [B], or per target token
    [B, A]; anything else (e.g. logits) is an `EngineError`. ``per_token``
    True/False demands [B, A] / [B]; None accepts both.
  - ``clean`` is the source run D+ (whose site value is patched in),
    ``corrupt`` the base run D− (which receives it); two pytrees of the same
    shapes, token-aligned.
  - ``site``: an `engine.Site`. ``probes``: which part of the site each
    intervened run restores (default: the full site).
  - ``chunk_size``: probes per vmapped chunk, or ``'auto'`` (the
    `chunking.choose` rule). ``paired``: one run on [D+; D−] per probe
    (sites inside nn.remat / nn.scan).
  - ``batch_sharding``: split the batch over a device mesh, e.g.
    ``NamedSharding(mesh, P('data'))`` (`ceu_jax.engine.placement`): inputs
    and probe masks split along B, variables replicated unless already on it,
    results replicated (readable on every process); probe chunks then bound
    the memory of each device, which holds B / shards examples.
  The compiled function is cached on (loglik_fn, site, static options) and
  probe names: keep ``loglik_fn`` the same object across calls (not a fresh
  lambda) to avoid recompiling. Differentiable (``ceu_unclipped``).
  """
  args, kwargs = _audit_args(loglik_fn, variables, clean, corrupt, site,
                             probes, eps, chunk_size, allow_approximate, hoist,
                             paired, per_token, batch_sharding)
  return _audit_jit(*args, **kwargs)


def audit_lowered(loglik_fn: LoglikFn, variables: Any, *, clean: Any,
                  corrupt: Any, site: Site, probes: Optional[Probes] = None,
                  chunk_size: ChunkSize = AUTO,
                  eps: float = scores.DEFAULT_EPS,
                  allow_approximate: bool = False, hoist: bool = True,
                  paired: bool = False, per_token: Optional[bool] = None,
                  batch_sharding: Optional[jax.sharding.NamedSharding] = None
                  ) -> jax.stages.Lowered:
  """The program `audit` would run, lowered but not run:
  ``.compile().memory_analysis()`` gives its bytes per device (temporaries,
  arguments, outputs) for a chunk size and mesh before committing to an
  audit; ``.cost_analysis()`` its FLOPs."""
  args, kwargs = _audit_args(loglik_fn, variables, clean, corrupt, site,
                             probes, eps, chunk_size, allow_approximate, hoist,
                             paired, per_token, batch_sharding)
  return _audit_jit.lower(*args, **kwargs)


def _audit_args(loglik_fn, variables, clean, corrupt, site, probes, eps,
                chunk_size, allow_approximate, hoist, paired, per_token,
                batch_sharding):
  """Checked, placed arguments of `_audit_jit`."""
  site = check_site(site)
  probes = Probes(names=(FULL,)) if probes is None else probes.validate()
  if chunk_size != AUTO:
    chunking.check(chunk_size)
  out_sharding, shards = None, 1
  if batch_sharding is not None:
    batch_sharding = placement.check(batch_sharding)
    shards = placement.num_shards(batch_sharding)
    out_sharding = placement.replicated(batch_sharding)
    clean = placement.place_batch(clean, batch_sharding, "clean")
    corrupt = placement.place_batch(corrupt, batch_sharding, "corrupt")
    probes = placement.place_probes(probes, batch_sharding)
    variables = placement.place_variables(variables, batch_sharding)
  return ((loglik_fn, site, variables, clean, corrupt, probes, eps),
          dict(chunk_size=chunk_size, allow_approximate=allow_approximate,
               hoist=hoist, paired=paired, per_token=per_token,
               batch_shards=shards, out_sharding=out_sharding))


@flax.struct.dataclass
class Profile:
  """CEU at several sites (layers / ports), in the order given."""
  results: tuple[AuditResult, ...]
  sites: tuple[str, ...] = flax.struct.field(pytree_node=False, default=())

  def __getitem__(self, site: Site) -> AuditResult:
    return self.results[self.sites.index(str(check_site(site)))]

  def stacked(self, field: str = "ceu", name: Optional[str] = None) -> jax.Array:
    """[S, ...] of one field (one probe row when ``name`` is given)."""
    rows = [r.row(field, name) if name else getattr(r, field)
            for r in self.results]
    return jnp.stack(rows)


def profile(loglik_fn: LoglikFn, variables: Any, *, clean: Any, corrupt: Any,
            sites: Sequence[Site],
            probes: Optional[Probes | Mapping[Site, Probes]] = None,
            **kwargs) -> Profile:
  """`audit` at every site; ``probes`` is one set or a {Site: set} mapping."""
  sites = [check_site(s) for s in sites]
  results = []
  for s in sites:
    p = probes
    if isinstance(probes, Mapping):
      if s not in probes:
        raise EngineError(f"profile: no probes given for site {s}")
      p = probes[s]
    results.append(audit(loglik_fn, variables, clean=clean, corrupt=corrupt,
                         site=s, probes=p, **kwargs))
  return Profile(tuple(results), tuple(str(s) for s in sites))
