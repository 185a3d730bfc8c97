"""Run an experiment grid: train, evaluate and audit every cell; aggregate; report.

  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke [--shard i/N]
  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke --processes 2
  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke --aggregate_only

Many hosts sharing the workdir: host i of N runs `--shard i/N` (SLURM array:
`--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`); every cell runs on
exactly one host. A host killed mid-cell: rerun its shard (on any host); finished
cells are skipped, the interrupted one resumes from its checkpoint. README,
"Grid across hosts".

One CPU host with several cores: `--processes P` runs P worker processes that share
the cells (each takes the next cell no other holds; CPU backend only).

Aggregation uses the cells of the current config's grid; cells left under
<workdir>/cells/ by an earlier config are named in a warning and left out of
results.csv and report.md (`--include_other_cells` includes them, flagged).
"""
import sys

from absl import flags
from absl import logging
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.grid import main as grid_main

_CONFIG = config_flags.DEFINE_config_file("config", None, "Grid config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Grid working directory.", required=True)
_SHARD = flags.DEFINE_string("shard", None, "Run every N-th cell: i/N.")
_AGG = flags.DEFINE_bool("aggregate_only", False, "Only merge finished cells and report.")
_BUSY_WAIT = flags.DEFINE_float("busy_wait", 300.0, "Seconds to wait at the end of the "
                                "shard for cells locked by another process (a dead "
                                "host's lock expiring, or a live host finishing them).",
                                lower_bound=0.0)
_PROCESSES = flags.DEFINE_integer("processes", 1, "Worker processes on this host sharing "
                                  "the cells (CPU backend; one JAX process each).",
                                  lower_bound=1)
_OTHER = flags.DEFINE_bool("include_other_cells", False, "Also aggregate finished cells that "
                           "are not in the current grid config (flagged in the report).")


def main(argv):
  del argv
  from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
  try:
    grid_main.run(_CONFIG.value, _WORKDIR.value, shard=_SHARD.value,
                  aggregate_only=_AGG.value, include_other_cells=_OTHER.value,
                  busy_wait_s=_BUSY_WAIT.value, processes=_PROCESSES.value)
  except loop.Preempted as e:   # SIGTERM/SIGINT during a cell: rerun to resume it
    logging.warning("grid stopped: %s; rerun the same command to resume; exiting with "
                    "code %d", e, loop.EXIT_PREEMPTED)
    logging.flush()
    sys.exit(loop.EXIT_PREEMPTED)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  cli.run(main)
