"""Shared pieces of every config: argument parsing and default sections.

A config argument is `name[,key=value...]`, e.g. `tiny` or `tiny,family=ssm`:
`python -m experiments.train --config configs/atr_insert.py:tiny,family=ssm`.
Values are parsed strictly: a bool is one of true/false/yes/no/1/0, a number must
parse as its type and lie in its range, a choice must be one of its values;
anything else is an error naming the key and what is allowed. `Opt(...)` declares
an argument whose absence (None) means "the variant's default", so no value
(0, '') is silently taken for "default".
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections

TRUE, FALSE = ("true", "yes", "1"), ("false", "no", "0")


@dataclasses.dataclass(frozen=True)
class Opt:
  """An argument that defaults to None (the variant's own value) unless given."""
  kind: type                            # bool | int | float | str
  min: float | None = None              # smallest allowed value (numbers)
  max: float | None = None              # largest allowed value (numbers)
  choices: tuple | None = None          # allowed values


def _spec(default: Any) -> tuple[Opt, Any]:
  if isinstance(default, Opt):
    return default, None
  return Opt(type(default)), default


def _allowed(spec: Opt) -> str:
  if spec.choices:
    return "one of " + ", ".join(map(str, spec.choices))
  if spec.kind is bool:
    return "one of " + ", ".join(TRUE + FALSE)
  name = {int: "an integer", float: "a number", str: "text"}.get(spec.kind, spec.kind.__name__)
  lo = "" if spec.min is None else f" >= {spec.min}"
  hi = "" if spec.max is None else f"{' and' if lo else ''} <= {spec.max}"
  return name + lo + hi


def parse_value(key: str, value: str, spec: Opt) -> Any:
  """`value` (text) as spec.kind, checked; ValueError naming `key` and what is allowed."""
  bad = ValueError(f"config argument {key}={value!r} is not allowed: {key} must be "
                   f"{_allowed(spec)}")
  if spec.kind is bool:
    v = value.strip().lower()
    if v not in TRUE + FALSE:
      raise bad
    out: Any = v in TRUE
  elif spec.kind is int:
    try:
      out = int(value)
    except ValueError:
      raise bad from None
  elif spec.kind is float:
    try:
      out = float(value)
    except ValueError:
      raise bad from None
    if not math.isfinite(out):
      raise bad
  else:
    out = spec.kind(value)
  if spec.choices is not None and out not in spec.choices:
    raise bad
  if spec.min is not None and out < spec.min or spec.max is not None and out > spec.max:
    raise bad
  return out


def given_or(value: Any, default: Any) -> Any:
  """An `Opt` argument: the value given, else the variant's default."""
  return default if value is None else value


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parse 'variant,k=v,...' into a ConfigDict; `defaults` fixes the allowed keys, their
  types (a plain default's type, or an `Opt`) and ranges."""
  specs = {k: _spec(v) for k, v in defaults.items()}
  out = ml_collections.ConfigDict({k: d for k, (_, d) in specs.items()})
  seen = set()
  for part in (arg or "").split(","):
    part = part.strip()
    if not part:
      continue
    if "=" not in part:
      if "variant" not in out:
        raise ValueError(f"config argument {part!r}: this config has no variants")
      key, value = "variant", part
    else:
      key, value = (s.strip() for s in part.split("=", 1))
    if key not in specs:
      raise ValueError(f"config argument {key!r} is unknown; known: {sorted(specs)}")
    if key in seen:
      raise ValueError(f"config argument {key!r} is given twice in {arg!r}")
    seen.add(key)
    spec = specs[key][0]
    with out.ignore_type():
      out[key] = parse_value(key, value, spec)
  return out


def model_section(family: str = "attention", preset: str = "p100k") -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.family = family               # retrieval interface: attention | ssm | memory_port
  m.preset = preset               # size preset: p100k | p400k | p1500k (parameter-matched)
  m.retrieval_layers = "last"     # read ports at the 'last' reader layer or at 'all' layers
  m.read_port = -1                # THE read port f (CER, audits, grid): index into the read
                                  # ports, shallowest first; -1 = the last
  m.bypass = False                # early fusion: retrieved tokens also enter the reader
  m.dtype = "float32"             # activation dtype
  return m


def sharding_section() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.mesh_shape = (-1,)            # devices per mesh axis; -1 = all remaining devices
  s.mesh_axes = ("data",)         # mesh axis names
  # Logical axis -> mesh axis (None = replicated). Model code names logical axes only.
  s.logical_axis_rules = (("batch", "data"), ("length", None), ("ctx", None),
                          ("embed", None), ("heads", None), ("kv", None),
                          ("mlp", None), ("vocab", None), ("ports", None),
                          ("state", None))
  return s


def cer_section(**overrides) -> ml_collections.ConfigDict:
  """The `cer` section: defaults from its one definition, `LossConfig` (every field
  documented and checked there)."""
  from ceu_jax import fields  # pylint: disable=import-outside-toplevel
  from ceu_jax.train import losses  # pylint: disable=import-outside-toplevel
  return fields.section(losses.LossConfig, **overrides)


def eval_section(**overrides) -> ml_collections.ConfigDict:
  """The `eval` section an audit reads: defaults from its one definition,
  `ceu_jax.audit_config.EvalSection` (every field documented and checked there:
  num_examples, batch_size, seed, corruptions, probe_chunk, eps, num_resamples)."""
  from ceu_jax import audit_config, fields  # pylint: disable=import-outside-toplevel
  return fields.section(audit_config.EvalSection, **overrides)


def reader_finetune_sections(c: ml_collections.ConfigDict, tiny: bool, num_steps: int) -> None:
  """The model, lora and train sections of a World B reader fine-tune (SmolLM2 + LoRA:
  configs/smollm2_traces.py, configs/smollm2_checklist.py; ceu_jax.audits.reader_finetune)."""
  m = c.model = ml_collections.ConfigDict()
  m.gguf_path = ''                 # GGUF file ('': $CEU_SMOLLM2_GGUF or the package's)
  m.n_layers = 2 if tiny else 0    # keep the first N layers (0: all 30)

  lo = c.lora = ml_collections.ConfigDict()
  lo.rank = 4 if tiny else 8       # adapter rank r
  lo.alpha = 16.0                  # ΔW = (alpha / r) A B
  lo.targets = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj',
                'down_proj')       # projections with adapters
  lo.full = False                  # full fine-tuning instead of adapters
  lo.init_from = ''                # warm start: a completed fine-tune's workdir whose trained
                                   # parameters start this run ('': fresh adapters; relative to
                                   # this run's workdir; same model and lora fields)

  t = c.train = ml_collections.ConfigDict()
  t.batch_size = 2 if tiny else 4  # rows per step
  t.num_steps = num_steps          # optimiser steps
  t.learning_rate = 1e-3           # peak learning rate (AdamW)
  t.warmup_steps = min(1 if tiny else 6, t.num_steps)  # linear warm-up steps
  t.weight_decay = 0.0             # AdamW weight decay (matrices only)
  t.grad_clip = 1.0                # global-norm clip (0 = off)
  t.log_every = 1 if tiny else 5   # train metric lines every N steps
  t.eval_every = 0                 # must be 0: the competence check runs after training
  t.checkpoint_every = 2 if tiny else 10  # checkpoint every N steps
  t.keep_latest = 2                # latest checkpoints kept
  t.keep_best = 0                  # best checkpoints kept (no periodic eval: 0)
  t.async_checkpointing = True     # save in the background
  t.debug_nan_step = -1            # TEST ONLY: NaN loss at this step (-1 = off)
  t.debug_kill = ''                # TEST ONLY: '<after_step|in_save|after_save|sigterm>:<step>'
