"""The grid job: expand and validate, run this shard's cells, aggregate, report."""
from __future__ import annotations

import os

import ml_collections

from ceu_jax import progress
from ceu_jax.grid import aggregate, report, runner, validate


def run(config: ml_collections.ConfigDict, workdir: str, *, shard: str | None = None,
        aggregate_only: bool = False, include_other_cells: bool = False, cell_fn=None,
        log=print) -> dict:
  """Run (or only aggregate) a grid; returns counts, paths and failures.

  Aggregation takes the cells of `config`'s grid only; cells under W/cells/ from an
  earlier config are named and left out unless `include_other_cells`.
  """
  clock = progress.Progress(1)
  counts = {}
  if not aggregate_only:
    if cell_fn is None:
      from ceu_jax.grid.cell import run_cell
      cell_fn = run_cell
    counts = runner.run_grid(config, workdir, cell_fn, shard=shard,
                             validate=validate.validate_cell, log=log)
  results, failures, other = aggregate.select_results(
      workdir, config, include_other_cells=include_other_cells, log=log)
  csv_path, rows = aggregate.write_rows(workdir, results)
  report_path = report.write_report(
      workdir, rows, results, failures, config=config,
      other_cells=other if include_other_cells else (), excluded=() if
      include_other_cells else other)
  log(f"[grid] wrote {csv_path} ({len(rows)} rows), {report_path} and "
      f"{os.path.join(workdir, 'plots')}/ (elapsed {progress.fmt_duration(clock.elapsed())})")
  for f in failures:
    log(f"[grid] FAILED cell {f['index']} {f['cell_id']}: {f['error']}")
  return dict(counts=counts, rows=len(rows), failures=len(failures),
              results_csv=csv_path, report=report_path, other_cells=len(other))
