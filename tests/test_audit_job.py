"""experiments.audit end to end on a micro ATR run: outputs, resume, stale parts.

Also the grid's cell function on the same micro run (train + audit per test
condition), which is what `experiments.grid` runs for every cell.
"""
import csv
import json
import os
import shutil

import pytest

from ceu_jax import audit_job
from ceu_jax.grid import cell as cell_lib
from ceu_jax.train import load_trained_params, train_and_evaluate
from configs import atr_insert


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def micro_config():
  c = atr_insert.get_config("tiny,context_len=64,steps=3")
  c.data.num_passages = 4
  c.data.n_ids = c.data.n_keys = c.data.n_values = 8
  c.train.batch_size = 8
  c.train.warmup_steps = 1
  c.train.eval_every = 3
  c.train.checkpoint_every = 3
  c.eval.num_examples = 16
  c.eval.batch_size = 8
  c.eval.corruptions = ("value_swap", "removal")
  return c


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("audit_job") / "run")
  config = micro_config()
  train_and_evaluate(config, workdir)
  return config, workdir


def test_audit_writes_rows_summary_plots_and_resumes(trained, tmp_path):
  config, workdir = trained
  logs = []
  summary = audit_job.run_audit(config, workdir, data_dir=str(tmp_path), log=logs.append)
  out = os.path.join(workdir, "audit")
  with open(os.path.join(out, "examples.csv")) as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 2 * 16
  assert {"L_plus", "L_minus", "L_int_ev", "ceu_ev", "ceu_control", "degenerate"} <= set(rows[0])
  assert {r["corruption"] for r in rows} == {"value_swap", "removal"}
  on_disk = json.load(open(os.path.join(out, "summary.json")))
  assert set(on_disk["corruptions"]) == {"value_swap", "removal"} == set(summary["corruptions"])
  ev = on_disk["corruptions"]["value_swap"]["ceu"]["ev"]["all"]["mean"]
  assert set(ev) == {"value", "ci_low", "ci_high", "n"}
  for name in ("value_swap", "removal"):
    assert os.path.getsize(os.path.join(out, "plots", f"ceu_hist_{name}.png")) > 1000
  assert any("value_swap: 16/16 examples" in line for line in logs)
  # What produced it: the checkpoint step audited, training completed, the eval set.
  run = on_disk["train_run"]
  assert run["checkpoint_step"] == config.train.num_steps and run["completed"] is True
  assert run["warning"] is None and on_disk["config_changes"] == []
  assert on_disk["settings"]["eval_set"]["seed"] == config.eval.seed
  assert on_disk["settings"]["eval_set"]["num_examples"] == 16
  # A rerun reuses every finished unit: the numbers are identical.
  again = audit_job.run_audit(config, workdir, data_dir=str(tmp_path), log=lambda s: None)
  assert again == summary
  assert json.load(open(os.path.join(out, "summary.json")))["produced_by"]["units_this_run"] == 0


def test_an_audit_of_other_params_moves_the_earlier_audit_aside(trained, tmp_path):
  config, trained_dir = trained
  workdir = str(tmp_path / "run")
  shutil.copytree(trained_dir, workdir, ignore=shutil.ignore_patterns("audit"))
  out = os.path.join(workdir, "audit")
  first = audit_job.run_audit(config, workdir, data_dir=str(tmp_path), log=lambda s: None)
  job_file = os.path.join(out, "job.json")
  rec = json.load(open(job_file))
  rec["config"]["params_digest"] = "something else"     # as if another checkpoint was audited
  with open(job_file, "w") as f:
    json.dump(rec, f)
  logs = []
  again = audit_job.run_audit(config, workdir, data_dir=str(tmp_path), log=logs.append)
  assert again == first
  assert any("held a run of another setting (params_digest 'something else' ->" in line
             and "moved it to" in line for line in logs)
  (stamp,) = os.listdir(os.path.join(out, "previous"))
  assert sorted(os.listdir(os.path.join(out, "previous", stamp, "units"))) == sorted(
      os.listdir(os.path.join(out, "units")))


def test_audit_of_a_run_stopped_early_warns_and_records_the_step(trained, tmp_path):
  config, trained_dir = trained
  workdir = str(tmp_path / "run")   # a copy of the module's micro run (same config), unaudited
  shutil.copytree(trained_dir, workdir, ignore=shutil.ignore_patterns("audit"))
  status = os.path.join(workdir, "status.json")
  st = json.load(open(status))
  st.update(status="preempted", step=4)
  with open(status, "w") as f:
    json.dump(st, f)
  logs = []
  summary = audit_job.run_audit(config, workdir, data_dir=str(tmp_path), log=logs.append)
  assert summary["train_run"]["completed"] is False
  assert "did not complete" in summary["train_run"]["warning"]
  assert any(line.startswith("[audit] WARNING: training did not complete") for line in logs)


def test_bad_read_port_index_is_named(trained):
  config, _ = trained
  bad = micro_config()
  bad.model.read_port = 5
  with pytest.raises(ValueError, match=r"model\.read_port must be an integer in \[-1, 0\]"):
    audit_job.run_audit(bad, "/nonexistent-workdir")


def test_grid_cell_rows_per_condition(trained):
  config, workdir = trained
  c = micro_config()
  c.grid = atr_insert.ml_collections.ConfigDict(dict(
      delta_test=(0.3, 0.9),
      n_test=(64, 128), eta_test=(0.0,)))
  names = [n for n, _ in cell_lib.test_conditions(c)]
  assert names == ["clean", "delta=0.9", "n=128"]
  out = cell_lib.run_cell(c, os.path.dirname(workdir) + "/cell",
                          train_fn=lambda cfg, d: {"step": 3},
                          load_fn=lambda cfg, d: load_trained_params(cfg, workdir),
                          log=lambda s: None)
  rows = out["rows"]
  assert [r["condition"] for r in rows] == names
  assert rows[2]["n_test"] == 128 and rows[1]["delta_test"] == 0.9
  for r in rows:
    assert 0.0 <= r["em"] <= 1.0 and r["em_n"] == 16
    assert r["approximate_span"] is (c.model.family == "memory_port")   # SPEC §2
    assert r["em_lo"] <= r["em"] <= r["em_hi"]
    # SPEC §5's calibration of the answer's probability, with its CI and n
    assert 0.0 <= r["ece_lo"] <= r["ece"] <= r["ece_hi"] <= 1.0 and r["ece_n"] == 16
    assert 0.0 <= r["brier_lo"] <= r["brier"] <= r["brier_hi"] <= 1.0 and r["brier_n"] == 16


def test_confidence_ece_and_brier_of_the_audit_equal_a_numpy_reference(trained):
  """SPEC §5: each audited example's confidence is the probability of its teacher-forced
  argmax answer (float64 numpy reference `teacher_forced_confidence` of the model's
  logits, 1e-5); the summary's ECE and Brier score are those of (confidence, EM)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ceu_jax import auditor as auditor_lib  # pylint: disable=g-import-not-at-top
  from ceu_jax.metrics import calibration  # pylint: disable=g-import-not-at-top
  config, workdir = trained
  variables = load_trained_params(config, workdir)
  bundle, data = auditor_lib.audited_model(config), auditor_lib.eval_set(config)
  auditor = auditor_lib.Auditor(bundle, auditor_lib.AuditSettings.of_config(config))
  rows = auditor.rows(variables, data)
  logits = np.asarray(bundle.model.apply(variables, *data.clean.model_inputs()))
  want = calibration.teacher_forced_confidence(logits, np.asarray(data.clean.answer))
  for corruption, r in rows.items():
    np.testing.assert_allclose(r["confidence"], want, rtol=1e-5, atol=1e-6, err_msg=corruption)
    got = auditor.summarize({corruption: r})[corruption]["calibration"]
    conf, correct = r["confidence"].astype(np.float64), r["correct"]
    assert got["ece"]["value"] == pytest.approx(calibration.ece(conf, correct), abs=1e-9)
    assert got["brier_binary"]["value"] == pytest.approx(
        float(np.mean((conf - correct) ** 2)), abs=1e-9)
    assert got["ece"]["n"] == got["brier_binary"]["n"] == 16
  assert 0.0 < want.min() and want.max() <= 1.0


def test_batches_rows_join_only_the_columns_every_batch_has():
  """A resumed audit may hold batches of an earlier version of the code without a newer
  column: it is left out, not mixed (`auditor.concat_rows`)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ceu_jax.auditor import concat_rows  # pylint: disable=g-import-not-at-top
  old = {"example_id": np.arange(2), "correct": np.array([True, False])}
  new = {"example_id": np.arange(2, 4), "correct": np.array([False, False]),
         "confidence": np.array([0.2, 0.9])}
  joined = concat_rows([old, new])
  assert list(joined) == ["example_id", "correct"]
  np.testing.assert_array_equal(joined["example_id"], [0, 1, 2, 3])
  assert set(concat_rows([new, new])) == set(new)


@pytest.mark.slow
def test_trained_attention_uses_its_evidence_and_not_a_control_span(tmp_path):
  """Issue #4 acceptance 4: the README's smoke-world attention run (bypass off).

  Mean CEU of a random non-evidence span of the evidence's length <= 0.05 and
  mean evidence CEU >= 0.5 under value swap (about 1 min on one CPU core).
  """
  from configs import smoke  # pylint: disable=g-import-not-at-top
  config, workdir = smoke.get_config("full,world=plain,steps=1000"), str(tmp_path / "run")
  config.model.family, config.model.bypass = "attention", False
  config.eval.corruptions = ("value_swap",)
  train_and_evaluate(config, workdir)
  summary = audit_job.run_audit(config, workdir, log=lambda *_: None)
  ceu = summary["corruptions"]["value_swap"]["ceu"]
  assert ceu["control"]["all"]["mean"]["value"] <= 0.05, ceu["control"]["all"]["mean"]
  assert ceu["ev"]["all"]["mean"]["value"] >= 0.5, ceu["ev"]["all"]["mean"]


def test_training_eval_audit_job_and_grid_give_identical_rows(trained, tmp_path):
  """One Auditor: the same checkpoint and eval set give the same rows and summary in the
  training-time evaluation, experiments.audit and a grid cell's 'clean' condition."""
  import numpy as np
  from ceu_jax import auditor as auditor_lib
  from ceu_jax.data import tasks
  from ceu_jax.train import evaluation
  from ceu_jax.train import task as task_lib
  config, workdir = trained
  variables = load_trained_params(config, workdir)
  evaluator = evaluation.Evaluator(config, task_lib.build_task(config))
  train_rows = evaluator.rows(variables["params"])
  summary = audit_job.run_audit(config, workdir, data_dir=str(tmp_path / "evalsets"),
                                log=lambda s: None)
  job_rows, _ = audit_job.audit_rows(
      auditor_lib.audited_model(config), auditor_lib.AuditSettings.of_config(config), variables,
      auditor_lib.eval_set(config, data_dir=str(tmp_path / "evalsets")),
      str(tmp_path / "again"), log=lambda s: None)
  grid_rows = cell_lib.audit_condition(config, variables, tasks.data_config(config.data))
  for name in config.eval.corruptions:
    assert set(train_rows[name]) == set(job_rows[name])
    for col in job_rows[name]:
      np.testing.assert_array_equal(train_rows[name][col], job_rows[name][col], err_msg=col)
  for col in grid_rows:
    np.testing.assert_array_equal(grid_rows[col], job_rows["value_swap"][col], err_msg=col)
  final = json.load(open(os.path.join(workdir, "eval_final.json")))
  assert final["eval_set"]["digest"] == summary["settings"]["eval_set"]["digest"]
  assert final["summary"] == json.loads(json.dumps(summary["corruptions"]))


def test_probe_chunk_does_not_change_the_rows(trained):
  """eval.probe_chunk: 'auto' (the engine's measured rule; here one chunk of the three
  probes ev, dis, control) and 2 (lax.map over two chunks, one padded) give the same
  rows: flags exactly, log-likelihoods and their differences at 1e-6, so the setting is
  free in the audit's record and in cell ids. The CEU ratios (L_int − L−) / (L+ − L−)
  amplify a float error δ of their ingredients by about (|L+| + |L−| + |L_int|) / gap:
  they are compared with that propagated bound, 1e-6 · (|L+| + |L−| + |L_int|) / gap
  + 1e-6 (as tests/test_sharded_audit.py does at 1e-5)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ceu_jax import auditor as auditor_lib  # pylint: disable=g-import-not-at-top
  config, workdir = trained
  variables = load_trained_params(config, workdir)
  bundle, data = auditor_lib.audited_model(config), auditor_lib.eval_set(config)
  auto = auditor_lib.AuditSettings.of_config(config)
  assert auto.probe_chunk == "auto"
  rows = {c: auditor_lib.Auditor(bundle, dataclasses.replace(auto, probe_chunk=c)).rows(
      variables, data) for c in ("auto", 2)}
  for corruption in data.corruptions:
    a, b = rows["auto"][corruption], rows[2][corruption]
    assert set(a) == set(b)
    gap = np.abs(a["L_plus"] - a["L_minus"])
    for col in a:
      if a[col].dtype == bool or col == "example_id":
        np.testing.assert_array_equal(b[col], a[col], err_msg=col)
      elif col.startswith("ceu_"):
        scale = np.abs(a["L_plus"]) + np.abs(a["L_minus"]) + np.abs(a[f"L_int_{col[4:]}"])
        bound = 1e-6 * scale / np.maximum(gap, 1e-12) + 1e-6
        assert np.array_equal(np.isnan(b[col]), np.isnan(a[col])), col
        ok = ~np.isnan(a[col])
        assert np.all(np.abs(b[col] - a[col])[ok] <= bound[ok]), col
      else:
        np.testing.assert_allclose(b[col], a[col], rtol=1e-6, atol=1e-6, err_msg=col)


def test_one_read_port_with_retrieval_layers_all(tmp_path):
  """model.read_port picks THE port f for training, audits and the grid alike."""
  import numpy as np
  from ceu_jax import auditor as auditor_lib
  from ceu_jax import engine
  from ceu_jax.data import tasks
  from ceu_jax.train import task as task_lib
  import architectures
  config = micro_config()
  config.model.retrieval_layers = "all"
  config.model.read_port = 0
  first = engine.Site("reader/block_0/retrieval", "read")
  assert task_lib.build_task(config).site == auditor_lib.audited_model(config).site == first
  assert architectures.read_port_sites(config.model)[-1] != first
  model = auditor_lib.audited_model(config).model
  variables = architectures.init_params(model, __import__("jax").random.PRNGKey(0))
  rows0 = cell_lib.audit_condition(config, variables, tasks.data_config(config.data))
  config.model.read_port = -1
  rows1 = cell_lib.audit_condition(config, variables, tasks.data_config(config.data))
  np.testing.assert_array_equal(rows0["L_plus"], rows1["L_plus"])     # same model
  assert not np.allclose(rows0["L_int_ev"], rows1["L_int_ev"])         # another port patched
