"""What the World B reader fine-tunes share (SmolLM2 + LoRA readers for the companion audits:
`traces.finetune` on arithmetic traces, `mediator.finetune` on checklists): the config
sections and their validation, "train unless the workdir holds a completed run", and the
warm start (lora.init_from: a run begins at a completed fine-tune's trained parameters).

A fine-tune config has the sections SECTIONS: seed, data (the audit's own fields), model
(MODEL_FIELDS), lora (LORA_FIELDS), train (the training loop's fields, no periodic
evaluation: the competence check runs after training), eval (the audit's competence check)
and sharding.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping

from ceu_jax import fields
from ceu_jax import sharding as sharding_lib
from ceu_jax.pretrained import lora as lora_lib
from ceu_jax.pretrained import sft
from ceu_jax.train import config as config_lib

SECTIONS = ('seed', 'data', 'model', 'lora', 'train', 'eval', 'sharding')
MODEL_FIELDS = {'gguf_path': lambda x: None if isinstance(x, str) else 'must be a path or ""',
                'n_layers': fields.ge(0, True)}
LORA_FIELDS = {'rank': fields.ge(1, True), 'alpha': fields.gt(0), 'full': fields.boolean,
               'targets': lambda x: None if isinstance(x, (tuple, list)) and x and all(
                   t in lora_lib.TARGETS for t in x) else
               f'must be a non-empty subset of {lora_lib.TARGETS}',
               'init_from': lambda x: None if isinstance(x, str) else 'must be a path or ""'}


def unit(x) -> str | None:
  """A field check: a number in [0, 1]."""
  return None if fields.is_num(x) and 0.0 <= float(x) <= 1.0 else 'must lie in [0, 1]'


def validate(config: Any, data_fields: Mapping, eval_fields: Mapping) -> None:
  """ValueError naming the field for a bad config; nothing is loaded or compiled."""
  fields.check_top(config, SECTIONS)
  fields.check_section('data', config.data, data_fields)
  fields.check_section('model', config.model, MODEL_FIELDS)
  fields.check_section('lora', config.lora, LORA_FIELDS)
  fields.check_section('train', config.train, config_lib.TRAIN_FIELDS)
  fields.check_section('eval', config.eval, eval_fields)
  t, d = config.train, config.data
  if t.warmup_steps > t.num_steps:
    raise ValueError(f'train.warmup_steps ({t.warmup_steps}) must be <= train.num_steps '
                     f'({t.num_steps})')
  if int(t.eval_every):
    raise ValueError('train.eval_every must be 0 (the competence check runs after training), '
                     f'got {t.eval_every}')
  if d.max_target_tokens >= d.max_len:
    raise ValueError('data.max_target_tokens must be < data.max_len')
  sharding_lib.check_section(config.sharding)


class TargetLoss:
  """The loss side of a reader fine-tune's task (with `lora.AdapterTask`): the mean NLL of
  the target tokens (`sft.target_loss`) over the last data.max_target_tokens positions."""

  @property
  def n_tail(self) -> int:
    return int(self.config.data.max_target_tokens)

  def check_rows_fit(self, config: Any) -> None:
    """ValueError naming data.max_len / data.max_target_tokens and the length needed when
    any training row of the run (num_steps × batch_size rows) does not fit: checked by the
    task's validate, before anything compiles (not at the step that reaches the row)."""
    n = int(config.train.num_steps) * int(config.train.batch_size)
    rows = self.train_rows(0, n)
    length, field = self.row_len(config)
    sft.check_fit([self.encode(r) for r in rows], length, self.n_tail,
                  [self.row_name(r) for r in rows], len_field=field)

  def row_len(self, config: Any) -> tuple[int, str]:
    """(row tokens (prompt + target) of a training batch, the field that sets them)."""
    return int(config.data.max_len), 'data.max_len'

  def loss(self, params: Any, frozen: Any, batch: dict, rng: Any):
    del rng
    return sft.target_loss(params, frozen, batch, config=self.model_config, lora=self.lora,
                           n_tail=self.n_tail)


def init_source(config: Any, workdir: str) -> str:
  """The workdir named by lora.init_from ('' when none): relative to `workdir`."""
  src = str(config.lora.init_from)
  return os.path.normpath(os.path.join(workdir, src)) if src else ''


def check_same_fields(config: Any, workdir: str, what: str) -> None:
  """ValueError starting with `what` when `workdir`'s fine-tune (its config.json) was
  trained with other model or lora fields than `config` (lora.init_from aside), naming each."""
  from ceu_jax import workdir as workdir_lib
  stored = workdir_lib.read_config_json(workdir)
  if stored is None:
    raise ValueError(f'{what}: {workdir} has no config.json (not a fine-tune workdir)')
  diff = [d for d in workdir_lib.config_diff(stored, config, fields=('model', 'lora'))
          if d[0] != 'lora.init_from']
  if diff:
    raise ValueError(f'{what}: {workdir} was trained with other model / lora fields (there -> '
                     f'here): {workdir_lib.format_diff(diff)}')


def warm_start(config: Any, workdir: str, task: Any, *, log: Callable[[str], None] = print
               ) -> None:
  """Sets task.init_tree to the trained parameters of lora.init_from's completed run (the
  start of this run: `lora.AdapterTask.init_params`); nothing when the field is ''.
  ValueError naming lora.init_from when that workdir holds no completed run or was trained
  with other model or lora fields (checked before anything is restored)."""
  from ceu_jax import workdir as workdir_lib
  from ceu_jax.train import loop
  src = init_source(config, workdir)
  if not src:
    return
  info = workdir_lib.run_info(src)
  if not info['completed']:
    raise ValueError(f'lora.init_from={config.lora.init_from!r}: {src} holds no completed '
                     f'fine-tune ({info["warning"] or "no checkpoint"})')
  check_same_fields(config, src, f'lora.init_from={config.lora.init_from!r}')
  task.init_tree, step = loop.restore_trainable(task, src)
  log(f'warm start: the trained parameters of {src} (step {step})')


def train_unless_done(config: Any, workdir: str, task: Any, name: str, *,
                      log: Callable[[str], None] = print, fresh: bool = False) -> bool:
  """Trains `task` in `workdir` (the one loop) unless it holds a completed run (or fresh);
  returns whether it trained."""
  from ceu_jax import workdir as workdir_lib
  from ceu_jax.train import loop
  if not fresh and workdir_lib.run_info(workdir)['completed']:
    return False
  t0 = time.time()
  if fresh or not workdir_lib.checkpoint_steps(workdir):   # (a resume reads its own)
    warm_start(config, workdir, task, log=log)
  log(f'training {name} ({int(config.train.num_steps)} steps) in {workdir}')
  loop.train_and_evaluate(config, workdir, custom=task, fresh=fresh)
  log(f'trained {name} in {time.time() - t0:.0f} s')
  return True
