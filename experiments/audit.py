"""Audit a trained checkpoint: CEU per probe on a fixed evaluation set.

  python -m experiments.audit --config configs/atr_insert.py:tiny --workdir W
  python -m experiments.audit --use_workdir_config --workdir runs/smoke/cells/<id>/train
Writes W/audit/examples.csv, W/audit/summary.json and W/audit/plots/; interrupt
and rerun freely (finished batches are kept).

The config is first compared with W/config.json (the config W was trained with):
any model or training field that differs is named and the audit refuses, touching
nothing; `--use_workdir_config` audits with W's own config, and
`--allow_config_change=data.delta` declares a deliberate difference. A second
audit of the same workdir is refused while one runs. Known errors (config,
workdir, checkpoint, data) print one line and exit 1; `--verbosity=1` shows the
traceback (and third-party INFO logs).

Several processes (hosts) audit one checkpoint together as they train it
(experiments.train): the same command on every host with the cluster in the
environment or the flags (--coordinator_address/--num_processes/--process_id, or
srun); the mesh of the config's `sharding` spans every process's devices, process 0
writes W/audit. docs/cluster.md, "Audits on a mesh".
"""
import jax
from absl import flags
from ml_collections import config_flags

from ceu_jax import audit_config, audit_job, cli
from ceu_jax.train import cluster
from ceu_jax.engine.probes import CONTROL, EV
from ceu_jax.metrics.resampling import fmt_ci

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (optional "
                                          "with --use_workdir_config).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints.",
                               required=True)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where eval sets are materialised "
                                "(default $CEU_JAX_DATA_DIR or ~/.cache/ceu_jax/evalsets).")
_USE_WORKDIR_CONFIG = flags.DEFINE_bool(
    "use_workdir_config", False, "Audit with <workdir>/config.json, the config the run was "
    "trained with (--config is then optional and ignored).")
_ALLOW = flags.DEFINE_list("allow_config_change", [], "Training fields (dotted) that may "
                           "differ from <workdir>/config.json, e.g. data.delta.")
_CLUSTER = cluster.define_flags("audits")


def main(argv):
  del argv
  procs = _CLUSTER()
  if _CONFIG.value is not None and not _USE_WORKDIR_CONFIG.value:
    audit_config.validate(_CONFIG.value)    # bad values first, before joining the cluster
  cluster.join(procs)
  summary = audit_job.run_audit(_CONFIG.value, _WORKDIR.value, data_dir=_DATA_DIR.value,
                                use_workdir_config=_USE_WORKDIR_CONFIG.value,
                                allow_config_change=_ALLOW.value)
  if jax.process_index() != 0:
    return
  for name, s in summary["corruptions"].items():
    ceu = s["ceu"]
    print(f"[audit] {name}: EM {_num(s['accuracy']['em']['value'])}, mean CEU_ev "
          f"{_stat(ceu[EV]['all']['mean'])}, control {_stat(ceu[CONTROL]['all']['mean'])}, "
          f"supported@0.5 {_num(s['supported_answer_rate'].get('0.5', {}).get('value'))}, "
          f"degenerate {s['n_degenerate']}")


def _num(x) -> str:
  return "n/a" if x is None else f"{x:.3f}"


def _stat(m: dict) -> str:
  """'value [ci_low, ci_high] (n=..)' to 3 decimals; n/a where no example counts."""
  return fmt_ci(m, with_n=True, missing="n/a")


if __name__ == "__main__":
  cli.run(main)
