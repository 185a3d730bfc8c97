r"""Teacher-forced verdicts of a fine-tuned checklist reader (issue #35): did it learn to grade?

  python -m experiments.checklist_verdicts --config configs/smollm2_checklist.py:cpu,regime=faithful,tool=true \
      --workdir runs/med_ft_tool/train/faithful_tool [--prompts no_tool] [--items audit] [--n 40]

The reader is the workdir's newest checkpoint (the config's model and lora fields must be the
workdir's); the gold answer of each checklist is fed after its prompt and the verdict of each
line read from the next-token distribution (`ceu_jax.audits.mediator.teacher_forced`). One
line is printed; --out writes the numbers (per item too) as JSON.
"""
from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax import code_version
from ceu_jax import io
from ceu_jax.audits.mediator import teacher_forced

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "configs/smollm2_checklist.py:<variant>",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "A checklist fine-tune's workdir.")
flags.DEFINE_enum("prompts", "same", teacher_forced.PROMPTS,
                  "The reader's own prompt, or with / without the tool instruction.")
flags.DEFINE_enum("items", "held_out", teacher_forced.ITEMS,
                  "The fine-tune's held-out checklists or the mediator audit's.")
flags.DEFINE_integer("n", 0, "The first n checklists (0: all).")
flags.DEFINE_string("out", "", "JSON file for the numbers ('': none).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"too many command-line arguments: {argv[1:]}")
  out = teacher_forced.run(FLAGS.config, FLAGS.workdir, prompts=FLAGS.prompts,
                           items=FLAGS.items, n=FLAGS.n)
  if FLAGS.out:
    io.write_json_atomic(FLAGS.out, dict(out, config=FLAGS.config.to_dict(),
                                         code=code_version.code_version()))


if __name__ == "__main__":
  cli.run(main)
