"""Run an experiment grid: train, evaluate and audit every cell; aggregate; report.

  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke [--shard i/N]
  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke --aggregate_only

Aggregation uses the cells of the current config's grid; cells left under
<workdir>/cells/ by an earlier config are named in a warning and left out of
results.csv and report.md (`--include_other_cells` includes them, flagged).
"""
from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.grid import main as grid_main

_CONFIG = config_flags.DEFINE_config_file("config", None, "Grid config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Grid working directory.", required=True)
_SHARD = flags.DEFINE_string("shard", None, "Run every N-th cell: i/N.")
_AGG = flags.DEFINE_bool("aggregate_only", False, "Only merge finished cells and report.")
_OTHER = flags.DEFINE_bool("include_other_cells", False, "Also aggregate finished cells that "
                           "are not in the current grid config (flagged in the report).")


def main(argv):
  del argv
  grid_main.run(_CONFIG.value, _WORKDIR.value, shard=_SHARD.value,
                aggregate_only=_AGG.value, include_other_cells=_OTHER.value)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  cli.run(main)
