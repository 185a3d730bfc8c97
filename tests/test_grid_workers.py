"""`--processes P`: P local worker processes share one grid's cells (ceu_jax.grid.workers).

With a fake cell (a short sleep, its pid recorded) on the 6-cell report grid: every
cell runs exactly once, both processes take cells, and the results equal a
one-process run; a worker that dies in a cell leaves that cell to worker 0, which
runs it before aggregating; an interrupt of worker 0 stops the other workers; bad
values are refused before any process starts.
"""
from __future__ import annotations

import glob
import json
import os
import time

import pytest

from ceu_jax.grid import aggregate, main as grid_main, runner, sweep, workers
from tests.test_grid_driver import _report_cell, _report_config, validate

CELL_S = 0.2    # seconds per fake cell
WAIT_S = 120.0  # worker 0's first cell waits this long at most for another worker's cell


def _parent(workdir: str) -> int:
  """Worker 0's pid (W/parent.pid), or -1 for a one-process run (no file)."""
  path = os.path.join(workdir, "parent.pid")
  return int(open(path).read()) if os.path.exists(path) else -1


def timed_cell(config, cell_dir):
  """A fake cell: sleeps CELL_S, appends '<cell id> <pid>' to W/completions.log. In
  worker 0 (pid in W/parent.pid) a cell first waits until another worker has started
  a cell, so that both take cells however slowly the spawned worker starts."""
  workdir = os.path.dirname(os.path.dirname(cell_dir))
  started = os.path.join(workdir, "started.log")
  with open(started, "a") as f:
    f.write(f"{os.getpid()}\n")
  deadline = time.time() + WAIT_S
  while os.getpid() == _parent(workdir) and time.time() < deadline and not any(
      int(p) != os.getpid() for p in open(started).read().split()):
    time.sleep(0.05)
  time.sleep(CELL_S)
  with open(os.path.join(workdir, "completions.log"), "a") as f:
    f.write(f"{sweep.cell_id(config)} {os.getpid()}\n")
  return _report_cell(config, cell_dir)


def _workdir(path) -> str:
  """A grid workdir whose parent.pid names this process (worker 0)."""
  os.makedirs(path)
  open(os.path.join(path, "parent.pid"), "w").write(str(os.getpid()))
  return str(path)


def dying_cell(config, cell_dir):
  """Like timed_cell, but a worker other than worker 0 (pid != W/parent.pid) dies hard
  in the first cell it takes."""
  workdir = os.path.dirname(os.path.dirname(cell_dir))
  marker = os.path.join(workdir, "died")
  if os.getpid() != _parent(workdir) and not os.path.exists(marker):
    open(marker, "w").write(sweep.cell_id(config))
    with open(os.path.join(workdir, "started.log"), "a") as f:
      f.write(f"{os.getpid()}\n")
    os._exit(3)   # pylint: disable=protected-access
  return timed_cell(config, cell_dir)


def sleeping_cell(config, cell_dir):
  """A fake cell that outlasts any test (stopped by a signal)."""
  del config, cell_dir
  time.sleep(300)


def _completions(workdir: str) -> list[tuple[str, int]]:
  lines = open(os.path.join(workdir, "completions.log")).read().splitlines()
  return [(cid, int(pid)) for cid, pid in (line.split() for line in lines)]


def _rows(workdir: str) -> list[dict]:
  return [{k: v for k, v in r.items() if not k.startswith("time_")}
          for r in aggregate.read_results_csv(os.path.join(workdir, "results.csv"))]


def test_two_workers_run_every_cell_once_and_equal_one_process(tmp_path):
  ids = sorted(c.cell_id for c in sweep.expand(_report_config()))
  one, two = str(tmp_path / "one"), _workdir(tmp_path / "two")
  grid_main.run(_report_config(), one, cell_fn=timed_cell, validate_fn=validate,
                log=lambda s: None)
  lines = []
  out = grid_main.run(_report_config(), two, cell_fn=timed_cell, validate_fn=validate,
                      processes=2, log=lines.append)
  assert out["counts"] == dict(skipped=0, done=6, failed=0, busy=0)
  done = _completions(two)
  assert sorted(cid for cid, _ in done) == ids                # each cell exactly once
  pids = {pid for _, pid in done}
  assert os.getpid() in pids and len(pids) == 2, done          # both processes took cells
  assert _rows(two) == _rows(one)
  assert any("2 worker processes share the cells" in line for line in lines)
  # Every cell records the XLA flags it ran under: the same in both processes.
  flags = {json.load(open(p))["xla_flags"]
           for p in glob.glob(os.path.join(two, "cells", "*", "result.json"))}
  assert flags == {os.environ.get("XLA_FLAGS", "")}, flags
  assert "[grid] all 6 cells of the grid are finished" in lines


def test_a_dead_worker_leaves_its_cell_to_worker_0(tmp_path):
  workdir = _workdir(tmp_path / "grid")
  lines = []
  out = grid_main.run(_report_config(), workdir, cell_fn=dying_cell, validate_fn=validate,
                      processes=2, log=lines.append)
  died = open(os.path.join(workdir, "died")).read()
  assert out["failures"] == 0 and out["counts"]["busy"] == 0
  done = _completions(workdir)
  assert sorted(cid for cid, _ in done) == sorted(c.cell_id for c in sweep.expand(
      _report_config()))
  assert (died, os.getpid()) in done                          # worker 0 ran it
  assert any("ended with exit code 3" in line for line in lines), lines


def test_stop_sends_sigterm_to_live_workers(tmp_path):
  pool = workers.Workers(_report_config(), _workdir(tmp_path / "g"), processes=2,
                         shard=None, cell_fn=timed_cell, validate_fn=validate,
                         log=lambda s: None)
  pool.stop()                                                  # never started: no-op
  pool.start()
  pool.stop()
  assert all(not p.is_alive() and p.exitcode is not None for p in pool.procs)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_processes_refused_before_anything_runs(tmp_path, bad):
  with pytest.raises(ValueError, match="--processes must be an integer >= 1"):
    grid_main.run(_report_config(), str(tmp_path / "g"), cell_fn=timed_cell,
                  validate_fn=validate, processes=bad)
  assert not os.path.exists(tmp_path / "g")


def test_workers_need_the_cpu_backend(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  with pytest.raises(ValueError, match="--shard i/N"):
    workers.check_processes(2)
  workers.check_processes(1)


def test_a_worker_skips_cells_another_holds(tmp_path):
  """Worker j > 0 passes over a locked cell (another worker runs it) without waiting."""
  workdir = str(tmp_path / "grid")
  cells = sweep.expand(_report_config())
  lock = runner.file_lock(os.path.join(runner.cell_dir(workdir, cells[0]), ".lock"), "cell")
  with lock:
    lines = []
    counts = runner.run_grid(_report_config(), workdir, _report_cell, worker=(1, 2),
                             log=lines.append)
  assert counts["done"] == 5 and not any(cells[0].cell_id in line for line in lines)


def test_sigterm_while_waiting_for_workers_stops_them_and_the_grid(tmp_path):
  """Worker 0 done with its pass, waiting: SIGTERM is forwarded to the workers and
  the grid stops (Preempted: the entry point exits 75, the rerun resumes)."""
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
  pool = workers.Workers(_report_config(), _workdir(tmp_path / "g"), processes=2,
                         shard=None, cell_fn=sleeping_cell, validate_fn=validate,
                         log=lambda s: None)
  pool.start()
  threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
  with pytest.raises(loop.Preempted):
    pool.join()
  assert all(p.exitcode == -signal.SIGTERM for p in pool.procs)   # fake cells: no handler
  assert signal.getsignal(signal.SIGTERM) is not None
