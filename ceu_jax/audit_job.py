"""`experiments.audit`: audit the checkpoint in a training workdir (SPEC §1, §5).

The rows come from the one `Auditor` (`ceu_jax.auditor`) on the device mesh of
`config.sharding`, as in training: each eval batch split over the axes the
logical 'batch' axis maps to, the parameters laid out as training lays them out
(replicated under pure data parallelism, split under model-parallel rules),
the model traced under the mesh and its logical axis rules. This module adds
what a job needs around it: resumable parts on disk, examples.csv,
summary.json and histograms. Layout under `out_dir` (W/audit by default):
  parts/fingerprint.json      what the parts were computed from (checkpoint digest,
                              eval-set identity, site, settings); parts of another
                              fingerprint are discarded, never mixed
  parts/<corruption>/<i>.npz  finished batch i (written atomically)
  examples.csv                one row per (corruption, example)
  summary.json                {settings: fingerprint, corruptions: {name: summary}}
  plots/ceu_hist_<corruption>.{png,pdf}
"""
from __future__ import annotations

import contextlib
import csv
import io as _io
import os
import shutil
from typing import Any, Iterator, Mapping, Optional

import flax.linen as nn
import jax
import numpy as np
from matplotlib.figure import Figure

from ceu_jax import io, plotting
from ceu_jax import workdir as workdir_lib
from ceu_jax import retrieval_adapter as adapter
from ceu_jax.auditor import (AuditedModel, Auditor, AuditSettings, Rows, audited_model,
                             eval_set)
from ceu_jax.data import evalsets
from ceu_jax.engine import placement

DATA_DIR_ENV = "CEU_JAX_DATA_DIR"
EXAMPLE_FIELDS = ("example_id", "corruption", "correct", "has_evidence", "dis_found",
                  "L_plus", "L_minus", *(f"L_int_{p}" for p in adapter.PROBES),
                  *(f"ceu_{p}" for p in adapter.PROBES), "delta_L",
                  *(f"delta_{p}" for p in adapter.PROBES), "degenerate")


def default_data_dir() -> str:
  """Where fixed evaluation sets are materialised ($CEU_JAX_DATA_DIR or ~/.cache)."""
  return os.environ.get(DATA_DIR_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "ceu_jax", "evalsets")


class DiskParts:
  """Finished batches as parts/<corruption>/<i>.npz, valid for one fingerprint."""

  def __init__(self, out_dir: str, fingerprint: Mapping[str, Any], log=print):
    self.root = os.path.join(out_dir, "parts")
    path = os.path.join(self.root, "fingerprint.json")
    if os.path.exists(path) and io.read_json(path) != fingerprint:
      log(f"[audit] {path} describes another checkpoint / eval set / setting; "
          "discarding its parts")
      shutil.rmtree(self.root)
    if not os.path.exists(path):
      io.write_json_atomic(path, dict(fingerprint))

  def _path(self, corruption: str, index: int) -> str:
    return os.path.join(self.root, corruption, f"{index:05d}.npz")

  def get(self, corruption: str, index: int) -> Optional[Rows]:
    path = self._path(corruption, index)
    if not os.path.exists(path):
      return None
    with np.load(path) as part:
      return {k: part[k] for k in part.files}

  def put(self, corruption: str, index: int, rows: Rows) -> None:
    io.write_atomic(self._path(corruption, index), lambda f: np.savez(f, **rows))


def fingerprint(bundle: AuditedModel, settings: AuditSettings, variables: Any,
                data: evalsets.FixedEvalSet) -> dict:
  """What an audit's rows depend on (JSON)."""
  return dict(site=str(bundle.site), approximate_span=bundle.approximate,
              params_digest=evalsets.digest(variables), eval_set=dict(data.identity),
              batch_size=settings.batch_size, chunk_size=settings.chunk_size,
              eps=settings.eps, probe_seed=settings.probe_seed)


def audit_rows(bundle: AuditedModel, settings: AuditSettings, variables: Any,
               data: evalsets.FixedEvalSet, out_dir: str, *, batch_sharding: Any = None,
               log=print) -> tuple[dict[str, Rows], dict]:
  """(rows per corruption, fingerprint), resumable through parts under out_dir.
  `batch_sharding` splits each batch over a mesh (`Auditor`); the caller enters the
  mesh context (`on_mesh`)."""
  os.makedirs(out_dir, exist_ok=True)
  fp = fingerprint(bundle, settings, variables, data)
  if bundle.approximate:
    log(f"[audit] WARNING: the read port {bundle.site} has an approximate span "
        "decomposition; span CEU values are approximate")
  auditor = Auditor(bundle, settings, batch_sharding=batch_sharding)
  rows = auditor.rows(variables, data, parts=DiskParts(out_dir, fp, log), log=log)
  return rows, fp


@contextlib.contextmanager
def on_mesh(config: Any, bundle: AuditedModel, variables: Any
            ) -> Iterator[tuple[Any, Any]]:
  """`with on_mesh(config, bundle, host_variables) as (variables, batch_sharding):`
  the mesh of `config.sharding` entered (jax.set_mesh and the logical axis rules, as
  the training loop does), the parameters placed in training's layout, and the
  sharding that splits an eval batch over the batch axes."""
  from ceu_jax.train import sharding as sharding_lib  # pylint: disable=import-outside-toplevel
  from ceu_jax.train import task as task_lib  # pylint: disable=import-outside-toplevel
  mesh = sharding_lib.make_mesh(config.sharding)
  rules = sharding_lib.rules(config.sharding)
  dummy = task_lib.Task(audited=bundle, loss_cfg=None, seed=0).dummy_inputs
  layout = sharding_lib.param_shardings(bundle.model, dummy, mesh, rules)
  placed = dict(variables, params=jax.device_put(variables["params"], layout))
  with sharding_lib.mesh_context(mesh), nn.logical_axis_rules(rules):
    yield placed, sharding_lib.batch_sharding(config.sharding, mesh)


def run_audit(config, workdir: str, *, data_dir: str | None = None,
              use_workdir_config: bool = False, allow_config_change: Any = (),
              log=print) -> dict:
  """Audit the newest valid checkpoint of `workdir` on the config's fixed eval set;
  writes W/audit/ and returns the summary.

  First, before anything is built: `config` is checked against W/config.json (the
  config W was trained with; `ceu_jax.workdir.resolve_config`): a model field that
  differs, or a training field not in `allow_config_change`, raises
  WorkdirConfigError naming each; `use_workdir_config` audits with W's own config
  (then `config` may be None). A second audit of one workdir is refused while one
  runs (WorkdirLocked). Nothing in W outside W/audit/ is written or moved.
  summary.json records the checkpoint step audited, whether training completed
  (`train_run`), the eval set's identity and every declared config change.
  """
  from ceu_jax.train import config as train_config, load_checkpoint
  config, changes = workdir_lib.resolve_config(
      config, workdir, use_workdir_config=use_workdir_config, allow=allow_config_change,
      log=log)
  train_config.validate(config)
  with workdir_lib.WorkdirLock(workdir, "audit"):
    loaded = load_checkpoint(config, workdir)
    run = dict(loaded.run, checkpoint_step=loaded.step)
    log(f"[audit] {workdir}: checkpoint step {loaded.step} of {run['num_steps']}, "
        f"training status {run['status']!r}")
    if not run["completed"]:
      log(f"[audit] WARNING: {run['warning']}; auditing step {loaded.step}")
    bundle = audited_model(config)
    settings = AuditSettings.of_config(config)
    data = eval_set(config, data_dir=data_dir or default_data_dir())
    out_dir = os.path.join(workdir, "audit")
    with on_mesh(config, bundle, loaded.variables) as (variables, batch_sharding):
      log(f"[audit] mesh {dict(batch_sharding.mesh.shape)}: each batch of "
          f"{settings.batch_size} split {placement.num_shards(batch_sharding)} ways")
      rows, fp = audit_rows(bundle, settings, variables, data, out_dir,
                            batch_sharding=batch_sharding, log=log)
    produced_by = dict(train_run=_jsonable(run), config_changes=[
        dict(field=f, old=o, new=n, kind=k) for f, o, n, k in changes])
    return write_outputs(out_dir, rows, Auditor(bundle, settings).summarize(rows), fp,
                         produced_by=produced_by)


def _jsonable(run: Mapping[str, Any]) -> dict:
  return {k: (list(v) if isinstance(v, tuple) else v) for k, v in run.items()}


def examples_csv(all_rows: Mapping[str, Rows]) -> str:
  buf = _io.StringIO()
  w = csv.writer(buf, lineterminator="\n")
  w.writerow(EXAMPLE_FIELDS)
  for name, rows in sorted(all_rows.items()):
    for i in range(len(rows["example_id"])):
      w.writerow([name if f == "corruption" else _cell(rows[f][i]) for f in EXAMPLE_FIELDS])
  return buf.getvalue()


def _cell(v):
  if isinstance(v, (np.bool_, bool)):
    return int(v)
  if isinstance(v, (np.floating, float)):
    return "" if not np.isfinite(v) else f"{float(v):.6g}"
  return int(v)


def write_outputs(out_dir: str, all_rows: Mapping[str, Rows], summaries: Mapping[str, dict],
                  settings: Mapping[str, Any], produced_by: Mapping[str, Any] | None = None
                  ) -> dict:
  """examples.csv, summary.json and histograms; returns the summary. `produced_by`
  (e.g. the training run audited and declared config changes) is recorded beside
  the settings."""
  io.write_text_atomic(os.path.join(out_dir, "examples.csv"), examples_csv(all_rows))
  summary = dict(settings=dict(settings), **dict(produced_by or {}),
                 corruptions=dict(summaries))
  io.write_json_atomic(os.path.join(out_dir, "summary.json"), summary)
  plot_histograms(all_rows, os.path.join(out_dir, "plots"))
  return summary


def plot_histograms(all_rows: Mapping[str, Rows], plots_dir: str) -> list[str]:
  paths = []
  bins = np.linspace(0, 1, 21)
  for name, rows in sorted(all_rows.items()):
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for probe in adapter.PROBES:
      v = rows[f"ceu_{probe}"]
      keep = np.asarray(rows["has_evidence"], bool) & np.isfinite(v)
      if probe == adapter.DIS:
        keep &= np.asarray(rows["dis_found"], bool)
      v = v[keep]
      mean = f"{np.mean(v):.2f}" if len(v) else "n/a"
      ax.hist(v, bins=bins, alpha=0.5, label=f"{probe} (n={len(v)}, mean={mean})")
    ax.set_xlabel("CEU (fraction of the lost log-likelihood restored)")
    ax.set_ylabel("examples (count)")
    n_deg = int(np.sum(np.asarray(rows["degenerate"], bool)
                       & np.asarray(rows["has_evidence"], bool)))
    ax.set_title(f"CEU per probe under {name} ({n_deg} degenerate excluded)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths += plotting.save_figure(fig, os.path.join(plots_dir, f"ceu_hist_{name}"))
  return paths
