"""World A's readers: the project's retrieval models trained as in the smoke grid.

The one module of `ceu_jax.audits` that reaches training and `architectures/`
(the audit library itself never does); `ceu_jax.audits.answer_presence.job` imports it only
when World A runs.

  reader = trained_reader(train_config, workdir, log)   # trains (or resumes) first

Training goes through `ceu_jax.train.train_and_evaluate` in the family's own
workdir (W/train/<family>), so its config.json checks, lock, checkpoints and
resume apply unchanged; a completed run is loaded without retraining.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ceu_jax import workdir as workdir_lib


def check_train_config(config: Any, section: str) -> None:
  """A reader's training config, validated before the job writes anything (ValueError
  naming the field under `section`, e.g. 'atr.train.train.num_steps must be ...')."""
  from ceu_jax.train import config as config_lib
  try:
    config_lib.validate(config)
  except ValueError as e:
    raise ValueError(f'{section}.{e}') from None


def trained_reader(config: Any, workdir: str, log: Callable[[str], None] = print,
                   batch_size: int = 256):
  """An ATRReader over the newest checkpoint of `config`'s run in `workdir` (trained here if needed)."""
  from ceu_jax.auditor import audited_model
  from ceu_jax.readers.atr import ATRReader
  from ceu_jax.train.loop import load_checkpoint, train_and_evaluate
  info = workdir_lib.run_info(workdir)
  if not info['completed']:
    t0 = time.time()
    log(f'training {config.model.family} ({int(config.train.num_steps)} steps) in {workdir}')
    metrics = train_and_evaluate(config, workdir)
    log(f'trained {config.model.family} in {time.time() - t0:.0f} s '
        f"(eval EM {_em(metrics)})")
  loaded = load_checkpoint(config, workdir)
  bundle = audited_model(config)
  return ATRReader(bundle.model, loaded.variables, vocab=bundle.data_cfg.vocab,
                   batch_size=batch_size), loaded


def _em(metrics: Any) -> str:
  try:
    return f"{float(metrics['eval']['em']):.3f}"
  except (KeyError, TypeError, ValueError):
    return '?'
