"""The task of a training run: data config, model, read-port site, data stream.

Training data is a pure function of (seed, step): D+ is
`generate_batch(data_cfg, seed, step, batch_size, 'train')` and D− is
`corrupt(data_cfg, D+, cer.corruption, fold_in(fold_in(PRNGKey(seed), SALT), step))`,
so every process, device layout and resumed run sees the same batches.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

import architectures
from ceu_jax.data import tasks
from ceu_jax.data.types import RetrievalBatch
from ceu_jax.train import losses
from ceu_jax.train.state import TrainBatch

CORRUPT_SALT = 0x5EED_C0DE & 0x7FFFFFFF
PROBE_SALT = 977


@dataclasses.dataclass(frozen=True)
class Task:
  data_cfg: Any                 # ATRConfig | FactQAConfig (ceu_jax.data.tasks)
  model: nn.Module
  site: str                     # 'module/path:read'
  loss_cfg: losses.LossConfig
  seed: int
  approximate: bool = False     # the site's span decomposition is approximate
  spec: tasks.TaskSpec | None = None  # data.task's stream and corruptions (None: ATR)

  @property
  def data(self) -> tasks.TaskSpec:
    return self.spec or tasks.get("atr_insert")

  @property
  def dummy_inputs(self) -> tuple:
    return _dummy(self.data_cfg)


def _dummy(d: Any) -> tuple:
  """(query, context, passage_ids, answer) of batch 1, for init / eval_shape."""
  return (jnp.ones((1, d.query_len), jnp.int32), jnp.ones((1, d.context_len), jnp.int32),
          jnp.zeros((1, d.context_len), jnp.int32), jnp.ones((1, d.target_len), jnp.int32))


def build_model(config: Any, data_cfg: Any) -> nn.Module:
  return architectures.build_model(
      config.model, vocab_size=data_cfg.vocab.size, context_len=data_cfg.context_len,
      num_passages=data_cfg.num_passages, query_len=data_cfg.query_len,
      answer_len=data_cfg.target_len)


def site_of(config: Any) -> str:
  sites = architectures.read_port_sites(config.model)
  path, method = sites[int(config.cer.site)]
  return f"{path}:{method}"


def build_task(config: Any, model: nn.Module | None = None, site: str | None = None) -> Task:
  """Task of a validated config; `model`/`site` override the architecture (tests)."""
  spec = tasks.of_config(config.data)
  data_cfg = spec.config_cls.from_config(config.data)
  return Task(data_cfg=data_cfg, spec=spec,
              model=build_model(config, data_cfg) if model is None else model,
              site=site_of(config) if site is None else site,
              loss_cfg=losses.LossConfig.from_config(config.cer), seed=int(config.seed),
              approximate=(architectures.span_decomposition(config.model.family)
                           != "exact" if model is None else False))


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


def eval_batches(config: Any, data_cfg: Any) -> list[RetrievalBatch]:
  """The fixed evaluation set (split 'eval', seed `eval.seed`) as batches."""
  e, generate = config.eval, tasks.of_config(config.data).generate_batch
  return [generate(data_cfg, int(e.seed), i, int(e.batch_size), "eval")
          for i in range(int(e.num_examples) // int(e.batch_size))]
