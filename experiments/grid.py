"""Run an experiment grid: train, evaluate and audit every cell; aggregate; report.

  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke [--shard i/N]
  python -m experiments.grid --config configs/smoke.py --workdir runs/smoke --aggregate_only
"""
from absl import app, flags
from ml_collections import config_flags

from ceu_jax.grid import main as grid_main

_CONFIG = config_flags.DEFINE_config_file("config", None, "Grid config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Grid working directory.", required=True)
_SHARD = flags.DEFINE_string("shard", None, "Run every N-th cell: i/N.")
_AGG = flags.DEFINE_bool("aggregate_only", False, "Only merge finished cells and report.")


def main(argv):
  del argv
  grid_main.run(_CONFIG.value, _WORKDIR.value, shard=_SHARD.value,
                aggregate_only=_AGG.value)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
