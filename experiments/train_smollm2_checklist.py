r"""Fine-tune SmolLM2-135M (LoRA) on World B's checklists, then its competence check (issue #35).

  python -m experiments.train_smollm2_checklist --config configs/smollm2_checklist.py:tiny,regime=faithful --workdir /tmp/ck
  python -m experiments.train_smollm2_checklist --config configs/smollm2_checklist.py:cpu,regime=shortcut \
      --workdir runs/checklist_ft_shortcut

Training is the project's loop (`ceu_jax.train.loop.train_and_evaluate` with
`ceu_jax.audits.mediator.finetune.SmolLM2ChecklistTask`): the same workdir files, resume, exit
codes (75 after SIGTERM with a checkpoint saved, 65 on a non-finite loss). A workdir holding a
completed run is not retrained. The competence check (the mediator audit on held-out
checklists: checklist accuracy, decision parse rate, F_ID, CNF consistency) is printed and
written to W/competence.json.
"""
from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.audits.mediator import competence
from ceu_jax.train import loop

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "configs/smollm2_checklist.py:<variant>",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and competence.json.")
flags.DEFINE_bool("fresh", False, "Move an earlier run aside and start from step 0.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"too many command-line arguments: {argv[1:]}")
  with loop.exit_codes():
    competence.run(FLAGS.config, FLAGS.workdir, fresh=FLAGS.fresh)


if __name__ == "__main__":
  cli.run(main)
