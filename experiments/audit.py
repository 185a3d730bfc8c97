"""Audit a trained checkpoint: CEU per probe on a fixed evaluation set.

  python -m experiments.audit --config configs/atr_insert.py:tiny --workdir W
Writes W/audit/examples.csv, W/audit/summary.json and W/audit/plots/; interrupt
and rerun freely (finished batches are kept).
"""
from absl import app, flags
from ml_collections import config_flags

from ceu_jax import audit_job

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints.",
                               required=True)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where eval sets are materialised "
                                "(default $CEU_JAX_DATA_DIR or ~/.cache/ceu_jax/evalsets).")


def main(argv):
  del argv
  summary = audit_job.run_audit(_CONFIG.value, _WORKDIR.value, data_dir=_DATA_DIR.value)
  for name, s in summary["corruptions"].items():
    ceu = s["ceu"]
    print(f"[audit] {name}: EM {_num(s['accuracy']['em']['value'])}, mean CEU_ev "
          f"{_stat(ceu['ev']['all']['mean'])}, control {_stat(ceu['control']['all']['mean'])}, "
          f"supported@0.5 {_num(s['supported_answer_rate'].get('0.5', {}).get('value'))}, "
          f"degenerate {s['n_degenerate']}")


def _num(x) -> str:
  return "n/a" if x is None else f"{x:.3f}"


def _stat(m: dict) -> str:
  """'value [ci_low, ci_high] (n=..)' to 3 decimals; n/a where no example counts."""
  return f"{_num(m['value'])} [{_num(m['ci_low'])}, {_num(m['ci_high'])}] (n={m['n']})"


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
