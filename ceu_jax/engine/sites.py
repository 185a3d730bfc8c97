"""Sites (read ports), and recording / patching them by method interception.

Shape legend (einsum letters):
  B batch, T reader positions, P ports, D features, N context tokens.

A site is named by the module path (``'/'.join(module.path)`` inside the
``flax.linen`` interceptor, e.g. ``'reader/block_1/retrieval'``; ``''`` is the
root module) and the method name (``'read'`` by default). The port returns
h_f, conventionally [B, T, P, D]. Span patches call the port once more with the
keyword ``span_mask`` [B, N] and use the returned Π_S h (docs/conventions.md §3).

Everything here runs while JAX traces the user's ``loglik_fn``: interceptors are
entered inside the traced function, values to patch in are traced arguments,
and recorded values are returned, never stored beyond the trace.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

LoglikFn = Callable[[Any, Any], jax.Array]
"""``loglik_fn(variables, inputs) -> gold log-likelihood [B] (or per token [B, A])``."""

SPAN_KWARG = "span_mask"
EXACT, APPROXIMATE = "exact", "approximate"


class EngineError(ValueError):
  """Base class of the engine's input errors."""


class SiteNotFoundError(EngineError):
  """The named site was never called during the run."""


class SpanUnsupportedError(EngineError):
  """A span patch was requested at a port that cannot decompose h by tokens."""


class MaskShapeError(EngineError):
  """A probe mask does not fit the site's activation."""


@dataclasses.dataclass(frozen=True, order=True)
class Site:
  """A read port: module path (``'a/b/c'``, matched exactly) and method name."""
  path: str
  method: str = "read"

  def __post_init__(self):
    object.__setattr__(self, "path", self.path.strip("/"))

  def matches(self, path: str, method: str) -> bool:
    return self.path == path and self.method == method

  def __str__(self) -> str:
    return f"{self.path}:{self.method}"


def as_site(site: Site | str) -> Site:
  """Accepts a `Site` or ``'path'`` / ``'path:method'``."""
  if isinstance(site, Site):
    return site
  path, _, method = site.partition(":")
  return Site(path, method or "read")


def module_path(module: nn.Module) -> Optional[str]:
  """``'/'.join(module.path)`` for a bound module, None when unbound."""
  try:
    return "/".join(str(p) for p in module.path)
  except Exception:  # pylint: disable=broad-except  (unbound module)
    return None


def span_kind(module: nn.Module) -> Optional[str]:
  """The port's declared ``span_decomposition`` ('exact' / 'approximate' / None)."""
  return getattr(module, "span_decomposition", None)


def check_span_support(module: nn.Module, site: Site,
                       allow_approximate: bool) -> str:
  """Raises `SpanUnsupportedError` unless the port may be span-patched."""
  kind = span_kind(module)
  name = type(module).__name__
  if kind is None:
    raise SpanUnsupportedError(
        f"site {site} ({name}) declares no `span_decomposition` class attribute;"
        " only full-site, port and position patches are supported there")
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


def rewind_compact(module: nn.Module) -> None:
  """Lets a compact method run again within the same intercepted call.

  Flax rewinds a module's scope and autonames after each compact method call;
  a second call of the port from inside its interceptor needs the same so
  that its params and inline submodules resolve to the same names.
  """
  state = getattr(module, "_state", None)
  if state is not None and state.in_compact_method and module.scope is not None:
    object.__setattr__(module, "scope", module.scope.rewound())
    state.autoname_cursor = dict()


def call_with_span(next_fun: Callable[..., Any], args: tuple, kwargs: dict,
                   module: nn.Module, method: str, span: jax.Array,
                   site: Site) -> jax.Array:
  """Calls the port with ``span_mask=span`` (replacing any value passed)."""
  fn = getattr(type(module), method)
  try:
    sig = inspect.signature(fn)
    bound = sig.bind_partial(None, *args, **kwargs)
  except (TypeError, ValueError):
    sig, bound = None, None
  if sig is not None and SPAN_KWARG in sig.parameters:
    bound.arguments[SPAN_KWARG] = span
    args, kwargs = tuple(bound.args[1:]), dict(bound.kwargs)
  elif sig is not None and not any(
      p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
    raise SpanUnsupportedError(
        f"site {site}: method {type(module).__name__}.{method} has no "
        f"`{SPAN_KWARG}` parameter")
  else:
    kwargs = {**kwargs, SPAN_KWARG: span}
  rewind_compact(module)
  try:
    return next_fun(*args, **kwargs)
  except EngineError:
    raise
  except (TypeError, ValueError) as e:
    raise MaskShapeError(
        f"site {site}: the port rejected span_mask of shape "
        f"{tuple(span.shape)} (expected [B, N] over its context tokens): {e}"
    ) from e


class SiteHook:
  """One interceptor that acts on some sites and remembers every site seen.

  ``actions`` maps each `Site` to ``action(next_fun, args, kwargs, module)``,
  which returns the method's (possibly replaced) output. Each site must be
  called exactly once per run.
  """

  def __init__(self, actions: Mapping[Site, Callable[..., Any]]):
    self.actions = dict(actions)
    self.seen: dict[str, None] = {}
    self.calls: dict[Site, int] = {s: 0 for s in self.actions}

  def __call__(self, next_fun, args, kwargs, context):
    if context.method_name == "setup":
      return next_fun(*args, **kwargs)
    path = module_path(context.module)
    if path is None:
      return next_fun(*args, **kwargs)
    self.seen[f"{path}:{context.method_name}"] = None
    for site, action in self.actions.items():
      if site.matches(path, context.method_name):
        self.calls[site] += 1
        if self.calls[site] > 1:
          raise EngineError(
              f"site {site} was called more than once in one run; the engine "
              "needs one call per run (give repeated calls distinct modules)")
        return action(next_fun, args, kwargs, context.module)
    return next_fun(*args, **kwargs)

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
               actions: Mapping[Site, Callable[..., Any]]) -> jax.Array:
  """Runs ``loglik_fn`` with the actions installed; checks every site fired."""
  hook = SiteHook(actions)
  with nn.intercept_methods(hook):
    out = loglik_fn(variables, inputs)
  hook.check_all_found()
  return out


def record(loglik_fn: LoglikFn, variables: Any, inputs: Any,
           sites: Sequence[Site | str] | Site | str, *,
           span_mask: Optional[jax.Array] = None,
           allow_approximate: bool = False) -> tuple[jax.Array, dict]:
  """Runs ``loglik_fn`` once; returns (loglik, {site: h_f}).

  With ``span_mask`` [B, N] the recorded value is Π_S h_f (same run). Pure and
  jit-safe: call it inside ``jax.jit`` with the loglik_fn closed over.
  """
  single = isinstance(sites, (Site, str))
  sites = [as_site(s) for s in ([sites] if single else sites)]
  captured: dict[Site, jax.Array] = {}

  def make(site):
    def action(next_fun, args, kwargs, module):
      h = next_fun(*args, **kwargs)
      if span_mask is None:
        captured[site] = h
      else:
        check_span_support(module, site, allow_approximate)
        _check_span_batch(span_mask, h, site)
        captured[site] = call_with_span(next_fun, args, kwargs, module,
                                        site.method, span_mask, site)
      return h
    return action

  out = run_hooked(loglik_fn, variables, inputs, {s: make(s) for s in sites})
  return out, dict(captured)


def _site_mask(h: jax.Array, port_mask: Optional[jax.Array],
               position_mask: Optional[jax.Array], site: Site
               ) -> Optional[jax.Array]:
  """Broadcastable [B|1, T|1, P|1, 1] mask from port [P]/[B,P] and position
  [T]/[B,T] masks; None when both are None."""
  if port_mask is None and position_mask is None:
    return None
  if h.ndim != 4:
    raise MaskShapeError(
        f"site {site}: port/position masks need h of shape [B, T, P, D], got "
        f"{tuple(h.shape)}")
  b, t, p, _ = h.shape
  masks = []
  for name, m, n, axis in (("ports", port_mask, p, 2),
                           ("positions", position_mask, t, 1)):
    if m is None:
      continue
    if m.ndim not in (1, 2) or m.shape[-1] != n or (m.ndim == 2 and m.shape[0] != b):
      want = "P" if name == "ports" else "T"
      raise MaskShapeError(
          f"site {site}: probe field `{name}` has per-probe shape "
          f"{tuple(m.shape)}, expected [{want}]={n} or [B, {want}]=({b}, {n})")
    shape = [1, 1, 1, 1]
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


def patch(loglik_fn: LoglikFn, variables: Any, inputs: Any,
          site: Site | str, value: jax.Array, *,
          span_mask: Optional[jax.Array] = None,
          port_mask: Optional[jax.Array] = None,
          position_mask: Optional[jax.Array] = None,
          allow_approximate: bool = False) -> jax.Array:
  """Gold log-likelihood of a run on ``inputs`` with the site patched.

  - ``span_mask`` None: h is replaced by ``value`` (h_f recorded on D+).
  - ``span_mask`` [B, N]: ``value`` is Π_S h(D+) (see `record`); the site
    returns h(D−) − Π_S h(D−) + Π_S h(D+).
  - ``port_mask`` [P] or [B, P], ``position_mask`` [T] or [B, T]: the patch
    applies only there (bool masks select; float masks interpolate).
  Pure, jit-, vmap- and grad-safe; masks and ``value`` may be traced.
  """
  site = as_site(site)

  def action(next_fun, args, kwargs, module):
    h = next_fun(*args, **kwargs)
    if value.shape != h.shape:
      raise MaskShapeError(
          f"site {site}: patch value has shape {tuple(value.shape)}, the run "
          f"produced h of shape {tuple(h.shape)} (inputs must be token-aligned)")
    full = value
    if span_mask is not None:
      check_span_support(module, site, allow_approximate)
      _check_span_batch(span_mask, h, site)
      pi = call_with_span(next_fun, args, kwargs, module, site.method,
                          span_mask, site)
      full = h - pi + value.astype(h.dtype)
    return blend(h, full, _site_mask(h, port_mask, position_mask, site))

  return run_hooked(loglik_fn, variables, inputs, {site: action})


def _check_span_batch(span: jax.Array, h: jax.Array, site: Site) -> None:
  if span.ndim != 2 or (h.ndim >= 1 and span.shape[0] != h.shape[0]):
    raise MaskShapeError(
        f"site {site}: probe field `span` has per-probe shape "
        f"{tuple(span.shape)}, expected [B, N] with B={h.shape[0]}")
