"""Answer-presence audit and five-sentinel panel (SPEC §8.1).

  python -m experiments.answer_presence --config configs/answer_presence.py[:tiny] --workdir W
Writes W/rows.csv, W/summary.json and W/report.md; interrupt and rerun freely
(finished chunks under W/chunks are kept).
"""
from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.audits import job

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Answer-presence config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)


def main(argv):
  del argv
  s = job.run_answer_presence(_CONFIG.value, _WORKDIR.value)
  print(f"records {s['n_kept']} of {s['n_records']}, skipped {s['skipped']}, "
        f"Δcausal {s['delta_causal']['value']}")
  if 'verdicts' in s:
    print(s['verdicts']['text'])


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(main)
