"""Aggregation of a grid workdir into W/results.csv (one row per cell x test condition).

Row schema (what a cell function returns per test condition):
  condition               name of the test condition ('clean', 'delta=0.6', ...)
  eta_test, delta_test, n_test   the test-time data knobs of that condition
  <metric>, <metric>_lo, <metric>_hi, <metric>_n   an aggregate with its 95% CI
      for metric in METRICS (em, ceu_ev, ceu_dis, ceu_control, supported_0.5, ...)
  time_*                  timing columns (differ between runs; excluded from equality)
Config columns are every leaf field of the cell config ('model.family', ...).
"""
from __future__ import annotations

import csv
import io as _io
import os
from typing import Iterable

from ceu_jax import io
from ceu_jax.grid import runner

METRICS = ("em", "nll", "ceu_ev", "ceu_dis", "ceu_control", "delta_L", "delta_ev", "delta_dis",
           "supported_0.25", "supported_0.5", "supported_0.75")
CONDITION_FIELDS = ("condition", "eta_test", "delta_test", "n_test")
ID_FIELDS = ("cell_id", "index")


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


def write_results_csv(workdir: str) -> tuple[str, list[dict], list[dict]]:
  """Merge every finished cell (from any shard) into W/results.csv, atomically."""
  results, failures = runner.load_results(workdir)
  rows = result_rows(results)
  path = os.path.join(workdir, "results.csv")
  io.write_text_atomic(path, to_csv(rows) if rows else "")
  return path, rows, failures


def read_results_csv(path: str) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))
