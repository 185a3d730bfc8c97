"""Shared pieces of every config: argument parsing and default sections.

A config argument is `name[,key=value...]`, e.g. `tiny` or `tiny,family=ssm`:
`python -m experiments.train --config configs/atr_insert.py:tiny,family=ssm`.
"""
from __future__ import annotations

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parse 'variant,k=v,...' into a ConfigDict; `defaults` fixes allowed keys and types."""
  out = ml_collections.ConfigDict(dict(defaults))
  for part in (arg or "").split(","):
    part = part.strip()
    if not part:
      continue
    if "=" not in part:
      if "variant" not in out:
        raise ValueError(f"config argument {part!r}: this config has no variants")
      out.variant = part
      continue
    key, value = part.split("=", 1)
    if key not in out:
      raise ValueError(f"config argument {key!r} is unknown; known: {sorted(out.keys())}")
    kind = type(out[key])
    out[key] = (value.lower() in ("1", "true", "yes")) if kind is bool else kind(value)
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
  from ceu_jax.train import fields, losses  # pylint: disable=import-outside-toplevel
  return fields.section(losses.LossConfig, **overrides)
