"""Answer-presence audit and five-sentinel panel (SPEC §8.1, issue #16).

  python -m experiments.answer_presence --config configs/answer_presence.py[:tiny] --workdir W

The config selects the world (World A: ATR readers; World B: SmolLM2 on NQ /
SQuAD; generated records with oracle readers) and its readers. Writes
W/rows.csv, W/scores.csv, W/summary.json, W/report.md and the figures;
interrupt and rerun freely (finished chunks under W/chunks are kept).
"""
from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.audits.answer_presence import job
from ceu_jax.metrics.resampling import fmt_ci

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Answer-presence config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)


def main(argv):
  del argv
  from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
  with loop.exit_codes():   # a reader's training stopped by SIGTERM: 75, resumable
    s = job.run_answer_presence(_CONFIG.value, _WORKDIR.value)
  for b, x in s['baselines'].items():
    if b != 'B1':
      print(f"{b}: {x['n_kept']} records, skipped {x['skipped'] or 'none'}, buckets {x['buckets']}")
  for name, r in s['readers'].items():
    for b, cell in r['cells'].items():
      d = cell['delta_causal']
      print(f"{name} {b}: Δcausal {fmt_ci(d, 2, signed=True, missing='n/a')} (n={d['n']})")
    if r['panel']:
      print(f"{name} sentinel panel: {r['panel']['verdicts']['text']}")
  print(f"report: {_WORKDIR.value}/report.md ({s['produced_by']['wall_s_this_run']:.0f} s this run)")


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(main)
