"""The grid job: expand and validate, run this shard's cells, aggregate, report."""
from __future__ import annotations

import os
import time

import ml_collections

from ceu_jax.grid import aggregate, report, runner, validate


def run(config: ml_collections.ConfigDict, workdir: str, *, shard: str | None = None,
        aggregate_only: bool = False, cell_fn=None, log=print) -> dict:
  """Run (or only aggregate) a grid; returns counts, paths and failures."""
  start = time.time()
  counts = {}
  if not aggregate_only:
    if cell_fn is None:
      from ceu_jax.grid.cell import run_cell
      cell_fn = run_cell
    counts = runner.run_grid(config, workdir, cell_fn, shard=shard,
                             validate=validate.validate_cell, log=log)
  csv_path, rows, failures = aggregate.write_results_csv(workdir)
  results, _ = runner.load_results(workdir)
  report_path = report.write_report(workdir, rows, results, failures)
  log(f"[grid] wrote {csv_path} ({len(rows)} rows), {report_path} and "
      f"{os.path.join(workdir, 'plots')}/ in {time.time() - start:.0f}s")
  for f in failures:
    log(f"[grid] FAILED cell {f['index']} {f['cell_id']}: {f['error']}")
  return dict(counts=counts, rows=len(rows), failures=len(failures),
              results_csv=csv_path, report=report_path)
