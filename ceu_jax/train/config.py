"""Validation of a training config before anything compiles, and resume checks.

`validate(config, num_devices)` raises ValueError whose message starts with the
offending field's dotted name (e.g. "cer.alpha must be in (0, 1], got 1.5").
`check_resume_compatible(stored, config)` raises WorkdirConfigError (a ValueError)
naming every field whose change makes a checkpoint unusable (architecture, n,
task, ...); ceu_jax.workdir has the full restart policy (`check_config_change`).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from ceu_jax import audit_config, fields
from ceu_jax import sharding as sharding_lib
from ceu_jax import workdir as workdir_lib
from ceu_jax.data import tasks
from ceu_jax.train import losses

TASKS = tasks.TASKS
SECTIONS = ("seed", "data", "model", "train", "cer", "eval", "sharding")
# Sections that other tools add to a training config and training ignores
# (the grid runner's cell settings, ceu_jax/grid).
IGNORED_SECTIONS = ("grid", "sweep")
MODEL_FIELDS = audit_config.MODEL_FIELDS
CER_CORRUPTIONS = losses.CER_CORRUPTIONS
# Eval metric -> 'max' | 'min' (which direction is better, for the best checkpoint).
BEST_METRICS = {"em": "max", "nll": "min", "ceu_ev": "max", "supported_0.5": "max"}
# Fields whose change between runs in one workdir invalidates the checkpoint.
RESUME_FIXED = workdir_lib.FIXED_FIELDS


def _debug_kill(x):
  if x == "":
    return None
  point, _, step = str(x).partition(":")
  if point in ("after_step", "in_save", "after_save", "sigterm") and step.isdigit():
    return None
  return "must be '' or '<after_step|in_save|after_save|sigterm>:<step>'"


_ge = fields.ge
TRAIN_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "batch_size": _ge(1, True), "num_steps": _ge(1, True), "learning_rate": _ge(0),
    "warmup_steps": _ge(0, True), "weight_decay": _ge(0), "grad_clip": _ge(0),
    "log_every": _ge(1, True), "eval_every": _ge(0, True), "checkpoint_every": _ge(1, True),
    "keep_latest": _ge(1, True), "keep_best": _ge(0, True), "async_checkpointing": fields.boolean,
    "debug_nan_step": _ge(-1, True), "debug_kill": _debug_kill,
}
# Derived from the one definition of the `cer` fields (ceu_jax.train.losses.LossConfig).
CER_FIELDS: dict[str, Callable[[Any], str | None]] = fields.checks(losses.LossConfig)
# The audit's eval fields (ceu_jax.audit_config.EvalSection) and training's own.
EVAL_FIELDS: dict[str, Callable[[Any], str | None]] = {
    **audit_config.EVAL_FIELDS, "best_metric": fields.one_of(*BEST_METRICS)}
items_of = fields.items_of


def validate(config: Any, num_devices: int | None = None) -> None:
  """Raise ValueError (message starts with the field name) for a bad config."""
  fields.check_top(config, SECTIONS, IGNORED_SECTIONS)
  audit_config.check_data(config.data)
  audit_config.check_model(config.model)
  fields.check_section("train", config.train, TRAIN_FIELDS)
  fields.check_section("cer", config.cer, CER_FIELDS)
  fields.check_section("eval", config.eval, EVAL_FIELDS)
  t, c = config.train, config.cer
  if t.warmup_steps > t.num_steps:
    raise ValueError(f"train.warmup_steps ({t.warmup_steps}) must be <= train.num_steps "
                     f"({t.num_steps}): set --config.train.warmup_steps (e.g. "
                     f"{max(1, t.num_steps // 10)}), or give the steps as the config argument "
                     "steps=N, which scales the warm-up")
  if c.regularizer == "evidence_distractor" and c.k < 2:
    raise ValueError(f"cer.k must be >= 2 for regularizer 'evidence_distractor' (the "
                     f"distractor probe), got {c.k}")
  if c.swap_form == "hinge" and c.beta_swap > 0 and c.gamma <= 0:
    raise ValueError(f"cer.gamma must be > 0 for the hinge swap term, got {c.gamma}")
  task = items_of(config.data)["task"]
  if c.corruption not in tasks.get(task).corruptions:
    raise ValueError(f"cer.corruption must be one of {tasks.get(task).corruptions} for "
                     f"data.task {task!r}, got {c.corruption!r}")
  audit_config.check_eval(config)      # eval sizes and corruptions of data.task
  sharding_lib.check_section(config.sharding, num_devices)
  if num_devices is not None:
    sharding_lib.check_batch_sizes(config.sharding, num_devices, {
        "train.batch_size": t.batch_size, "eval.batch_size": config.eval.batch_size})


def to_json(config: Any) -> str:
  return config.to_json_best_effort(indent=2, sort_keys=True) if hasattr(
      config, "to_json_best_effort") else json.dumps(config, indent=2, sort_keys=True)


def check_resume_compatible(stored: Mapping, config: Any) -> None:
  """WorkdirConfigError naming every RESUME_FIXED field that differs from `stored`."""
  diff = workdir_lib.config_diff(stored, config, RESUME_FIXED)
  if diff:
    raise workdir_lib.WorkdirConfigError(
        f"this workdir was trained with a different config: {workdir_lib.format_diff(diff)};"
        " its checkpoints cannot be used with this config (use a new --workdir)", diff)
