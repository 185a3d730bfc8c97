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
