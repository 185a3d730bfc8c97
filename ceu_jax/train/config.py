"""Validation of a training config before anything compiles, and resume checks.

`validate(config, num_devices)` raises ValueError whose message starts with the
offending field's dotted name (e.g. "cer.alpha must be in (0, 1], got 1.5").
`check_resume_compatible(stored, config)` raises WorkdirConfigError (a ValueError)
naming every field whose change makes a checkpoint unusable (architecture, n,
task, ...); ceu_jax.workdir has the full restart policy (`check_config_change`).
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

import architectures
from ceu_jax import workdir as workdir_lib
from ceu_jax.data import tasks
from ceu_jax.train import fields, losses
from ceu_jax import sharding as sharding_lib

TASKS = tasks.TASKS
SECTIONS = ("seed", "data", "model", "train", "cer", "eval", "sharding")
# Sections that other tools add to a training config and training ignores
# (the grid runner's cell settings, ceu_jax/grid).
IGNORED_SECTIONS = ("grid", "sweep")
MODEL_FIELDS = ("family", "preset", "retrieval_layers", "read_port", "bypass", "dtype",
                "overrides")
CER_CORRUPTIONS = losses.CER_CORRUPTIONS
LOGICAL_AXES = ("batch", "length", "ctx", "embed", "heads", "kv", "mlp", "vocab", "ports",
                "state")
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
EVAL_FIELDS: dict[str, Callable[[Any], str | None]] = {
    "num_examples": _ge(1, True), "batch_size": _ge(1, True), "seed": _ge(0, True),
    "corruptions": lambda x: (None if isinstance(x, (tuple, list)) and len(x) > 0 and all(
        c in CER_CORRUPTIONS for c in x) else f"must be a non-empty subset of {CER_CORRUPTIONS}"),
    "chunk_size": _ge(1, True), "best_metric": fields.one_of(*BEST_METRICS),
    "num_resamples": _ge(0, True),
}
SHARDING_FIELDS = ("mesh_shape", "mesh_axes", "logical_axis_rules")


def items_of(section: Any) -> dict:
  if hasattr(section, "to_dict"):
    return section.to_dict()
  return dict(section)


def _check_section(name: str, section: Any, checks: Mapping[str, Callable]) -> None:
  items = items_of(section)
  unknown = sorted(set(items) - set(checks))
  if unknown:
    raise ValueError(f"{name}.{unknown[0]} is an unknown field; known fields of {name}: "
                     f"{sorted(checks)}")
  missing = sorted(set(checks) - set(items))
  if missing:
    raise ValueError(f"{name}.{missing[0]} is missing")
  for key, check in checks.items():
    err = check(items[key])
    if err:
      raise ValueError(f"{name}.{key} {err}, got {items[key]!r}")


def _check_sharding(s: Any, num_devices: int | None) -> None:
  items = items_of(s)
  unknown = sorted(set(items) - set(SHARDING_FIELDS))
  if unknown:
    raise ValueError(f"sharding.{unknown[0]} is an unknown field; known: {SHARDING_FIELDS}")
  shape, axes = tuple(items["mesh_shape"]), tuple(items["mesh_axes"])
  if len(shape) != len(axes) or not shape:
    raise ValueError(f"sharding.mesh_axes {axes} must name each of the mesh_shape {shape} "
                     "dimensions")
  if len(set(axes)) != len(axes) or not all(isinstance(a, str) for a in axes):
    raise ValueError(f"sharding.mesh_axes must be distinct names, got {axes}")
  for rule in items["logical_axis_rules"]:
    if len(rule) != 2 or rule[0] not in LOGICAL_AXES:
      raise ValueError(f"sharding.logical_axis_rules: {rule!r} must be (logical axis, mesh "
                       f"axis | None) with a logical axis in {LOGICAL_AXES}")
    targets = () if rule[1] is None else ((rule[1],) if isinstance(rule[1], str)
                                          else tuple(rule[1]))
    bad = [t for t in targets if t not in axes]
    if bad:
      raise ValueError(f"sharding.logical_axis_rules: {rule!r} maps to mesh axis {bad[0]!r},"
                       f" which is not in sharding.mesh_axes {axes}")
  if num_devices is not None:
    sharding_lib.resolve_mesh_shape(shape, num_devices)


def _check_task_corruptions(task: str, cer_corruption: str, eval_corruptions) -> None:
  """cer.corruption and eval.corruptions must be corruptions of data.task."""
  allowed = tasks.get(task).corruptions
  if cer_corruption not in allowed:
    raise ValueError(f"cer.corruption must be one of {allowed} for data.task {task!r}, "
                     f"got {cer_corruption!r}")
  bad = [n for n in eval_corruptions if n not in allowed]
  if bad:
    raise ValueError(f"eval.corruptions must be a non-empty subset of {allowed} for "
                     f"data.task {task!r}, got {bad[0]!r}")


def validate(config: Any, num_devices: int | None = None) -> None:
  """Raise ValueError (message starts with the field name) for a bad config."""
  top = items_of(config)
  unknown = sorted(set(top) - set(SECTIONS) - set(IGNORED_SECTIONS))
  if unknown:
    raise ValueError(f"{unknown[0]} is an unknown config section; known: {SECTIONS}")
  for name in SECTIONS:
    if name not in top:
      raise ValueError(f"{name} is missing from the config")
  if not fields.is_int(top["seed"]) or top["seed"] < 0:
    raise ValueError(f"seed must be an integer >= 0, got {top['seed']!r}")
  data = items_of(config.data)
  if data.get("task") not in TASKS:
    raise ValueError(f"data.task must be one of {TASKS}, got {data.get('task')!r}")
  tasks.data_config(data)                         # raises "data.<field> ..."
  model = items_of(config.model)
  unknown = sorted(set(model) - set(MODEL_FIELDS))
  if unknown:
    raise ValueError(f"model.{unknown[0]} is an unknown field; known: {MODEL_FIELDS}")
  architectures.validate_model_config(model)      # raises "model.<field> ..."
  _check_section("train", config.train, TRAIN_FIELDS)
  _check_section("cer", config.cer, CER_FIELDS)
  _check_section("eval", config.eval, EVAL_FIELDS)
  t, c, e = config.train, config.cer, config.eval
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
  if e.num_examples % e.batch_size:
    raise ValueError(f"eval.num_examples ({e.num_examples}) must be a multiple of "
                     f"eval.batch_size ({e.batch_size})")
  _check_task_corruptions(data["task"], c.corruption, e.corruptions)
  _check_sharding(config.sharding, num_devices)
  if num_devices is not None:
    shape = sharding_lib.resolve_mesh_shape(config.sharding.mesh_shape, num_devices)
    sizes = dict(zip(config.sharding.mesh_axes, shape))
    shards = math.prod(sizes[a] for a in sharding_lib.batch_axes(config.sharding))
    for name, size in (("train.batch_size", t.batch_size), ("eval.batch_size", e.batch_size)):
      if size % shards:
        raise ValueError(f"{name} ({size}) must be divisible by the {shards} batch shards of "
                         f"the mesh {dict(sizes)}")


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
