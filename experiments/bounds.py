"""Theorem-style bound plots T1–T3 on trained models (SPEC §7, issue #7).

  python -m experiments.bounds --config configs/bounds.py:tiny --workdir runs/bounds_tiny
  python -m experiments.bounds --config configs/bounds.py:full --workdir runs/bounds  # accelerator

Trains the config's models under <workdir>/models/ (finished ones are skipped on a
rerun), then writes <workdir>/plots/{t1,t2,t3}.{png,pdf}, <workdir>/bounds.md and
<workdir>/bounds.json. See ceu_jax/theory/experiment.py.
"""
from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.theory import experiment

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/bounds.py:<variant>",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (models, plots, report).")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
  experiment.run_bounds(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  cli.run(main)
