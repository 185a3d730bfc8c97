"""SmolLM2-135M-Instruct on factual QA: EM / F1 open book vs closed book, copy rate.

  python -m experiments.reader_eval --config configs/reader_eval.py --workdir W
Writes W/rows.csv, W/summary.json and W/table.md; interrupt and rerun freely
(finished chunks under W/chunks are kept).
"""
from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.readers import factqa_eval

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Reader-eval config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)


def main(argv):
  del argv
  s = factqa_eval.run_reader_eval(_CONFIG.value, _WORKDIR.value)
  print(f"items {s['n_items']}, skipped (too long) {len(s['skipped_too_long'])}")
  print(factqa_eval.markdown_table(s['groups']), end='')


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(main)
