"""experiments.audit end to end on a micro ATR run: outputs, resume, stale parts.

Also the grid's cell function on the same micro run (train + audit per test
condition), which is what `experiments.grid` runs for every cell.
"""
import csv
import json
import os

import pytest

from ceu_jax import audit_job
from ceu_jax.grid import cell as cell_lib
from ceu_jax.train import load_trained_params, train_and_evaluate
from configs import atr_insert


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
  assert {"L_plus", "L_minus", "L_int_ev", "ceu_ev", "ceu_ctrl", "degenerate"} <= set(rows[0])
  assert {r["corruption"] for r in rows} == {"value_swap", "removal"}
  on_disk = json.load(open(os.path.join(out, "summary.json")))
  assert set(on_disk["corruptions"]) == {"value_swap", "removal"} == set(summary["corruptions"])
  ev = on_disk["corruptions"]["value_swap"]["ceu"]["ev"]["all"]["mean"]
  assert set(ev) == {"value", "ci_low", "ci_high", "n"}
  for name in ("value_swap", "removal"):
    assert os.path.getsize(os.path.join(out, "plots", f"ceu_hist_{name}.png")) > 1000
  assert any("16/16 examples audited" in line for line in logs)
  # A rerun reuses every finished part: the numbers are identical.
  again = audit_job.run_audit(config, workdir, data_dir=str(tmp_path), log=lambda s: None)
  assert again == summary


def test_stale_parts_from_other_params_are_discarded(trained, tmp_path):
  config, workdir = trained
  out = os.path.join(workdir, "audit")
  os.makedirs(os.path.join(out, "parts"), exist_ok=True)
  with open(os.path.join(out, "parts", "fingerprint.json"), "w") as f:
    json.dump({"params_digest": "something else"}, f)
  logs = []
  audit_job.run_audit(config, workdir, data_dir=str(tmp_path), log=logs.append)
  assert any("discarding its parts" in line for line in logs)


def test_bad_site_index_is_named(trained):
  config, _ = trained
  bad = micro_config()
  bad.cer.site = 5
  with pytest.raises(ValueError, match="cer.site"):
    audit_job.read_port(bad)


def test_grid_cell_rows_per_condition(trained):
  config, workdir = trained
  c = micro_config()
  c.grid = atr_insert.ml_collections.ConfigDict(dict(
      corruption="value_swap", eval_examples=16, eval_seed=7, delta_test=(0.3, 0.9),
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
    assert r["em_lo"] <= r["em"] <= r["em_hi"]


@pytest.mark.slow
def test_trained_attention_uses_its_evidence_and_not_a_control_span(tmp_path):
  """Issue #4 acceptance 4: the README's smoke-world attention run (bypass off).

  Mean CEU of a random non-evidence span of the evidence's length <= 0.05 and
  mean evidence CEU >= 0.5 under value swap (about 1 min on one CPU core).
  """
  from configs import smoke  # pylint: disable=g-import-not-at-top
  config, workdir = smoke.get_config(), str(tmp_path / "run")
  config.model.family, config.model.bypass = "attention", False
  config.eval.corruptions = ("value_swap",)
  train_and_evaluate(config, workdir)
  summary = audit_job.run_audit(config, workdir, log=lambda *_: None)
  ceu = summary["corruptions"]["value_swap"]["ceu"]
  assert ceu["ctrl"]["all"]["mean"]["value"] <= 0.05, ceu["ctrl"]["all"]["mean"]
  assert ceu["ev"]["all"]["mean"]["value"] >= 0.5, ceu["ev"]["all"]["mean"]
