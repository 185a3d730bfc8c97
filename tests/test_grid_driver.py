"""Grid driver: expansion, validation, skip/resume, shards, locks, failures, aggregation.

Uses a fake, deterministic cell function so the driver is tested on its own;
the end-to-end grid on real cells is tested in test_grid_e2e.py.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import ml_collections
import numpy as np
import pytest

from ceu_jax.grid import aggregate, runner, sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def base_config():
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict(dict(family="attention", width=8))
  c.cer = ml_collections.ConfigDict(dict(regularizer="none", lambda_ev=0.0))
  c.data = ml_collections.ConfigDict(dict(delta=0.3))
  c.sweep = (
      (("model.family", ("attention", "ssm", "memory_port")),),
      (("cer.regularizer", ("none", "evidence")), ("cer.lambda_ev", (0.0, 1.0))),
  )
  return c


def fake_cell(config, cell_dir):
  score = len(config.model.family) / 10 + config.cer.lambda_ev
  return {"rows": [{"condition": "clean", "delta_test": 0.3, "em": score},
                   {"condition": "delta=0.6", "delta_test": 0.6, "em": score / 2}]}


def validate(cfg):
  if not 0.0 <= cfg.data.delta <= 1.0:
    raise ValueError(f"data.delta must be in [0, 1], got {cfg.data.delta}")


def test_expand_product_and_zip():
  cells = sweep.expand(base_config())
  assert len(cells) == 6                      # 3 families x 2 zipped settings
  assert len({c.cell_id for c in cells}) == 6
  zipped = {(c.config.cer.regularizer, c.config.cer.lambda_ev) for c in cells}
  assert zipped == {("none", 0.0), ("evidence", 1.0)}
  again = sweep.expand(base_config())
  assert [c.cell_id for c in cells] == [c.cell_id for c in again]   # stable ids


@pytest.mark.parametrize("bad_sweep, match", [
    ((), "sweep is empty"),
    (((("model.nope", (1, 2)),),), r"grid cell 0 .*unknown field 'model.nope'"),
    (((("data.delta", (0.5, 1.5)),),), r"grid cell 1 \(data.delta=1.5\).*data.delta must be in"),
    (((("model.family", ()),),), "has no values"),
    (((("model.family", ("a", "b")), ("model.width", (1,))),), "different lengths"),
])
def test_invalid_grid_rejected_naming_cell_and_field(bad_sweep, match):
  c = base_config()
  c.sweep = bad_sweep
  with pytest.raises(ValueError, match=match):
    sweep.expand(c, validate=validate)


def test_rerun_skips_finished_cells_and_failures_are_recorded(tmp_path):
  calls = []

  def flaky(config, d):
    calls.append(config.model.family)
    if config.model.family == "ssm" and config.cer.lambda_ev == 1.0:
      raise RuntimeError("boom")
    return fake_cell(config, d)

  logs = []
  counts = runner.run_grid(base_config(), str(tmp_path), flaky, log=logs.append)
  assert counts == dict(done=5, failed=1, skipped=0, busy=0)
  results, failures = runner.load_results(str(tmp_path))
  assert len(results) == 5 and len(failures) == 1
  assert "RuntimeError: boom" in failures[0]["error"]
  calls.clear()
  logs.clear()
  counts = runner.run_grid(base_config(), str(tmp_path), fake_cell, log=logs.append)
  assert counts == dict(done=1, failed=0, skipped=5, busy=0)   # only the failed cell reruns
  assert sum("finished earlier, skipped" in line for line in logs) == 5
  _, failures = runner.load_results(str(tmp_path))
  assert failures == []


def test_shards_cover_the_grid_exactly_and_merge(tmp_path):
  whole, split = tmp_path / "whole", tmp_path / "split"
  runner.run_grid(base_config(), str(whole), fake_cell, log=lambda s: None)
  ran = []
  for shard in ("0/2", "1/2"):
    def cell(config, d, shard=shard):
      ran.append((shard, sweep.cell_id(config)))
      return fake_cell(config, d)
    runner.run_grid(base_config(), str(split), cell, shard=shard, log=lambda s: None)
  ids = [cid for _, cid in ran]
  assert sorted(ids) == sorted(c.cell_id for c in sweep.expand(base_config()))
  assert len(ids) == len(set(ids))
  drop_time = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time_")}
                            for r in rows]
  _, rows_whole, _ = aggregate.write_results_csv(str(whole))
  _, rows_split, _ = aggregate.write_results_csv(str(split))
  assert drop_time(rows_whole) == drop_time(rows_split)
  csv_rows = aggregate.read_results_csv(str(whole / "results.csv"))
  assert len(csv_rows) == 12 and "model.family" in csv_rows[0]


def test_bad_shard_spec():
  for spec in ("2/2", "x", "1/0", "-1/3"):
    with pytest.raises(ValueError, match="--shard"):
      sweep.parse_shard(spec)


def test_second_driver_on_same_workdir_is_refused(tmp_path):
  lock = tmp_path / "driver-0of1.lock"
  with runner.file_lock(str(lock), "grid workdir shard 0/1"):
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from tests.test_grid_driver import base_config, fake_cell
        from ceu_jax.grid import runner
        try:
          runner.run_grid(base_config(), {str(tmp_path)!r}, fake_cell)
        except runner.LockHeld as e:
          print("REFUSED", e); sys.exit(3)
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert proc.returncode == 3, proc.stderr
  assert "locked by another process" in proc.stdout


SLOW_DRIVER = """
import sys, time, json, os
sys.path.insert(0, {root!r})
from tests.test_grid_driver import base_config, fake_cell
from ceu_jax.grid import runner
def slow(config, d):
  # a cell that writes partial progress, then finishes
  with open(os.path.join(d, "progress.txt"), "a") as f: f.write("start\\n")
  time.sleep({sleep})
  return fake_cell(config, d)
runner.run_grid(base_config(), {workdir!r}, slow)
"""


def test_killed_driver_resumes_and_matches_uninterrupted(tmp_path):
  killed, clean = str(tmp_path / "killed"), str(tmp_path / "clean")
  proc = subprocess.Popen([sys.executable, "-c", SLOW_DRIVER.format(
      root=ROOT, sleep=0.6, workdir=killed)], stdout=subprocess.PIPE, text=True)
  deadline = time.time() + 60
  while time.time() < deadline:                 # wait until 2 cells are finished
    done = runner.load_results(killed)[0] if os.path.isdir(killed) else []
    if len(done) >= 2:
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  finished_before = len(runner.load_results(killed)[0])
  assert 2 <= finished_before < 6
  out = subprocess.run([sys.executable, "-c", SLOW_DRIVER.format(
      root=ROOT, sleep=0.0, workdir=killed)], capture_output=True, text=True, check=True)
  assert out.stdout.count("finished earlier, skipped") == finished_before
  runner.run_grid(base_config(), clean, fake_cell, log=lambda s: None)
  strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time_")}
                        for r in rows]
  assert strip(aggregate.write_results_csv(killed)[1]) == strip(
      aggregate.write_results_csv(clean)[1])


def test_report_writes_plots_and_table(tmp_path):
  from ceu_jax.grid import report

  def cell(config, d):
    em = 0.5 + config.cer.lambda_ev / 4
    rows = []
    for cond, dt in (("clean", 0.3), ("delta=0.6", 0.6), ("delta=0.9", 0.9)):
      rows.append({"condition": cond, "delta_test": dt, "eta_test": 0.0, "n_test": 128,
                   "em": em - dt / 3, "em_lo": em - dt / 3 - 0.05, "em_hi": em - dt / 3 + 0.05,
                   "em_n": 100, "ceu_ev": em, "ceu_ev_lo": em - 0.1, "ceu_ev_hi": em + 0.1,
                   "supported_0.5": em / 2})
    return {"rows": rows}

  c = base_config()
  with c.cer.unlocked():
    c.cer.k = 2
    c.cer.alpha = 0.6
  runner.run_grid(c, str(tmp_path), cell, log=lambda s: None)
  _, rows, failures = aggregate.write_results_csv(str(tmp_path))
  results, _ = runner.load_results(str(tmp_path))
  path = report.write_report(str(tmp_path), rows, results, failures)
  text = open(path).read()
  assert "| attention | evidence | 1.0 | 0.6 | 2 |" in text
  for stem in ("em_ceu_vs_delta", "pareto_em_supported", "ceu_gain_per_forward_vs_k"):
    for ext in ("png", "pdf"):
      assert (tmp_path / "plots" / f"{stem}.{ext}").stat().st_size > 1000
  assert report.pareto_front(np.array([[0.5, 0.5], [0.6, 0.4], [0.4, 0.4]])).tolist() == [
      [0.5, 0.5], [0.6, 0.4]]
