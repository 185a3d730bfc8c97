"""A deliberately small optax training loop for the architecture tests (issue #3).

Not the project's trainer (experiments/train.py is): it exists so that the
architecture tests can check that each family learns ATR-insert and that the
read port carries the answer. Run as a script to reproduce the acceptance run:

  python -m tests.arch_training --family attention --steps 3000

Shape legend: B batch, A answer length, V vocabulary.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import architectures
from ceu_jax.data.atr import generate_batch
from ceu_jax.data.atr_config import ATRConfig


def tiny_data_config(**overrides: Any) -> ATRConfig:
  """The tiny ATR-insert task of configs/atr_insert.py:tiny (n = 128, ρ = 0, δ = 0.3)."""
  from configs.atr_insert import get_config  # pylint: disable=g-import-not-at-top
  data = dict(get_config("tiny").data)
  data.update(overrides)
  return ATRConfig.from_config(data)


def build(model_cfg: dict, data: ATRConfig) -> nn.Module:
  return architectures.build_model(
      model_cfg, vocab_size=data.vocab.size, context_len=data.context_len,
      num_passages=data.num_passages, query_len=data.query_len, answer_len=data.answer_len)


def exact_match(logits: jax.Array, answer: jax.Array) -> jax.Array:
  """[B] bool: every answer token is the arg-max."""
  return jnp.all(jnp.argmax(logits, -1) == answer, axis=-1)


@dataclasses.dataclass
class TrainResult:
  params: Any
  model: nn.Module
  losses: list[float]
  seconds: float
  steps: int


def train(model_cfg: dict, data: ATRConfig, *, steps: int, batch_size: int = 64,
          lr: float = 1e-3, warmup: int = 100, seed: int = 0,
          log_every: int = 0, eval_every: int = 0, max_seconds: float = 0.0) -> TrainResult:
  """AdamW + cosine schedule on fresh ATR-insert batches (teacher-forced NLL)."""
  model = build(model_cfg, data)
  params = architectures.init_params(model, jax.random.PRNGKey(seed))
  warmup = min(warmup, max(steps // 2, 1))
  sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1),
                                             lr * 0.05)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.01))
  opt_state = opt.init(params)

  def loss_fn(p, batch):
    logits = model.apply(p, *batch.model_inputs())
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch.answer).sum(-1).mean()

  @jax.jit
  def step(p, s, batch):
    loss, g = jax.value_and_grad(loss_fn)(p, batch)
    upd, s = opt.update(g, s, p)
    return optax.apply_updates(p, upd), s, loss

  losses, start = [], time.time()
  for i in range(steps):
    batch = generate_batch(data, seed, i, batch_size, "train")
    params, opt_state, loss = step(params, opt_state, batch)
    losses.append(float(loss))
    if log_every and (i % log_every == 0 or i == steps - 1):
      print(f"step {i:5d} loss {losses[-1]:.4f} ({time.time() - start:.0f}s)", flush=True)
    if eval_every and (i + 1) % eval_every == 0:
      em = evaluate(TrainResult(params, model, losses, 0, i + 1), data, num_batches=2)
      print(f"step {i + 1:5d} eval_em {em:.4f} ({time.time() - start:.0f}s)", flush=True)
    if max_seconds and time.time() - start > max_seconds:
      break
  return TrainResult(params, model, losses, time.time() - start, len(losses))


def evaluate(result: TrainResult, data: ATRConfig, *, num_batches: int = 4,
             batch_size: int = 128, seed: int = 1234,
             transform: Callable | None = None) -> float:
  """Exact match on held-out batches (split 'eval'); `transform` wraps the apply."""
  apply = transform(result.model) if transform else result.model.apply
  fn = jax.jit(lambda p, b: exact_match(apply(p, *b.model_inputs()), b.answer))
  hits = [fn(result.params, generate_batch(data, seed, i, batch_size, "eval"))
          for i in range(num_batches)]
  return float(jnp.concatenate(hits).mean())


def mean_ablation(site: str) -> Callable:
  """transform for `evaluate`: the read port's output replaced by its batch mean."""
  def transform(model):
    def interceptor(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if context.method_name == "read" and "/".join(context.module.path) == site:
        return jnp.broadcast_to(out.mean(0, keepdims=True), out.shape)
      return out

    def apply(params, *inputs):
      with nn.intercept_methods(interceptor):
        return model.apply(params, *inputs)
    return apply
  return transform


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--family", default="attention", choices=architectures.FAMILIES)
  ap.add_argument("--preset", default="p100k")
  ap.add_argument("--steps", type=int, default=3000)
  ap.add_argument("--batch_size", type=int, default=64)
  ap.add_argument("--lr", type=float, default=1e-3)
  ap.add_argument("--bypass", action="store_true")
  ap.add_argument("--eval_every", type=int, default=500)
  ap.add_argument("--max_seconds", type=float, default=0.0)
  ap.add_argument("--scan_impl", default="")
  ap.add_argument("--overrides", default="{}", help="JSON of ArchSpec width fields")
  args = ap.parse_args()
  data = tiny_data_config()
  cfg = dict(family=args.family, preset=args.preset, bypass=args.bypass)
  overrides = json.loads(args.overrides)
  if args.scan_impl:
    overrides["scan_impl"] = args.scan_impl
  if overrides:
    cfg["overrides"] = overrides
  res = train(cfg, data, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
              log_every=250, eval_every=args.eval_every, max_seconds=args.max_seconds)
  em = evaluate(res, data)
  site = architectures.read_port_site(cfg).path
  em_ablated = evaluate(res, data, transform=mean_ablation(site))
  print(f"RESULT family={args.family} preset={args.preset} steps={args.steps} "
        f"steps_done={res.steps} batch={args.batch_size} seconds={res.seconds:.0f} eval_em={em:.4f} "
        f"eval_em_port_mean_ablated={em_ablated:.4f} (chance 1/{data.n_values})")


if __name__ == "__main__":
  main()
