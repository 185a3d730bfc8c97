"""Adapters: how the engine finds, splits and replaces a site's value h_f.

Shape legend (einsum letters):
  B batch, T reader positions, P ports (heads), D features, N context
  (source) tokens, H heads, K head features.

A `Site` names a module path and method; its adapter says what h_f is in
that method call and how to compute the span part Π_S h_f. The adapter is
supplied from outside the model, so any Flax linen model can be audited:

  `Native()`     the project's convention (docs/conventions.md §3): h = the
                 method's output, Π_S by calling the method again with the
                 keyword ``span_mask``, exactness declared by the module's
                 class attribute ``span_decomposition``.
  `Output(...)`  h = the output of any method (e.g. any module's
                 ``__call__``), with a declared layout and optionally a
                 user-supplied ``span_fn``.
  `Input(...)`   h = one input argument of the method: the value a submodule
                 consumes (e.g. a value computed inline in a block, caught
                 where the next submodule reads it).
  `Attention()`  attention whose read is Σ_j a_j v_j, e.g. an unmodified
                 ``flax.linen.MultiHeadDotProductAttention``: h = the input of
                 its child ``out`` projection [B, T, H, K]; Π_S h = the same
                 module re-run with its child ``value`` projection's output
                 zeroed outside S (exact: a_j does not depend on v).
  `Scanned(...)` one layer of an ``nn.scan`` stack, selected by a layer index
                 the model carries through the scan (paired evaluation only).

`Tap` is an identity module a user may drop into a model to name an inline
value: ``x = engine.Tap(name='resid')(x)`` then
``Site('block_0/resid', adapter=Output(layout='btd'))``.

An adapter's ``intercept(call, span, edit)`` runs the method (the engine calls
it from inside ``nn.intercept_methods``), computes h and, when ``span`` [B, N]
is given, Π_S h of the same call, hands them to ``edit(h, pi) -> h'`` and
returns the method's output with h' in place of h.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from ceu_jax.engine.errors import (EngineError, MaskShapeError,
                                   SpanUnsupportedError)

SPAN_KWARG = "span_mask"
# Optional class attribute of a native port: the name of a method that takes the site
# method's arguments (with `span_mask`) and returns (h, Π_S h) from one computation, equal
# to the two calls; the engine then calls it once instead (docs/conventions.md §3).
SPAN_PAIR_ATTR = "span_pair_method"
EXACT, APPROXIMATE = "exact", "approximate"
PORT_LETTERS = ("p", "h")          # a layout's port axis: ports or heads

Edit = Callable[[jax.Array, Optional[jax.Array]], jax.Array]
"""``edit(h, pi) -> h'``: pi = Π_S h of the same call (None without a span)."""


@dataclasses.dataclass
class Call:
  """One intercepted call of a site: what an adapter (and a user's
  ``span_fn`` / ``index``) may look at."""
  site: Any                        # the engine `Site`
  module: nn.Module                # the bound module
  next_fun: Callable[..., Any]     # the method (rest of the interceptor chain)
  args: tuple                      # positional arguments of this call
  kwargs: dict                     # keyword arguments of this call
  outer: tuple = ()                # enclosing intercepted calls, outermost
                                   # first: (path, method, args, kwargs)

  def run(self) -> Any:
    """The method on this call's own arguments."""
    return self.next_fun(*self.args, **self.kwargs)

  def enclosing(self, path: str, method: str = "__call__") -> tuple[tuple, dict]:
    """(args, kwargs) of the innermost enclosing call of ``path:method``
    (e.g. the scanned body that carries a layer index)."""
    path = path.strip("/")
    for p, m, args, kwargs in reversed(self.outer):
      if p == path and m == method:
        return args, kwargs
    raise EngineError(
        f"site {self.site}: no enclosing call of {path}:{method}; enclosing "
        f"calls: {[f'{p}:{m}' for p, m, _, _ in self.outer]}")

  def rerun(self, *args, **kwargs) -> Any:
    """The method once more in the same call (e.g. on masked inputs, to
    compute Π_S); compact scopes are rewound so parameters resolve to the
    same names."""
    rewind_compact(self.module)
    return self.next_fun(*args, **kwargs)


def module_path(module: nn.Module) -> Optional[str]:
  """``'/'.join(module.path)`` for a bound module, None when unbound."""
  try:
    return "/".join(str(p) for p in module.path)
  except Exception:  # pylint: disable=broad-except  (unbound module)
    return None


def lifted_transforms(module: nn.Module) -> tuple[str, ...]:
  """Names of the lifted transforms (``'remat'``, ``'scan'``, ``'vmap'``, …)
  around a bound module, outermost first; () when there are none.

  Flax records them in the scope's public ``debug_path`` as ``name(child)``.
  """
  scope = getattr(module, "scope", None)
  debug = getattr(scope, "debug_path", ()) or ()
  return tuple(str(p).split("(", 1)[0] for p in debug if "(" in str(p))


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


def check_layout(layout: Optional[str], what: str) -> None:
  """A layout is a string of distinct axis letters, 'b' first."""
  if layout is None:
    return
  if (not isinstance(layout, str) or not layout or layout[0] != "b"
      or len(set(layout)) != len(layout)
      or sum(c in PORT_LETTERS for c in layout) > 1):
    raise EngineError(
        f"{what}: layout={layout!r}; expected distinct axis letters with the "
        "batch 'b' first, e.g. 'btd', 'btpd' or 'bthd' (t positions, p or h "
        "ports/heads, other letters features)")


def check_decomposition(span_fn, kind, what: str) -> None:
  if span_fn is None and kind is not None:
    raise EngineError(f"{what}: span_decomposition={kind!r} needs a span_fn")
  if span_fn is not None and kind not in (EXACT, APPROXIMATE):
    raise EngineError(
        f"{what}: span_decomposition={kind!r}; with a span_fn declare "
        f"{EXACT!r} (Π_S h + Π_S̄ h = h; verify with engine.check_port) or "
        f"{APPROXIMATE!r}")


class Adapter:
  """Base: subclasses set ``layout`` and implement `intercept`."""
  layout: Optional[str] = None
  default_method: str = "__call__"

  def decomposition(self, module: nn.Module) -> Optional[str]:
    """'exact' / 'approximate' / None (no span patches) at this module."""
    del module
    return None

  def intercept(self, call: Call, span: Optional[jax.Array], edit: Edit) -> Any:
    raise NotImplementedError

  def repeats_ok(self) -> bool:
    """Whether the site may be called more than once per run."""
    return False


@dataclasses.dataclass(frozen=True)
class Native(Adapter):
  """The project's read-port convention (docs/conventions.md §3): h = the
  method's output ([B, T, P, D] for port/position probes); Π_S = the method
  called again with ``span_mask=S`` — or, where the class names a
  `span_pair_method`, h and Π_S from one call of that method; the module class
  declares ``span_decomposition = 'exact' | 'approximate'``."""
  layout: Optional[str] = "btpd"
  default_method: str = dataclasses.field(default="read", repr=False)

  def decomposition(self, module):
    return getattr(module, "span_decomposition", None)

  def intercept(self, call, span, edit):
    pair = None if span is None else getattr(type(call.module), SPAN_PAIR_ATTR, None)
    if pair:                      # one computation for both (docs/conventions.md §3)
      return edit(*call_pair(call, pair, span))
    h = call.run()
    pi = None if span is None else call_with_span(call, span)
    return edit(h, pi)


NATIVE = Native()


@dataclasses.dataclass(frozen=True)
class Output(Adapter):
  """h = the output of any method (``'__call__'`` of any module by default).

  ``layout``: h's axis letters, e.g. 'btd' (no port axis), 'btpd' / 'bthd'
  (ports / heads), or None (full-site probes only). ``span_fn(call, span)``
  -> Π_S h, optional, with ``span_decomposition`` 'exact' or 'approximate';
  ``call.rerun(...)`` runs the method again on other (e.g. masked) inputs.
  """
  layout: Optional[str] = None
  span_fn: Optional[Callable[[Call, jax.Array], jax.Array]] = None
  span_decomposition: Optional[str] = None

  def __post_init__(self):
    check_layout(self.layout, "Output adapter")
    check_decomposition(self.span_fn, self.span_decomposition, "Output adapter")

  def decomposition(self, module):
    return self.span_decomposition

  def intercept(self, call, span, edit):
    h = call.run()
    pi = None if span is None else self.span_fn(call, span)
    return edit(h, pi)


@dataclasses.dataclass(frozen=True)
class Input(Adapter):
  """h = one input of the method: positional index ``arg`` or keyword name.

  Patching replaces the value the module consumes, so a value computed
  inline in a block becomes a site at the submodule that reads it (e.g.
  ``Site('block_0/proj', adapter=Input(0, layout='btd'))``). ``span_fn`` /
  ``span_decomposition`` as in `Output`.
  """
  arg: int | str = 0
  layout: Optional[str] = None
  span_fn: Optional[Callable[[Call, jax.Array], jax.Array]] = None
  span_decomposition: Optional[str] = None

  def __post_init__(self):
    check_layout(self.layout, "Input adapter")
    check_decomposition(self.span_fn, self.span_decomposition, "Input adapter")

  def decomposition(self, module):
    return self.span_decomposition

  def intercept(self, call, span, edit):
    args, kwargs = list(call.args), dict(call.kwargs)
    if isinstance(self.arg, int):
      if not -len(args) <= self.arg < len(args):
        raise EngineError(
            f"site {call.site}: Input(arg={self.arg}) but the call has "
            f"{len(args)} positional argument(s); pass the index or keyword "
            "name of the input that holds h")
      h = args[self.arg]
    else:
      if self.arg not in kwargs:
        raise EngineError(
            f"site {call.site}: Input(arg={self.arg!r}) but the call's "
            f"keywords are {sorted(kwargs)}")
      h = kwargs[self.arg]
    pi = None if span is None else self.span_fn(call, span)
    new = edit(h, pi)
    if isinstance(self.arg, int):
      args[self.arg] = new
    else:
      kwargs[self.arg] = new
    return call.next_fun(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Attention(Adapter):
  """Σ_j a_j v_j attention built like ``nn.MultiHeadDotProductAttention``.

  h = the input of the child ``out`` (the per-head Σ_j a_j v_j before the
  output projection, [B, T, H, K]: heads are the ports). Π_S h = the module
  re-run on the same inputs with the child ``value``'s output [B, N, H, K]
  (token axis ``token_axis``) zeroed outside S. The weights a_j come from
  queries and keys only, so Π_S h = Σ_{j∈S} a_j v_j exactly and
  Π_S h + Π_S̄ h = h (the output projection's bias is outside h). Needs
  ``decode=False`` (the cache would be advanced twice) and deterministic or
  fixed-rng dropout.
  """
  value: str = "value"
  out: str = "out"
  token_axis: int = -3
  layout: Optional[str] = "bthd"

  def __post_init__(self):
    check_layout(self.layout, "Attention adapter")

  def decomposition(self, module):
    return EXACT

  def _children(self, call):
    base = module_path(call.module)
    pre = f"{base}/" if base else ""
    return pre + self.value, pre + self.out

  def intercept(self, call, span, edit):
    value_path, out_path = self._children(call)
    pi = None
    if span is not None:
      got = {}

      def masked(next_fun, args, kwargs, ctx):
        path = module_path(ctx.module)
        if ctx.method_name == "__call__" and path == value_path:
          v = next_fun(*args, **kwargs)
          return v * _token_mask(span, v, self.token_axis, call.site)
        if ctx.method_name == "__call__" and path == out_path:
          got["x"] = args[0]
        return next_fun(*args, **kwargs)

      with nn.intercept_methods(masked):
        call.run()
      self._check_found(call, "x" in got, out_path)
      rewind_compact(call.module)
      pi = got["x"]

    seen = []

    def replace(next_fun, args, kwargs, ctx):
      if ctx.method_name == "__call__" and module_path(ctx.module) == out_path:
        seen.append(True)
        return next_fun(edit(args[0], pi), *args[1:], **kwargs)
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(replace):
      y = call.run()
    self._check_found(call, bool(seen), out_path)
    return y

  def _check_found(self, call, found, out_path):
    if not found:
      raise EngineError(
          f"site {call.site}: the Attention adapter expects a child "
          f"`{self.out}` (the output projection, path {out_path!r}) fed by "
          f"Σ_j a_j v_j, and a child `{self.value}` (the value projection); "
          "the module never called it. Name the children with "
          "Attention(value=..., out=...), or use Output/Input adapters")


def _token_mask(span: jax.Array, v: jax.Array, axis: int, site) -> jax.Array:
  """span [B, N] reshaped to broadcast over v's batch and token axes."""
  ax = axis % v.ndim
  if v.ndim < 2 or ax == 0 or v.shape[0] != span.shape[0] or v.shape[ax] != span.shape[1]:
    raise MaskShapeError(
        f"site {site}: probe field `span` has per-probe shape "
        f"{tuple(span.shape)}, expected [B, N] matching the value "
        f"projection's batch and token axes (shape {tuple(v.shape)}, token "
        f"axis {axis})")
  shape = [1] * v.ndim
  shape[0], shape[ax] = span.shape
  return span.reshape(shape).astype(v.dtype)


@dataclasses.dataclass(frozen=True)
class Scanned(Adapter):
  """One layer of an ``nn.scan`` stack.

  ``nn.scan`` traces its body once, so every layer is the same call to an
  interceptor. The model must carry a layer index through the scan (in the
  carry or the scanned-over inputs); ``index(call)`` reads it from this call
  (``call.args`` / ``call.kwargs``, or an enclosing call in ``call.outer``),
  and the patch applies where ``index == layer`` (h passes unchanged in the
  other layers). ``inner`` is the adapter of the site within the body.
  Values cannot leave a scan, so audit with ``paired=True`` (D+ and D− run
  as one batch; SPEC §9).
  """
  layer: int = 0
  index: Optional[Callable[[Call], jax.Array]] = None
  inner: Adapter = dataclasses.field(default_factory=Output)

  def __post_init__(self):
    if self.index is None:
      raise EngineError(
          "Scanned adapter: pass index=lambda call: ... returning the layer "
          "index the model carries through its scan")

  @property
  def layout(self):  # type: ignore[override]
    return self.inner.layout

  @property
  def default_method(self):  # type: ignore[override]
    return self.inner.default_method

  def decomposition(self, module):
    return self.inner.decomposition(module)

  def repeats_ok(self):
    return True

  def intercept(self, call, span, edit):
    here = jnp.asarray(self.index(call)) == self.layer

    def where(h, pi):
      return jnp.where(here, edit(h, pi), h)
    return self.inner.intercept(call, span, where)


class Tap(nn.Module):
  """The identity. Drop ``x = engine.Tap(name='resid')(x)`` into a model to
  make an inline value a site: ``Site('.../resid', adapter=Output('btd'))``."""

  @nn.compact
  def __call__(self, x):
    return x


def _span_arguments(call: Call, span: jax.Array) -> tuple[tuple, dict]:
  """The call's (args, kwargs) with ``span_mask=span`` (replacing any value passed)."""
  fn = getattr(type(call.module), call.site.method)
  args, kwargs = call.args, call.kwargs
  try:
    sig = inspect.signature(fn)
    bound = sig.bind_partial(None, *args, **kwargs)
  except (TypeError, ValueError):
    sig, bound = None, None
  if sig is not None and SPAN_KWARG in sig.parameters:
    bound.arguments[SPAN_KWARG] = span
    return tuple(bound.args[1:]), dict(bound.kwargs)
  if sig is not None and not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
    raise SpanUnsupportedError(
        f"site {call.site}: method {type(call.module).__name__}."
        f"{call.site.method} has no `{SPAN_KWARG}` parameter")
  return args, {**kwargs, SPAN_KWARG: span}


def _rejected(call: Call, span: jax.Array, e: Exception) -> MaskShapeError:
  return MaskShapeError(
      f"site {call.site}: the port rejected span_mask of shape "
      f"{tuple(span.shape)} (expected [B, N] over its context tokens): {e}")


def call_with_span(call: Call, span: jax.Array) -> jax.Array:
  """Calls a native port with ``span_mask=span`` (replacing any value passed)."""
  args, kwargs = _span_arguments(call, span)
  try:
    return call.rerun(*args, **kwargs)
  except EngineError:
    raise
  except (TypeError, ValueError) as e:
    raise _rejected(call, span, e) from e


def call_pair(call: Call, method: str, span: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(h, Π_S h) from the port's ``method`` (its class's `SPAN_PAIR_ATTR`), called once
  with the site call's arguments and ``span_mask=span``."""
  args, kwargs = _span_arguments(call, span)
  try:
    out = getattr(call.module, method)(*args, **kwargs)
  except EngineError:
    raise
  except (TypeError, ValueError) as e:
    raise _rejected(call, span, e) from e
  if not (isinstance(out, tuple) and len(out) == 2):
    raise EngineError(
        f"site {call.site}: {type(call.module).__name__}.{method} (its "
        f"`{SPAN_PAIR_ATTR}`) must return the pair (h, Π_S h), got {type(out).__name__}")
  return out
