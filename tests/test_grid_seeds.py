"""Seeds of a grid (issue #19.3): mean ± sd over seeds per setting, against numpy."""
import csv

import numpy as np
import pytest

from ceu_jax.grid import aggregate, report, runner, seeds
from tests.test_grid_driver import _report_config


def _seed_cell(config, d):
  """EM and CEU_ev depend on the setting and, by a known offset, on the seed."""
  em = 0.5 + config.cer.lambda_ev / 4 + 0.01 * config.seed ** 2
  rows = []
  for cond, dt in (("clean", 0.3), ("delta=0.9", 0.9)):
    rows.append({"condition": cond, "delta_test": dt, "eta_test": 0.0, "n_test": 128,
                 "em": em - dt / 3, "em_lo": em - dt / 3 - 0.05, "em_hi": em - dt / 3 + 0.05,
                 "em_n": 100, "ceu_ev": em, "ceu_ev_lo": em - 0.1, "ceu_ev_hi": em + 0.1,
                 "ceu_ev_n": 90 - config.seed, "supported_0.5": em / 2})
  return {"rows": rows}


def _seeded_config(seeds_=(0, 1, 2)):
  c = _report_config()
  with c.unlocked():
    c.sweep = tuple(c.sweep) + ((("seed", seeds_),),)
  return c


@pytest.fixture
def grid(tmp_path):
  c = _seeded_config()
  runner.run_grid(c, str(tmp_path), _seed_cell, log=lambda s: None)
  _, rows, failures = aggregate.write_results_csv(str(tmp_path), c)
  results, _ = runner.load_results(str(tmp_path))
  return c, rows, results, failures, tmp_path


def test_by_setting_equals_numpy_over_seeds(grid):
  _, rows, results, _, _ = grid
  fields = seeds.setting_fields(results)
  assert "seed" not in fields and "model.family" in fields
  agg = seeds.by_setting(rows, fields)
  assert len(agg) == 6 * 2 and len(rows) == 18 * 2
  for a in agg:
    members = [r for r in rows if r["model.family"] == a["model.family"]
               and r["cer.regularizer"] == a["cer.regularizer"]
               and r["condition"] == a["condition"]]
    assert sorted(int(r["seed"]) for r in members) == [0, 1, 2] and a["n_seeds"] == 3
    for m in ("em", "ceu_ev", "supported_0.5"):
      vals = np.array([float(r[m]) for r in members])
      np.testing.assert_allclose(a[m], vals.mean(), rtol=1e-12)
      np.testing.assert_allclose(a[f"{m}_sd"], vals.std(ddof=1), rtol=1e-12)
      np.testing.assert_allclose([a[f"{m}_lo"], a[f"{m}_hi"]],
                                 [vals.mean() - vals.std(ddof=1), vals.mean() + vals.std(ddof=1)])
    assert a["ceu_ev_n"] == 88                     # the smallest n over the seeds
    assert a["em_seed_ci"].count("[") == 3


def test_one_seed_keeps_the_within_seed_ci(tmp_path):
  c = _seeded_config((5,))
  runner.run_grid(c, str(tmp_path), _seed_cell, log=lambda s: None)
  _, rows, _ = aggregate.write_results_csv(str(tmp_path), c)
  results, _ = runner.load_results(str(tmp_path))
  agg = seeds.by_setting(rows, seeds.setting_fields(results))
  for a, r in zip(sorted(agg, key=lambda a: (a["index"], a["condition"])),
                  sorted(rows, key=lambda r: (r["index"], r["condition"]))):
    assert a["n_seeds"] == 1 and np.isnan(a["em_sd"])
    assert (a["em"], a["em_lo"], a["em_hi"]) == (r["em"], r["em_lo"], r["em_hi"])
  assert seeds.spread_kind(agg) == "95% bootstrap CI within the one seed"


def test_repeated_seed_in_one_setting_is_an_error():
  rows = [{"condition": "clean", "index": i, "model.family": "ssm", "seed": 0, "em": 0.5}
          for i in range(2)]
  with pytest.raises(ValueError, match="repeated seed"):
    seeds.by_setting(rows, ["model.family"])


def test_report_shows_mean_sd_per_setting_and_every_seed(grid):
  c, rows, results, failures, tmp_path = grid
  path = report.write_report(str(tmp_path), rows, results, failures, config=c)
  text = open(path).read()
  assert "18 cells" in text and "6 settings with 3 seeds each" in text
  summary = text.split("## Summary over seeds")[1].split("## Every cell")[0]
  em = np.array([0.75 + 0.01 * s ** 2 for s in (0, 1, 2)]) - 0.1
  assert (f"| attention | evidence | 1.0 | 0.6 | 2 | 3 | {em.mean():.3f} ± "
          f"{em.std(ddof=1):.3f} |") in summary
  every = text.split("## Every cell")[1]
  assert "| attention | evidence | 1.0 | 0.6 | 2 | 2 | 100 |" in every   # seed column
  assert "± 1 sd over 3 seeds" in text
  with open(tmp_path / "results_seeds.csv", newline="") as f:
    table = list(csv.DictReader(f))
  assert len(table) == 12 and {r["seeds"] for r in table} == {"0 1 2"}
  for stem in ("em_ceu_vs_delta", "pareto_em_supported"):
    assert (tmp_path / "plots" / f"{stem}.png").stat().st_size > 1000


def test_strata_metrics_equal_numpy_on_the_subsets():
  """A cell's per-stratum columns (grid.cell.summarize_condition) against numpy on the
  masked examples; the degenerate share counts examples with evidence only."""
  from ceu_jax import auditor as auditor_lib  # pylint: disable=g-import-not-at-top
  from ceu_jax.grid import cell  # pylint: disable=g-import-not-at-top
  r = np.random.default_rng(0)
  n = 400
  has_ev = r.random(n) < 0.7
  mem = r.random(n) < 0.9
  L_plus = -r.random(n)
  L_minus = np.where(mem & (r.random(n) < 0.6), L_plus, L_plus - 1 - r.random(n))
  rows = dict(example_id=np.arange(n), correct=r.random(n) < 0.85, has_evidence=has_ev,
              dis_found=np.ones(n, bool), L_plus=L_plus, L_minus=L_minus,
              delta_L=L_plus - L_minus, degenerate=(L_plus - L_minus) < 1e-3)
  for probe in ("ev", "dis", "control"):
    rows[f"L_int_{probe}"] = L_minus + r.random(n) * (L_plus - L_minus)
    with np.errstate(invalid="ignore", divide="ignore"):
      rows[f"ceu_{probe}"] = np.where(rows["degenerate"], np.nan,
                                      (rows[f"L_int_{probe}"] - L_minus) / (L_plus - L_minus))
    rows[f"delta_{probe}"] = rows[f"L_int_{probe}"] - L_minus
  rows["stratum_memorised"] = has_ev & mem
  rows["stratum_evidence_only"] = has_ev & ~mem
  rows["stratum_no_evidence"] = ~has_ev
  settings = auditor_lib.AuditSettings(batch_size=64, probe_chunk=16, eps=1e-3,
                                       num_resamples=200)
  row, _ = cell.summarize_condition(rows, settings)
  ok = has_ev & ~rows["degenerate"]
  assert row["degenerate"] == pytest.approx((rows["degenerate"] & has_ev).sum() / has_ev.sum())
  for name in ("memorised", "evidence_only"):
    m = rows[f"stratum_{name}"]
    np.testing.assert_allclose(row[f"em_{name}"], rows["correct"][m].mean(), rtol=1e-12)
    assert row[f"em_{name}_n"] == m.sum()
    np.testing.assert_allclose(row[f"ceu_ev_{name}"], np.mean(rows["ceu_ev"][m & ok]),
                               rtol=1e-6)
    assert row[f"ceu_ev_{name}_n"] == (m & ok).sum()
    supported = rows["correct"] & ok & (np.nan_to_num(rows["ceu_ev"]) >= 0.5)
    np.testing.assert_allclose(row[f"supported_0.5_{name}"], supported[m].mean(), rtol=1e-12)
    assert row[f"degenerate_{name}"] == pytest.approx(rows["degenerate"][m].mean())
    assert row[f"em_{name}_lo"] <= row[f"em_{name}"] <= row[f"em_{name}_hi"]
  np.testing.assert_allclose(row["em"], rows["correct"].mean(), rtol=1e-12)
  np.testing.assert_allclose(row["em_no_evidence"], rows["correct"][~has_ev].mean(), rtol=1e-12)
  assert row["supported_0.5_no_evidence"] == 0.0 and "degenerate_no_evidence" not in row


def test_report_shows_accuracy_beside_evidence_use_per_stratum(tmp_path):
  """The H1 table: per setting, EM and supported rate overall and per stratum, mean ±
  sd over seeds, with the strata's example counts."""
  def cell_fn(config, d):
    em = 0.9 - 0.2 * config.cer.lambda_ev + 0.01 * config.seed
    sup = 0.3 + 0.3 * config.cer.lambda_ev
    row = {"condition": "clean", "delta_test": 0.3, "eta_test": 0.0, "n_test": 128,
           "em": em, "supported_0.5": sup, "degenerate": 0.5 - sup / 2,
           "em_memorised": em + 0.05, "em_memorised_n": 160,
           "supported_0.5_memorised": sup - 0.1, "degenerate_memorised": 0.6,
           "em_evidence_only": em - 0.3, "em_evidence_only_n": 20,
           "ceu_ev_evidence_only": 0.9, "ceu_ev_evidence_only_n": 18}
    return {"rows": [row]}
  c = _seeded_config((0, 1))
  runner.run_grid(c, str(tmp_path), cell_fn, log=lambda s: None)
  _, rows, failures = aggregate.write_results_csv(str(tmp_path), c)
  results, _ = runner.load_results(str(tmp_path))
  text = open(report.write_report(str(tmp_path), rows, results, failures, config=c)).read()
  table = text.split("## Accurate, but is the evidence used?")[1].split("## ")[0]
  em = np.array([0.7, 0.71])
  assert (f"| attention | evidence | 2 | {em.mean():.3f} ± {em.std(ddof=1):.3f} | "
          "0.600 ± 0.000 | 0.200 ± 0.000 | ") in table
  assert "[memorised] = evidence present, answer memorisable (ρ prior) (examples: 160)" in table
  assert "(examples: 20)" in table and "0.900 ± 0.000 (n≥18)" in table
