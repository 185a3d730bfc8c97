"""Several processes of one `jax.distributed` run start each compiled program together.

On CPU, collectives go through gloo, whose first contact between processes
waits only 30 s for a peer ("Gloo context initialization failed: ...
GetKeyValue() timed out"); a process that is still compiling a program for
longer — a loaded machine, a bigger model — makes the others abort, and then
the shutdown barrier fails too. `Synced` wraps a jitted function over global
arrays: on its first call per signature it compiles ahead of time and `meet`s
the other processes at a coordination-service barrier (no device collective,
`BARRIER_TIMEOUT_S`) before running. With one process both are no-ops.
`to_host` reads a tree of (possibly process-spanning) arrays as host numpy, the
same on every process (a checkpoint's parameters, the audit's digest).

Uses `jax._src.distributed.global_state.client` (jax has no public barrier that
avoids a device collective: `multihost_utils.sync_global_devices` is one), so it
lives outside the engine, which uses public jax only.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

BARRIER_TIMEOUT_S = 1800   # how long a process waits at `meet` for the others

_meetings = [0]            # barriers met by this process (ids agree across processes:
                           # every process calls the same compiled functions in order)


def meet(name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
  """Wait until every process of a `jax.distributed` run reaches this point (a
  coordination-service barrier, no device collective); nothing with one process."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  client = distributed.global_state.client
  if client is None:
    return
  _meetings[0] += 1
  barrier = f"ceu_jax:{_meetings[0]}:{name}"
  try:
    client.wait_at_barrier(barrier, int(timeout_s * 1000))
  except Exception as e:   # jaxlib's JaxRuntimeError: DEADLINE_EXCEEDED or a peer failed
    raise RuntimeError(
        f"process {jax.process_index()} of {jax.process_count()} waited {timeout_s:.0f} s "
        f"at barrier {barrier!r} for the other processes ({e})") from e


def _signature(args: tuple, kwargs: dict) -> tuple:
  leaves, treedef = jax.tree.flatten((args, kwargs))

  def sig(x):
    if isinstance(x, jax.Array):
      return (x.shape, str(x.dtype), x.sharding)
    if isinstance(x, np.ndarray):
      return (x.shape, str(x.dtype))
    try:
      return (type(x).__name__, hash(x))
    except TypeError:
      return (type(x).__name__, id(x))
  return (treedef, tuple(sig(x) for x in leaves))


class Synced:
  """A jitted function whose processes start each new compiled program together.

  With several processes, a program over global arrays (an array split across
  processes) runs collectives, and CPU collectives (gloo) give a peer only 30 s
  to arrive when they first connect: a process still compiling for longer (a
  loaded machine, a bigger program) makes the others fail. So on the first call
  for each new signature of a global-array call, this compiles ahead of time
  (`lower(...).compile()`, which fills the jit's own cache) and then `meet`s the
  other processes before running. One process, or only process-local inputs: a
  plain call. `lower` (default `fn.lower`) takes fn's arguments and returns the
  lowered program fn runs (e.g. `engine.audit_lowered` for `engine.audit`).
  """

  def __init__(self, fn: Any, name: str, lower: Any = None):
    self.fn = fn                        # the jitted function (or a caller of one)
    self.name = name                    # names its barriers
    self.lower = lower or fn.lower      # same arguments as fn -> jax.stages.Lowered
    self._seen: set = set()

  def __call__(self, *args, **kwargs):
    if jax.process_count() > 1 and any(
        isinstance(x, jax.Array) and not x.is_fully_addressable
        for x in jax.tree.leaves((args, kwargs))):
      key = _signature(args, kwargs)
      if key not in self._seen:
        self.lower(*args, **kwargs).compile()
        meet(f"{self.name} compiled")
        self._seen.add(key)
    return self.fn(*args, **kwargs)


def _gather(*xs):
  return xs


def to_host(tree: Any) -> Any:
  """Every array leaf of `tree` as host numpy holding its global value, the same on
  every process: host values and arrays this process holds whole (one device,
  replicated, or only local devices) are read here; arrays split across processes
  (model-parallel parameters on a multi-process mesh, which `np.asarray` refuses) are
  first replicated in one program over their mesh (`Synced`), so with several
  processes every process must call this with the same tree."""
  leaves, treedef = jax.tree.flatten(tree)
  split = [i for i, x in enumerate(leaves)
           if isinstance(x, jax.Array) and not x.is_fully_addressable
           and not x.is_fully_replicated]
  if split:
    from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
    parts = tuple(leaves[i] for i in split)
    if not all(isinstance(x.sharding, NamedSharding) for x in parts):
      raise TypeError("to_host: arrays split across processes must be laid out by a "
                      "NamedSharding")
    out = tuple(NamedSharding(x.sharding.mesh, PartitionSpec()) for x in parts)
    gather = jax.jit(_gather, out_shardings=out)
    for i, x in zip(split, Synced(gather, "to_host")(*parts)):
      leaves[i] = x

  def host(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(x.addressable_data(0))      # replicated: a local copy is whole
    return np.asarray(x)
  return jax.tree.unflatten(treedef, [host(x) for x in leaves])
