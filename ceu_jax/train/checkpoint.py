"""Checkpoints (orbax), the run status file and the preemption signal handler.

- `Checkpointer` wraps orbax's `CheckpointManager` with `max_to_keep=None` and
  prunes explicitly: it keeps the latest `keep_latest` committed steps and the
  `keep_best` best ones by an eval metric, so the newest step is never deleted
  by a best-metric policy (SPEC §9). Each checkpoint holds the train state and
  a JSON `meta` item (step, eval metrics, an order-independent digest of the
  state). Restoring verifies the digest; an unreadable or mismatching latest
  step is moved to `<workdir>/corrupt_checkpoints/` with a warning and the
  previous step is tried. If steps exist but none is valid, `restore` raises
  `CheckpointError`: a run never silently starts from scratch. Only real
  corruption is quarantined: before restoring, the stored array tree (paths,
  shapes, dtypes) is compared with the config's; a mismatch means the workdir was
  trained with another config, raises `WorkdirConfigError` and touches nothing.
  A read-only Checkpointer (audits) never moves, prunes or cleans anything.
- `write_status` writes `<workdir>/status.json` atomically (temp + os.replace).
- `PreemptionHandler` turns SIGTERM/SIGINT into a flag that the loop checks at
  the next step boundary (orbax's own preemption sync needs jax.distributed).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath

from ceu_jax import workdir as workdir_lib
from ceu_jax import multihost


def _ocp():
  """orbax.checkpoint, imported where a checkpoint is first made or read: an entry point
  that stops on bad input, or never checkpoints, does not pay its import (about
  0.25 CPU-s: `import experiments.train` 1.81 -> 1.56 CPU-s, median of 8)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp


def _other_code_hint(workdir: str) -> str:
  """'' or, where W/provenance.json says other code wrote the run, a sentence naming it:
  with the same config, a model's layout can differ because the code changed (e.g. a
  preset's widths; docs/architectures.md)."""
  from ceu_jax import code_version  # pylint: disable=g-import-not-at-top
  recorded = [e.get("code") for e in workdir_lib.history(workdir) if e.get("code")]
  here = code_version.code_version()
  if not recorded or not recorded[-1].get("commit") or not here.get("commit") or (
      recorded[-1]["commit"] == here["commit"]):
    return ""
  return (f". The run was written by {code_version.describe(recorded[-1])} and this is "
          f"{code_version.describe(here)}: if the config is the same, the model's layout "
          "changed in the code between them (docs/architectures.md); that commit loads it")


class CheckpointError(workdir_lib.WorkdirError):
  """No valid checkpoint although the workdir has some: refuse a fresh start."""


# ---------------------------------------------------------------- digest
def _leaf_digest(x: jax.Array) -> jax.Array:
  """(sum of bits, position-weighted sum of bits) mod 2^32: exact and independent of
  the reduction order, so any sharding of the same values gives the same digest."""
  x = jnp.asarray(x)
  if jnp.issubdtype(x.dtype, jnp.floating):
    unsigned = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, unsigned)   # f64 -> [..., 2] uint32
  else:
    bits = x
  bits = bits.reshape(-1).astype(jnp.uint32)
  pos = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
  return jnp.stack([bits.sum(dtype=jnp.uint32), (bits * pos).sum(dtype=jnp.uint32)])


@jax.jit
def _tree_digest(tree: Any) -> jax.Array:
  """The digest in one compiled call (reference of `_tree_digest_by_leaf`)."""
  leaves = jax.tree.leaves(tree)
  out = jnp.zeros((2,), jnp.uint32)
  for i, leaf in enumerate(leaves):
    out = out + _leaf_digest(leaf) * jnp.uint32(2 * i + 1)
  return out


def _weighted_sum(leaves: list, offset: jax.Array) -> jax.Array:
  """Σ_i digest(leaf_i) · (2 (offset + i) + 1) over one chunk of leaves (uint32, wraps)."""
  out = jnp.zeros((2,), jnp.uint32)
  for i, leaf in enumerate(leaves):
    out = out + _leaf_digest(leaf) * (jnp.uint32(2 * i + 1) + jnp.uint32(2) * offset)
  return out


_jit_chunk_digest = multihost.Synced(jax.jit(_weighted_sum), "checkpoint.digest")
DIGEST_CHUNK = 64   # leaves per compiled call


def _host_leaf_digest(x: np.ndarray) -> np.ndarray:
  """`_leaf_digest` in numpy on the host: the same uint32 arithmetic (sums and products
  wrap mod 2^32 alike), the same bits (little-endian words of a float64 as bitcast gives
  them). Every value gets the dtype jit would give it (a numpy float64 or a Python float
  -> float32 without x64; a jax array's dtype is that already)."""
  x = np.asarray(x)   # a jax array on this host's CPU: no transfer
  x = x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)
  if np.issubdtype(x.dtype, np.floating) or x.dtype == jnp.bfloat16:
    unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint32}[x.dtype.itemsize]
    bits = np.ascontiguousarray(x).view(unsigned)
  else:
    bits = x
  bits = bits.reshape(-1).astype(np.uint32)
  pos = np.arange(bits.size, dtype=np.uint32) * np.uint32(2654435761) + np.uint32(1)
  return np.stack([bits.sum(dtype=np.uint32), (bits * pos).sum(dtype=np.uint32)])


def _on_this_host_cpu(leaf: Any) -> bool:
  """A numpy value, or a jax array whose every shard is in this process on a CPU device
  (reading it costs no transfer)."""
  if not isinstance(leaf, jax.Array):
    return True
  return leaf.is_fully_addressable and all(d.platform == "cpu" for d in leaf.devices())


def _tree_digest_by_leaf(tree: Any) -> np.ndarray:
  """`_tree_digest`'s exact value. Where every leaf lies on this host's CPU, in numpy
  leaf by leaf (no program to compile: the chunked programs below cost ~0.5 s of
  compiling each, four per tiny training run, for microseconds of work). Otherwise (an
  accelerator, or shards in other processes) in chunks of DIGEST_CHUNK leaves: the
  whole-tree jit compiles in time growing with the leaf count (minutes for the ~1,300
  leaves of LoRA adapters + Adam moments on SmolLM2). One chunk at a time, each finished
  before the next is dispatched: many sharded computations in flight at once aborted a
  CPU run with a model-parallel mesh (CI, 2 × 4 mesh). uint32 sums wrap alike on the
  host. Every process takes the same branch (`multihost.Synced` needs all of them in
  the jitted one): a tree with shards in other processes is not on this host."""
  leaves = jax.tree.leaves(tree)
  if jax.process_count() == 1 and all(_on_this_host_cpu(x) for x in leaves):
    return _host_digest(leaves)
  return _chunked_digest(leaves)


def _host_digest(leaves: list) -> np.ndarray:
  out = np.zeros((2,), np.uint32)
  with np.errstate(over="ignore"):
    for i, leaf in enumerate(leaves):
      out = out + _host_leaf_digest(leaf) * np.uint32(2 * i + 1)
  return out


def _chunked_digest(leaves: list) -> np.ndarray:
  out = np.zeros((2,), np.uint32)
  for start in range(0, len(leaves), DIGEST_CHUNK):
    part = _jit_chunk_digest(leaves[start:start + DIGEST_CHUNK], jnp.uint32(start))
    out = out + np.asarray(jax.device_get(part), np.uint32)
  return out


def state_digest(tree: Any) -> str:
  """A hex digest of every leaf's exact bits (order-independent reduction)."""
  d = _tree_digest_by_leaf(tree)
  return f"{int(d[0]):08x}{int(d[1]):08x}-{len(jax.tree.leaves(tree))}"


# ---------------------------------------------------------------- status file
def write_json_atomic(path: str, payload: Any) -> None:
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp_", suffix=".json")
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(payload, f, indent=2, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_status(workdir: str, status: str, step: int, message: str = "", **extra) -> None:
  """<workdir>/status.json = {status, step, message, time, ...} (process 0 only).

  The loop adds num_steps, checkpoint_step (the newest committed checkpoint on disk) and,
  while an asynchronous save is in flight, saving_step."""
  if jax.process_index() != 0:
    return
  write_json_atomic(os.path.join(workdir, "status.json"),
                    dict(status=status, step=int(step), message=message, time=time.time(),
                         **extra))


def read_status(workdir: str) -> dict | None:
  path = os.path.join(workdir, "status.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


# ---------------------------------------------------------------- preemption
class PreemptionHandler:
  """Context manager: SIGTERM / SIGINT set `requested` (and remember the signal)
  instead of killing the process; the loop saves at the next step boundary."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested: int | None = None
    self._old: dict = {}

  def _handle(self, signum, frame):
    del frame
    logging.warning("received signal %d: checkpointing at the next step boundary", signum)
    self.requested = signum

  def __enter__(self) -> "PreemptionHandler":
    try:
      for s in self.SIGNALS:
        self._old[s] = signal.signal(s, self._handle)
    except ValueError:   # not the main thread: signals cannot be handled here
      logging.warning("PreemptionHandler: not in the main thread; signals not handled")
    return self

  def __exit__(self, *exc) -> None:
    for s, old in self._old.items():
      signal.signal(s, old)

  def should_stop(self) -> bool:
    flag = self.requested is not None
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      flag = bool(np.asarray(multihost_utils.process_allgather(np.asarray(flag))).any())
    return flag


# ---------------------------------------------------------------- checkpointer
def _from_process_0(steps: list[int]) -> list[int]:
  """Process 0's list on every process. Deleting is collective in Orbax, and the
  processes may list the steps differently for a moment (process 0 commits a save
  after the others have written their shards), so process 0 decides what to prune."""
  if jax.process_count() == 1:
    return steps
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  n = int(multihost_utils.broadcast_one_to_all(np.int32(len(steps))))
  if n == 0:
    return []
  mine = np.asarray(steps if jax.process_index() == 0 else [0] * n, np.int32)
  return [int(s) for s in multihost_utils.broadcast_one_to_all(mine)]


class Checkpointer:
  """Orbax CheckpointManager with explicit latest-N + best-N retention."""

  def __init__(self, workdir: str, *, keep_latest: int, keep_best: int, best_metric: str,
               best_mode: str, async_save: bool = True, read_only: bool = False):
    self.workdir = workdir
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.keep_latest, self.keep_best = keep_latest, keep_best
    self.best_metric, self.best_mode = best_metric, best_mode
    self.read_only = read_only
    # Read-only (audits): no directory created, no temp dir of a running save cleaned up;
    # save / prune / quarantine are refused or skipped here (orbax's own read_only mode
    # only adds warnings).
    options = _ocp().CheckpointManagerOptions(
        max_to_keep=None, create=not read_only, cleanup_tmp_directories=not read_only,
        enable_async_checkpointing=async_save and not read_only)
    self.manager = _ocp().CheckpointManager(self.directory, options=options,
                                            item_names=("state", "meta"))
    self._meta: dict[int, dict] = {}

  # --- save
  def save(self, step: int, state: Any, metrics: dict | None = None) -> None:
    """Start saving `state` at `step` (async); prunes the committed steps first."""
    if self.read_only:
      raise CheckpointError(f"{self.directory}: this Checkpointer is read-only")
    self.manager.wait_until_finished()
    self.prune()
    meta = {"step": int(step), "digest": state_digest(state), "metrics": metrics or {},
            "time": time.time()}
    ocp = _ocp()
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave(meta)),
                      force=True)
    self._meta[int(step)] = meta

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    if not self.read_only:
      self.prune()
    self.manager.close()

  # --- retention
  def _metric(self, step: int) -> float | None:
    meta = self._meta.get(step)
    if meta is None:
      # The JSON file itself, not manager.restore: a restore is collective in a
      # multi-process run, and only process 0 decides what to prune.
      try:
        with open(os.path.join(self.directory, str(step), "meta", "metadata")) as f:
          meta = dict(json.load(f))
      except (OSError, ValueError, TypeError):
        return None
      self._meta[step] = meta
    value = meta.get("metrics", {}).get(self.best_metric)
    return None if value is None or not np.isfinite(value) else float(value)

  def keep_set(self, steps: list[int]) -> set[int]:
    steps = sorted(steps)
    keep = set(steps[-self.keep_latest:]) if self.keep_latest else set()
    scored = [(m, s) for s in steps if (m := self._metric(s)) is not None]
    sign = 1.0 if self.best_mode == "max" else -1.0
    scored.sort(key=lambda ms: (sign * ms[0], ms[1]), reverse=True)
    keep |= {s for _, s in scored[:self.keep_best]}
    return keep

  def prune(self) -> None:
    if self.read_only:
      return
    self.manager.reload()
    steps = list(self.manager.all_steps())
    drop = []
    if jax.process_index() == 0:     # the others follow its decision
      keep = self.keep_set(steps)
      drop = [s for s in steps if s not in keep]
    for s in _from_process_0(drop):
      self.manager.delete(s)
      self._meta.pop(s, None)

  # --- restore
  def all_steps(self) -> list[int]:
    self.manager.reload()
    return sorted(self.manager.all_steps())

  def stored_layout(self, step: int) -> dict[str, tuple]:
    """{'params/reader/...': (shape, dtype)} of a step's stored state (no arrays read).
    Raises if the step's metadata is unreadable (a corrupt step)."""
    path = epath.Path(self.directory) / str(step) / "state"
    meta = _ocp().StandardCheckpointHandler().metadata(path)
    tree = getattr(meta, "tree", meta)
    return _layout(tree)

  def check_layout(self, step: int, abstract_state: Any) -> bool:
    """False if the step's metadata is unreadable; raises WorkdirConfigError if the
    stored arrays differ from `abstract_state`'s (another config); True if they match."""
    try:
      stored = self.stored_layout(step)
    except Exception:  # pylint: disable=broad-except
      return False
    mismatch = layout_diff(stored, _layout(abstract_state))
    if mismatch:
      raise workdir_lib.WorkdirConfigError(
          f"this workdir ({self.workdir}) was trained with a different config: the arrays "
          f"of its checkpoint step {step} differ from this config's model ({mismatch}). "
          "Nothing was moved; use the workdir's own config (W/config.json) or another "
          "--workdir" + _other_code_hint(self.workdir))
    return True

  def _quarantine(self, step: int, reason: str) -> None:
    src = os.path.join(self.directory, str(step))
    dst_dir = os.path.join(os.path.abspath(self.workdir), "corrupt_checkpoints")
    if self.read_only:
      logging.warning("checkpoint step %d is unusable (%s); falling back to the previous "
                      "step (read-only: left in place)", step, reason)
      return
    logging.warning("checkpoint step %d is unusable (%s); moving it to %s and falling back "
                    "to the previous step", step, reason, dst_dir)
    if jax.process_index() == 0 and os.path.exists(src):
      os.makedirs(dst_dir, exist_ok=True)
      dst = os.path.join(dst_dir, f"{step}_{int(time.time())}")
      shutil.move(src, dst)
    self._meta.pop(step, None)
    self.manager.reload()

  def restore(self, abstract_state: Any) -> tuple[Any, int, dict] | None:
    """(state, step, meta) of the newest valid step, None if there is none at all.

    `abstract_state`: jax.ShapeDtypeStruct tree with shardings (the layout).
    """
    steps = self.all_steps()
    if not steps:
      return None
    tried = []
    checked = False
    for step in reversed(steps):
      # A structure mismatch (another config) raises here, before anything is moved.
      if not checked and self.check_layout(step, abstract_state):
        checked = True
      try:
        ocp = _ocp()
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        state, meta = out["state"], dict(out["meta"])
        digest = state_digest(state)
        if meta.get("digest") != digest:
          raise CheckpointError(f"state digest {digest} != stored {meta.get('digest')}")
      except Exception as e:  # pylint: disable=broad-except
        tried.append((step, f"{type(e).__name__}: {str(e)[:300]}"))
        self._quarantine(step, tried[-1][1])
        continue
      if tried:
        logging.warning("restored step %d after skipping unusable steps %s", step,
                        [s for s, _ in tried])
      self._meta[step] = meta
      return state, step, meta
    raise CheckpointError(
        f"{self.directory} holds checkpoints {steps} but none could be restored "
        f"({tried}); refusing to start from scratch. Rerun with --fresh to move the old "
        "files aside and start a fresh run.")


# ---------------------------------------------------------------- layout check
def _key_name(k: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _layout(tree: Any) -> dict[str, tuple]:
  """{'params/a/kernel': (shape, dtype name)} for every array leaf of `tree`."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    shape = getattr(leaf, "shape", None)
    dtype = getattr(leaf, "dtype", None)
    out["/".join(_key_name(k) for k in path)] = (
        None if shape is None else tuple(int(d) for d in shape),
        None if dtype is None else np.dtype(dtype).name)
  return out


def layout_diff(stored: dict[str, tuple], wanted: dict[str, tuple], show: int = 3) -> str:
  """'' if equal, else a short description: arrays only in the checkpoint, only in
  the config, and arrays whose shape/dtype differ (a few examples of each)."""
  parts = []
  only_stored = sorted(set(stored) - set(wanted))
  only_wanted = sorted(set(wanted) - set(stored))
  changed = sorted(k for k in set(stored) & set(wanted) if stored[k] != wanted[k])
  def ex(keys, fmt):
    more = f", ... {len(keys) - show} more" if len(keys) > show else ""
    return ", ".join(fmt(k) for k in keys[:show]) + more
  if changed:
    parts.append(f"{len(changed)} arrays differ in shape or dtype, e.g. " + ex(
        changed, lambda k: f"{k} {stored[k][0]} {stored[k][1]} in the checkpoint vs "
                           f"{wanted[k][0]} {wanted[k][1]}"))
  if only_stored:
    parts.append(f"{len(only_stored)} arrays only in the checkpoint, e.g. "
                 + ex(only_stored, str))
  if only_wanted:
    parts.append(f"{len(only_wanted)} arrays only in this config's model, e.g. "
                 + ex(only_wanted, str))
  return "; ".join(parts)
