"""Local worker processes: one grid (or one shard of it) run by P processes on one host.

XLA on a CPU host runs a small model's step on about one core and compiles on one
thread, so one grid process leaves the other cores mostly idle. `--processes P`
starts P − 1 more worker processes (multiprocessing's spawn: each starts its own
JAX); every worker goes through the shard's cells in order and takes the next cell
no other worker holds (the per-cell lock of `ceu_jax.grid.runner`), so the cells are
shared dynamically, a slow cell never holds up the others, and each cell runs once.
Worker 0 is the calling process: after its pass it waits for the other workers,
runs any cell a worker left unfinished (a worker that died), then aggregates.

Interrupts: SIGTERM or SIGINT to worker 0 stops its cell at a checkpoint
(`train.loop.Preempted`) and forwards SIGTERM to the other workers, which stop
theirs the same way; the rerun resumes every interrupted cell. Accelerators: one
process per device, so P > 1 is refused on a non-CPU backend (use `--shard i/N`,
one per host or device).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Callable

EXIT_PREEMPTED = 75    # a worker stopped by SIGTERM/SIGINT (its cell checkpointed)
JOIN_GRACE_S = 600.0   # after an interrupt: how long a worker may take to checkpoint


def check_processes(processes: int) -> None:
  """--processes must be an int >= 1; more than one only on the CPU backend."""
  if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
    raise ValueError(f"--processes must be an integer >= 1, got {processes!r}")
  if processes > 1:
    import jax  # pylint: disable=g-import-not-at-top
    if jax.default_backend() != "cpu":
      raise ValueError(
          f"--processes={processes} starts several JAX processes on this host; on the "
          f"{jax.default_backend()} backend they would share one device. Use --shard i/N "
          "with one process per host or device instead")


def _worker(config, workdir: str, shard: str | None, worker: tuple[int, int], cell_fn,
            validate_fn, setup, results) -> None:
  """Body of worker j > 0 (a spawned process)."""
  from ceu_jax import cli  # pylint: disable=g-import-not-at-top
  cli.keep_freed_memory()            # as the entry points do, before JAX allocates
  from ceu_jax.grid import runner, validate  # pylint: disable=g-import-not-at-top
  tag = f"[w{worker[0]}] "
  log = lambda msg: print(tag + msg, flush=True)
  if setup is not None:
    setup(workdir)
  if cell_fn is None:
    from ceu_jax.grid.cell import run_cell  # pylint: disable=g-import-not-at-top
    cell_fn = run_cell
  try:
    counts = runner.run_grid(config, workdir, cell_fn, shard=shard, worker=worker,
                             validate=validate_fn or validate.validate_cell, log=log)
  except Exception as e:  # pylint: disable=broad-except
    if runner.is_preemption(e):
      log(f"[grid] stopped: {e}; its cell resumes on the rerun")
      raise SystemExit(EXIT_PREEMPTED) from None
    raise
  results.put({k: counts[k] for k in ("done", "failed")})


class Workers:
  """Workers 1..P−1 of one grid run, started by `start` and waited for by `join`."""

  def __init__(self, config, workdir: str, *, processes: int, shard: str | None,
               cell_fn=None, validate_fn=None,
               setup: Callable[[str], object] | None = None,
               log: Callable[[str], None] = print):
    """`setup(workdir)` runs first in each worker (module-level, picklable: the grid's
    compilation cache); `cell_fn` / `validate_fn` as in `runner.run_grid` (picklable)."""
    self.log = log
    ctx = multiprocessing.get_context("spawn")   # JAX is not fork-safe
    self.results = ctx.Queue()                   # each worker's counts of cells it ran
    self.procs = [ctx.Process(
        target=_worker, name=f"grid-worker-{j}",
        args=(config, workdir, shard, (j, processes), cell_fn, validate_fn,
              setup, self.results)) for j in range(1, processes)]

  def start(self) -> "Workers":
    for p in self.procs:
      p.start()
    self.log(f"[grid] {len(self.procs) + 1} worker processes share the cells "
             f"(this one and pids {', '.join(str(p.pid) for p in self.procs)})")
    return self

  def join(self) -> dict:
    """Wait for every worker; name any that did not end cleanly. Returns the counts
    (done, failed) of the cells the workers ran. SIGTERM or SIGINT meanwhile: forwarded
    to the workers (each checkpoints its cell), then `loop.Preempted` once they ended."""
    from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
    signums = []

    def forward(signum, frame):
      del frame
      signums.append(signum)
      for p in self.procs:
        if p.is_alive():
          os.kill(p.pid, signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      for p in self.procs:
        p.join()
    finally:
      for s, handler in old.items():
        signal.signal(s, handler)
    counts = dict(done=0, failed=0)
    for p in self.procs:
      if p.exitcode == EXIT_PREEMPTED:
        self.log(f"[grid] worker {p.name} (pid {p.pid}) was interrupted; rerun to resume "
                 "its cell")
      elif p.exitcode != 0:
        self.log(f"[grid] worker {p.name} (pid {p.pid}) ended with exit code {p.exitcode}; "
                 "a cell it left unfinished is run here")
    for _ in range(sum(p.exitcode == 0 for p in self.procs)):   # one dict per clean exit
      for k, v in self.results.get(timeout=60).items():
        counts[k] += v
    if signums:
      raise loop.Preempted(-1, signums[0])   # the grid stops; the rerun resumes the cells
    return counts

  def stop(self) -> None:
    """After an interrupt or error here: SIGTERM to live workers (each checkpoints its
    cell and exits), then wait for them."""
    started = [p for p in self.procs if p.pid is not None]
    for p in started:
      if p.is_alive():
        os.kill(p.pid, signal.SIGTERM)
    for p in started:
      p.join(JOIN_GRACE_S)
      if p.is_alive():
        p.kill()
        p.join()
