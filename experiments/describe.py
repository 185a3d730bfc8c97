"""Print, per family and preset: parameter count, read ports, span decomposition.

  python -m experiments.describe --config configs/atr_insert.py:tiny

Thin entry point: the table comes from `architectures.describe(config)`.
"""
from __future__ import annotations

from ml_collections import config_flags

import architectures
from ceu_jax import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)


def main(argv):
  del argv
  print(architectures.describe(_CONFIG.value))


if __name__ == "__main__":
  cli.run(main)
