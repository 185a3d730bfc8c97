"""`train_and_evaluate(config, workdir)`: the training loop.

Steps are numbered 1..train.num_steps; step s is the s-th optimiser update,
uses data batch s − 1 and rng fold_in(rng, s − 1), and a checkpoint at step s
holds the state after s updates. Files in the workdir:
  config.json      the config of the run (checked on every restart, ceu_jax.workdir:
                   model fields never change, training fields only when declared)
  provenance.json  history of starts, resumes (with declared/free config changes), --fresh
  status.json      {status: running|completed|preempted|diverged|failed, step,
                   checkpoint_step, num_steps, message}, rewritten at every checkpoint
  metrics.jsonl    train/eval metric lines (process 0), tensorboard/ likewise
  checkpoints/     orbax steps (latest N + best N by eval.best_metric)
  eval_final.json  summarize_audit of the final evaluation, per corruption
  .train.lock      held while a `train` runs: a second one on the workdir is refused
A workdir with signs of an earlier run (status, metrics, quarantined checkpoints)
but no checkpoint is never retrained from step 0 unless `fresh=True`, which moves
the earlier files to previous/<time>/ first.
Ends: normally (returns a dict); `Preempted` after SIGTERM/SIGINT (checkpoint
saved at the step boundary); `Diverged` at the first non-finite loss or
gradient (no checkpoint of that or a later step is written).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
from typing import Any, Iterable

import flax.linen as nn
import jax
import numpy as np
from absl import logging

from ceu_jax import multihost
from ceu_jax import progress as progress_lib
from ceu_jax import workdir as workdir_lib
from ceu_jax.train import checkpoint as ckpt_lib
from ceu_jax.train import cluster as cluster_lib
from ceu_jax.train import config as config_lib
from ceu_jax.train import evaluation
from ceu_jax.train import metric_writer
from ceu_jax import sharding as sharding_lib
from ceu_jax.train import state as state_lib
from ceu_jax.train import task as task_lib

EXIT_PREEMPTED = 75   # EX_TEMPFAIL: checkpoint saved after SIGTERM/SIGINT; rerun to resume
EXIT_DIVERGED = 65    # non-finite loss or gradient; status.json names the step


class Preempted(Exception):
  def __init__(self, step: int, signum: int):
    super().__init__(f"stopped by signal {signum} after step {step}; checkpoint saved")
    self.step, self.signum = step, signum


class Diverged(Exception):
  def __init__(self, step: int, message: str):
    super().__init__(message)
    self.step = step


@contextlib.contextmanager
def exit_codes():
  """For an entry point's `main` that trains (itself, or readers inside a job): a preempted
  run exits with EXIT_PREEMPTED (rerun the command to resume), a diverged one with
  EXIT_DIVERGED and its reason on stderr."""
  try:
    yield
  except Preempted as e:
    logging.warning("%s; rerun the same command to resume; exiting with code %d", e,
                    EXIT_PREEMPTED)
    logging.flush()
    sys.exit(EXIT_PREEMPTED)
  except Diverged as e:
    logging.error("training diverged: %s", e)
    print(f"training diverged: {e}", file=sys.stderr)
    logging.flush()
    sys.exit(EXIT_DIVERGED)


def _debug_kill(spec: str, point: str, step: int) -> None:
  """TEST ONLY (train.debug_kill): at `point` of `step`, SIGKILL this process, or for
  point 'sigterm' send it SIGTERM (handled: checkpoint at the step boundary)."""
  if spec and spec == f"{point}:{step}":
    sig = signal.SIGTERM if point == "sigterm" else signal.SIGKILL
    logging.warning("train.debug_kill: signal %d at %s", sig, spec)
    logging.flush()
    os.kill(os.getpid(), sig)


def _check_workdir(config: Any, workdir: str, fresh: bool,
                   allow_config_change: Iterable[str] | str) -> list:
  """--fresh: move an earlier run aside. Else: the changes from W/config.json's config
  (raises WorkdirConfigError for a model field or an undeclared training field)."""
  os.makedirs(workdir, exist_ok=True)
  if fresh and jax.process_index() == 0:
    moved = workdir_lib.move_aside(workdir)
    if moved:
      logging.warning("--fresh: moved the earlier run's files to %s", moved)
  if jax.process_count() > 1:   # the others read the workdir after process 0 changed it
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices("ceu_jax.train: workdir checked")
  stored = workdir_lib.read_config_json(workdir)
  if stored is None:
    return []
  return workdir_lib.check_config_change(stored, config, allow=allow_config_change,
                                         what=f"this workdir ({workdir})")


def _record_start(config: Any, workdir: str, start: int, changes: list) -> None:
  """Write config.json (the run's current config) and the start/resume event."""
  if jax.process_index() != 0:
    return
  path = os.path.join(workdir, workdir_lib.CONFIG_FILE)
  if changes or not os.path.exists(path):
    ckpt_lib.write_json_atomic(path, json.loads(config_lib.to_json(config)))
  for f, old, new, kind in changes:
    level = logging.WARNING if kind == "declared" else logging.INFO
    logging.log(level, "config change (%s) from step %d: %s %r -> %r", kind, start, f, old,
                new)
  workdir_lib.record_event(workdir, "resume" if start else "start", step=start,
                           changes=[list(c) for c in changes])


def _host(tree: Any) -> dict:
  return {k: np.asarray(v) for k, v in jax.device_get(tree).items()}


def train_and_evaluate(config: Any, workdir: str, *, model: nn.Module | None = None,
                       site: Any = None, fresh: bool = False,
                       allow_config_change: Iterable[str] | str = (),
                       cluster: cluster_lib.Cluster | None = None,
                       custom: task_lib.CustomTask | None = None) -> dict:
  """Train (or resume) the run of `config` in `workdir`; returns the final metrics.

  `cluster`: the processes that train together (`ceu_jax.train.cluster`; None = this
  process alone). Every process runs this function with the same config and workdir (a
  filesystem all of them see); the cluster is joined first, before any JAX use, the
  mesh spans every process's devices, process 0 writes the workdir's files and every
  process writes its shards of each checkpoint (Orbax).

  `fresh`: move an earlier run's files to W/previous/<time>/ and start from step 0.
  `allow_config_change`: training fields (dotted, or a section such as 'cer') that may
  differ from W/config.json's; the change is recorded in W/provenance.json.
  `model`/`site` replace the configured architecture (tests with toy models).
  `custom`: a `task.CustomTask` that supplies the config check, parameters, batches
  and objective instead of the retrieval-model task (periodic evaluation is then off:
  the task validates train.eval_every == 0 and evaluates its checkpoints itself).
  Raises ValueError (bad config), WorkdirConfigError (another config trained this
  workdir), WorkdirLocked (another `train` runs here), EarlierRunError (an earlier
  run without a checkpoint) before anything compiles.
  """
  check = config_lib.validate if custom is None else lambda c, n=None: custom.validate(c)
  check(config)                                   # before joining: errors come first
  cluster_lib.join(cluster)
  check(config, jax.device_count())
  with workdir_lib.maybe_lock(workdir, "train", enabled=jax.process_index() == 0):
    return _train(config, workdir, model, site, fresh, allow_config_change, custom)


def custom_init_fn(custom: task_lib.CustomTask, tx) -> Any:
  def init(rng: jax.Array) -> state_lib.TrainState:
    params = custom.init_params(rng)
    return state_lib.TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                                opt_state=tx.init(params))
  return init


def _refuse_earlier_run(config, workdir: str) -> None:
  """EarlierRunError when W has no checkpoint to resume from but shows an earlier run
  that got past its first checkpoint (a completed run whose checkpoints/ were deleted)."""
  evidence = workdir_lib.earlier_run_evidence(workdir, int(config.train.checkpoint_every))
  if evidence:
    raise workdir_lib.EarlierRunError(
        f"{workdir} has no checkpoint to resume from, but it shows an earlier run ("
        f"{'; '.join(evidence)}). Refusing to retrain from step 0 silently: rerun "
        "with --fresh to move the earlier files to "
        f"{workdir_lib.PREVIOUS_DIR}/<time>/ and start again, or use another --workdir")


def _train(config, workdir, model, site, fresh, allow_config_change, custom=None) -> dict:
  changes = _check_workdir(config, workdir, fresh, allow_config_change)
  if not fresh and not workdir_lib.checkpoint_steps(workdir):
    _refuse_earlier_run(config, workdir)   # before Orbax starts its threads
  if custom is not None and int(config.train.eval_every):
    raise ValueError("train.eval_every must be 0 for a custom task (it evaluates its "
                     f"checkpoints itself), got {config.train.eval_every}")
  task = task_lib.build_task(config, model, site) if custom is None else None
  t, seed = config.train, int(config.seed)
  mesh = sharding_lib.make_mesh(config.sharding)
  rules = sharding_lib.rules(config.sharding)
  batch_sharding = sharding_lib.batch_sharding(config.sharding, mesh)
  tx = state_lib.make_optimizer(t)
  init_fn = (state_lib.boxed_init_fn(task.model, tx, task.dummy_inputs) if custom is None
             else custom_init_fn(custom, tx))
  params_rng = jax.random.fold_in(jax.random.PRNGKey(seed), 0)
  train_rng = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
  abstract, shardings = sharding_lib.state_layout(init_fn, params_rng, mesh, rules)

  best_metric = str(config.eval.best_metric)
  ckpt = ckpt_lib.Checkpointer(workdir, keep_latest=int(t.keep_latest),
                               keep_best=int(t.keep_best), best_metric=best_metric,
                               best_mode=config_lib.BEST_METRICS[best_metric],
                               async_save=bool(t.async_checkpointing))
  num_steps = int(t.num_steps)
  try:
    restored = ckpt.restore(abstract)
    if restored is None and not fresh:     # every checkpoint was corrupt (quarantined)
      _refuse_earlier_run(config, workdir)
  except BaseException:
    ckpt.manager.close()
    raise
  if restored is None:
    state = sharding_lib.init_sharded(init_fn, params_rng, shardings, mesh, rules)
    start = 0
  else:
    state, start, _ = restored
    logging.info("resumed from checkpoint step %d", start)
  _record_start(config, workdir, start, changes)
  writer = metric_writer.MetricWriter(workdir)
  writer.truncate_after(start)
  status_extra = dict(num_steps=num_steps)
  ckpt_lib.write_status(workdir, "running", start,
                        checkpoint_step=start if restored is not None else None, **status_extra)

  if custom is None:
    train_step = state_lib.make_train_step(
        task.model, tx, task.site, task.loss_cfg, nan_step=int(t.debug_nan_step),
        state_shardings=shardings, batch_sharding=batch_sharding, axis_rules=rules,
        lr_schedule=state_lib.learning_rate_schedule(t), allow_approximate=task.approximate)
    next_batch = lambda i: task_lib.train_batch(task, i, int(t.batch_size))
  else:
    train_step = state_lib.make_train_step(
        None, tx, None, None, nan_step=int(t.debug_nan_step), state_shardings=shardings,
        batch_sharding=batch_sharding, axis_rules=rules,
        lr_schedule=state_lib.learning_rate_schedule(t), loss_fn=custom.loss,
        frozen=custom.frozen)
    next_batch = lambda i: custom.train_batch(i, int(t.batch_size))
  evaluator = None
  eval_metrics: dict = {}
  last_train: dict = {}
  last_eval: list = [-1, None]   # [step, rows] of the latest evaluation
  saved_at = start if restored is not None else -1
  kill = str(t.debug_kill)

  def committed() -> int | None:
    """The newest checkpoint step on disk (Orbax renames a step's folder on commit)."""
    steps = workdir_lib.checkpoint_steps(workdir)
    return steps[-1] if steps else None

  def save(step: int, metrics: dict) -> None:
    nonlocal saved_at
    ckpt.save(step, state, metrics)       # async: committed when the next save or close waits
    saved_at = step
    ckpt_lib.write_status(workdir, "running", step, checkpoint_step=committed(),
                          saving_step=step, **status_extra)
    _debug_kill(kill, "in_save", step)
    if kill == f"after_save:{step}":
      ckpt.wait()
      _debug_kill(kill, "after_save", step)

  def run_eval(step: int) -> dict:
    nonlocal evaluator
    tic = progress_lib.Progress(1)
    if evaluator is None:
      evaluator = evaluation.Evaluator(config, task, batch_sharding)
    logging.info("eval step %d: %d examples x %d corruptions (%s) ...", step,
                 int(config.eval.num_examples), len(config.eval.corruptions),
                 ", ".join(config.eval.corruptions))
    metrics, rows = evaluator.evaluate(
        state.params, log=lambda line: logging.info("eval step %d: %s", step, line))
    last_eval[:] = [step, rows]
    writer.write(step, "eval", metrics)
    logging.info("eval step %d: %s (%s)", step, ", ".join(
        f"{k}={v:.4g}" for k, v in metrics.items() if "/" not in k),
                 f"took {progress_lib.fmt_duration(tic.elapsed())}")
    return metrics, rows

  last_step = [start]

  def _loop() -> dict:
    nonlocal state, eval_metrics, last_train
    with sharding_lib.mesh_context(mesh), nn.logical_axis_rules(rules), \
        ckpt_lib.PreemptionHandler() as preempt:
      prog = progress_lib.Progress(num_steps, done=start)
      tic, tic_step = prog.clock(), start
      for step in range(start + 1, num_steps + 1):
        last_step[0] = step - 1
        batch = sharding_lib.shard_batch(next_batch(step - 1), batch_sharding)
        state, metrics = train_step(state, batch, train_rng)
        if not bool(jax.device_get(metrics["finite"])):
          host = _host(metrics)
          writer.write(step, "train", host)
          msg = (f"non-finite loss or gradient at step {step} (loss={float(host['loss'])}, "
                 f"grad_norm={float(host['grad_norm'])}); stopping without checkpointing it")
          ckpt.wait()
          ckpt_lib.write_status(workdir, "diverged", step, msg,
                                checkpoint_step=saved_at if saved_at >= 0 else None,
                                **status_extra)
          writer.close()
          logging.error(msg)
          raise Diverged(step, msg)
        _debug_kill(kill, "after_step", step)
        _debug_kill(kill, "sigterm", step)
        if step % int(t.log_every) == 0 or step == start + 1 or step == num_steps:
          last_train = _host(metrics)
          now = prog.clock()
          perf = {"perf/steps_per_sec": (step - tic_step) / max(now - tic, 1e-9)}
          tic, tic_step = now, step
          writer.write(step, "train", {**last_train, **perf})
          logging.info("step %d/%d loss=%.4f task_nll=%.4f grad_norm=%.3g (%.1f steps/s, %s)",
                       step, num_steps, float(last_train["loss"]),
                       float(last_train["task_nll"]), float(last_train["grad_norm"]),
                       perf["perf/steps_per_sec"], prog.update(step))
        evaluated = {}
        if int(t.eval_every) and (step % int(t.eval_every) == 0 or step == num_steps):
          eval_metrics, _ = run_eval(step)
          evaluated = eval_metrics
        if step % int(t.checkpoint_every) == 0 or step == num_steps:
          save(step, evaluated)
        if preempt.should_stop():
          if saved_at != step:
            save(step, evaluated)
          ckpt.close()
          ckpt_lib.write_status(workdir, "preempted", step,
                                f"signal {preempt.requested}; checkpoint saved at step {step}",
                                checkpoint_step=step, **status_extra)
          writer.close()
          raise Preempted(step, preempt.requested or 0)

      final_step = max(start, num_steps)
      if saved_at != final_step:
        save(final_step, eval_metrics)
      ckpt.close()
      result = {"step": final_step, "train": {k: float(v) for k, v in last_train.items()},
                "eval": eval_metrics}
      if int(t.eval_every):
        if last_eval[0] != final_step:
          eval_metrics, _ = run_eval(final_step)
        result["eval"] = eval_metrics
        result["final_eval"] = evaluator.final_summary(last_eval[1])
        if jax.process_index() == 0:
          ckpt_lib.write_json_atomic(os.path.join(workdir, "eval_final.json"),
                                     {"step": final_step, "periodic": eval_metrics,
                                      "eval_set": dict(evaluator.data.identity),
                                      "summary": result["final_eval"]})
    writer.close()
    ckpt_lib.write_status(workdir, "completed", final_step, checkpoint_step=final_step,
                          **status_extra)
    return result

  try:
    return _loop()
  except (Preempted, Diverged):
    raise
  except BaseException as e:  # status says why the run stopped, then re-raise
    ckpt_lib.write_status(workdir, "failed", last_step[0], f"{type(e).__name__}: {e}"[:2000],
                          checkpoint_step=committed(), **status_extra)
    raise


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
  variables: dict      # {'params': host numpy arrays} of the restored step
  step: int            # the checkpoint step restored (older than the newest if that is corrupt)
  meta: dict           # its meta item: digest, eval metrics at save time, save time
  run: dict            # ceu_jax.workdir.run_info(workdir): status, num_steps, completed, warning


def restore_read_only(config: Any, workdir: str, abstract: Any) -> tuple[Any, int, dict]:
  """(state, step, meta) of the newest valid checkpoint of `workdir`, laid out as
  `abstract`; read-only (nothing moved or pruned). CheckpointError if there is none."""
  best_metric = str(config.eval.best_metric)
  ckpt = ckpt_lib.Checkpointer(workdir, keep_latest=int(config.train.keep_latest),
                               keep_best=int(config.train.keep_best), best_metric=best_metric,
                               best_mode=config_lib.BEST_METRICS[best_metric], read_only=True)
  try:
    restored = ckpt.restore(abstract)
  finally:
    ckpt.manager.close()
  if restored is None:
    raise ckpt_lib.CheckpointError(f"no checkpoint in {workdir}")
  state, step, meta = restored
  return state, int(step), dict(meta)


def restore_trainable(task: Any, workdir: str) -> tuple[Any, int]:
  """(trained tree, step) of a custom task's newest valid checkpoint in `workdir`
  (read-only): e.g. the LoRA adapters of a SmolLM2 fine-tune."""
  from ceu_jax import sharding as sharding_lib
  from ceu_jax.train import state as state_lib
  c = task.config
  mesh = sharding_lib.make_mesh(c.sharding)
  tx = state_lib.make_optimizer(c.train)
  abstract, _ = sharding_lib.state_layout(custom_init_fn(task, tx), jax.random.PRNGKey(0),
                                          mesh, sharding_lib.rules(c.sharding))
  state, step, _ = restore_read_only(c, workdir, abstract)
  return jax.device_get(state.params), int(step)


def load_checkpoint(config: Any, workdir: str, *, model: nn.Module | None = None
                    ) -> LoadedCheckpoint:
  """The newest valid checkpoint of `workdir` (a run of `config`), read-only.

  Before anything is built or read: W/config.json's model fields must equal the
  config's (WorkdirConfigError naming each differing field), then the stored array
  layout must match the config's model (WorkdirConfigError naming arrays, for
  workdirs without config.json). Nothing in the workdir is moved, pruned or cleaned:
  a corrupt newest step is skipped with a warning and left in place.
  CheckpointError if there is no checkpoint or none is valid.
  """
  config_lib.validate(config, jax.device_count())
  workdir_lib.check_same_config(config, workdir, fields=workdir_lib.FIXED_FIELDS)
  if not workdir_lib.checkpoint_steps(workdir):
    raise ckpt_lib.CheckpointError(f"no checkpoint in {workdir}")
  task = task_lib.build_task(config, model)
  mesh = sharding_lib.make_mesh(config.sharding)
  rules = sharding_lib.rules(config.sharding)
  tx = state_lib.make_optimizer(config.train)
  init_fn = state_lib.boxed_init_fn(task.model, tx, task.dummy_inputs)
  abstract, _ = sharding_lib.state_layout(init_fn, jax.random.PRNGKey(0), mesh, rules)
  state, step, meta = restore_read_only(config, workdir, abstract)
  # Host numpy on every process (parameters split across processes are gathered).
  return LoadedCheckpoint(variables={"params": multihost.to_host(state.params)}, step=int(step),
                          meta=dict(meta), run=workdir_lib.run_info(workdir))


def load_trained_params(config: Any, workdir: str, *, model: nn.Module | None = None) -> dict:
  """Model variables {'params': ...} (host numpy) of the newest valid checkpoint in
  `workdir` (a run of `config`); see `load_checkpoint` for the checks (read-only)."""
  return load_checkpoint(config, workdir, model=model).variables
