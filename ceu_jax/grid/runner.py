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

A cell function `cell_fn(config, cell_dir) -> dict` trains/evaluates one cell and
returns {"rows": [one dict per test condition], ...}; it must itself resume from
whatever it left in cell_dir (the training loop resumes from its checkpoints).
"""
from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Callable

import ml_collections

from ceu_jax import io, locks
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


def _record(cell: sweep_lib.Cell, status: str, **extra) -> dict:
  return dict(cell_id=cell.cell_id, index=cell.index, status=status,
              overrides=[[k, v] for k, v in cell.overrides],
              config=sweep_lib.flatten(cell.config), **extra)


def run_cell(cell: sweep_lib.Cell, workdir: str, cell_fn: CellFn) -> str:
  """Run one cell unless finished; returns 'skipped', 'done', 'failed' or 'busy'."""
  d = cell_dir(workdir, cell)
  result_path = os.path.join(d, "result.json")
  if os.path.exists(result_path):
    return "skipped"
  try:
    with file_lock(os.path.join(d, ".lock"), f"cell {cell.cell_id}"):
      if os.path.exists(result_path):     # finished by another shard meanwhile
        return "skipped"
      io.write_json_atomic(os.path.join(d, "config.json"), cell.config.to_dict())
      start = time.time()
      try:
        out = cell_fn(cell.config, d)
      except Exception as e:  # a failing cell is recorded; the grid goes on
        io.write_json_atomic(os.path.join(d, "error.json"), _record(
            cell, "failed", error=f"{type(e).__name__}: {e}",
            traceback=traceback.format_exc(), time_wall_s=time.time() - start))
        logging.error("cell %s failed: %s: %s", cell.cell_id, type(e).__name__, e)
        return "failed"
      train_dir = os.path.join(d, "train")
      train_run = workdir_lib.run_info(train_dir) if os.path.isdir(train_dir) else None
      io.write_json_atomic(result_path, _record(
          cell, "ok", rows=out.get("rows", []),
          extra={k: v for k, v in out.items() if k != "rows"},
          train_run=train_run, time_wall_s=time.time() - start))
      if os.path.exists(os.path.join(d, "error.json")):
        os.unlink(os.path.join(d, "error.json"))
      return "done"
  except LockHeld:
    return "busy"


def run_grid(config: ml_collections.ConfigDict, workdir: str, cell_fn: CellFn, *,
             shard: str | None = None, validate=None, log=print) -> dict:
  """Expand, validate and run every cell of this shard. Returns counts per outcome."""
  cells = sweep_lib.expand(config, validate=validate)      # fails before any training
  i, n = sweep_lib.parse_shard(shard)
  mine = sweep_lib.shard_cells(cells, (i, n))
  os.makedirs(workdir, exist_ok=True)
  counts = dict(skipped=0, done=0, failed=0, busy=0)
  with file_lock(os.path.join(workdir, f"driver-{i}of{n}.lock"),
                 f"grid workdir shard {i}/{n}"):
    io.write_json_atomic(os.path.join(workdir, "grid.json"), dict(
        num_cells=len(cells),
        cells=[dict(cell_id=c.cell_id, index=c.index, label=c.label()) for c in cells]))
    todo = [c for c in mine
            if not os.path.exists(os.path.join(cell_dir(workdir, c), "result.json"))]
    prog = progress_lib.Progress(len(todo))
    prog.update(0)
    ran = 0
    for pos, cell in enumerate(mine, 1):
      tag = f"[grid] cell {pos}/{len(mine)} (shard {i}/{n}, #{cell.index}) {cell.cell_id} {cell.label()}"
      if os.path.exists(os.path.join(cell_dir(workdir, cell), "result.json")):
        log(f"{tag}: finished earlier, skipped")
        counts["skipped"] += 1
        continue
      log(f"{tag}: running ({prog.line()})")
      outcome = run_cell(cell, workdir, cell_fn)
      counts[outcome] += 1
      ran += 1
      log(f"{tag}: {outcome} ({prog.update(ran)}, {len(todo) - ran} cells left)")
  log(f"[grid] shard {i}/{n}: {counts['done']} done, {counts['skipped']} skipped, "
      f"{counts['failed']} failed, {counts['busy']} busy elsewhere; "
      f"{len(mine)} cells in this shard, {len(cells)} in the grid")
  return counts


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
