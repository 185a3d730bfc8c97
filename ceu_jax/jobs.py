"""One job contract: every resumable job runs through `run_job` (issue #34).

  job = trace_job.TraceSensitivityJob(config)   # validates: ValueError naming the field
  summary = jobs.run_job(job, workdir)           # lock, config check, units, outputs

A `Job` says what it computes; `run_job` owns everything a user can lose work to:

  1. The workdir lock W/.job.lock, taken first. One name for every job, so two
     jobs never write one workdir at the same time (a second is refused naming the
     first: `ceu_jax.workdir.WorkdirLocked`).
  2. The workdir's record W/job.json ({job, config}). Absent: written. Present: it
     must name this job (else `JobMismatchError`, naming the job that owns W) and
     hold the same config up to `job.free_fields` (else `JobConfigError`, naming
     only the fields that differ, at most MAX_FIELDS of them); a field added to the
     job after W was recorded (`job.added_fields`) resumes at the value the earlier
     run ran as and is refused at any other. A job whose
     `mismatch` is 'move_aside' (the audit of a newer checkpoint) moves the
     earlier run's files to W/previous/<time>/ instead (nothing is deleted).
     Changed free fields are written back and recorded in W/provenance.json, as
     is every start and resume.
  3. `job.plan(ctx)` lists the units (key, spec) in order; a unit whose result is
     in W/units/ was finished by an earlier run and is skipped.
  4. Each remaining unit: `job.run_unit(ctx, spec)`, its result written at once
     and atomically (W/units/<key>.json, or .npz for a dict of arrays): a run
     killed at any point loses at most the unit in progress, and a rerun gives
     the same outputs as an uninterrupted run (results are always read back
     through the same serialisation).
  5. A progress line per unit: '[<job>] unit i/N <key> (elapsed h:mm:ss, ETA h:mm:ss)'.
  6. `job.summarize(ctx, results)`, then `job.write(ctx, results, summary)` (outputs
     through ctx.write_json / ctx.write_text: atomic), then W/summary.json with
     `produced_by` (job, config, units, wall time, versions).

Validation belongs in the job's constructor: nothing is created or written before
it passes. With several JAX processes only process 0 takes the lock and writes;
the others compute the same units (process 0 decides which are finished).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ceu_jax import code_version, io, progress
from ceu_jax import workdir as workdir_lib

JOB_FILE = "job.json"          # W/job.json: {"job": name, "config": {...}}
LOCK_ROLE = "job"              # W/.job.lock
UNITS_DIR = "units"            # W/units/<key>.json|.npz
SUMMARY_FILE = "summary.json"
MAX_FIELDS = 5                 # a refusal names at most this many differing fields
KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]*")


class JobError(workdir_lib.WorkdirError):
  """A job cannot run in this workdir as asked (entry points print one line)."""


class JobMismatchError(JobError):
  """The workdir holds another job's run."""


class JobConfigError(JobError, workdir_lib.WorkdirConfigError):
  """The workdir holds this job's run of another config."""

  def __init__(self, message: str, differences: Sequence[tuple[str, Any, Any]] = ()):
    workdir_lib.WorkdirConfigError.__init__(self, message, differences)


@dataclasses.dataclass(frozen=True)
class Unit:
  key: str       # file-safe, unique within the job: W/units/<key>.<format>
  spec: Any      # what run_unit needs (the job's own value)


class Job:
  """Base class of a resumable job; see the module docstring."""
  name: str = ""                          # identifier: W/job.json, progress lines
  free_fields: tuple[str, ...] = ()       # dotted fields that may change on resumption
  added_fields: Mapping[str, Any] = {}    # dotted fields added after runs were recorded: the
                                          # value a stored config without one ran as (ANY_VALUE:
                                          # it did not matter); that value resumes, others refuse
  unit_format: str = "json"               # 'json' | 'npz' (a dict of numpy arrays)
  mismatch: str = "refuse"                # 'refuse' | 'move_aside' (a different config)

  def __init__(self, config: Any):
    self.config = config

  def record(self) -> Any:
    """What W/job.json stores and compares (default: the config)."""
    return self.config

  def prepare(self, ctx: "JobContext") -> None:
    """Under the lock, after the config check: build what the units share."""

  def plan(self, ctx: "JobContext") -> list[Unit]:
    raise NotImplementedError

  def run_unit(self, ctx: "JobContext", spec: Any) -> Any:
    raise NotImplementedError

  def summarize(self, ctx: "JobContext", results: Mapping[str, Any]) -> dict:
    raise NotImplementedError

  def write(self, ctx: "JobContext", results: Mapping[str, Any], summary: dict) -> None:
    """Outputs besides W/summary.json (through ctx.write_*: atomic)."""

  def describe_unit(self, spec: Any, result: Any) -> str:
    """Extra words for the unit's progress line."""
    del spec, result
    return ""


@dataclasses.dataclass
class JobContext:
  """What a job's methods get: the workdir, the log and atomic writers."""
  workdir: str
  log: Callable[[str], None]
  primary: bool = True                    # this process writes (JAX process 0)

  def path(self, *parts: str) -> str:
    return os.path.join(self.workdir, *parts)

  def exists(self, *parts: str) -> bool:
    return os.path.exists(self.path(*parts))

  def read_json(self, *parts: str) -> Any:
    return io.read_json(self.path(*parts))

  def write_json(self, rel: str, obj: Any) -> None:
    if self.primary:
      io.write_json_atomic(self.path(rel), obj)

  def write_text(self, rel: str, text: str) -> None:
    if self.primary:
      io.write_text_atomic(self.path(rel), text)


# ----------------------------------------------------------------------------- unit store
class _Store:
  """Finished units under W/units/ in the job's format."""

  def __init__(self, workdir: str, fmt: str):
    if fmt not in ("json", "npz"):
      raise ValueError(f"unit_format must be 'json' or 'npz', got {fmt!r}")
    self.dir, self.fmt = os.path.join(workdir, UNITS_DIR), fmt

  def path(self, key: str) -> str:
    return os.path.join(self.dir, f"{key}.{self.fmt}")

  def has(self, key: str) -> bool:
    return os.path.exists(self.path(key))

  def get(self, key: str) -> Any:
    if self.fmt == "json":
      return io.read_json(self.path(key))
    with np.load(self.path(key)) as f:
      return {k: f[k] for k in f.files}

  def put(self, key: str, value: Any) -> None:
    if self.fmt == "json":
      io.write_json_atomic(self.path(key), value)
    else:
      io.write_atomic(self.path(key), lambda f: np.savez(f, **value))

  def roundtrip(self, value: Any) -> Any:
    """The value as a later `get` returns it (so a resumed run equals a fresh one)."""
    if self.fmt == "json":
      return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    return {k: np.asarray(v) for k, v in value.items()}


# ----------------------------------------------------------------------------- record
def plain(obj: Any) -> Any:
  """JSON-able copy of a config (ConfigDict or mapping): what W/job.json stores."""
  if hasattr(obj, "to_json_best_effort"):
    return json.loads(obj.to_json_best_effort(sort_keys=True))
  return json.loads(json.dumps(obj, sort_keys=True, default=str))


def _a(name: str) -> str:
  """'a toy' / 'an answer_presence'."""
  return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def _covered(field: str, free: Iterable[str]) -> bool:
  return any(field == f or field.startswith(f + ".") for f in free)


ANY_VALUE = object()   # Job.added_fields: every value is what an earlier run ran as


def _as_recorded(d: tuple[str, Any, Any], added: Mapping[str, Any]) -> bool:
  """A difference that is a field added later, absent from the stored config, whose new
  value is the one the earlier run ran as (Job.added_fields)."""
  field, old, new = d
  if old is not workdir_lib.ABSENT or field not in added:
    return False
  return added[field] is ANY_VALUE or workdir_lib.config_diff({'v': added[field]}, {'v': new}) == []


def _fmt_fields(diff: Sequence[tuple[str, Any, Any]]) -> str:
  shown = workdir_lib.format_diff(diff[:MAX_FIELDS])
  more = len(diff) - MAX_FIELDS
  return shown + (f" (and {more} more field{'s' * (more > 1)})" if more > 0 else "")


def check_record(job: Job, workdir: str, *, primary: bool = True, dry: bool = False,
                 log: Callable[[str], None] = print) -> str:
  """Step 2 of `run_job`: 'new' | 'resume' | 'moved' (see the module docstring).
  `dry`: only raise what would be refused (no writes; before the lock file exists)."""
  path = os.path.join(workdir, JOB_FILE)
  new = plain(job.record())
  primary = primary and not dry
  if not os.path.exists(path):
    legacy = os.path.join(workdir, workdir_lib.CONFIG_FILE)
    if os.path.exists(legacy):
      raise JobMismatchError(
          f"{workdir} holds {legacy} but no {JOB_FILE}: a training run, or a job written by "
          f"an earlier version of ceu-jax; {_a(job.name)} job needs a workdir of its own "
          "(use another --workdir)")
    if primary:
      io.write_json_atomic(path, {"job": job.name, "config": new})
      workdir_lib.record_event(workdir, "start", job=job.name)
    return "new"
  try:
    stored = io.read_json(path)
    owner, old = stored["job"], stored["config"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise JobError(f"{path} is unreadable ({e}); move it away to continue") from None
  if owner != job.name:
    raise JobMismatchError(f"{workdir} holds {_a(owner)} run ({path}); this is "
                           f"{_a(job.name)} job: use another --workdir")
  diff = [d for d in workdir_lib.config_diff(old, new) if not _as_recorded(d, job.added_fields)]
  fixed = [d for d in diff if not _covered(d[0], job.free_fields)]
  if fixed and job.mismatch == "move_aside":
    if dry:
      return "moved"
    moved = workdir_lib.move_aside(workdir) if primary else None
    log(f"[{job.name}] {workdir} held a run of another setting ({_fmt_fields(fixed)}); "
        f"moved it to {moved}")
    if primary:
      io.write_json_atomic(path, {"job": job.name, "config": new})
      workdir_lib.record_event(workdir, "start", job=job.name, moved_earlier_run_to=moved)
    return "moved"
  if fixed:
    raise JobConfigError(
        f"{workdir} holds {_a(job.name)} run of another config: {_fmt_fields(fixed)}. Its "
        f"finished units belong to that config: use another --workdir (or rerun with the "
        f"config in {path})", fixed)
  if primary:
    if diff:
      io.write_json_atomic(path, {"job": job.name, "config": new})
    workdir_lib.record_event(workdir, "resume", job=job.name, changed_free_fields=[
        dict(field=f, old=a, new=b) for f, a, b in diff])
  if diff and not dry:
    log(f"[{job.name}] resuming with changed free fields: {workdir_lib.format_diff(diff)}")
  return "resume"


# ----------------------------------------------------------------------------- run
def _process() -> tuple[int, int]:
  """(index, count) of this JAX process; (0, 1) when JAX is not imported."""
  jax = sys.modules.get("jax")
  if jax is None:
    return 0, 1
  return jax.process_index(), jax.process_count()


def _agree(done: list[bool]) -> list[bool]:
  """Process 0's view of the finished units, on every process."""
  if _process()[1] == 1 or not done:
    return done
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return [bool(x) for x in multihost_utils.broadcast_one_to_all(np.asarray(done, bool))]


versions = code_version.versions   # what produced a result (recorded in summary.json)


def run_job(job: Job, workdir: str, *, log: Callable[[str], None] = print) -> dict:
  """Run (or resume) `job` in `workdir`; returns the summary (also W/summary.json)."""
  if not job.name or not job.name.isidentifier():
    raise ValueError(f"a job needs an identifier name, got {job.name!r}")
  index, _ = _process()
  primary = index == 0
  t0 = time.time()
  if primary:
    check_record(job, workdir, dry=True)   # a refusal leaves not even a lock file behind
    os.makedirs(workdir, exist_ok=True)
  with workdir_lib.maybe_lock(workdir, LOCK_ROLE, enabled=primary):
    state = check_record(job, workdir, primary=primary, log=log)
    ctx = JobContext(workdir=workdir, log=log, primary=primary)
    job.prepare(ctx)
    units = job.plan(ctx)
    keys = [u.key for u in units]
    bad = [k for k in keys if not KEY_RE.fullmatch(k)]
    if bad or len(set(keys)) != len(keys):
      raise ValueError(f"{job.name}: unit keys must be unique and file-safe, got "
                       f"{bad or sorted(k for k in keys if keys.count(k) > 1)[:3]}")
    store = _Store(workdir, job.unit_format)
    done = _agree([store.has(k) for k in keys])
    n_done = sum(done)
    prog = progress.Progress(total=len(units), done=n_done)
    log(f"[{job.name}] {workdir}: {len(units)} units, {n_done} finished before"
        + (" (resumed)" if state == "resume" and n_done else ""))
    results = {}
    for unit, finished in zip(units, done):
      if finished:
        results[unit.key] = store.get(unit.key)
        continue
      value = store.roundtrip(job.run_unit(ctx, unit.spec))
      if primary:
        store.put(unit.key, value)
      results[unit.key] = value
      n_done += 1
      extra = job.describe_unit(unit.spec, value)
      log(f"[{job.name}] unit {n_done}/{len(units)} {unit.key}"
          f"{'; ' + extra if extra else ''} ({prog.update(n_done)})")
    summary = job.summarize(ctx, results)
    summary = dict(summary, produced_by=dict(
        job=job.name, config=plain(job.record()), units=len(units),
        units_this_run=len(units) - sum(done), wall_s_this_run=round(time.time() - t0, 1),
        versions=versions()))
    summary = json.loads(json.dumps(summary, default=_json_default))
    job.write(ctx, results, summary)
    ctx.write_json(SUMMARY_FILE, summary)
  ended = f"wrote {os.path.join(workdir, SUMMARY_FILE)}" if primary else (
      f"finished (process {index}; process 0 writes {workdir})")
  log(f"[{job.name}] {ended} (elapsed {progress.fmt_duration(time.time() - t0)})")
  return summary


def _json_default(x: Any) -> Any:
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, tuple):
    return list(x)
  return str(x)
