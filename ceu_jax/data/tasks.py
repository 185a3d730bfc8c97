"""Task name (a config's `data.task`) -> its data config class, stream and corruptions.

  spec = tasks.get("factqa")
  data_cfg = spec.config_cls.from_config(config.data)
  clean = spec.generate_batch(data_cfg, seed, index, batch_size, "train")
  minus = spec.corrupt(data_cfg, clean, "value_swap", key)

Both tasks share the signatures generate_batch(cfg, seed, index, batch_size, split)
and corrupt(cfg, batch, name, key, delta=None). `corruptions` lists the names a
config may use in cer.corruption / eval.corruptions (factqa accepts the ATR
name value_swap as an alias of entity_swap).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

TASKS = ("atr_insert", "factqa", "checklist", "atr_chain")
ATR_CORRUPTIONS = ("value_swap", "evidence_swap", "removal")
FACTQA_CORRUPTIONS = ("value_swap", "entity_swap", "evidence_swap", "removal",
                      "distractor_injection", "paraphrase")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  name: str
  config_cls: type
  generate_batch: Callable[..., Any]
  corrupt: Callable[..., Any]
  corruptions: tuple[str, ...]
  # strata(cfg, batch) -> {name: [B] bool}: example groups reported separately
  # (ATR-insert: evidence present and answer memorisable or not); None: no strata.
  strata: Callable[..., dict] | None = None


def _atr() -> TaskSpec:
  from ceu_jax.data import atr, corruptions  # pylint: disable=import-outside-toplevel
  from ceu_jax.data.atr_config import ATRConfig  # pylint: disable=import-outside-toplevel
  return TaskSpec("atr_insert", ATRConfig, atr.generate_batch, corruptions.corrupt,
                  ATR_CORRUPTIONS, strata=atr.strata)


def _factqa() -> TaskSpec:
  from ceu_jax.data import factqa  # pylint: disable=import-outside-toplevel
  return TaskSpec("factqa", factqa.FactQAConfig, factqa.generate_batch, factqa.corrupt,
                  FACTQA_CORRUPTIONS)


def _checklist() -> TaskSpec:
  from ceu_jax.data import checklist  # pylint: disable=import-outside-toplevel
  return TaskSpec("checklist", checklist.ChecklistConfig, checklist.generate_batch,
                  checklist.corrupt, checklist.CORRUPTIONS)


def _chain() -> TaskSpec:
  from ceu_jax.data import chain  # pylint: disable=import-outside-toplevel
  return TaskSpec("atr_chain", chain.ChainConfig, chain.generate_batch, chain.corrupt,
                  chain.CORRUPTIONS)


_BUILDERS = {"atr_insert": _atr, "factqa": _factqa, "checklist": _checklist, "atr_chain": _chain}


def get(name: str) -> TaskSpec:
  """The TaskSpec of task `name`; ValueError naming data.task otherwise."""
  if name not in _BUILDERS:
    raise ValueError(f"data.task must be one of {TASKS}, got {name!r}")
  return _BUILDERS[name]()


def of_config(data: Any) -> TaskSpec:
  """The TaskSpec of a config's data section (missing task -> atr_insert)."""
  return get(data.get("task", "atr_insert") if hasattr(data, "get") else data["task"])


def data_config(data: Any) -> Any:
  """The validated data config (ATRConfig / FactQAConfig) of a data section."""
  return of_config(data).config_cls.from_config(data)   # from_config ignores `task`
