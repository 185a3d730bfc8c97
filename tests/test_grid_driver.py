"""Grid driver: expansion, validation, skip/resume, shards, locks, failures, aggregation.

Uses a fake, deterministic cell function so the driver is tested on its own;
the end-to-end grid on real cells is tested in test_grid_e2e.py.
"""
import json
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
from ceu_jax.grid import plots as grid_plots

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


# Cell ids of configs/smoke.py:full as the main job's grid (runs/smoke, commit 9b8c54a)
# named its cells: a grid directory from then keeps its finished cells.
SMOKE_FULL_IDS = (
    "09bc78e4fdf4", "157e408a1e77", "22b316d4cad2", "28c9cdd91c05", "35e241b18960",
    "43430415ac50", "442e50ff8f4d", "79fb7bf1bf09", "7d36b873586e", "7fb1d371c67a",
    "8234bc5fd634", "8f262ed3003b", "908f6d0531c6", "acc13e2a8b94", "bd6fa4176d80",
    "d4d2dfbc016a", "ea8ce88f80ff", "fa3a869da03e")


def test_cell_ids_survive_new_eval_settings():
  """eval.probe_chunk and eval.eps (issue #34) left the main job's cell ids as they
  were; the probe chunk never enters an id (rows do not depend on it), an eval.eps
  other than cer.eps (the ε audits used before) makes another cell."""
  from configs import smoke  # pylint: disable=g-import-not-at-top
  cells = sweep.expand(smoke.get_config("full"))
  assert tuple(sorted(c.cell_id for c in cells)) == SMOKE_FULL_IDS
  config = cells[0].config
  with config.ignore_type():
    config.eval.probe_chunk = 4
  assert sweep.cell_id(config) == cells[0].cell_id
  config.eval.eps = 0.01
  assert sweep.cell_id(config) != cells[0].cell_id


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


def test_a_preempted_cell_stops_the_grid_and_is_not_recorded_as_failed(tmp_path):
  """SIGTERM during a cell's training (training raises Preempted after its
  checkpoint): the grid stops at that cell, writes no error.json, and a rerun runs it."""
  from ceu_jax.train import loop
  c = base_config()
  calls = []

  def cell(config, d):
    calls.append(config.model.family)
    if len(calls) == 2:
      raise loop.Preempted(7, 15)
    return fake_cell(config, d)

  with pytest.raises(loop.Preempted):
    runner.run_grid(c, str(tmp_path), cell, log=lambda s: None)
  results, failures = runner.load_results(str(tmp_path))
  assert len(results) == 1 and failures == []
  counts = runner.run_grid(c, str(tmp_path), cell, log=lambda s: None)
  assert counts["done"] == 5 and counts["skipped"] == 1 and counts["failed"] == 0


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
  assert f"pid {os.getpid()} on host" in proc.stdout   # the holder is named


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


def _report_cell(config, d):
  em = 0.5 + config.cer.lambda_ev / 4
  rows = []
  for cond, dt in (("clean", 0.3), ("delta=0.6", 0.6), ("delta=0.9", 0.9)):
    rows.append({"condition": cond, "delta_test": dt, "eta_test": 0.0, "n_test": 128,
                 "em": em - dt / 3, "em_lo": em - dt / 3 - 0.05, "em_hi": em - dt / 3 + 0.05,
                 "em_n": 100, "ceu_ev": em, "ceu_ev_lo": em - 0.1, "ceu_ev_hi": em + 0.1,
                 "ceu_ev_n": 90 - int(10 * dt), "supported_0.5": em / 2,
                 # over every example with the evidence, degenerate gaps as 0 (SPEC §5a)
                 "ceu_ev_fixed": 0.8 * em, "ceu_ev_fixed_lo": 0.8 * em - 0.05,
                 "ceu_ev_fixed_hi": 0.8 * em + 0.05, "ceu_ev_fixed_n": 95})
  return {"rows": rows}


def _report_config():
  c = base_config()
  with c.cer.unlocked():
    c.cer.k = 2
    c.cer.alpha = 0.6
  with c.unlocked():
    c.seed = 0
  return c


def test_report_writes_plots_and_table(tmp_path):
  from ceu_jax.grid import report
  c = _report_config()
  runner.run_grid(c, str(tmp_path), _report_cell, log=lambda s: None)
  _, rows, failures = aggregate.write_results_csv(str(tmp_path), c)
  results, _ = runner.load_results(str(tmp_path))
  path = report.write_report(str(tmp_path), rows, results, failures, config=c)
  text = open(path).read()
  # Every CEU mean with its n beside it: CEU_ev over the non-degenerate examples, and
  # beside it over every example with the evidence, degenerate gaps as 0 (SPEC §5a).
  assert "| em | ceu_ev (n) | ceu_ev_fixed (n) | ceu_dis (n) | supported_0.5 |" in text
  assert "| attention | evidence | 1.0 | 0.6 | 2 | 100 | 0.650 [0.600, 0.700] | " \
         "0.750 [0.650, 0.850] (n=87) | 0.600 [0.550, 0.650] (n=95) | – | 0.375 |" in text
  assert "a degenerate gap counted as 0 (SPEC §5a)" in text
  assert "| attention | evidence | delta=0.9 | 100 |" in text and "(n=81)" in text
  # It opens with what was run.
  head = text.split("## Summary")[0]
  assert "## What was run" in head and "6 cells" in head and "seed 0" in head
  assert "Test conditions (3): clean, delta=0.6, delta=0.9" in head
  # SPEC §2: memory_port's span CEUs are approximate, and the report says so (these rows
  # carry no flag, as a cell of an earlier version: the family's decomposition decides).
  assert ("**Approximate span CEU** (SPEC §2): the read port of memory_port restricts"
          in head)
  flagged = lambda v: report._approximate({"model.family": "memory_port",   # noqa: E731
                                           "approximate_span": v})
  assert flagged(True) and flagged("True") and not flagged(False) and not flagged("False")
  assert not report._approximate({"model.family": "attention"})
  assert report._approximate({"model.family": "memory_port", "approximate_span": ""})
  for stem in ("em_ceu_vs_delta", "pareto_em_supported"):
    for ext in ("png", "pdf"):
      assert (tmp_path / "plots" / f"{stem}.{ext}").stat().st_size > 1000
  # One k, one n and one η value: those plots are skipped, with the reason.
  for stem in ("ceu_gain_per_forward_vs_k", "em_ceu_vs_n", "em_ceu_vs_eta"):
    assert not (tmp_path / "plots" / f"{stem}.png").exists()
  notes = text.split("Not drawn:")[1]
  assert "k [2]" in notes and "[128.0]" in notes and "[0.0]" in notes
  assert grid_plots.pareto_front(np.array([[0.5, 0.5], [0.6, 0.4], [0.4, 0.4]])).tolist() == [
      [0.5, 0.5], [0.6, 0.4]]


def test_pareto_names_every_setting_in_a_legend_outside_the_axes(tmp_path):
  """No text on the points (labels cannot overlap): one legend entry per setting, to the
  right of the axes; error bars and nothing clipped (blank border in the image)."""
  import matplotlib.image
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from ceu_jax.grid import report
  rows = [{"condition": "clean", "index": i, "model.family": fam, "cer.lambda_ev": lam,
           "cer.alpha": 0.6, "cer.regularizer": "evidence", "em": em, "supported_0.5": sup,
           "em_lo": em - 0.05, "em_hi": em + 0.02}
          for i, (fam, lam, em, sup) in enumerate([
              ("attention", 0.0, 1.0, 1.0), ("attention", 10.0, 0.0, 0.0),
              ("ssm", 1.0, 0.99, 0.01), ("ssm", 0.5, 0.0, 1.0)])]
  fig, ax = grid_plots.pareto_figure(rows)
  FigureCanvasAgg(fig).draw()
  assert len(ax.texts) == 0
  legend = ax.get_legend()
  names = [t.get_text() for t in legend.get_texts()]
  assert sorted(names) == sorted(grid_plots.series_label(r) for r in rows)
  assert legend.get_window_extent().x0 >= ax.get_window_extent().x1
  png, _ = grid_plots.plot_pareto(rows, str(tmp_path / "p"))
  img = matplotlib.image.imread(png)
  for edge in (img[:, -1, :3], img[-1, :, :3], img[:, 0, :3], img[0, :, :3]):
    assert np.all(edge > 0.95)


def test_pareto_frontier_per_data_setting_and_k_gain_over_the_same_settings_baseline(tmp_path):
  """SPEC §6: the frontier is over (λ, α), so settings of another training η are another
  frontier; the k plot gains over the baseline of the same setting and is skipped when
  no CER cell has one."""
  def row(i, eta, reg, em, sup, k=1, ceu=0.5):
    return {"condition": "clean", "index": i, "model.family": "attention", "data.eta": eta,
            "cer.regularizer": reg, "cer.lambda_ev": 0.0 if reg == "none" else 1.0,
            "cer.k": k, "em": em, "supported_0.5": sup, "ceu_ev": ceu}
  rows = [row(0, 0.0, "none", 0.95, 0.3), row(1, 0.0, "evidence", 0.9, 0.6),
          row(2, 0.3, "none", 0.7, 0.5), row(3, 0.3, "evidence", 0.65, 0.7)]
  _, ax = grid_plots.pareto_figure(rows, frontier_by=("data.eta",))
  lines = [l for l in ax.get_lines() if len(l.get_xdata()) > 1]
  assert sorted(sorted(l.get_xdata()) for l in lines) == [[0.65, 0.7], [0.9, 0.95]]
  _, ax = grid_plots.pareto_figure(rows)             # one family, one frontier (as before)
  assert len([l for l in ax.get_lines() if len(l.get_xdata()) > 1]) == 1
  cer = [row(4, 0.0, "evidence", 0.9, 0.6, k=2, ceu=0.9),
         row(5, 0.0, "evidence", 0.9, 0.6, k=1, ceu=0.7)]
  fields = ["cer.k", "cer.lambda_ev", "cer.regularizer", "data.eta", "model.family"]
  with pytest.raises(grid_plots.Skipped, match="no CER cell has a baseline"):
    grid_plots.plot_k_gain(cer, str(tmp_path / "k"), fields)
  paths = grid_plots.plot_k_gain(cer + [rows[0]], str(tmp_path / "k"), fields)
  assert os.path.exists(paths[0])


def test_aggregation_excludes_cells_of_an_earlier_config(tmp_path):
  from ceu_jax.grid import main as grid_main
  old = base_config()
  runner.run_grid(old, str(tmp_path), fake_cell, log=lambda s: None)
  new = base_config()
  new.sweep = ((("model.family", ("attention", "ssm")),),
               (("cer.regularizer", ("none", "evidence")), ("cer.lambda_ev", (0.0, 1.0))))
  logs = []
  out = grid_main.run(new, str(tmp_path), aggregate_only=True, log=logs.append)
  assert out["rows"] == 8 and out["other_cells"] == 2     # memory_port cells left over
  warning = [l for l in logs if "WARNING" in l][0]
  assert "2 cells" in warning and "family=memory_port" in warning and "excluded" in warning
  csv_rows = aggregate.read_results_csv(str(tmp_path / "results.csv"))
  assert {r["model.family"] for r in csv_rows} == {"attention", "ssm"}
  text = (tmp_path / "report.md").read_text()
  assert "Cells not in the current config (excluded)" in text and "memory_port" in text
  logs.clear()
  out = grid_main.run(new, str(tmp_path), aggregate_only=True, include_other_cells=True,
                      log=logs.append)
  assert out["rows"] == 12 and "INCLUDED" in [l for l in logs if "WARNING" in l][0]
  assert "included as asked" in (tmp_path / "report.md").read_text()


def test_cells_of_two_cpu_models_are_flagged_in_the_log_and_the_report(tmp_path):
  from ceu_jax import code_version  # pylint: disable=g-import-not-at-top
  from ceu_jax.grid import main as grid_main
  config = base_config()
  runner.run_grid(config, str(tmp_path), fake_cell, log=lambda s: None)
  logs = []
  grid_main.run(config, str(tmp_path), aggregate_only=True, log=logs.append)
  assert not [l for l in logs if "kinds of CPU" in l]
  here = code_version.cpu_kind()
  assert f"CPU: {here} (every cell)." in (tmp_path / "report.md").read_text()
  path = sorted((tmp_path / "cells").glob("*/result.json"))[0]
  original = json.loads(path.read_text())
  # as if finished on another host: another model name, or the same name with other
  # instruction sets (two virtual machines both called "Intel(R) Xeon(R) Processor")
  for other, named in ((dict(cpu="Another CPU"), "Another CPU"),
                       (dict(cpu_features=["avx", "avx2", "fma"]), "[AVX2, 3 ISA flags #")):
    result = json.loads(json.dumps(original))
    result["versions"].update(other)
    path.write_text(json.dumps(result))
    logs.clear()
    grid_main.run(config, str(tmp_path), aggregate_only=True, log=logs.append)
    warning = [l for l in logs if "kinds of CPU" in l]
    assert len(warning) == 1 and "2 kinds of CPU" in warning[0], logs
    assert f"{here}: 5 cells" in warning[0] and named in warning[0], warning
    text = (tmp_path / "report.md").read_text()
    assert "**The cells were computed on 2 kinds of CPU**" in text


def test_grid_lines_have_elapsed_and_eta(tmp_path):
  logs = []
  runner.run_grid(base_config(), str(tmp_path), fake_cell, log=logs.append)
  done = [l for l in logs if ": done (" in l]
  assert len(done) == 6
  assert all("elapsed 0:00:" in l and "ETA " in l and "cells left" in l for l in done)
  assert "ETA 0:00:00, 0 cells left" in done[-1]
  assert "running (elapsed" in [l for l in logs if ": running" in l][0]


def test_cells_record_their_training_run_and_the_report_flags_partial_ones(tmp_path):
  import json
  from ceu_jax.grid import main as grid_main

  def cell(config, d):
    train = os.path.join(d, "train")
    short = config.model.family == "ssm"
    os.makedirs(os.path.join(train, "checkpoints", "810" if short else "3000"))
    with open(os.path.join(train, "config.json"), "w") as f:
      json.dump({"train": {"num_steps": 3000}}, f)
    with open(os.path.join(train, "status.json"), "w") as f:
      json.dump({"status": "preempted" if short else "completed",
                 "step": 810 if short else 3000}, f)
    return fake_cell(config, d)

  runner.run_grid(base_config(), str(tmp_path), cell, log=lambda s: None)
  grid_main.run(base_config(), str(tmp_path), aggregate_only=True, log=lambda s: None)
  results, _ = runner.load_results(str(tmp_path))
  runs = {r["config"]["model.family"]: r["train_run"] for r in results}
  assert runs["attention"]["completed"] and runs["attention"]["checkpoint_step"] == 3000
  assert not runs["ssm"]["completed"] and runs["ssm"]["checkpoint_step"] == 810
  text = (tmp_path / "report.md").read_text()
  assert "Checkpoints audited: step 3000, 810" in text
  assert "**2 cells did not complete training**" in text
  assert "status 'preempted' at step 810 of 3000" in text
