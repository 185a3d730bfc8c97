r"""Train a retrieval model (optionally with the CER objective) and evaluate it.

  python -m experiments.train --config configs/atr_insert.py:tiny --workdir /tmp/atr
  python -m experiments.train --config configs/atr_insert.py:tiny,bypass=true \
      --config.cer.regularizer=evidence --workdir /tmp/atr_cer

Rerunning with the same --workdir resumes from the latest committed checkpoint.
Exit codes: 0 done; 75 stopped by SIGTERM/SIGINT after saving a checkpoint at
the step boundary (rerun to resume); 65 diverged (non-finite loss/gradients;
<workdir>/status.json names the step); 1 any other error (e.g. a bad config:
the ValueError names the field).
"""
from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from ceu_jax.train import loop
from ceu_jax.train import sharding

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and status.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
  sharding.maybe_initialize_distributed()
  try:
    loop.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except loop.Preempted as e:
    logging.warning("%s; exiting with code %d", e, loop.EXIT_PREEMPTED)
    logging.flush()
    sys.exit(loop.EXIT_PREEMPTED)
  except loop.Diverged as e:
    logging.error("training diverged: %s", e)
    print(f"training diverged: {e}", file=sys.stderr)
    logging.flush()
    sys.exit(loop.EXIT_DIVERGED)


if __name__ == "__main__":
  app.run(main)
