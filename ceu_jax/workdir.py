"""Workdir provenance: which config a workdir's run used, who is using it now, and
whether a run finished. Pure Python (no JAX), shared by training, audits and grids.

Files in a training workdir W that this module reads or writes:
  W/config.json       the run's current config (rewritten when a declared change resumes)
  W/provenance.json   {"history": [event, ...]}: every start, resume (with the config
                      fields that changed and whether they were declared) and --fresh
  W/status.json       written by the training loop ({status, step, checkpoint_step, ...})
  W/.<role>.lock      flock-held while a `train` or an `audit` runs (holder as JSON)
  W/previous/<time>/  where `--fresh` moves an earlier run's files (nothing is deleted)

Config fields fall in three groups (`classify`):
  FIXED_FIELDS       define the model's parameters: a checkpoint of one value cannot be
                     loaded with another (never allowed; use another workdir or --fresh).
  FREE_FIELDS        how the run is operated (logging, evaluation, sharding, debug hooks):
                     may change between restarts; the change is recorded.
  everything else    what is trained (seed, data knobs, optimiser, schedule, steps, CER):
                     a change is refused unless declared (`allow`), then recorded.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ceu_jax import code_version, io, locks

# Dotted config fields (a field also covers its sub-fields: 'model.overrides' covers
# 'model.overrides.embed_dim').
FIXED_FIELDS = ("data.task", "data.variant", "data.context_len", "data.num_passages",
                "data.value_len", "data.answer_len", "data.query_len", "data.n_ids",
                "data.n_keys", "data.n_values", "data.n_filler", "model.family",
                "model.preset", "model.retrieval_layers", "model.read_port", "model.bypass",
                "model.dtype", "model.overrides")
FREE_FIELDS = ("eval", "sharding", "grid", "sweep", "train.log_every", "train.eval_every",
               "train.checkpoint_every", "train.keep_latest", "train.keep_best",
               "train.async_checkpointing", "train.debug_nan_step", "train.debug_kill")
ABSENT = "(absent)"          # how a field missing on one side is shown in a diff

CONFIG_FILE, PROVENANCE_FILE, STATUS_FILE = "config.json", "provenance.json", "status.json"
PREVIOUS_DIR = "previous"    # --fresh moves earlier runs' files under W/previous/<time>/


class WorkdirError(ValueError):
  """A workdir cannot be used as asked (entry points print it as one line, exit 1)."""


class WorkdirConfigError(WorkdirError):
  """The config differs from the one the workdir's run was trained with."""

  def __init__(self, message: str, differences: Sequence[tuple[str, Any, Any]] = ()):
    super().__init__(message)
    self.differences = list(differences)     # [(dotted field, stored value, new value)]

  @property
  def fields(self) -> list[str]:
    return [f for f, _, _ in self.differences]


class WorkdirLocked(WorkdirError, locks.Locked):
  """Another process holds the workdir's lock for this role."""


class EarlierRunError(WorkdirError):
  """The workdir shows an earlier run but has no checkpoint to resume from."""


# ---------------------------------------------------------------- config diffs
def _plain(config: Any) -> dict:
  """A config (ConfigDict, dict or JSON text) as plain JSON-normalised dicts/lists."""
  if isinstance(config, str):
    return json.loads(config)
  if hasattr(config, "to_json_best_effort"):
    return json.loads(config.to_json_best_effort(sort_keys=True))
  return json.loads(json.dumps(config, sort_keys=True, default=str))


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
  """{'model.family': 'ssm', 'model.overrides.embed_dim': 16, ...}: dict leaves by path;
  lists stay whole (a sweep or a tuple of corruptions is one value)."""
  out = {}
  for k, v in tree.items():
    key = f"{prefix}{k}"
    if isinstance(v, Mapping) and v:
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out


def _is_empty(v: Any) -> bool:
  return v is None or v == '' or (isinstance(v, (dict, list)) and not v)


def _same(a: Any, b: Any) -> bool:
  """Equal values; 1 == 1.0 (a JSON round trip), but True != 1."""
  if isinstance(a, bool) or isinstance(b, bool):
    return isinstance(a, bool) and isinstance(b, bool) and a == b
  return a == b


def _covers(prefix: str, field: str) -> bool:
  return field == prefix or field.startswith(prefix + ".")


def config_diff(stored: Any, config: Any, fields: Iterable[str] | None = None
                ) -> list[tuple[str, Any, Any]]:
  """[(field, stored value, new value)] for every leaf field that differs, sorted.

  `stored`/`config`: ConfigDicts, dicts or JSON text. `fields`: only fields covered by
  these dotted prefixes (None: all). A field missing on one side shows as ABSENT;
  None, '', {} and [] count as absent (an empty `model.overrides` equals none; a path
  field added later with '' for "none", e.g. `lora.init_from`, equals its absence).
  """
  old, new = flatten(_plain(stored)), flatten(_plain(config))
  keys = sorted(set(old) | set(new))
  if fields is not None:
    fields = tuple(fields)
    keys = [k for k in keys if any(_covers(f, k) for f in fields)]
  out = []
  for k in keys:
    a, b = old.get(k), new.get(k)
    if _is_empty(a) and _is_empty(b):
      continue
    if not _same(a, b):
      out.append((k, ABSENT if _is_empty(a) else a, ABSENT if _is_empty(b) else b))
  return out


def classify(field: str) -> str:
  """'fixed' | 'free' | 'training' (see the module docstring)."""
  if any(_covers(f, field) for f in FIXED_FIELDS):
    return "fixed"
  if any(_covers(f, field) for f in FREE_FIELDS):
    return "free"
  return "training"


def format_diff(diff: Sequence[tuple[str, Any, Any]]) -> str:
  """'model.family 'attention' -> 'ssm'; cer.lambda_ev 0.0 -> 1.0'."""
  def show(v):
    return v if v == ABSENT else repr(v)
  return "; ".join(f"{f} {show(a)} -> {show(b)}" for f, a, b in diff)


def _parse_allow(allow: Iterable[str] | str | None) -> tuple[str, ...]:
  if not allow:
    return ()
  if isinstance(allow, str):
    allow = allow.split(",")
  return tuple(a.strip() for a in allow if a and a.strip())


def check_config_change(stored: Any, config: Any, *, allow: Iterable[str] | str = (),
                        what: str = "this workdir") -> list[tuple[str, Any, Any, str]]:
  """Check a restart of `stored`'s run with `config`; returns every change as
  (field, old, new, 'declared' | 'free'). Raises WorkdirConfigError naming every
  fixed field that differs (never allowed), else every undeclared training field.

  `allow`: dotted fields (or prefixes, e.g. 'cer') the caller declared it changes.
  """
  allow = _parse_allow(allow)
  diff = config_diff(stored, config)
  fixed = [d for d in diff if classify(d[0]) == "fixed"]
  undeclared = [d for d in diff if classify(d[0]) == "training"
                and not any(_covers(a, d[0]) for a in allow)]
  if fixed:
    other = f"; it also differs in {format_diff(undeclared)}" if undeclared else ""
    raise WorkdirConfigError(
        f"{what} was trained with a different config: {format_diff(fixed)}{other}. "
        f"{', '.join(f for f, _, _ in fixed)} define the model's parameters, so its "
        "checkpoints cannot be used with this config (use the workdir's own config, "
        "another --workdir, or start over with --fresh)", sorted(fixed + undeclared))
  if undeclared:
    fields = ",".join(f for f, _, _ in undeclared)
    raise WorkdirConfigError(
        f"{what} was trained with a different config: {format_diff(undeclared)}. "
        f"Use another --workdir, or declare the change with --allow_config_change={fields} "
        "(it is then recorded in provenance.json)", undeclared)
  return [(f, a, b, "free" if classify(f) == "free" else "declared") for f, a, b in diff]


def read_config_json(workdir: str) -> dict | None:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    return io.read_json(path)
  except (OSError, ValueError) as e:
    raise WorkdirError(f"{path} is unreadable ({e}); move it away to continue") from None


def check_same_config(config: Any, workdir: str, *, allow: Iterable[str] | str = (),
                      fields: Iterable[str] | None = None) -> list[tuple[str, Any, Any, str]]:
  """`check_config_change` against W/config.json (no file: nothing to compare, []).

  `fields`: compare only these (e.g. FIXED_FIELDS to ask only "can this config load
  the checkpoints?"); None: every field, grouped as in `check_config_change`.
  """
  stored = read_config_json(workdir)
  if stored is None:
    return []
  what = f"this workdir ({workdir})"
  if fields is not None:
    diff = config_diff(stored, config, fields)
    if diff:
      raise WorkdirConfigError(
          f"{what} was trained with a different config: {format_diff(diff)}", diff)
    return []
  return check_config_change(stored, config, allow=allow, what=what)


def _tuples(x: Any) -> Any:
  if isinstance(x, list):
    return tuple(_tuples(v) for v in x)
  if isinstance(x, dict):
    return {k: _tuples(v) for k, v in x.items()}
  return x


def load_workdir_config(workdir: str):
  """W/config.json as an ml_collections.ConfigDict (JSON lists back to tuples)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  stored = read_config_json(workdir)
  if stored is None:
    raise WorkdirError(f"{os.path.join(workdir, CONFIG_FILE)} does not exist: {workdir} is "
                       "not a training workdir (or its run never started)")
  return ml_collections.ConfigDict(_tuples(stored))


def resolve_config(config: Any, workdir: str, *, use_workdir_config: bool = False,
                   allow: Iterable[str] | str = (), role: str = "audit", log=None):
  """The config to read `workdir`'s run with (an audit's first step).

  use_workdir_config: W/config.json's config (fields of `config` that differ are
  logged, not used). Otherwise `config` itself, after checking it against
  W/config.json: a model field that differs, or a training field (data knobs, CER,
  optimiser, steps) that differs and is not in `allow`, raises WorkdirConfigError
  naming every such field; eval/sharding/grid settings may differ freely.
  Returns (config, changes) with changes as in `check_config_change`.
  """
  if use_workdir_config:
    stored = load_workdir_config(workdir)
    if config is not None and log is not None:
      diff = config_diff(stored, config)
      if diff:
        log(f"[{role}] using {os.path.join(workdir, CONFIG_FILE)}; --config differs in "
            f"{format_diff(diff)} (ignored)")
    return stored, []
  if config is None:
    raise WorkdirError(f"{role}: give --config, or --use_workdir_config to use "
                       f"{os.path.join(workdir, CONFIG_FILE)}")
  try:
    changes = check_same_config(config, workdir, allow=allow)
  except WorkdirConfigError as e:
    fixed = [f for f in e.fields if classify(f) == "fixed"]
    declarable = [f for f in e.fields if classify(f) != "fixed"]
    hint = (f"; to {role} it under a deliberately different setting, declare it: "
            f"--allow_config_change={','.join(declarable)}" if declarable else "")
    hint += (f"; {', '.join(fixed)} define the model and can never differ" if fixed else "")
    raise WorkdirConfigError(
        f"this workdir ({workdir}) was trained with a different config: "
        f"{format_diff(e.differences)}. To {role} the run as it was trained, pass "
        f"--use_workdir_config (reads {os.path.join(workdir, CONFIG_FILE)}){hint}",
        e.differences) from None
  if changes and log is not None:
    log(f"[{role}] config differs from the run's: {format_diff([c[:3] for c in changes])} "
        "(declared or eval/sharding settings)")
  return config, changes


# ---------------------------------------------------------------- history
def record_event(workdir: str, event: str, **fields) -> dict:
  """Append {event, time, host, pid, cmd, code, **fields} to W/provenance.json's history
  (code: `code_version.code_version()`, the version and git commit that ran)."""
  path = os.path.join(workdir, PROVENANCE_FILE)
  doc = io.read_json(path) if os.path.exists(path) else {"history": []}
  entry = dict(event=event, **locks.who(), code=code_version.code_version(), **fields)
  doc["history"].append(json.loads(json.dumps(entry, default=str)))
  io.write_json_atomic(path, doc)
  return entry


def history(workdir: str) -> list[dict]:
  path = os.path.join(workdir, PROVENANCE_FILE)
  return io.read_json(path)["history"] if os.path.exists(path) else []


# ---------------------------------------------------------------- earlier runs
def read_status(workdir: str) -> dict | None:
  path = os.path.join(workdir, STATUS_FILE)
  if not os.path.exists(path):
    return None
  try:
    return io.read_json(path)
  except (OSError, ValueError):
    return {"status": "unreadable", "step": -1}


def checkpoint_steps(workdir: str) -> list[int]:
  """Committed checkpoint steps (orbax renames a step's temp dir to its number on commit)."""
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _metric_steps(workdir: str) -> tuple[int, int]:
  """(lines, largest step) of W/metrics.jsonl (torn lines skipped)."""
  path = os.path.join(workdir, "metrics.jsonl")
  lines, last = 0, -1
  for row in io.read_jsonl(path) if os.path.exists(path) else ():
    try:
      last = max(last, int(row["step"]))
      lines += 1
    except (ValueError, KeyError, TypeError):
      continue
  return lines, last


def earlier_run_evidence(workdir: str, checkpoint_every: int = 1) -> list[str]:
  """Why W looks like it held a run that got past its first checkpoint ([] if not).

  Used when W has no checkpoint: a run killed before its first checkpoint lost
  nothing and may start again, but a finished run whose checkpoints/ were deleted,
  or whose checkpoints were all quarantined, must not silently retrain from step 0.
  """
  out = []
  st = read_status(workdir)
  if st is not None:
    step, ck = int(st.get("step", -1)), st.get("checkpoint_step")
    if st.get("status") == "completed":
      out.append(f"status.json says the run completed at step {step}")
    elif ck:
      out.append(f"status.json says a checkpoint was written at step {ck}")
    elif step >= checkpoint_every:
      out.append(f"status.json says {st.get('status')!r} at step {step}")
  lines, last = _metric_steps(workdir)
  if last >= checkpoint_every:
    out.append(f"metrics.jsonl has {lines} lines up to step {last}")
  bad = os.path.join(workdir, "corrupt_checkpoints")
  if os.path.isdir(bad) and os.listdir(bad):
    out.append(f"corrupt_checkpoints/ holds {sorted(os.listdir(bad))}")
  if os.path.exists(os.path.join(workdir, "eval_final.json")):
    out.append("eval_final.json exists")
  return out


def move_aside(workdir: str) -> str | None:
  """Move every entry of W except previous/ and lock files to W/previous/<time>/;
  returns that folder (None if there was nothing to move). Deletes nothing."""
  if not os.path.isdir(workdir):
    return None
  names = [n for n in sorted(os.listdir(workdir))
           if n != PREVIOUS_DIR and not (n.startswith(".") and n.endswith(".lock"))]
  if not names:
    return None
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  dest = os.path.join(workdir, PREVIOUS_DIR, stamp)
  suffix = 1
  while os.path.exists(dest):
    dest = os.path.join(workdir, PREVIOUS_DIR, f"{stamp}-{suffix}")
    suffix += 1
  os.makedirs(dest)
  for n in names:
    shutil.move(os.path.join(workdir, n), os.path.join(dest, n))
  return dest


# ---------------------------------------------------------------- run info
def run_info(workdir: str) -> dict:
  """What a workdir's training run got to, for an audit's summary:

  checkpoint_step  newest committed checkpoint (None: none)
  num_steps        train.num_steps of W/config.json (None: unknown)
  status, status_step, message   from W/status.json (None: no status file)
  completed        status 'completed' and the newest checkpoint is step num_steps
  warning          a sentence when the run did not complete (None otherwise)
  """
  st = read_status(workdir) or {}
  steps = checkpoint_steps(workdir)
  stored = read_config_json(workdir) or {}
  num_steps = stored.get("train", {}).get("num_steps")
  ck = steps[-1] if steps else None
  completed = (st.get("status") == "completed" and ck is not None
               and (num_steps is None or ck == int(num_steps)))
  warning = None
  if not completed:
    of = f" of {num_steps}" if num_steps is not None else ""
    warning = (f"training did not complete: status {st.get('status', 'unknown')!r} at step "
               f"{st.get('step', '?')}{of}; newest checkpoint: step {ck}")
  return dict(workdir=os.path.abspath(workdir), checkpoint_step=ck, checkpoint_steps=steps,
              num_steps=None if num_steps is None else int(num_steps),
              status=st.get("status"), status_step=st.get("step"),
              message=st.get("message", ""), completed=bool(completed), warning=warning)


# ---------------------------------------------------------------- lock
class WorkdirLock(locks.FileLock):
  """`with WorkdirLock(W, 'train'):` — at most one holder per (workdir, role), on
  W/.<role>.lock (a `ceu_jax.locks.FileLock`: flock released by the kernel when the
  holder dies; a second holder is refused with WorkdirLocked naming the first; a file
  still naming a dead holder is a stale lock, taken over with a warning)."""

  def __init__(self, workdir: str, role: str, log=None):
    if not role.isidentifier():
      raise ValueError(f"lock role must be an identifier, got {role!r}")
    super().__init__(os.path.join(workdir, f".{role}.lock"), f"{role} lock of {workdir}",
                     log=log, error=WorkdirLocked,
                     advice=f"Wait for that {role} to finish or stop it; a second {role} "
                            "on one workdir is refused")
    self.workdir, self.role = workdir, role


@contextlib.contextmanager
def maybe_lock(workdir: str, role: str, enabled: bool = True, log=None) -> Iterator[None]:
  """WorkdirLock when `enabled` (e.g. only on JAX process 0), else nothing."""
  if not enabled:
    yield
    return
  with WorkdirLock(workdir, role, log=log):
    yield
