"""Layer profile of causal evidence usage in pretrained SmolLM2-135M on NQ conflicts.

  python -m experiments.audit_pretrained --config configs/smollm2_nq.py --workdir W
Writes W/examples.csv, W/summary.json and W/plots/layer_profile.{png,pdf};
interrupt and rerun freely (finished batches under W/batches are kept).
"""
from absl import flags
from ml_collections import config_flags

from ceu_jax import cli
from ceu_jax.metrics.resampling import fmt_ci
from ceu_jax.pretrained import audit_nq

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Audit config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)


def _fmt(agg: dict) -> str:
  return fmt_ci(agg, signed=True, missing=f"n/a (n={agg['n']})")


def main(argv):
  del argv
  s = audit_nq.run_pretrained_audit(_CONFIG.value, _WORKDIR.value)
  print(f"pairs kept {s['pairs']['kept']}/{s['pairs']['items']}, audited {s['n_examples']}, "
        f"degenerate {s['n_degenerate']}; mean L+ {s['L_plus']['value']:.2f}, "
        f"L- {s['L_minus']['value']:.2f}")
  print('no valid span (probe absent, never filled): ' + ', '.join(
      f"{p} {v['count']}" for p, v in s['no_valid_span'].items()))
  print('layer  ' + '  '.join(f'{p:>24s}' for p in s['probes']))
  for e in s['per_layer']:
    print(f"{e['layer']:5d}  " + '  '.join(f"{_fmt(e[p]['ceu']):>24s}" for p in s['probes']))


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(main)
