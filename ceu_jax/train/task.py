"""The task of a training run: data config, model, read-port site, data stream.

Training data is a pure function of (seed, step): D+ is
`generate_batch(data_cfg, seed, step, batch_size, 'train')` and D− is
`corrupt(data_cfg, D+, cer.corruption, fold_in(fold_in(PRNGKey(seed), SALT), step))`,
so every process, device layout and resumed run sees the same batches.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp

from ceu_jax import engine
from ceu_jax.auditor import AuditedModel, OfAuditedModel, audited_model
from ceu_jax.data import tasks
from ceu_jax.train import losses
from ceu_jax.train.state import TrainBatch

CORRUPT_SALT = 0x5EED_C0DE & 0x7FFFFFFF


@dataclasses.dataclass(frozen=True)
class Task(OfAuditedModel):
  """The audited model (model, read port f, data) plus the objective and seed;
  `model`, `site`, `approximate`, `data_cfg` read through `audited`."""
  audited: AuditedModel         # ceu_jax.auditor: the same bundle every audit uses
  loss_cfg: losses.LossConfig   # the `cer` section
  seed: int                     # data / init seed

  @property
  def data(self) -> tasks.TaskSpec:
    return self.audited.task_spec

  @property
  def dummy_inputs(self) -> tuple:
    """(query, context, passage_ids, answer) of batch 1, for init / eval_shape."""
    return self.audited.dummy_inputs


def build_task(config: Any, model: nn.Module | None = None,
               site: engine.Site | None = None) -> Task:
  """Task of a validated config; `model`/`site` override the architecture (tests)."""
  return Task(audited=audited_model(config, model=model, site=site),
              loss_cfg=losses.LossConfig.from_config(config.cer), seed=int(config.seed))


def corrupt_key(seed: int, step: int) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), CORRUPT_SALT), step)


def train_batch(task: Task, step: int, batch_size: int) -> TrainBatch:
  """The global batch of optimiser step `step` (D+ and, when needed, D−)."""
  clean = task.data.generate_batch(task.data_cfg, task.seed, step, batch_size, "train")
  corrupt = None
  if task.loss_cfg.uses_corrupt:
    corrupt = task.data.corrupt(task.data_cfg, clean, task.loss_cfg.corruption,
                                corrupt_key(task.seed, step))
  return TrainBatch(clean=clean, corrupt=corrupt)


class CustomTask(Protocol):
  """A task the loop trains without the retrieval-model machinery (e.g. fine-tuning
  a pretrained LM, `ceu_jax.finetune.task`). The loop keeps its own
  checkpointing, resume, SIGTERM, NaN handling and metric files; the task gives:"""

  frozen: Any   # pytree passed to `loss` (never in the state, never checkpointed)

  def validate(self, config: Any) -> None:
    """ValueError naming the field for a bad config (before anything compiles)."""

  def init_params(self, rng: jax.Array) -> Any:
    """The trained parameters (unboxed: replicated on the mesh)."""

  def loss(self, params: Any, frozen: Any, batch: Any, rng: jax.Array
           ) -> tuple[jax.Array, dict]:
    """(scalar loss, metrics incl. 'task_nll'); pure and jittable."""

  def train_batch(self, step: int, batch_size: int) -> Any:
    """The global batch of data step `step` (a pure function of the seed and step;
    a pytree of arrays with leading axis batch_size)."""
