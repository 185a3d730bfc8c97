"""Loop-invariant hoisting by partial evaluation, with public JAX APIs only.

Shape legend (einsum letters): C probes per chunk.

`split(fn, consts, chunk)` traces ``fn(consts, chunk)`` to a jaxpr
(``jax.make_jaxpr``) and walks its equations in order: an equation whose
inputs are all known (derived from ``consts`` alone) is evaluated now, under
the caller's trace; the others, and whatever they need from the known part
(the residuals), form the returned body, a function of ``chunk`` alone.
Evaluation binds each equation's primitive as ``jax.core.eval_jaxpr`` does,
through ``jax.extend.core`` types; no ``jax._src`` import.

Only the top level of the jaxpr is split: an equation with a sub-jaxpr
(``pjit``, ``scan``, ``cond``) that takes any probe-dependent input runs whole
in the body. The engine's probe function is traced without an inner jit, so
the model's prefix (everything before the site) is top-level and is hoisted.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
from jax.extend import core as jcore


@dataclasses.dataclass
class Split:
  """The two halves of ``fn(consts, chunk)``."""
  body: Callable[[Any], Any]      # chunk -> fn's output (residuals closed over)
  apply: Callable[[list, Any], Any]  # (residuals, chunk) -> fn's output
  residuals: list                 # values the body reads from the known part
  n_known: int                    # top-level equations run once, now
  n_body: int                     # top-level equations left in the body
  residual_bytes: int             # bytes the body reads from the known part
  body_bytes: int                 # bytes of every value the body makes (one
                                  # chunk): the per-chunk working set


def _aval_bytes(v: Any) -> int:
  aval = getattr(v, "aval", None)
  shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
  if shape is None or dtype is None:
    return 0
  return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _bind(eqn: Any, invals: list) -> list:
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns = ()
  if isinstance(params, tuple):                   # older (subfuns, params)
    subfuns, params = params
  ctx = getattr(getattr(eqn, "ctx", None), "manager", None)
  if ctx is not None:
    with ctx:
      out = eqn.primitive.bind(*subfuns, *invals, **params)
  else:
    out = eqn.primitive.bind(*subfuns, *invals, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def _run(eqns: list, env: dict) -> None:
  def read(v):
    return v.val if isinstance(v, jcore.Literal) else env[v]
  for eqn in eqns:
    outs = _bind(eqn, [read(v) for v in eqn.invars])
    for var, val in zip(eqn.outvars, outs):
      if not isinstance(var, jcore.DropVar):
        env[var] = val


def split(fn: Callable[[Any, Any], Any], consts: Any, chunk: Any) -> Split:
  """Splits ``fn(consts, chunk)`` into a part run now (whatever does not
  depend on ``chunk``) and a body, a function of ``chunk`` for the loop."""
  c_leaves, c_tree = jax.tree.flatten(consts)
  p_leaves, p_tree = jax.tree.flatten(chunk)
  nc = len(c_leaves)

  def flat(*leaves):
    return fn(jax.tree.unflatten(c_tree, leaves[:nc]),
              jax.tree.unflatten(p_tree, leaves[nc:]))

  closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(
      *c_leaves, *p_leaves)
  jaxpr = closed.jaxpr
  probe_vars = set(jaxpr.invars[nc:])
  unknown: set = set(probe_vars)
  known_eqns, body_eqns = [], []
  for eqn in jaxpr.eqns:
    if any(isinstance(v, jcore.Var) and v in unknown for v in eqn.invars):
      body_eqns.append(eqn)
      unknown.update(v for v in eqn.outvars if not isinstance(v, jcore.DropVar))
    else:
      known_eqns.append(eqn)

  def is_residual(v):
    return isinstance(v, jcore.Var) and v not in unknown
  residual_vars = list(dict.fromkeys(   # first use order: deterministic
      [v for e in body_eqns for v in e.invars if is_residual(v)]
      + [v for v in jaxpr.outvars if is_residual(v)]))

  env: dict = dict(zip(jaxpr.constvars, closed.consts))
  env.update(zip(jaxpr.invars[:nc], c_leaves))
  _run(known_eqns, env)
  residuals = [env[v] for v in residual_vars]
  out_tree = jax.tree.structure(out_shape)

  def apply(res, ch):
    env_b = dict(zip(residual_vars, res))
    env_b.update(zip(jaxpr.invars[nc:], jax.tree.leaves(ch)))
    _run(body_eqns, env_b)
    outs = [v.val if isinstance(v, jcore.Literal) else env_b[v]
            for v in jaxpr.outvars]
    return jax.tree.unflatten(out_tree, outs)

  return Split(
      body=lambda ch: apply(residuals, ch), apply=apply, residuals=residuals,
      n_known=len(known_eqns), n_body=len(body_eqns),
      residual_bytes=sum(_aval_bytes(v) for v in residual_vars),
      body_bytes=sum(_aval_bytes(v) for e in body_eqns for v in e.outvars))
