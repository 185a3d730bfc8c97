"""Device mesh, logical-axis rules and shardings (big_vision / flax lm1b style).

The mesh comes from `config.sharding` (`mesh_shape`, -1 = all remaining
devices; `mesh_axes`); model code names logical axes only (docs/conventions.md
§4) and `config.sharding.logical_axis_rules` maps them to mesh axes. Parameters
and optimizer state are initialised under `jax.jit(..., out_shardings=...)`
with the shardings derived from `jax.eval_shape` of the boxed (logically
partitioned) initialiser, so no array is ever materialised unsharded.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ceu_jax.engine import placement

SHARDING_FIELDS = ("mesh_shape", "mesh_axes", "logical_axis_rules")   # config.sharding
LOGICAL_AXES = ("batch", "length", "ctx", "embed", "heads", "kv", "mlp", "vocab", "ports",
                "state")                                              # named by model code


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Replace the (single) -1 by the remaining devices; ValueError if it cannot fit."""
  shape = [int(s) for s in mesh_shape]
  known = math.prod(s for s in shape if s != -1)
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"sharding.mesh_shape must hold positive sizes and at most one -1, "
                     f"got {tuple(mesh_shape)}")
  if num_devices % known:
    raise ValueError(f"sharding.mesh_shape {tuple(mesh_shape)} does not divide the device "
                     f"count {num_devices}")
  if -1 in shape:
    shape[shape.index(-1)] = num_devices // known
  elif known != num_devices:
    raise ValueError(f"sharding.mesh_shape {tuple(mesh_shape)} uses {known} devices, but "
                     f"{num_devices} are present (use -1 for 'all remaining')")
  return tuple(shape)


def make_mesh(sharding_cfg: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(sharding_cfg.mesh_shape, len(devices))
  try:
    grid = mesh_utils.create_device_mesh(shape, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, tuple(sharding_cfg.mesh_axes))


def rules(sharding_cfg: Any) -> tuple[tuple[str, Any], ...]:
  return tuple((str(a), b if b is None or isinstance(b, str) else tuple(b))
               for a, b in sharding_cfg.logical_axis_rules)


def check_section(sharding_cfg: Any, num_devices: int | None = None) -> None:
  """ValueError naming the field ("sharding.<field> ...") for a bad `config.sharding`;
  with `num_devices`, the mesh must also fit that many devices."""
  items = sharding_cfg.to_dict() if hasattr(sharding_cfg, "to_dict") else dict(sharding_cfg)
  unknown = sorted(set(items) - set(SHARDING_FIELDS))
  if unknown:
    raise ValueError(f"sharding.{unknown[0]} is an unknown field; known: {SHARDING_FIELDS}")
  missing = sorted(set(SHARDING_FIELDS) - set(items))
  if missing:
    raise ValueError(f"sharding.{missing[0]} is missing")
  shape, axes = tuple(items["mesh_shape"]), tuple(items["mesh_axes"])
  if len(shape) != len(axes) or not shape:
    raise ValueError(f"sharding.mesh_axes {axes} must name each of the mesh_shape {shape} "
                     "dimensions")
  if len(set(axes)) != len(axes) or not all(isinstance(a, str) for a in axes):
    raise ValueError(f"sharding.mesh_axes must be distinct names, got {axes}")
  for rule in items["logical_axis_rules"]:
    if len(rule) != 2 or rule[0] not in LOGICAL_AXES:
      raise ValueError(f"sharding.logical_axis_rules: {rule!r} must be (logical axis, mesh "
                       f"axis | None) with a logical axis in {LOGICAL_AXES}")
    targets = () if rule[1] is None else ((rule[1],) if isinstance(rule[1], str)
                                          else tuple(rule[1]))
    bad = [t for t in targets if t not in axes]
    if bad:
      raise ValueError(f"sharding.logical_axis_rules: {rule!r} maps to mesh axis {bad[0]!r},"
                       f" which is not in sharding.mesh_axes {axes}")
  if num_devices is not None:
    resolve_mesh_shape(shape, num_devices)


def check_batch_sizes(sharding_cfg: Any, num_devices: int, sizes: dict[str, int]) -> None:
  """ValueError naming the field unless every batch size in `sizes` ({dotted field:
  size}) divides into the batch shards of the mesh on `num_devices` devices."""
  shape = resolve_mesh_shape(sharding_cfg.mesh_shape, num_devices)
  dims = dict(zip(sharding_cfg.mesh_axes, shape))
  shards = math.prod(dims[a] for a in batch_axes(sharding_cfg))
  for name, size in sizes.items():
    if size % shards:
      raise ValueError(f"{name} ({size}) must be divisible by the {shards} batch shards of "
                       f"the mesh {dims}")


def batch_axes(sharding_cfg: Any) -> tuple[str, ...]:
  """Mesh axes that the logical 'batch' axis is split over."""
  for name, target in rules(sharding_cfg):
    if name == "batch":
      if target is None:
        return ()
      return (target,) if isinstance(target, str) else tuple(target)
  return ()


def batch_shards(sharding_cfg: Any, mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in batch_axes(sharding_cfg))


def batch_sharding(sharding_cfg: Any, mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over the batch mesh axes, rest replicated."""
  axes = batch_axes(sharding_cfg)
  spec = PartitionSpec(axes if len(axes) > 1 else (axes[0] if axes else None))
  return NamedSharding(mesh, spec)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def shard_batch(tree: Any, sharding: NamedSharding) -> Any:
  """Place a host/global batch (identical on every process) onto the mesh, the leading
  axis split by `sharding` (each process contributes its devices' slices)."""
  return placement.place_batch(tree, sharding, "the batch")


def state_layout(boxed_init: Callable[[jax.Array], Any], rng: jax.Array, mesh: Mesh,
                 axis_rules: Sequence[tuple[str, Any]]) -> tuple[Any, Any]:
  """(abstract, shardings) of the unboxed state that `boxed_init(rng)` builds.

  `boxed_init` returns a pytree whose leaves may be `nn.LogicallyPartitioned`;
  named leaves are laid out by the logical axis rules, unnamed ones replicated.
  `abstract` is a jax.ShapeDtypeStruct tree carrying the shardings (for restore).
  """
  boxed = jax.eval_shape(boxed_init, rng)
  specs = nn.get_partition_spec(boxed)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, axis_rules)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          nn.meta.unbox(boxed), shardings)
  return abstract, shardings


def param_shardings(model: nn.Module, dummy_inputs: tuple, mesh: Mesh,
                    axis_rules: Sequence[tuple[str, Any]]) -> Any:
  """The layout of `model`'s parameters on `mesh` (as training lays them out)."""
  boxed = jax.eval_shape(lambda r: model.init(r, *dummy_inputs)["params"],
                         jax.random.PRNGKey(0))
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, axis_rules)


def init_sharded(boxed_init: Callable[[jax.Array], Any], rng: jax.Array, shardings: Any,
                 mesh: Mesh, axis_rules: Sequence[tuple[str, Any]]) -> Any:
  """The unboxed state, computed directly in its sharded layout.

  Traced without a current mesh: the layout comes from `out_shardings` (so
  models whose parameter boxes are not mesh-safe, e.g. test toys using flax's
  stock `with_logical_partitioning` in a DenseGeneral, still initialise).
  """
  del mesh, axis_rules
  init = jax.jit(lambda r: nn.meta.unbox(boxed_init(r)), out_shardings=shardings)
  return init(rng)


def mesh_context(mesh: Mesh):
  """The context under which the model is traced: `jax.set_mesh(mesh)`.

  With the mesh current (and `nn.logical_axis_rules` entered by the caller) the
  model's activation constraints (`architectures.layers.constrain`) take
  effect. Parameters use `architectures.layers.LogicalParam`, whose constraint
  waits for the full-rank value, so flax's DenseGeneral (which boxes a flat
  kernel first) traces under the mesh.
  """
  return jax.set_mesh(mesh)
