"""Placing an audit on a device mesh: the batch split, the rest replicated.

Shape legend (einsum letters): K probes, B batch, N context tokens, P ports,
T reader positions.

`audit(..., batch_sharding=s)` takes ``s``, a `jax.sharding.NamedSharding`
whose spec splits the leading (batch) axis over some mesh axes, e.g.
``NamedSharding(mesh, P('data'))``. The clean and corrupted inputs are split
along B with it, probe masks along their B axis ([K, B, N] spans, [K, B, P]
ports, [K, B, T] positions; [K, P] / [K, T] masks are replicated), the
variables replicated on the same mesh (unless already laid out on its
devices: a model-parallel layout is kept), and every result is replicated, so
each process can read the rows. With several processes (`jax.distributed`),
host inputs must be the same on every process (the global batch); each
process contributes the slices its devices hold.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ceu_jax.engine.errors import EngineError


def check(sharding: Any) -> NamedSharding:
  if not isinstance(sharding, NamedSharding):
    raise EngineError(
        "batch_sharding must be a jax.sharding.NamedSharding splitting the "
        f"batch axis, e.g. NamedSharding(mesh, P('data')); got {sharding!r}")
  if any(s is not None for s in tuple(sharding.spec)[1:]):
    raise EngineError("batch_sharding may split only the leading (batch) "
                      f"axis; got spec {sharding.spec}")
  return sharding


def batch_spec(sharding: NamedSharding) -> Any:
  """The mesh axes (None, a name or a tuple) the batch axis is split over."""
  return sharding.spec[0] if len(sharding.spec) else None


def num_shards(sharding: NamedSharding) -> int:
  """Pieces the batch axis is cut into (1 = every device holds all of it)."""
  axes = batch_spec(sharding)
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(sharding.mesh.shape[a] for a in axes)


def replicated(sharding: NamedSharding) -> NamedSharding:
  return NamedSharding(sharding.mesh, PartitionSpec())


def _put(x: Any, sharding: NamedSharding) -> Any:
  """A host (or single-process) value as a global array laid out by
  `sharding`."""
  if isinstance(x, jax.Array):
    if x.sharding == sharding:
      return x
    if not x.is_fully_addressable and not x.is_fully_replicated:
      return jax.device_put(x, sharding)    # a global array: reshard
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  host = np.asarray(x)   # host values, or a replicated global array
  return jax.make_array_from_callback(host.shape, sharding,
                                      lambda idx: host[idx])


def _check_batch(x: Any, axis: int, shards: int, what: str) -> None:
  shape = getattr(x, "shape", ())
  if len(shape) <= axis or shape[axis] % shards:
    raise EngineError(
        f"batch_sharding splits the batch into {shards} pieces, but {what} "
        f"has shape {tuple(shape)} (its batch axis {axis} must be divisible "
        f"by {shards})")


def place_batch(tree: Any, sharding: NamedSharding,
                what: str = "inputs") -> Any:
  """Every leaf's leading axis split by `sharding`."""
  shards = num_shards(sharding)

  def put(x):
    _check_batch(x, 0, shards, what)
    return _put(x, sharding)
  return jax.tree.map(put, tree)


def place_probes(probes: Any, sharding: NamedSharding) -> Any:
  """Probe masks: [K, B, ...] split along B, [K, P] / [K, T] replicated."""
  shards = num_shards(sharding)
  along_b = NamedSharding(sharding.mesh,
                          PartitionSpec(None, batch_spec(sharding)))
  rep = replicated(sharding)

  def put(m):
    if m.ndim == 3:
      _check_batch(m, 1, shards, "a probe mask")
      return _put(m, along_b)
    return _put(m, rep)
  return jax.tree.map(put, probes)


def place_variables(variables: Any, sharding: NamedSharding) -> Any:
  """Variables replicated on `sharding`'s mesh; arrays already laid out on
  the mesh's devices (e.g. model-parallel parameters) are left as they are."""
  rep = replicated(sharding)
  devices = rep.device_set

  def put(x):
    if isinstance(x, jax.Array) and x.sharding.device_set == devices:
      return x
    return _put(x, rep)
  return jax.tree.map(put, variables)
