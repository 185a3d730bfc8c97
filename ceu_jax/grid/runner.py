"""Grid driver: runs every cell of a shard, resumably, and records each outcome.

Layout of a grid workdir W:
  W/grid.json                 the expanded grid (cell ids, overrides), written once
  W/cells/<id>/config.json    the cell's full config
  W/cells/<id>/result.json    written atomically when the cell finishes (then skipped);
                              `train_run` records the checkpoint step the cell used and
                              whether its training completed (ceu_jax.workdir.run_info)
  W/cells/<id>/error.json     written when the cell fails (retried on the next run)
  W/driver-<i>of<N>.lock      one driver per shard; a second one is refused
  W/cells/<id>/.lock          held while a cell runs, so overlapping shards never
                              run the same cell at once
  W/aggregate.lock            held while results.csv / report.md are rewritten

Many hosts sharing W (a filesystem with working flock: local, NFSv4, Lustre
mounted with -o flock): host i of N runs `--shard i/N`, the cells whose index
is i mod N, so the shards partition the grid and every cell runs on exactly one
host; result.json records the host, pid, shard and code (version, git commit) that
finished it. A host killed mid-cell leaves the cell without result.json and its lock released (by the kernel,
or by the NFS server when the dead client's lease expires): rerunning the same
shard, on any host, skips the finished cells and resumes that one from its
checkpoint. A cell found locked (`busy`) is retried at the end of the pass for
up to `busy_wait_s` (a dead host's lock until its lease runs out; a live holder
until it finishes the cell, which is then skipped).

A cell function `cell_fn(config, cell_dir) -> dict` trains/evaluates one cell and
returns {"rows": [one dict per test condition], ...}; it must itself resume from
whatever it left in cell_dir (the training loop resumes from its checkpoints).
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import traceback
from typing import Callable, Iterator

import ml_collections

from ceu_jax import code_version, io, locks
from ceu_jax import progress as progress_lib
from ceu_jax import workdir as workdir_lib
from ceu_jax.grid import sweep as sweep_lib

CellFn = Callable[[ml_collections.ConfigDict, str], dict]


class LockHeld(locks.Locked):
  """Another process holds the lock."""


def file_lock(path: str, what: str) -> locks.FileLock:
  """Exclusive, non-blocking flock (a context manager); released when the process dies
  (even kill -9). A second holder gets LockHeld naming the first (pid, host, command)."""
  return locks.FileLock(path, what, error=LockHeld)


def cell_dir(workdir: str, cell: sweep_lib.Cell) -> str:
  return os.path.join(workdir, "cells", cell.cell_id)


@contextlib.contextmanager
def waiting_lock(path: str, what: str, *, timeout_s: float, poll_s: float = 0.5
                 ) -> Iterator[locks.FileLock]:
  """`with waiting_lock(path, what, timeout_s=...):` `file_lock(path, what)` held,
  waiting up to `timeout_s` for another holder to let go (LockHeld after that)."""
  deadline = time.time() + timeout_s
  while True:
    try:
      lock = file_lock(path, what).acquire()
      break
    except LockHeld:
      if time.time() >= deadline:
        raise
      time.sleep(poll_s)
  try:
    yield lock
  finally:
    lock.release()


def _record(cell: sweep_lib.Cell, status: str, **extra) -> dict:
  return dict(cell_id=cell.cell_id, index=cell.index, status=status,
              overrides=[[k, v] for k, v in cell.overrides],
              config=sweep_lib.flatten(cell.config), **extra)


def _finished(workdir: str, cell: sweep_lib.Cell) -> bool:
  return os.path.exists(os.path.join(cell_dir(workdir, cell), "result.json"))


def is_preemption(e: BaseException) -> bool:
  """A cell stopped by SIGTERM/SIGINT (training's `Preempted`, raised after its
  checkpoint): the grid stops too, and a rerun resumes the cell. Not a failure."""
  from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
  return isinstance(e, loop.Preempted)


def run_cell(cell: sweep_lib.Cell, workdir: str, cell_fn: CellFn, shard: str = "0/1",
             on_start: Callable[[], None] | None = None) -> str:
  """Run one cell unless finished; returns 'skipped', 'done', 'failed' or 'busy'.
  `shard` ('i/N') is recorded with the host and pid that ran the cell; `on_start` is
  called once this process holds the cell's lock, before the cell runs."""
  d = cell_dir(workdir, cell)
  result_path = os.path.join(d, "result.json")
  if os.path.exists(result_path):
    return "skipped"
  try:
    with file_lock(os.path.join(d, ".lock"), f"cell {cell.cell_id}"):
      if os.path.exists(result_path):     # finished by another shard meanwhile
        return "skipped"
      if on_start is not None:
        on_start()
      io.write_json_atomic(os.path.join(d, "config.json"), cell.config.to_dict())
      ran_by = dict(host=socket.gethostname(), pid=os.getpid(), shard=shard,
                    code=code_version.code_version(),
                    versions=code_version.versions(),   # libraries and CPU (rounding)
                    xla_flags=os.environ.get("XLA_FLAGS", ""))   # e.g. one thread per op
      start = time.time()
      try:
        out = cell_fn(cell.config, d)
      except Exception as e:  # a failing cell is recorded; the grid goes on
        if is_preemption(e):  # SIGTERM/SIGINT: the cell saved a checkpoint; stop the grid
          raise
        io.write_json_atomic(os.path.join(d, "error.json"), _record(
            cell, "failed", error=f"{type(e).__name__}: {e}",
            traceback=traceback.format_exc(), time_wall_s=time.time() - start, **ran_by))
        logging.error("cell %s failed: %s: %s", cell.cell_id, type(e).__name__, e)
        return "failed"
      train_dir = os.path.join(d, "train")
      train_run = workdir_lib.run_info(train_dir) if os.path.isdir(train_dir) else None
      io.write_json_atomic(result_path, _record(
          cell, "ok", rows=out.get("rows", []),
          extra={k: v for k, v in out.items() if k != "rows"},
          train_run=train_run, time_wall_s=time.time() - start, **ran_by))
      if os.path.exists(os.path.join(d, "error.json")):
        os.unlink(os.path.join(d, "error.json"))
      return "done"
  except LockHeld:
    return "busy"


def run_grid(config: ml_collections.ConfigDict, workdir: str, cell_fn: CellFn, *,
             shard: str | None = None, validate=None, busy_wait_s: float = 0.0,
             worker: tuple[int, int] = (0, 1), pool=None,
             log=print) -> dict:
  """Expand, validate and run every cell of this shard. Returns counts per outcome
  ('busy': cells still locked elsewhere after waiting `busy_wait_s` at the end).

  `worker` (j, P): one of P local worker processes sharing this shard's cells
  (`ceu_jax.grid.workers`): each takes the next cell no other worker holds. Worker 0
  takes the shard's driver lock, then starts the others (`pool.start()`); after its
  pass it waits for them (`pool.join()`, the counts of the cells they ran are added to
  these) before retrying the cells it found busy. Workers j > 0 skip busy cells
  (another worker has them) and do not retry them."""
  cells = sweep_lib.expand(config, validate=validate)      # fails before any training
  i, n = sweep_lib.parse_shard(shard)
  j, num_workers = worker
  mine = sweep_lib.shard_cells(cells, (i, n))
  os.makedirs(workdir, exist_ok=True)
  counts = dict(skipped=0, done=0, failed=0, busy=0)
  lock_name = f"driver-{i}of{n}.lock" if j == 0 else f"driver-{i}of{n}-worker{j}.lock"
  who = f"shard {i}/{n}" + (f" worker {j}/{num_workers}" if num_workers > 1 else "")
  with file_lock(os.path.join(workdir, lock_name), f"grid workdir {who}"):
    if pool is not None:
      pool.start()
    io.write_json_atomic(os.path.join(workdir, "grid.json"), dict(
        num_cells=len(cells),
        cells=[dict(cell_id=c.cell_id, index=c.index, label=c.label()) for c in cells]))
    todo = [c for c in mine if not _finished(workdir, c)]
    todo_ids = {c.cell_id for c in todo}
    prog = progress_lib.Progress(len(todo))
    prog.update(0)
    ran, busy = 0, []
    for pos, cell in enumerate(mine, 1):
      tag = f"[grid] cell {pos}/{len(mine)} ({who}, #{cell.index}) {cell.cell_id} {cell.label()}"
      if _finished(workdir, cell):
        if cell.cell_id not in todo_ids and j == 0:
          log(f"{tag}: finished earlier, skipped")
          counts["skipped"] += 1
        continue                  # (or finished by another worker during this run)
      outcome = run_cell(cell, workdir, cell_fn, f"{i}/{n}",
                         on_start=lambda tag=tag: log(f"{tag}: running ({prog.line()})"))
      if outcome == "busy":
        busy.append(cell)
        if num_workers > 1:       # another worker has it: no line, not this run's progress
          continue
      elif outcome == "skipped" and num_workers > 1:
        continue                  # another worker finished it just now: counted there
      else:
        counts[outcome] += 1
      # Progress over this run's cells, whoever ran them (one worker: its own count).
      ran = sum(_finished(workdir, c) for c in todo) if num_workers > 1 else ran + 1
      log(f"{tag}: {outcome} ({prog.update(ran)}, {len(todo) - ran} cells left)")
    if j > 0:
      log(f"[grid] {who}: {counts['done']} done, {counts['failed']} failed")
      return counts
    if pool is not None:
      for k, v in pool.join().items():
        counts[k] += v
    retried = _retry_busy(busy, workdir, cell_fn, f"{i}/{n}", busy_wait_s, log)
    if pool is not None:
      retried["skipped"] = 0      # finished by the other workers: counted in pool.join
    for k, v in retried.items():
      counts[k] += v
  log(f"[grid] shard {i}/{n}: {counts['done']} done, {counts['skipped']} skipped, "
      f"{counts['failed']} failed, {counts['busy']} busy elsewhere; "
      f"{len(mine)} cells in this shard, {len(cells)} in the grid")
  log(coverage_line(cells, workdir, n))
  return counts


def _retry_busy(busy: list, workdir: str, cell_fn: CellFn, shard: str, wait_s: float,
                log) -> dict:
  """Retry cells found locked until each is finished (elsewhere or here), or until
  `wait_s` has passed; returns the counts of their final outcomes."""
  counts = dict(skipped=0, done=0, failed=0, busy=0)
  deadline = time.time() + wait_s
  for cell in busy:
    if _finished(workdir, cell):       # finished meanwhile (another worker or host)
      counts["skipped"] += 1
      continue
    if deadline > time.time():
      log(f"[grid] cell #{cell.index} {cell.cell_id} is locked by another process; "
          f"waiting up to {deadline - time.time():.0f}s for it")
    while True:
      outcome = run_cell(cell, workdir, cell_fn, shard)
      if outcome != "busy" or time.time() >= deadline:
        break
      time.sleep(min(5.0, max(deadline - time.time(), 0.0)))
    counts[outcome] += 1
    if outcome == "busy":
      log(f"[grid] cell #{cell.index} {cell.cell_id} is still locked by another process "
          "(a live host running it, or a dead host's lock not yet expired): rerun this "
          "shard later")
  return counts


def coverage_line(cells: list, workdir: str, num_shards: int) -> str:
  """How much of the whole grid is finished, and which shards still have cells."""
  left: dict[int, int] = {}
  for c in cells:
    if not _finished(workdir, c):
      left[c.index % num_shards] = left.get(c.index % num_shards, 0) + 1
  done = len(cells) - sum(left.values())
  if not left:
    return f"[grid] all {len(cells)} cells of the grid are finished"
  return (f"[grid] {done}/{len(cells)} cells of the grid finished; unfinished: " + ", ".join(
      f"shard {s}/{num_shards} ({k} cells)" for s, k in sorted(left.items())))


def load_results(workdir: str) -> tuple[list[dict], list[dict]]:
  """(finished results, failures) of every cell under workdir/cells, sorted by index."""
  ok, failed = [], []
  root = os.path.join(workdir, "cells")
  for cid in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    for name, bucket in (("result.json", ok), ("error.json", failed)):
      path = os.path.join(root, cid, name)
      if os.path.exists(path):
        bucket.append(io.read_json(path))
  key = lambda r: r["index"]
  return sorted(ok, key=key), sorted(failed, key=key)
