"""`experiments.audit`: audit the checkpoint in a training workdir (SPEC §1, §5).

The rows come from the one `Auditor` (`ceu_jax.auditor`) on the device mesh of
`config.sharding`, as in training: each eval batch split over the axes the
logical 'batch' axis maps to, the parameters laid out as training lays them out
(replicated under pure data parallelism, split under model-parallel rules),
the model traced under the mesh and its logical axis rules. This module is the
audit's job on the one job contract (`ceu_jax.jobs`). Layout under W/audit:
  job.json                    the fingerprint: what the units were computed from
                              (checkpoint digest, eval-set identity, site, settings);
                              an audit of another fingerprint moves the earlier one
                              to W/audit/previous/<time>/ (never mixed, never deleted)
  units/<corruption>_<i>.npz  finished batch i (written atomically)
  examples.csv                one row per (corruption, example)
  summary.json                {settings: fingerprint, train_run, config_changes,
                               corruptions: {name: summary}, produced_by}
  plots/ceu_hist_<corruption>.{png,pdf}
"""
from __future__ import annotations

import contextlib
import csv
import io as _io
import os
from typing import Any, Iterator, Mapping

import flax.linen as nn
import jax
import numpy as np

from ceu_jax import audit_config, io, jobs, multihost, plotting
from ceu_jax import sharding as sharding_lib
from ceu_jax import workdir as workdir_lib
from ceu_jax import retrieval_adapter as adapter
from ceu_jax.auditor import (AuditedModel, Auditor, AuditSettings, Rows, audited_model,
                             concat_rows, eval_set)
from ceu_jax.data import evalsets
from ceu_jax.engine import placement
from ceu_jax.engine.probes import DIS

DATA_DIR_ENV = "CEU_JAX_DATA_DIR"
EXAMPLE_FIELDS = ("example_id", "corruption", "correct", "has_evidence", "dis_found",
                  "L_plus", "L_minus", *(f"L_int_{p}" for p in adapter.PROBES),
                  *(f"ceu_{p}" for p in adapter.PROBES), "delta_L",
                  *(f"delta_{p}" for p in adapter.PROBES), "degenerate")


def default_data_dir() -> str:
  """Where fixed evaluation sets are materialised ($CEU_JAX_DATA_DIR or ~/.cache)."""
  return os.environ.get(DATA_DIR_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "ceu_jax", "evalsets")


class AuditJob(jobs.Job):
  """The audit of one checkpoint on the one job contract, in W/audit: a unit is one
  batch of the fixed eval set under one corruption (W/audit/units/<corruption>_<i>.npz).

  Its record is the fingerprint (`fingerprint`): a later audit of another checkpoint,
  eval set or setting moves the earlier audit to W/audit/previous/<time>/ (nothing
  is deleted, nothing is mixed)."""
  name = "audit"
  unit_format = "npz"
  mismatch = "move_aside"
  free_fields = ("probe_chunk",)    # how probes are batched: the rows do not depend on it

  def __init__(self, bundle: AuditedModel, settings: AuditSettings, variables: Any,
               data: evalsets.FixedEvalSet, *, batch_sharding: Any = None,
               produced_by: Mapping[str, Any] | None = None, fingerprint_: dict | None = None):
    super().__init__(fingerprint_ or fingerprint(bundle, settings, variables, data))
    if batch_sharding is not None:       # once, not per batch
      variables = placement.place_variables(variables, placement.check(batch_sharding))
    self.bundle, self.settings, self.variables, self.data = bundle, settings, variables, data
    self.auditor = Auditor(bundle, settings, batch_sharding=batch_sharding)
    self.produced_by = dict(produced_by or {})

  def plan(self, ctx):
    n, size = self.data.num_examples, self.settings.batch_size
    return [jobs.Unit(f"{c}_{i:05d}", (c, i, start)) for c in self.data.corruptions
            for i, start in enumerate(range(0, n, size))]

  def run_unit(self, ctx, spec):
    corruption, _, start = spec
    take = lambda t: jax.tree.map(lambda x: x[start:start + self.settings.batch_size], t)
    return self.auditor.batch_rows(self.variables, take(self.data.clean),
                                   take(self.data.corrupt[corruption]), corruption)

  def describe_unit(self, spec, result):
    corruption, _, start = spec
    return (f"{corruption}: {min(start + self.settings.batch_size, self.data.num_examples)}/"
            f"{self.data.num_examples} examples")

  def rows(self, results) -> dict[str, Rows]:
    out = {}
    for c in self.data.corruptions:
      got = [results[u.key] for u in self.plan(None) if u.spec[0] == c]
      out[c] = concat_rows(got)
    return out

  def summarize(self, ctx, results):
    self.last_rows = self.rows(results)     # audit_rows returns them
    return dict(settings=dict(self.config), **self.produced_by,
                corruptions=self.auditor.summarize(self.last_rows))

  def write(self, ctx, results, summary):
    rows = self.last_rows
    ctx.write_text("examples.csv", examples_csv(rows))
    if ctx.primary:
      plot_histograms(rows, ctx.path("plots"))


def params_digest(variables: Any) -> str:
  """The checkpoint digest of an audit's fingerprint: `evalsets.digest` of the
  variables' global values, the same on every process and equal to the one-process
  digest, wherever they are (host numpy, one device, or a mesh across processes with
  model-parallel parameters: gathered by `multihost.to_host`, so every process must
  call it)."""
  return evalsets.digest(multihost.to_host(variables))


def fingerprint(bundle: AuditedModel, settings: AuditSettings, variables: Any,
                data: evalsets.FixedEvalSet) -> dict:
  """What an audit's rows depend on (JSON); `variables` anywhere (`params_digest`)."""
  return dict(site=str(bundle.site), approximate_span=bundle.approximate,
              params_digest=params_digest(variables), eval_set=dict(data.identity),
              batch_size=settings.batch_size, probe_chunk=settings.probe_chunk,
              eps=settings.eps, probe_seed=settings.probe_seed)


def audit_rows(bundle: AuditedModel, settings: AuditSettings, variables: Any,
               data: evalsets.FixedEvalSet, out_dir: str, *, batch_sharding: Any = None,
               host_variables: Any = None, log=print) -> tuple[dict[str, Rows], dict]:
  """(rows per corruption, fingerprint), resumable in `out_dir` (the job contract).
  `batch_sharding` splits each batch over a mesh (`Auditor`); the caller enters the
  mesh context (`on_mesh`); `host_variables`: the same variables as host numpy (the
  fingerprint's digest; default `variables`)."""
  if bundle.approximate:
    log(f"[audit] WARNING: the read port {bundle.site} has an approximate span "
        "decomposition; span CEU values are approximate")
  fp = fingerprint(bundle, settings, variables if host_variables is None else host_variables,
                   data)
  job = AuditJob(bundle, settings, variables, data, batch_sharding=batch_sharding,
                 fingerprint_=fp)
  jobs.run_job(job, out_dir, log=log)
  return job.last_rows, fp


@contextlib.contextmanager
def on_mesh(config: Any, bundle: AuditedModel, variables: Any
            ) -> Iterator[tuple[Any, Any]]:
  """`with on_mesh(config, bundle, host_variables) as (variables, batch_sharding):`
  the mesh of `config.sharding` entered (jax.set_mesh and the logical axis rules, as
  the training loop does), the parameters placed in training's layout, and the
  sharding that splits an eval batch over the batch axes."""
  mesh = sharding_lib.make_mesh(config.sharding)
  rules = sharding_lib.rules(config.sharding)
  layout = sharding_lib.param_shardings(bundle.model, bundle.dummy_inputs, mesh, rules)
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
  (then `config` may be None). The audit itself is a job on the one job contract
  in W/audit (`AuditJob`): a second audit of one workdir is refused while one runs
  (WorkdirLocked), an audit of another checkpoint or setting moves the earlier one
  to W/audit/previous/. Nothing in W outside W/audit/ is written or moved.
  summary.json records the checkpoint step audited, whether training completed
  (`train_run`), the eval set's identity and every declared config change.
  """
  from ceu_jax.train import load_checkpoint  # the checkpoint format is training's
  if config is not None and not use_workdir_config:
    audit_config.validate(config, jax.device_count())   # bad values first, named
  if not os.path.isdir(workdir):
    raise workdir_lib.WorkdirError(f"{workdir} does not exist: give the workdir of a "
                                   "training run (experiments.train --workdir)")
  config, changes = workdir_lib.resolve_config(
      config, workdir, use_workdir_config=use_workdir_config, allow=allow_config_change,
      log=log)
  config = audit_config.upgrade(config)      # a config.json recorded before eval.eps
  audit_config.validate(config, jax.device_count())
  loaded = load_checkpoint(config, workdir)  # also checks what loading needs (train.*)
  run = dict(loaded.run, checkpoint_step=loaded.step)
  log(f"[audit] {workdir}: checkpoint step {loaded.step} of {run['num_steps']}, "
      f"training status {run['status']!r}")
  if not run["completed"]:
    log(f"[audit] WARNING: {run['warning']}; auditing step {loaded.step}")
  bundle = audited_model(config)
  settings = AuditSettings.of_config(config)
  data = eval_set(config, data_dir=data_dir or default_data_dir())
  if bundle.approximate:
    log(f"[audit] WARNING: the read port {bundle.site} has an approximate span "
        "decomposition; span CEU values are approximate")
  produced_by = dict(train_run=_jsonable(run), config_changes=[
      dict(field=f, old=o, new=n, kind=k) for f, o, n, k in changes])
  fp = fingerprint(bundle, settings, loaded.variables, data)   # host-local numpy
  with on_mesh(config, bundle, loaded.variables) as (variables, batch_sharding):
    log(f"[audit] mesh {dict(batch_sharding.mesh.shape)}: each batch of "
        f"{settings.batch_size} split {placement.num_shards(batch_sharding)} ways")
    job = AuditJob(bundle, settings, variables, data, batch_sharding=batch_sharding,
                   produced_by=produced_by, fingerprint_=fp)
    summary = jobs.run_job(job, os.path.join(workdir, "audit"), log=log)
  return {k: v for k, v in summary.items() if k != "produced_by"}


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
    fig = plotting.figure(figsize=(6, 4))
    ax = fig.subplots()
    for probe in adapter.PROBES:
      v = rows[f"ceu_{probe}"]
      keep = np.asarray(rows["has_evidence"], bool) & np.isfinite(v)
      if probe == DIS:
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
