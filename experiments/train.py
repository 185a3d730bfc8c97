r"""Train a retrieval model (optionally with the CER objective) and evaluate it.

  python -m experiments.train --config configs/atr_insert.py:tiny --workdir /tmp/atr
  python -m experiments.train --config configs/atr_insert.py:tiny,bypass=true \
      --config.cer.regularizer=evidence --workdir /tmp/atr_cer

Rerunning with the same --workdir resumes from the latest committed checkpoint.
The workdir remembers its config: a rerun with another model is refused, and a
rerun with other training settings (steps, lr, regulariser, data knobs...) only
continues when declared, e.g. `--allow_config_change=train.num_steps` (recorded
in <workdir>/provenance.json). A workdir with an earlier run but no checkpoint is
not retrained from step 0 unless `--fresh` (which moves the old files to
<workdir>/previous/<time>/). A second `train` on the same workdir is refused.
Exit codes: 0 done; 75 stopped by SIGTERM/SIGINT after saving a checkpoint at
the step boundary (rerun to resume); 65 diverged (non-finite loss/gradients;
<workdir>/status.json names the step); 1 any other error: known ones (bad config,
workdir, checkpoint, data) as one line, the traceback with --verbosity=1.

Several processes (hosts) train one run together when the environment or the
flags describe a cluster: run the same command on every host with
JAX_COORDINATOR_ADDRESS=host0:port JAX_NUM_PROCESSES=N JAX_PROCESS_ID=i (or
--coordinator_address/--num_processes/--process_id), or under `srun` (SLURM is
detected); the workdir must be on a filesystem every host sees. README, "Many hosts".
"""
from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.train import cluster
from ceu_jax.train import loop

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and status.")
flags.DEFINE_bool("fresh", False, "Start from step 0 even though the workdir holds an "
                  "earlier run; its files are moved to <workdir>/previous/<time>/.")
flags.DEFINE_list("allow_config_change", [], "Training fields (dotted, or a section such as "
                  "'cer') that may differ from <workdir>/config.json on this rerun, e.g. "
                  "train.num_steps,cer.lambda_ev. Model fields can never change.")
_CLUSTER = cluster.define_flags("runs")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
  with loop.exit_codes():
    loop.train_and_evaluate(FLAGS.config, FLAGS.workdir, fresh=FLAGS.fresh,
                            allow_config_change=FLAGS.allow_config_change, cluster=_CLUSTER())


if __name__ == "__main__":
  cli.run(main)
