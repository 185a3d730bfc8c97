"""The audit's settings where they belong: its `eval` section and its own validator.

`EvalSection` is the one definition of the `eval` fields an audit reads (default,
check, meaning): configs build their `eval` section from it
(`configs/common.eval_section`), `ceu_jax.auditor.AuditSettings.of_config` reads
it, and both validators check it — `validate` here (what an audit of a config
reads: data, model, eval, sharding) and the training validator
(`ceu_jax.train.config.validate`, which adds training's own `eval.best_metric`).
Every error is one line starting with the field ("eval.eps must be a number > 0,
got 0.0"), raised before anything is built or written.

Configs recorded before these fields existed (a workdir's config.json) had
`eval.chunk_size` (probes per vmapped chunk) and no `eval.eps` (the audit took
ε from `cer.eps`); `upgrade` reads such a config in today's form with the values
those audits used (`probe_chunk` = the recorded chunk, `eps` = `cer.eps`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import architectures
from ceu_jax import fields as F
from ceu_jax import sharding as sharding_lib
from ceu_jax.data import tasks

AUTO = "auto"          # probe_chunk: the engine's measured rule (engine.chunking; = runner.AUTO)
SECTIONS = ("data", "model", "eval", "sharding")   # what an audit of a config reads
MODEL_FIELDS = ("family", "preset", "retrieval_layers", "read_port", "bypass", "dtype",
                "overrides")


def probe_chunk(value: Any) -> str | int:
  """`eval.probe_chunk` as the engine takes it: 'auto' or an int >= 1; ValueError
  naming the field otherwise."""
  if isinstance(value, str) and value == AUTO:
    return AUTO
  if not F.is_int(value) or value < 1:
    raise ValueError(f"eval.probe_chunk must be 'auto' or an integer >= 1, got {value!r}")
  return int(value)


def _probe_chunk_check(value: Any) -> str | None:
  try:
    probe_chunk(value)
  except ValueError:
    return "must be 'auto' or an integer >= 1"
  return None


def _corruptions_check(value: Any) -> str | None:
  """Names; which are allowed depends on data.task (`check_eval`)."""
  ok = (isinstance(value, (tuple, list)) and len(value) > 0
        and all(isinstance(c, str) for c in value) and len(set(value)) == len(value))
  return None if ok else "must be a non-empty tuple of distinct corruption names"


@dataclasses.dataclass(frozen=True)
class EvalSection:
  """The `eval` config section as an audit reads it (one definition per field)."""
  num_examples: int = F.field(512, F.ge(1, True),
                              "fixed evaluation set size (a multiple of batch_size)")
  batch_size: int = F.field(128, F.ge(1, True), "examples per compiled audit call")
  seed: int = F.field(1234, F.ge(0, True),
                      "evaluation-set seed; also seeds the probe spans")
  corruptions: tuple = F.field(("value_swap", "evidence_swap", "removal"),
                               _corruptions_check, "D− kinds audited (of data.task)")
  probe_chunk: Any = F.field(AUTO, _probe_chunk_check,
                             "probes per vmapped chunk: 'auto' (the engine's measured "
                             "rule) or an integer >= 1; rows do not depend on it",
                             any_type=True)
  eps: float = F.field(1e-3, F.gt(0), "ε of the stabilised CEU (degenerate below)")
  num_resamples: int = F.field(1000, F.ge(0, True),
                               "bootstrap resamples of the summary CIs (0 = no CIs)")


EVAL_FIELDS = F.checks(EvalSection)


def check_eval(config: Any, *, strict: bool = False) -> None:
  """The eval fields an audit reads, and their cross-checks with data.task.
  `strict`: an eval field not in EvalSection is an error (the training validator
  passes its own table instead)."""
  F.check_section("eval", config.eval, EVAL_FIELDS, strict=strict)
  e = config.eval
  if e.num_examples % e.batch_size:
    raise ValueError(f"eval.num_examples ({e.num_examples}) must be a multiple of "
                     f"eval.batch_size ({e.batch_size})")
  allowed = tasks.of_config(config.data).corruptions
  bad = [c for c in e.corruptions if c not in allowed]
  if bad:
    raise ValueError(f"eval.corruptions must be a non-empty subset of {allowed} for "
                     f"data.task {config.data.task!r}, got {bad[0]!r}")


def check_model(model: Any) -> None:
  unknown = sorted(set(F.items_of(model)) - set(MODEL_FIELDS))
  if unknown:
    raise ValueError(f"model.{unknown[0]} is an unknown field; known: {MODEL_FIELDS}")
  architectures.validate_model_config(F.items_of(model))   # raises "model.<field> ..."


def check_data(data: Any) -> None:
  items = F.items_of(data)
  if items.get("task") not in tasks.TASKS:
    raise ValueError(f"data.task must be one of {tasks.TASKS}, got {items.get('task')!r}")
  tasks.data_config(items)                                # raises "data.<field> ..."


def validate(config: Any, num_devices: int | None = None) -> None:
  """ValueError (one line, starting with the field) for anything an audit of `config`
  reads: data, model, the eval fields of `EvalSection`, sharding; with `num_devices`,
  the mesh must fit them and split eval.batch_size evenly. Other sections (train,
  cer, a grid's) are not the audit's: loading a checkpoint checks what it needs."""
  top = F.items_of(config)
  for name in SECTIONS:
    if name not in top:
      raise ValueError(f"{name} is missing from the config")
  check_data(config.data)
  check_model(config.model)
  check_eval(config)
  sharding_lib.check_section(config.sharding, num_devices)
  if num_devices is not None:
    sharding_lib.check_batch_sizes(config.sharding, num_devices,
                                   {"eval.batch_size": config.eval.batch_size})


def upgrade(config: Any) -> Any:
  """A config recorded before `eval.probe_chunk` / `eval.eps` existed, in today's
  form (a copy; a current config is returned as is): eval.chunk_size becomes
  eval.probe_chunk with its value, and eval.eps is cer.eps, the ε those audits used."""
  e = config.get("eval") if hasattr(config, "get") else None
  if e is None or ("chunk_size" not in e and "eps" in e):
    return config
  config = config.copy_and_resolve_references()
  with config.unlocked():
    if "chunk_size" in config.eval:
      config.eval.probe_chunk = config.eval.chunk_size
      del config.eval["chunk_size"]
    if "eps" not in config.eval:
      cer = config.get("cer")
      config.eval.eps = float(cer.eps) if cer is not None and "eps" in cer else (
          EvalSection.eps)
  return config
