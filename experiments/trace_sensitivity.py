"""Causal sensitivity of reasoning traces (SPEC §8.2, issue #17).

  python -m experiments.trace_sensitivity --config configs/trace_sensitivity.py[:tiny] --workdir W

The config selects the world (World A: chained ATR with trace oracles; World B:
SmolLM2 with few-shot "Step i:" traces). Writes W/rows.csv, W/summary.json,
W/report.md (φ, ρ and the follow rate by domain × τ, by trace length and by k) and
W/rho_by_length.png/pdf; interrupt and rerun freely (finished chunks under
W/chunks are kept).
"""
from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.audits.traces import job as trace_job
from ceu_jax.audits.traces import summary as tsum

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Trace-sensitivity config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)


def main(argv):
  del argv
  from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
  with loop.exit_codes():   # a reader's fine-tune stopped by SIGTERM: 75, resumable
    s = trace_job.run_trace_sensitivity(_CONFIG.value, _WORKDIR.value)
  for name, r in s['readers'].items():
    a, i = r['all'], r['identity']
    print(f"{name}: φ {tsum.fmt(a['phi'])}, ρ {tsum.fmt(a['rho'])}, follow "
          f"{tsum.fmt(a['follow'])} (n={a['n']}, regen parse failures {a['n_regen_unparsed']}; "
          f"identity φ {tsum.fmt(i['phi'])}, identical {i['n_identical']}/{i['n']}; "
          f"parse failures {r['n_parse_failure']}/{r['n_items']})")
  if s.get('competence'):
    from ceu_jax.audits.traces.competence import fmt_competence
    for name, c in s['competence'].items():
      print(fmt_competence(name, c))
  print(f"report: {_WORKDIR.value}/report.md ({s['produced_by']['wall_s_this_run']:.0f} s this run)")


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(main)
