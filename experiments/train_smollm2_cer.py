r"""Fine-tune SmolLM2-135M on factual QA (baseline or CER), then evaluate it on held-out items.

  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:tiny --workdir /tmp/cer
  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:cpu,regularizer=none \
      --workdir runs/smollm2_ft_base

Training is the project's loop (`ceu_jax.train.loop.train_and_evaluate` with the
`ceu_jax.finetune.task.SmolLM2CERTask`): the same workdir files, resume,
exit codes (75 after SIGTERM with a checkpoint saved, 65 on a non-finite loss).
`--eval=base` evaluates the untrained base model instead (no training);
`--eval=none` only trains. Evaluation writes <workdir>/eval_{trained|base}/ (`cer_eval`).
The tables and the before/after layer profile of several runs, from their eval_*/ files
only (summary.json and the per-item rows in batches/; no model is loaded, nothing is
retrained): per-run metrics, robustness, the paired differences of every two runs on
their shared held-out items (later − earlier) and the H1 / H2 verdicts (`finetune.paired`):
  python -m experiments.train_smollm2_cer --config configs/smollm2_cer.py:cpu --workdir runs/report \
      --report=base=runs/smollm2_base/eval_base/summary.json,ft=runs/smollm2_ft/eval_trained/summary.json,cer=runs/smollm2_cer/eval_trained/summary.json
"""
from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.finetune import evaluate as cer_eval
from ceu_jax.train import loop

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "configs/smollm2_cer.py:<variant>",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and evaluation.")
flags.DEFINE_bool("fresh", False, "Move an earlier run aside and start from step 0.")
flags.DEFINE_list("allow_config_change", [], "Training fields that may differ from "
                  "<workdir>/config.json on this rerun.")
flags.DEFINE_enum("eval", "trained", ["trained", "base", "none"],
                  "Evaluate the trained checkpoint, the base model (no training), or nothing.")
flags.DEFINE_list("report", [], "Instead of training: label=path/to/eval_*/summary.json "
                  "entries; writes <workdir>/table.md (per-run tables, and the paired "
                  "differences of every pair on their shared items from the per-item rows "
                  "beside each summary) and layer_profiles.png of them. No model is loaded.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"too many command-line arguments: {argv[1:]}")
  if FLAGS.report:
    entries = [tuple(e.split("=", 1)) for e in FLAGS.report]
    bad = [e for e in entries if len(e) != 2]
    if bad:
      raise ValueError(f"--report entries must be label=path, got {bad[0]}")
    print(cer_eval.report(entries, FLAGS.workdir, seed=int(FLAGS.config.seed),
                          num_resamples=int(FLAGS.config.eval.num_resamples)))
    return
  with loop.exit_codes():
    cer_eval.run(FLAGS.config, FLAGS.workdir, fresh=FLAGS.fresh,
                 allow_config_change=FLAGS.allow_config_change, evaluate=FLAGS.eval)


if __name__ == "__main__":
  cli.run(main)
