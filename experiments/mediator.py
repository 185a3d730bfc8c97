"""Faithfulness to an intermediate structure: F_ID, F_Strong, COR / CNF, tool (SPEC §8.3, issue #18).

  python -m experiments.mediator --config configs/mediator.py[:tiny] --workdir W

The config selects the world (World A: checklist ATR readers trained in three
regimes, with and without the tool; or the oracle readers on the same items).
Writes W/rows.csv, W/summary.json, W/report.md and the figures; interrupt and
rerun freely (finished chunks under W/chunks and trained readers under W/train
are kept).
"""
from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.audits.mediator import job as mediator_job
from ceu_jax.metrics.resampling import fmt_ci

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Mediator config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)


def main(argv):
  del argv
  from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
  with loop.exit_codes():   # a reader's fine-tune stopped by SIGTERM: 75, resumable
    s = mediator_job.run_mediator(_CONFIG.value, _WORKDIR.value)
  for name, x in s['settings'].items():
    f = lambda a: 'n/a' if a['value'] is None else f"{a['value']:.3f}"
    d = x['delta']
    dd = fmt_ci(d, signed=True, missing='n/a')
    print(f"{name}: F_ID {f(x['F_ID'])} F_Strong {f(x['F_Strong'])} Δ {dd} "
          f"(COR {x['n_COR']}, CNF {x['n_CNF']})")
  print(f"report: {_WORKDIR.value}/report.md ({s['produced_by']['wall_s_this_run']:.0f} s this run)")


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(main)
