"""Aggregation of a grid workdir into W/results.csv (one row per cell x test condition).

Row schema (what a cell function returns per test condition):
  condition               name of the test condition ('clean', 'delta=0.6', ...)
  eta_test, delta_test, n_test   the test-time data knobs of that condition
  <metric>, <metric>_lo, <metric>_hi, <metric>_n   an aggregate with its 95% CI
      for metric in METRICS (em, ceu_ev, ceu_dis, ceu_control, supported_0.5, ...);
      degenerate (share of degenerate gaps among examples with evidence; no CI) and,
      for tasks with strata, <metric>_<stratum> (e.g. supported_0.5_memorised)
  time_*                  timing columns (differ between runs; excluded from equality)
Config columns are every leaf field of the cell config ('model.family', ...).
Only cells of the current grid config are aggregated: cells left in W/cells/ by an
earlier version of the config are named in a warning and excluded (or, asked to,
included and flagged in the report).
"""
from __future__ import annotations

import csv
import io as _io
import os
from typing import Iterable

import numpy as np

from ceu_jax import io
from ceu_jax.grid import runner
from ceu_jax.metrics.resampling import Aggregate

# Strata of a task's examples (ceu_jax.data.tasks.TaskSpec.strata; ATR-insert with a ρ
# prior: evidence present and the answer memorisable, or not) and the metrics each
# gets, as <metric>_<stratum> columns.
STRATA = ("memorised", "evidence_only", "no_evidence")
STRATUM_METRICS = ("em", "ceu_ev", "supported_0.5", "degenerate")
METRICS = ("em", "nll", "ece", "brier", "ceu_ev", "ceu_dis", "ceu_control", "ceu_ev_fixed",
           "ceu_dis_fixed", "ceu_control_fixed", "delta_L", "delta_ev", "delta_dis",
           "supported_0.25", "supported_0.5", "supported_0.75", "degenerate") + tuple(
               f"{m}_{s}" for s in STRATA for m in STRATUM_METRICS)
CONDITION_FIELDS = ("condition", "eta_test", "delta_test", "n_test")
ID_FIELDS = ("cell_id", "index")


CLEAN = "clean"   # the test condition of the training distribution (grid.cell)


def examples_path(cell_dir: str, condition: str = CLEAN) -> str:
  """A cell's per-item audit rows of one test condition: <cell>/audit/examples.csv for
  'clean' (the cell's audit), <cell>/conditions/<condition>/examples.csv for a shifted
  one (written since H3 pairs items; absent in cells of older runs)."""
  if condition == CLEAN:
    return os.path.join(cell_dir, "audit", "examples.csv")
  return os.path.join(cell_dir, "conditions", condition, "examples.csv")


def number(v) -> float:
  """A row's cell as a float (results.csv holds strings); NaN when empty or not a number."""
  try:
    return float(v)
  except (TypeError, ValueError):
    return np.nan


def row_aggregate(row: dict, metric: str) -> Aggregate:
  """<metric>, <metric>_lo, <metric>_hi, <metric>_n of a row as an Aggregate (NaN: absent)."""
  v, lo, hi, n = (number(row.get(k)) for k in (metric, f"{metric}_lo", f"{metric}_hi",
                                               f"{metric}_n"))
  some = lambda x: float(x) if np.isfinite(x) else None
  return Aggregate(some(v), some(lo), some(hi), int(n) if np.isfinite(n) else 0)


def result_rows(results: Iterable[dict]) -> list[dict]:
  rows = []
  for res in results:
    for row in res.get("rows", []):
      rows.append({"cell_id": res["cell_id"], "index": res["index"], **res["config"],
                   **row, "time_cell_wall_s": res.get("time_wall_s")})
  return rows


def column_order(rows: list[dict]) -> list[str]:
  keys = []
  for r in rows:
    keys.extend(k for k in r if k not in keys)
  ids = [k for k in ID_FIELDS if k in keys]
  cond = [k for k in CONDITION_FIELDS if k in keys]
  timing = sorted(k for k in keys if k.startswith("time_"))
  config = sorted(k for k in keys if "." in k and k not in timing)
  rest = [k for k in keys if k not in set(ids + cond + timing + config)]
  return ids + config + cond + rest + timing


def to_csv(rows: list[dict]) -> str:
  buf = _io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=column_order(rows), extrasaction="raise",
                          lineterminator="\n")
  writer.writeheader()
  for r in sorted(rows, key=lambda r: (r["index"], str(r.get("condition")))):
    writer.writerow({k: ("" if v is None else v) for k, v in r.items()})
  return buf.getvalue()


def split_current(results: list[dict], current_ids: set[str] | None
                  ) -> tuple[list[dict], list[dict]]:
  """(results of cells in the current grid, the others); None ids: all are current."""
  if current_ids is None:
    return list(results), []
  return ([r for r in results if r["cell_id"] in current_ids],
          [r for r in results if r["cell_id"] not in current_ids])


def current_cell_ids(config) -> set[str] | None:
  """Cell ids of the grid `config` expands to (None without a config)."""
  if config is None:
    return None
  from ceu_jax.grid import sweep  # pylint: disable=g-import-not-at-top
  return {c.cell_id for c in sweep.expand(config)}


def select_results(workdir: str, config=None, *, include_other_cells: bool = False,
                   log=print) -> tuple[list[dict], list[dict], list[dict]]:
  """(results, failures, other) of W/cells: `other` are cells (finished or failed) not in
  the current `config`'s grid; they are left out of results/failures with a warning
  unless `include_other_cells`."""
  results, failures = runner.load_results(workdir)
  ids = current_cell_ids(config)
  results, other = split_current(results, ids)
  failures, other_failed = split_current(failures, ids)
  other = other + other_failed
  if other:
    what = ", ".join(f"{r['cell_id']} ({_label(r)})" for r in other[:5])
    more = f" and {len(other) - 5} more" if len(other) > 5 else ""
    action = ("INCLUDED as asked (--include_other_cells)" if include_other_cells else
              "excluded from results.csv and report.md (--include_other_cells includes them)")
    log(f"[grid] WARNING: {len(other)} cells in {os.path.join(workdir, 'cells')} are not in "
        f"the current grid config (left by an earlier config): {what}{more}; {action}")
    if include_other_cells:
      results = sorted(results + [r for r in other if r.get("status") == "ok"],
                       key=lambda r: r["index"])
      failures = sorted(failures + [r for r in other if r.get("status") != "ok"],
                        key=lambda r: r["index"])
  return results, failures, other


def _label(res: dict) -> str:
  return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in res.get("overrides", [])) or "base"


def write_results_csv(workdir: str, config=None, *, include_other_cells: bool = False,
                      log=print) -> tuple[str, list[dict], list[dict]]:
  """Merge every finished cell (from any shard) of the current grid `config` into
  W/results.csv, atomically (without `config`: every cell under W/cells)."""
  results, failures, _ = select_results(workdir, config,
                                        include_other_cells=include_other_cells, log=log)
  path, rows = write_rows(workdir, results)
  return path, rows, failures


def write_rows(workdir: str, results: list[dict]) -> tuple[str, list[dict]]:
  """W/results.csv of these cell results (atomically); returns (path, rows)."""
  rows = result_rows(results)
  path = os.path.join(workdir, "results.csv")
  io.write_text_atomic(path, to_csv(rows) if rows else "")
  return path, rows


def read_results_csv(path: str) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))
