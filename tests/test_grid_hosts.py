"""Issue #20.6: one grid on several hosts sharing a filesystem (`--shard i/N`).

Two local processes stand for two hosts: each runs `ceu_jax.grid.main.run` (what
`experiments.grid` calls) with `--shard 0/2` and `--shard 1/2` on one workdir at
the same time. Host 0 is killed (SIGKILL) in the middle of a cell; host 1 finishes
and reports that shard 0 still has unfinished cells; rerunning shard 0 skips its
finished cell, resumes the interrupted one where it stopped and finishes. Every
cell runs to completion exactly once, on the host of its shard, and the last
aggregation holds every cell.

The CI test uses a resumable fake cell (a few timed steps, each recorded in the
cell directory, resuming after the last recorded one); the slow test runs the
real `python -m experiments.grid` on a 2-cell training grid and kills a host
during training, so the rerun resumes the cell from its checkpoint.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ceu_jax.grid import aggregate, runner, sweep
from tests.test_grid_driver import _report_cell, _report_config
from tests.test_multiprocess_helpers import REPO, env_for

STEPS = 4          # steps of a fake cell
STEP_S = 0.4       # seconds per step


def steady_cell(config, cell_dir):
  """A resumable fake cell: STEPS steps of STEP_S seconds, each appended to
  cell_dir/steps.log ('<step> <pid>') once done; resumes after the last one. Its
  completion is appended to <workdir>/completions.log."""
  log = os.path.join(cell_dir, "steps.log")
  done = len(open(log).read().splitlines()) if os.path.exists(log) else 0
  for step in range(done + 1, STEPS + 1):
    time.sleep(STEP_S)
    with open(log, "a") as f:
      f.write(f"{step} {os.getpid()}\n")
      f.flush()
      os.fsync(f.fileno())
  workdir = os.path.dirname(os.path.dirname(cell_dir))
  with open(os.path.join(workdir, "completions.log"), "a") as f:
    f.write(f"{sweep.cell_id(config)} {os.getpid()}\n")
  return _report_cell(config, cell_dir)


HOST = textwrap.dedent('''
    import sys
    sys.path.insert(0, {root!r})
    from tests.test_grid_hosts import steady_cell
    from tests.test_grid_driver import _report_config, validate
    from ceu_jax.grid import main as grid_main
    grid_main.run(_report_config(), {workdir!r}, shard={shard!r}, cell_fn=steady_cell,
                  validate_fn=validate)
''')


def _host(workdir: str, shard: str, log_dir: str, tag: str) -> subprocess.Popen:
  out = open(os.path.join(log_dir, f"{tag}.log"), "w")
  return subprocess.Popen([sys.executable, "-c", HOST.format(root=REPO, workdir=workdir,
                                                             shard=shard)],
                          cwd=REPO, env=env_for(1), stdout=out, stderr=subprocess.STDOUT)


def _steps(workdir: str, cell) -> list[tuple[int, int]]:
  path = os.path.join(runner.cell_dir(workdir, cell), "steps.log")
  if not os.path.exists(path):
    return []
  return [tuple(int(x) for x in line.split()) for line in open(path).read().splitlines()]


def _wait(cond, timeout: float, what: str, proc: subprocess.Popen) -> None:
  deadline = time.time() + timeout
  while not cond():
    if proc.poll() is not None:
      raise AssertionError(f"the process ended (rc {proc.returncode}) before {what}")
    if time.time() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.05)


def test_two_hosts_cover_the_grid_once_and_a_killed_host_resumes(tmp_path):
  workdir, logs = str(tmp_path / "grid"), str(tmp_path / "logs")
  os.makedirs(logs)
  cells = sweep.expand(_report_config())
  assert len(cells) == 6
  target = cells[2]                          # host 0's second cell (index 2 = 0 mod 2)
  host0 = _host(workdir, "0/2", logs, "host0")
  host1 = _host(workdir, "1/2", logs, "host1")
  try:
    _wait(lambda: len(_steps(workdir, target)) >= 2, 120, "host 0 inside cell #2", host0)
  finally:
    host0.send_signal(signal.SIGKILL)        # the host dies in the middle of the cell
    host0.wait()
  before = _steps(workdir, target)
  assert 2 <= len(before) < STEPS
  assert not os.path.exists(os.path.join(runner.cell_dir(workdir, target), "result.json"))
  assert host1.wait(timeout=120) == 0
  out1 = open(os.path.join(logs, "host1.log")).read()
  assert "[grid] shard 1/2: 3 done, 0 skipped, 0 failed, 0 busy elsewhere" in out1
  assert "unfinished: shard 0/2" in out1

  rerun = _host(workdir, "0/2", logs, "host0_rerun")
  assert rerun.wait(timeout=120) == 0
  out0 = open(os.path.join(logs, "host0_rerun.log")).read()
  assert f"#0) {cells[0].cell_id}" in out0 and "finished earlier, skipped" in out0
  assert "[grid] all 6 cells of the grid are finished" in out0

  # The interrupted cell resumed after its last finished step: each step once.
  after = _steps(workdir, target)
  assert [s for s, _ in after] == list(range(1, STEPS + 1))
  assert after[:len(before)] == before
  assert {p for _, p in after[len(before):]} == {rerun.pid}
  # Every cell finished exactly once, by the host of its shard.
  done = [line.split()[0] for line in open(os.path.join(workdir, "completions.log"))]
  assert sorted(done) == sorted(c.cell_id for c in cells)
  for c in cells:
    res = json.load(open(os.path.join(runner.cell_dir(workdir, c), "result.json")))
    assert res["shard"] == f"{c.index % 2}/2" and res["host"] and res["pid"] > 0
    assert {p for _, p in _steps(workdir, c)} <= {host0.pid, host1.pid, rerun.pid}
  rows = aggregate.read_results_csv(os.path.join(workdir, "results.csv"))
  assert sorted({r["cell_id"] for r in rows}) == sorted(c.cell_id for c in cells)
  assert len(rows) == 6 * 3                    # 3 conditions per cell, each once


def test_busy_cell_is_retried_until_its_holder_lets_go(tmp_path):
  """A cell locked by another process (a dead host's lock not yet expired, or a live
  host running it) is retried at the end of the pass for up to busy_wait_s."""
  workdir = str(tmp_path / "grid")
  cell = sweep.expand(_report_config())[0]
  lock = runner.file_lock(os.path.join(runner.cell_dir(workdir, cell), ".lock"), "cell")
  lock.acquire()
  lines = []

  def log(line):
    lines.append(line)
    if "waiting up to" in line:
      lock.release()                        # the other holder lets go while we wait

  counts = runner.run_grid(_report_config(), workdir, _report_cell, shard="0/6",
                           busy_wait_s=30, log=log)
  assert counts == dict(skipped=0, done=1, failed=0, busy=0)
  assert any("is locked by another process; waiting" in line for line in lines)
  # Without waiting it stays busy and says what to do.
  lock = runner.file_lock(os.path.join(runner.cell_dir(str(tmp_path / "g2"), cell), ".lock"),
                          "cell")
  with lock:
    lines = []
    counts = runner.run_grid(_report_config(), str(tmp_path / "g2"), _report_cell,
                             shard="0/6", log=lines.append)
  assert counts["busy"] == 1 and counts["done"] == 0
  assert any("rerun this shard later" in line for line in lines)
  assert "unfinished: shard 0/6 (1 cells)" in lines[-1]


GRID_CONFIG = textwrap.dedent('''
    from configs import smoke

    def get_config(arg=None):
      c = smoke.get_config("tiny,steps=12")
      c.train.batch_size, c.train.warmup_steps, c.train.checkpoint_every = 16, 2, 2
      c.train.log_every = 1
      c.eval.num_examples, c.eval.batch_size = 16, 16
      c.eval.corruptions = ("value_swap",)
      c.grid.delta_test, c.grid.n_test, c.grid.eta_test = (0.3,), (64,), (0.0,)
      c.model.overrides = dict(embed_dim=16, reader_mlp_dim=32, enc_mlp_dim=32,
                               read_heads=2, read_head_dim=8, reader_heads=2,
                               reader_layers=1)
      c.sweep = ((("cer.regularizer", ("none", "evidence")),
                  ("cer.lambda_ev", (0.0, 1.0))),)
      return c
''')


@pytest.mark.slow
def test_real_grid_on_two_hosts_resumes_a_killed_cell_from_its_checkpoint(tmp_path):
  """`python -m experiments.grid --shard i/2` x 2 on a 2-cell training grid; host 0 is
  killed during training; rerunning shard 0 resumes the cell from its checkpoint."""
  cfg = tmp_path / "grid_config.py"
  cfg.write_text(GRID_CONFIG)
  workdir = str(tmp_path / "grid")

  def host(shard, tag):
    out = open(tmp_path / f"{tag}.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.grid", f"--config={cfg}", f"--workdir={workdir}",
         f"--shard={shard}"], cwd=REPO, env=env_for(1), stdout=out, stderr=subprocess.STDOUT)

  sys.path.insert(0, str(tmp_path))
  try:
    import grid_config  # pylint: disable=g-import-not-at-top,import-error
    cells = sweep.expand(grid_config.get_config())
  finally:
    sys.path.remove(str(tmp_path))
  ckpts = os.path.join(runner.cell_dir(workdir, cells[0]), "train", "checkpoints")
  host0, host1 = host("0/2", "host0"), host("1/2", "host1")
  try:
    _wait(lambda: os.path.isdir(ckpts) and any(
        d.isdigit() and int(d) >= 4 for d in os.listdir(ckpts)), 900, "a checkpoint", host0)
  finally:
    host0.send_signal(signal.SIGKILL)
    host0.wait()
  assert host1.wait(timeout=900) == 0, open(tmp_path / "host1.log").read()[-3000:]
  rerun = host("0/2", "host0_rerun")
  assert rerun.wait(timeout=900) == 0, open(tmp_path / "host0_rerun.log").read()[-3000:]
  out = open(tmp_path / "host0_rerun.log").read()
  assert "resumed from checkpoint step" in out
  assert "[grid] all 2 cells of the grid are finished" in out
  rows = aggregate.read_results_csv(os.path.join(workdir, "results.csv"))
  assert sorted(r["cell_id"] for r in rows) == sorted(c.cell_id for c in cells)
  for c in cells:
    res = json.load(open(os.path.join(runner.cell_dir(workdir, c), "result.json")))
    assert res["shard"] == f"{c.index}/2" and res["train_run"]["completed"] is True


def test_aggregation_waits_for_another_hosts_aggregation(tmp_path):
  """results.csv is rewritten by one host at a time: an aggregation waits while
  another holds W/aggregate.lock, then reads every cell finished by then."""
  import threading  # pylint: disable=g-import-not-at-top
  from ceu_jax.grid import main as grid_main  # pylint: disable=g-import-not-at-top
  from tests.test_grid_driver import validate  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "grid")
  runner.run_grid(_report_config(), workdir, _report_cell, log=lambda s: None)
  lock = runner.file_lock(os.path.join(workdir, "aggregate.lock"), "grid aggregation")
  lock.acquire()
  out = {}
  worker = threading.Thread(target=lambda: out.update(grid_main.run(
      _report_config(), workdir, aggregate_only=True, validate_fn=validate,
      log=lambda s: None)))
  worker.start()
  time.sleep(1.5)
  assert worker.is_alive() and not os.path.exists(os.path.join(workdir, "results.csv"))
  lock.release()
  worker.join(timeout=60)
  assert not worker.is_alive() and out["rows"] == 6 * 3
