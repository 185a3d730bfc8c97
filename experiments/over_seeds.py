r"""The World B pair claims of one companion audit over training seeds (issue #35).

  python -m experiments.over_seeds --runs runs/traces_smollm2_ft,runs/traces_smollm2_ft_s1 \
      [--out runs/traces_over_seeds.json]

Each run is a finished `experiments.mediator` or `experiments.trace_sensitivity` workdir with
fine-tuned readers; they must differ only in `smollm2.train.seed` (e.g. the same command with
`--config.smollm2.train.seed=1` and another --workdir). Prints the claims table
(`ceu_jax.audits.over_seeds`); --out writes it as JSON with the runs and the code version.
"""
from __future__ import annotations

from absl import flags

from ceu_jax import cli
from ceu_jax.audits import over_seeds

FLAGS = flags.FLAGS
flags.DEFINE_list("runs", None, "Finished audit workdirs, one per training seed.")
flags.DEFINE_string("out", "", "JSON file for the claims ('': none).")
flags.mark_flags_as_required(["runs"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"too many command-line arguments: {argv[1:]}")
  _, text = over_seeds.run(FLAGS.runs, FLAGS.out or None)
  print(text, end="")


if __name__ == "__main__":
  cli.run(main)
