"""Sites (read ports), and recording / patching them by method interception.

Shape legend (einsum letters):
  B batch, T reader positions, P ports, D features, N context tokens.

A site is named by the module path (``'/'.join(module.path)`` inside the
``flax.linen`` interceptor, e.g. ``'reader/block_1/retrieval'``; ``''`` is the
root module), the method name, and an adapter (`ceu_jax.engine.adapters`) that
says what h_f is in that call and how to compute Π_S h_f. The default adapter
is the project's native convention (method ``read`` returning [B, T, P, D],
keyword ``span_mask``, class attribute ``span_decomposition``).

Everything here runs while JAX traces the user's ``loglik_fn``: interceptors are
entered inside the traced function, values to patch in are traced arguments,
and recorded values are returned, never stored beyond the trace.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from ceu_jax.engine.adapters import (APPROXIMATE, EXACT, NATIVE, PORT_LETTERS,
                                     Adapter, Call, lifted_transforms,
                                     module_path)
from ceu_jax.engine.errors import (EngineError, LiftedSiteError,
                                   MaskShapeError, SiteNotFoundError,
                                   SpanUnsupportedError)

LoglikFn = Callable[[Any, Any], jax.Array]
"""``loglik_fn(variables, inputs) -> gold log-likelihood [B] (or per token [B, A])``."""

Action = Callable[[Call], Any]
"""``action(call) -> the method's (possibly replaced) output``."""


@dataclasses.dataclass(frozen=True)
class Site:
  """A site: module path (``'a/b/c'``, matched exactly), method name and the
  adapter that reads h_f there (default `Native`, whose method is ``read``;
  other adapters default to ``__call__``)."""
  path: str
  method: Optional[str] = None
  adapter: Adapter = NATIVE

  def __post_init__(self):
    if not isinstance(self.path, str):
      raise EngineError(f"Site.path must be a str, got {type(self.path).__name__}")
    if not isinstance(self.adapter, Adapter):
      raise EngineError(
          f"Site.adapter must be an engine adapter (Native, Output, Input, "
          f"Attention, Scanned), got {type(self.adapter).__name__}")
    object.__setattr__(self, "path", self.path.strip("/"))
    if self.method is None:
      object.__setattr__(self, "method", self.adapter.default_method)

  @classmethod
  def parse(cls, text: "str | Site") -> "Site":
    """``'path'`` or ``'path:method'`` (native adapter) -> `Site`; a `Site`
    is returned unchanged. For command lines and config strings only: the
    engine API itself takes `Site` objects."""
    if isinstance(text, Site):
      return text
    if not isinstance(text, str):
      raise EngineError(f"Site.parse needs 'path[:method]', got {text!r}")
    path, _, method = text.partition(":")
    return cls(path, method or None)

  def matches(self, path: str, method: str) -> bool:
    return self.path == path and self.method == method

  def __str__(self) -> str:
    return f"{self.path}:{self.method}"

  def __lt__(self, other: "Site") -> bool:   # sorted pytree dict keys
    return ((self.path, self.method, repr(self.adapter))
            < (other.path, other.method, repr(other.adapter)))


def check_site(site: Any) -> Site:
  """The engine API takes `Site` objects only."""
  if isinstance(site, Site):
    return site
  raise EngineError(
      f"site must be an engine.Site, got {type(site).__name__} {site!r}; "
      "build it with engine.Site(path, method, adapter) "
      "(engine.Site.parse('path:method') where a site comes as text)")


def check_span_support(site: Site, module: nn.Module,
                       allow_approximate: bool) -> str:
  """Raises `SpanUnsupportedError` unless the site may be span-patched."""
  kind = site.adapter.decomposition(module)
  name = type(module).__name__
  if kind is None:
    how = ("declares no `span_decomposition` class attribute"
           if site.adapter is NATIVE or type(site.adapter).__name__ == "Native"
           else f"has an adapter without a span decomposition ({site.adapter!r})")
    raise SpanUnsupportedError(
        f"site {site} ({name}) {how}; only full-site, port and position "
        "patches are supported there")
  if kind not in (EXACT, APPROXIMATE):
    raise SpanUnsupportedError(
        f"site {site} ({name}): span_decomposition={kind!r}, expected "
        f"{EXACT!r} or {APPROXIMATE!r}")
  if kind == APPROXIMATE and not allow_approximate:
    raise SpanUnsupportedError(
        f"site {site} ({name}) has an approximate span decomposition; pass "
        "allow_approximate=True to patch spans there (the scores are then "
        "approximate)")
  return kind


def lifted_error(site: Site, lifted: tuple[str, ...], paired: bool) -> Optional[str]:
  """Why the site cannot be used as called (None when it can)."""
  if not lifted:
    return None
  where = " inside ".join(f"nn.{t}" for t in reversed(lifted))
  scanned = any(t == "scan" for t in lifted)
  if scanned and not site.adapter.repeats_ok():
    return (f"site {site} lies inside {where}: nn.scan traces its body once, "
            "so every scanned layer is the same call and cannot be told "
            "apart. Select one layer with engine.Scanned(layer=l, index=...) "
            "reading a layer index the model carries through the scan, and "
            "audit with paired=True (docs/engine.md, 'Lifted transforms')")
  if not paired:
    return (f"site {site} lies inside {where}: a value recorded there belongs "
            "to the transform's inner trace and cannot be returned (JAX "
            "would raise UnexpectedTracerError). Audit with paired=True "
            "(D+ and D− run as one batch, nothing leaves the transform), or "
            "build the model without the transform for the audit (remat "
            "does not change values)")
  return None


class SiteHook:
  """One interceptor that acts on some sites and remembers every site seen.

  ``actions`` maps each `Site` to ``action(call) -> output``. Each site must
  be called exactly once per run (adapters such as `Scanned` allow more).
  ``paired``: the actions are paired (in-place) ones, allowed inside lifted
  transforms; ``lifted_ok``: pass-through actions, allowed anywhere.
  """

  def __init__(self, actions: Mapping[Site, Action], *, paired: bool = False,
               lifted_ok: bool = False):
    self.actions = {check_site(s): a for s, a in actions.items()}
    self.paired, self.lifted_ok = paired, lifted_ok
    self.seen: dict[str, None] = {}
    self.calls: dict[Site, int] = {s: 0 for s in self.actions}
    self.active: list[tuple[str, str, tuple, dict]] = []

  def __call__(self, next_fun, args, kwargs, context):
    if context.method_name == "setup":
      return next_fun(*args, **kwargs)
    path = module_path(context.module)
    if path is None:
      return next_fun(*args, **kwargs)
    self.seen[f"{path}:{context.method_name}"] = None
    outer = tuple(self.active)
    self.active.append((path, context.method_name, args, kwargs))
    try:
      for site, action in self.actions.items():
        if site.matches(path, context.method_name):
          return self._act(site, action, next_fun, args, kwargs,
                           context.module, outer)
      return next_fun(*args, **kwargs)
    finally:
      self.active.pop()

  def _act(self, site, action, next_fun, args, kwargs, module, outer):
    # Inside nn.scan without a layer selector: an error even for pass-through
    # actions (the layers cannot be told apart whatever is done there).
    why = lifted_error(site, lifted_transforms(module),
                       self.paired or self.lifted_ok)
    if why and not (self.lifted_ok and site.adapter.repeats_ok()):
      raise LiftedSiteError(why)
    self.calls[site] += 1
    if self.calls[site] > 1 and not site.adapter.repeats_ok():
      raise EngineError(
          f"site {site} was called more than once in one run; the engine "
          "needs one call per run (give repeated calls distinct modules)")
    return action(Call(site, module, next_fun, args, kwargs, outer))

  def check_all_found(self) -> None:
    missing = [s for s, n in self.calls.items() if n == 0]
    if missing:
      seen = "\n  ".join(self.seen) or (
          "(none: loglik_fn must call model.apply itself and must not be "
          "wrapped in jax.jit, whose cache ignores interceptors)")
      raise SiteNotFoundError(
          f"site(s) {', '.join(map(str, missing))} never called. Sites seen "
          f"(path:method):\n  {seen}")


def run_hooked(loglik_fn: LoglikFn, variables: Any, inputs: Any,
               actions: Mapping[Site, Action], *, paired: bool = False,
               lifted_ok: bool = False) -> jax.Array:
  """Runs ``loglik_fn`` with the actions installed; checks every site fired."""
  hook = SiteHook(actions, paired=paired, lifted_ok=lifted_ok)
  try:
    with nn.intercept_methods(hook):
      out = loglik_fn(variables, inputs)
  except jax.errors.UnexpectedTracerError as e:
    raise LiftedSiteError(
        f"site(s) {', '.join(map(str, hook.actions))}: a value left the trace "
        "it was made in (a site inside a lifted transform such as nn.remat or "
        f"nn.scan?). Audit with paired=True. JAX said: {e}") from e
  hook.check_all_found()
  return out


def edit_action(site: Site, edit, span: Optional[jax.Array],
                allow_approximate: bool) -> Action:
  """The action that hands (h, Π_S h) of the site's call to ``edit``."""
  def action(call):
    if span is not None:
      check_span_support(site, call.module, allow_approximate)
    return site.adapter.intercept(call, span, edit)
  return action


def record(loglik_fn: LoglikFn, variables: Any, inputs: Any,
           sites: Sequence[Site] | Site, *,
           span_mask: Optional[jax.Array] = None,
           allow_approximate: bool = False) -> tuple[jax.Array, dict]:
  """Runs ``loglik_fn`` once; returns (loglik, {site: h_f}).

  With ``span_mask`` [B, N] the recorded value is Π_S h_f (same run). Pure and
  jit-safe: call it inside ``jax.jit`` with the loglik_fn closed over.
  """
  single = isinstance(sites, Site)
  sites = [check_site(s) for s in ([sites] if single else sites)]
  captured: dict[Site, jax.Array] = {}

  def make(site):
    def edit(h, pi):
      if span_mask is not None:
        _check_span_batch(span_mask, h, site)
      captured[site] = h if pi is None else pi
      return h
    return edit_action(site, edit, span_mask, allow_approximate)

  out = run_hooked(loglik_fn, variables, inputs, {s: make(s) for s in sites})
  return out, dict(captured)


def site_mask(h: jax.Array, port_mask: Optional[jax.Array],
              position_mask: Optional[jax.Array], site: Site
              ) -> Optional[jax.Array]:
  """Broadcastable mask over h from port [P]/[B,P] and position [T]/[B,T]
  masks, placed by the adapter's layout; None when both are None."""
  if port_mask is None and position_mask is None:
    return None
  layout = site.adapter.layout
  if layout is None:
    raise MaskShapeError(
        f"site {site}: port/position probes need the site's layout (axis "
        f"letters of h, e.g. 'btd' or 'btpd'); its adapter {site.adapter!r} "
        "declares none")
  if h.ndim != len(layout):
    raise MaskShapeError(
        f"site {site}: port/position masks need h of layout {layout!r} "
        f"({len(layout)} axes), got h of shape {tuple(h.shape)}")
  b = h.shape[0]
  port_axis = next((layout.index(c) for c in PORT_LETTERS if c in layout), None)
  pos_axis = layout.index("t") if "t" in layout else None
  masks = []
  for name, m, axis in (("ports", port_mask, port_axis),
                        ("positions", position_mask, pos_axis)):
    if m is None:
      continue
    want = "P" if name == "ports" else "T"
    if axis is None:
      raise MaskShapeError(
          f"site {site}: probe field `{name}` given, but the site's layout "
          f"{layout!r} has no {'port' if name == 'ports' else 'position'} "
          f"axis ({'p or h' if name == 'ports' else 't'})")
    n = h.shape[axis]
    if m.ndim not in (1, 2) or m.shape[-1] != n or (m.ndim == 2 and m.shape[0] != b):
      raise MaskShapeError(
          f"site {site}: probe field `{name}` has per-probe shape "
          f"{tuple(m.shape)}, expected [{want}]={n} or [B, {want}]=({b}, {n})")
    shape = [1] * h.ndim
    shape[axis] = n
    if m.ndim == 2:
      shape[0] = b
    masks.append(m.reshape(shape))
  if len(masks) == 1:
    return masks[0]
  a, c = masks
  if a.dtype == jnp.bool_ and c.dtype == jnp.bool_:
    return a & c
  return a.astype(h.dtype) * c.astype(h.dtype)


def blend(h_minus: jax.Array, patched: jax.Array,
          mask: Optional[jax.Array]) -> jax.Array:
  """``patched`` where mask, ``h_minus`` elsewhere (soft masks interpolate)."""
  patched = patched.astype(h_minus.dtype)
  if mask is None:
    return patched
  if mask.dtype == jnp.bool_:
    return jnp.where(mask, patched, h_minus)
  return h_minus + mask.astype(h_minus.dtype) * (patched - h_minus)


def patched_value(site: Site, h: jax.Array, pi: Optional[jax.Array],
                  value: jax.Array, span: Optional[jax.Array],
                  port_mask: Optional[jax.Array],
                  position_mask: Optional[jax.Array]) -> jax.Array:
  """h' = h − Π_S h + value (value alone without a span), on the masked part."""
  if value.shape != h.shape:
    raise MaskShapeError(
        f"site {site}: patch value has shape {tuple(value.shape)}, the run "
        f"produced h of shape {tuple(h.shape)} (inputs must be token-aligned)")
  full = value
  if span is not None:
    _check_span_batch(span, h, site)
    full = h - pi + value.astype(h.dtype)
  return blend(h, full, site_mask(h, port_mask, position_mask, site))


def patch(loglik_fn: LoglikFn, variables: Any, inputs: Any,
          site: Site, value: jax.Array, *,
          span_mask: Optional[jax.Array] = None,
          port_mask: Optional[jax.Array] = None,
          position_mask: Optional[jax.Array] = None,
          allow_approximate: bool = False) -> jax.Array:
  """Gold log-likelihood of a run on ``inputs`` with the site patched.

  - ``span_mask`` None: h is replaced by ``value`` (h_f recorded on D+).
  - ``span_mask`` [B, N]: ``value`` is Π_S h(D+) (see `record`); the site
    returns h(D−) − Π_S h(D−) + Π_S h(D+).
  - ``port_mask`` [P] or [B, P], ``position_mask`` [T] or [B, T]: the patch
    applies only there (bool masks select; float masks interpolate), placed
    by the adapter's layout.
  Pure, jit-, vmap- and grad-safe; masks and ``value`` may be traced.
  """
  site = check_site(site)

  def edit(h, pi):
    return patched_value(site, h, pi, value, span_mask, port_mask,
                         position_mask)

  return run_hooked(loglik_fn, variables, inputs,
                    {site: edit_action(site, edit, span_mask, allow_approximate)})


def _check_span_batch(span: jax.Array, h: jax.Array, site: Site) -> None:
  if span.ndim != 2 or (h.ndim >= 1 and span.shape[0] != h.shape[0]):
    raise MaskShapeError(
        f"site {site}: probe field `span` has per-probe shape "
        f"{tuple(span.shape)}, expected [B, N] with B={h.shape[0]}")
