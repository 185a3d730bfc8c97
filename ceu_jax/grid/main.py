"""The grid job: expand and validate, run this shard's cells, aggregate, report.

On N hosts sharing the workdir, host i runs `run(..., shard='i/N')`: the shards
partition the grid (ceu_jax.grid.runner); each host then aggregates what is
finished so far under W/aggregate.lock, one host at a time, so the last host to
finish writes results.csv and report.md with every cell.
"""
from __future__ import annotations

import os

import ml_collections

from ceu_jax import progress, xla_cpu
from ceu_jax.grid import aggregate, report, runner, sweep, validate, workers


AGGREGATE_WAIT_S = 600.0   # longest wait for another host's aggregation
CACHE_DIR = "jax_cache"    # W/jax_cache: compiled programs, reused by later cells and reruns
CACHE_MIN_COMPILE_S = 0.1  # programs that compile faster are not worth a cache entry


def use_compilation_cache(workdir: str) -> str:
  """Keep compiled programs in W/jax_cache (JAX's persistent compilation cache): the
  cells of one setting (seeds) and of the test conditions compile the same programs,
  and a rerun finds them too. A cache directory the user already set (e.g.
  JAX_COMPILATION_CACHE_DIR) wins. Returns the directory in use."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  if jax.config.jax_compilation_cache_dir:
    return jax.config.jax_compilation_cache_dir
  path = os.path.join(os.path.abspath(workdir), CACHE_DIR)
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_S)
  compilation_cache.set_cache_dir(path)
  compilation_cache.reset_cache()   # a cache checked before this call is looked up again
  return path


def run(config: ml_collections.ConfigDict, workdir: str, *, shard: str | None = None,
        aggregate_only: bool = False, include_other_cells: bool = False, cell_fn=None,
        validate_fn=None, busy_wait_s: float = 0.0, processes: int = 1, log=print) -> dict:
  """Run (or only aggregate) a grid; returns counts, paths and failures.

  Aggregation takes the cells of `config`'s grid only; cells under W/cells/ from an
  earlier config are named and left out unless `include_other_cells`. `busy_wait_s`:
  how long to wait at the end for cells locked by another process (runner.run_grid).
  `processes`: worker processes on this host sharing the shard's cells (CPU backend;
  `ceu_jax.grid.workers`). `cell_fn` / `validate_fn` replace the training cell and its
  config check (tests; with processes > 1 they must be picklable, module-level).
  """
  clock = progress.Progress(1)
  counts = {}
  if not aggregate_only and xla_cpu.one_thread_per_op():   # before JAX's backend starts
    log(f"[grid] XLA:CPU ops run on one thread per process ({xla_cpu.EIGEN_FLAG}=false)")
  if not aggregate_only and xla_cpu.one_piece_codegen():
    log(f"[grid] XLA:CPU compiles each program's code in one piece ({xla_cpu.CODEGEN_FLAG}=1)")
  workers.check_processes(processes)
  if aggregate_only:
    processes = 1
  cache = bool(config.get("grid", {}).get("compilation_cache", False))
  if not aggregate_only and cache:
    log(f"[grid] compiled programs are cached in {use_compilation_cache(workdir)}")
  if not aggregate_only:
    sweep.expand(config, validate=validate_fn or validate.validate_cell)  # before any worker
    pool = (workers.Workers(config, workdir, processes=processes, shard=shard,
                            cell_fn=cell_fn, validate_fn=validate_fn,
                            setup=use_compilation_cache if cache else None, log=log)
            if processes > 1 else None)
    if cell_fn is None:
      from ceu_jax.grid.cell import run_cell
      cell_fn = run_cell
    try:
      counts = runner.run_grid(config, workdir, cell_fn, shard=shard,
                               validate=validate_fn or validate.validate_cell,
                               busy_wait_s=busy_wait_s, worker=(0, processes), pool=pool,
                               log=log)
    finally:
      if pool is not None:
        pool.stop()          # only live workers: after an interrupt or error here
  os.makedirs(workdir, exist_ok=True)
  # One aggregation at a time: each reads the cells finished before it took the lock,
  # so the last host to finish writes the complete results.
  with runner.waiting_lock(os.path.join(workdir, "aggregate.lock"), "grid aggregation",
                           timeout_s=AGGREGATE_WAIT_S):
    results, failures, other = aggregate.select_results(
        workdir, config, include_other_cells=include_other_cells, log=log)
    csv_path, rows = aggregate.write_rows(workdir, results)
    report_path = report.write_report(
        workdir, rows, results, failures, config=config,
        other_cells=other if include_other_cells else (), excluded=() if
        include_other_cells else other)
  models = report.cpu_models(results)
  if len(models) > 1:   # e.g. a grid resumed on another host: float rounding differs
    log(f"[grid] WARNING: the cells were computed on {len(models)} kinds of CPU ("
        + "; ".join(f"{m}: {n} cells" for m, n in models.most_common())
        + "); XLA:CPU rounds differently on each, so a cell rerun elsewhere gives other "
        "numbers (report.md says so too)")
  claims_path = os.path.join(workdir, "claims.md")
  if os.path.exists(claims_path):
    with open(claims_path) as f:
      for line in f:
        if line.startswith("| H"):
          cells = [c.strip() for c in line.strip().strip("|").split("|")]
          log(f"[grid] {cells[0]}: {cells[2].strip('*')}")
  log(f"[grid] wrote {csv_path} ({len(rows)} rows), {report_path} and "
      f"{os.path.join(workdir, 'plots')}/ (elapsed {progress.fmt_duration(clock.elapsed())})")
  for f in failures:
    log(f"[grid] FAILED cell {f['index']} {f['cell_id']}: {f['error']}")
  return dict(counts=counts, rows=len(rows), failures=len(failures),
              results_csv=csv_path, report=report_path, other_cells=len(other))
