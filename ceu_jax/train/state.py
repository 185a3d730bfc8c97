"""Train state, optimizer and the one pure jitted `train_step(state, batch, rng)`.

`train_step` (big_vision style): rng = fold_in(rng, state.step); loss and
gradients of `losses.cer_loss`; AdamW (warm-up + cosine schedule, global-norm
clipping); metrics include grad/param/update norms, the learning rate and a
`finite` flag that the host checks after every step. The state is donated.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from ceu_jax import multihost
from ceu_jax.engine.sites import Site
from ceu_jax.data.types import RetrievalBatch
from ceu_jax.train import losses


@flax.struct.dataclass
class TrainState:
  step: jax.Array       # int32 scalar: optimiser steps taken
  params: Any
  opt_state: Any


def learning_rate_schedule(train_cfg: Any) -> optax.Schedule:
  """Linear warm-up to `learning_rate`, then cosine decay to 0 at `num_steps`."""
  warmup = int(train_cfg.warmup_steps)
  total = int(train_cfg.num_steps)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=float(train_cfg.learning_rate), warmup_steps=warmup,
      decay_steps=max(total, warmup + 1), end_value=0.0)


def _decay_mask(params: Any) -> Any:
  """Weight decay on matrices only (not biases, norms' scales or 1-d vectors)."""
  return jax.tree.map(lambda x: x.ndim > 1, params)


def make_optimizer(train_cfg: Any) -> optax.GradientTransformation:
  parts = []
  if float(train_cfg.grad_clip) > 0:
    parts.append(optax.clip_by_global_norm(float(train_cfg.grad_clip)))
  parts.append(optax.adamw(learning_rate_schedule(train_cfg),
                           weight_decay=float(train_cfg.weight_decay), mask=_decay_mask))
  return optax.chain(*parts)


def boxed_init_fn(model: nn.Module, tx: optax.GradientTransformation,
                  dummy_inputs: tuple) -> Callable[[jax.Array], TrainState]:
  """rng -> TrainState with logically partitioned (boxed) params and opt state."""
  def init(rng: jax.Array) -> TrainState:
    params = model.init(rng, *dummy_inputs)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params))
  return init


@flax.struct.dataclass
class TrainBatch:
  """D+ and (when the objective needs it) its token-aligned D−."""
  clean: RetrievalBatch
  corrupt: RetrievalBatch | None = None


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, site: Site,
                    loss_cfg: losses.LossConfig, *, nan_step: int = -1,
                    state_shardings: Any = None, batch_sharding: Any = None,
                    axis_rules: Any = (), lr_schedule: optax.Schedule | None = None,
                    allow_approximate: bool = False, loss_fn: Callable | None = None,
                    frozen: Any = None) -> Callable:
  """The jitted `train_step(state, batch, rng) -> (state, metrics)`.

  `loss_fn(params, frozen, batch, rng) -> (loss, metrics)` replaces
  `losses.cer_loss` (a `task.CustomTask`'s objective; model/site/loss_cfg are then
  unused); `frozen` is a pytree of constants it reads (e.g. a pretrained model's
  frozen weights): an argument of the compiled step, never part of the state.

  `nan_step` >= 1 (tests only) multiplies the loss by NaN in the update that
  completes step `nan_step` (state.step == nan_step − 1).
  With shardings given, the state keeps its layout and the metrics are
  replicated.
  """
  def train_step(state: TrainState, batch: TrainBatch, rng: jax.Array,
                 frozen_args: Any = None):
    rng = jax.random.fold_in(rng, state.step)
    nan_scale = None
    if nan_step >= 1:
      nan_scale = jnp.where(state.step + 1 == nan_step, jnp.nan, 1.0).astype(jnp.float32)

    def objective(params):
      with nn.logical_axis_rules(axis_rules):
        if loss_fn is not None:
          loss, metrics = loss_fn(params, frozen_args, batch, rng)
          if nan_scale is not None:
            loss = loss * nan_scale
            metrics = {**metrics, "loss": loss}
          return loss, metrics
        return losses.cer_loss(params, model, site, batch.clean, batch.corrupt, rng,
                               loss_cfg, nan_scale, allow_approximate)

    (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.tree.norm(grads)
    metrics = dict(metrics)
    metrics.update(grad_norm=grad_norm, param_norm=optax.tree.norm(params),
                   update_norm=optax.tree.norm(updates),
                   finite=jnp.isfinite(loss) & jnp.isfinite(grad_norm))
    if lr_schedule is not None:
      metrics["lr"] = lr_schedule(state.step)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  kwargs = {}
  extra = () if loss_fn is None else (None,)   # the frozen pytree: replicated
  if state_shardings is not None:
    kwargs = dict(in_shardings=(state_shardings, batch_sharding, None) + extra,
                  out_shardings=(state_shardings, None))
  step = multihost.Synced(jax.jit(train_step, donate_argnums=(0,), **kwargs), "train_step")
  if loss_fn is None:
    return step
  return lambda state, batch, rng: step(state, batch, rng, frozen)
