"""`check_port`: verify a site's declared decomposition on the user's own
model and inputs (SPEC §1 identities plus additivity of the parts).

Shape legend (einsum letters):
  B batch, N context (source) tokens, P ports, T reader positions.

A decomposition can pass the all/none identities and still be wrong: an
output projection's bias put into every part Π_S gives Π_∅ = bias and
Π_S + Π_S̄ = h + bias, yet S = ∅ and S = all patch correctly (the bias
cancels). So besides the identities this checks, on both runs (D+ and D−):

  parts_empty       Π_∅ h = 0
  parts_complement  Π_S h + Π_S̄ h = h
  parts_all         Π_all h = h
  parts_union       Π_{S1} h + Π_{S2} h = Π_S h  (S1, S2: a split of S)

and on the log-likelihoods:

  self_full   D+ into D+ (full site) gives L+
  self_span   D+ into D+ (span S) gives L+
  span_empty  S = ∅ gives L−
  span_all    S = all gives the full patch
  masks_all   all ports × all positions gives the full patch (when the
              site's layout has those axes)

Tolerances are relative to scale: |error| ≤ tol · max(1, max |reference|).
An 'approximate' decomposition is reported but only its identities must hold.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax.engine.adapters import APPROXIMATE, PORT_LETTERS
from ceu_jax.engine.errors import EngineError, PortCheckError
from ceu_jax.engine.probes import Probes
from ceu_jax.engine.runner import (intervened_logliks, observed_loglik,
                                   check_loglik_shape)
from ceu_jax.engine.sites import LoglikFn, Site, check_site, record

PARTS = ("parts_empty", "parts_complement", "parts_all", "parts_union")


@dataclasses.dataclass
class PortCheck:
  """The outcome of `check_port`: one row per check."""
  site: str                          # 'path:method'
  decomposition: Optional[str]       # 'exact' / 'approximate' / None
  errors: dict[str, float]           # check -> max |error| (scaled units: see tol)
  scale: dict[str, float]            # check -> max(1, max |reference|)
  tol: float                         # relative tolerance
  required: tuple[str, ...]          # checks that must pass

  @property
  def passed(self) -> dict[str, bool]:
    return {k: bool(e <= self.tol * self.scale[k]) for k, e in self.errors.items()}

  @property
  def failures(self) -> list[str]:
    return [k for k in self.required if not self.passed[k]]

  @property
  def ok(self) -> bool:
    return not self.failures

  def __str__(self) -> str:
    lines = [f"check_port {self.site} (span_decomposition="
             f"{self.decomposition!r}, tol={self.tol:g} x scale)"]
    for k, e in self.errors.items():
      flag = ("ok" if self.passed[k] else
              "FAIL" if k in self.required else "off (not required)")
      lines.append(f"  {k:<17} max|err| {e:.3e}  scale {self.scale[k]:.3g}  {flag}")
    return "\n".join(lines)


def _split(span: jax.Array) -> tuple[jax.Array, jax.Array]:
  """S1 = every other token of S (per example), S2 = the rest of S."""
  rank = jnp.cumsum(span, axis=-1)
  s1 = span & (rank % 2 == 1)
  return s1, span & ~s1


def check_port(loglik_fn: LoglikFn, variables: Any, *, clean: Any,
               corrupt: Any, site: Site, span: Optional[jax.Array] = None,
               tol: float = 1e-5, raise_on_failure: bool = True) -> PortCheck:
  """Checks the site's identities and the additivity of its parts.

  ``clean`` (the source run D+) and ``corrupt`` (the base run D−) as for
  `audit`; ``span`` [B, N] is a token set S over the site's source tokens
  (e.g. the evidence), needed when the site declares a span decomposition.
  Returns a `PortCheck`; raises `PortCheckError` (with the report) when a
  required check fails and ``raise_on_failure``.
  """
  site = check_site(site)
  if not tol > 0:
    raise EngineError(f"check_port: tol must be > 0, got {tol}")
  kinds = []                                   # traced only, not run

  def observe(v, c):
    out, kind = observed_loglik(loglik_fn, site, v, c)
    kinds.append(kind)
    return out
  jax.eval_shape(observe, variables, clean)
  kind = kinds[0]
  if kind is not None and span is None:
    raise EngineError(
        f"check_port: site {site} declares span_decomposition={kind!r}; pass "
        "span=[B, N], a token set S over its source tokens (e.g. the evidence)")
  span = None if kind is None else jnp.asarray(span).astype(bool)
  errors, scale = _measure(loglik_fn, site, variables, clean, corrupt, span)
  required = tuple(k for k in errors
                   if not (kind == APPROXIMATE and k in PARTS))
  report = PortCheck(str(site), kind,
                     {k: float(v) for k, v in errors.items()},
                     {k: float(v) for k, v in scale.items()}, tol, required)
  if raise_on_failure and not report.ok:
    raise PortCheckError(
        f"the decomposition declared at {site} does not hold on these inputs "
        f"(failed: {', '.join(report.failures)}):\n{report}", report)
  return report


def _measure(loglik_fn, site, variables, clean, corrupt, span):
  def err(got, want):
    return jnp.max(jnp.abs(got - want)), jnp.maximum(1.0, jnp.max(jnp.abs(want)))

  @jax.jit
  def run(variables, clean, corrupt, span):
    L_plus = loglik_fn(variables, clean)
    check_loglik_shape(L_plus, None, "clean")
    L_minus = loglik_fn(variables, corrupt)
    il = lambda src, dst, probes: intervened_logliks(
        loglik_fn, variables, clean=src, corrupt=dst, site=site,
        probes=probes, allow_approximate=True)
    full = il(clean, corrupt, Probes())[0]
    out = {"self_full": err(il(clean, clean, Probes())[0], L_plus)}
    _, rec = record(loglik_fn, variables, clean, site)
    h = rec[site]
    if span is not None:
      empty, every = jnp.zeros_like(span), jnp.ones_like(span)
      s1, s2 = _split(span)
      li = il(clean, corrupt, Probes(span=jnp.stack([empty, every])))
      out["self_span"] = err(il(clean, clean, Probes(span=span[None]))[0], L_plus)
      out["span_empty"] = err(li[0], L_minus)
      out["span_all"] = err(li[1], full)
      masks = jnp.stack([empty, span, ~span, every, s1, s2])
      for inputs in (clean, corrupt):           # both runs, parts vmapped
        h_run = record(loglik_fn, variables, inputs, site)[1][site]
        p_0, p_s, p_c, p_a, p_1, p_2 = jax.vmap(
            lambda s, inputs=inputs: record(
                loglik_fn, variables, inputs, site, span_mask=s,
                allow_approximate=True)[1][site])(masks)
        for k, e in (("parts_empty", err(p_0, jnp.zeros_like(h_run))),
                     ("parts_complement", err(p_s + p_c, h_run)),
                     ("parts_all", err(p_a, h_run)),
                     ("parts_union", err(p_1 + p_2, p_s))):
          prev = out.get(k)
          out[k] = e if prev is None else (jnp.maximum(prev[0], e[0]),
                                           jnp.maximum(prev[1], e[1]))
    layout = site.adapter.layout
    if layout is not None and len(layout) == h.ndim:
      ports = next((h.shape[layout.index(c)] for c in PORT_LETTERS
                    if c in layout), None)
      pos = h.shape[layout.index("t")] if "t" in layout else None
      if ports or pos:
        probes = Probes(
            ports=None if ports is None else jnp.ones((1, ports), bool),
            positions=None if pos is None else jnp.ones((1, pos), bool))
        out["masks_all"] = err(il(clean, corrupt, probes)[0], full)
    return out

  out = run(variables, clean, corrupt, span)
  return ({k: np.asarray(v[0]) for k, v in out.items()},
          {k: np.asarray(v[1]) for k, v in out.items()})
