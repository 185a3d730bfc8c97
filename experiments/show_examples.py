"""Print a few ATR-insert examples as text: D+, each corruption's D−, spans marked.

  python -m experiments.show_examples --config configs/atr_insert.py:tiny

The evidence span E(D+) is marked ⟦ ... ⟧ and tokens a corruption changed «tok».
The examples are the first ones of the config's fixed evaluation set (eval.seed).
Thin entry point: the text comes from `ceu_jax.data.render_text.show_examples`.
"""
from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.data import render_text

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_NUM = flags.DEFINE_integer("num", 3, "Number of examples to print.", lower_bound=1)


def main(argv: list[str]) -> None:
  del argv
  print(render_text.show_examples(_CONFIG.value, num=_NUM.value))


if __name__ == "__main__":
  cli.run(main)
