"""Low-rank adapters (LoRA) on the SmolLM2 attention and MLP projections.

A projection kernel W [I, O] (flax `Dense`, y = x W) is fine-tuned as
    W' = W + (alpha / r) · A B,   A [I, r], B [r, O],
with the base W frozen. B starts at zero, so a freshly initialised adapter (or
`zero_adapters`) leaves the model exactly the base model: `merge` adds an exact
0 to every kernel. Only the adapter tree {A, B} is trained; the base weights
are an argument of the loss (never part of the train state, so never in a
checkpoint). `merge(base, adapters)` returns ordinary SmolLM params, so the
linen model, its read ports and the engine are used unchanged.

With `LoRAConfig.full=True` the trainable tree is the whole parameter tree
(full fine-tuning): `init_trainable` returns a copy of the base and `merged`
ignores the base.

Shape legend: I projection input width, O projection output width, r rank,
L layers.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax.pretrained.model import SmolLMConfig

# Projection name -> the module holding it inside `layers_{l}`.
ATTN_TARGETS = ('q_proj', 'k_proj', 'v_proj', 'o_proj')
MLP_TARGETS = ('gate_proj', 'up_proj', 'down_proj')
TARGETS = ATTN_TARGETS + MLP_TARGETS
MODULE_OF = {**{t: 'attn' for t in ATTN_TARGETS}, **{t: 'mlp' for t in MLP_TARGETS}}


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Which projections carry adapters, and their size."""
  rank: int = 8  # r, adapter rank (>= 1)
  alpha: float = 16.0  # scale numerator: ΔW = (alpha / r) · A B
  targets: tuple[str, ...] = TARGETS  # projections with adapters (subset of TARGETS)
  full: bool = False  # full fine-tuning: every parameter trainable, no adapters

  @property
  def scale(self) -> float:
    return float(self.alpha) / int(self.rank)

  def validate(self, prefix: str = 'lora') -> None:
    """ValueError naming the field (prefix.field) and the allowed values."""
    if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) \
        or self.rank < 1:
      raise ValueError(f'{prefix}.rank must be an integer >= 1, got {self.rank!r}')
    if not np.isfinite(self.alpha) or self.alpha <= 0:
      raise ValueError(f'{prefix}.alpha must be a finite number > 0, got {self.alpha!r}')
    bad = [t for t in self.targets if t not in TARGETS]
    if bad or not self.targets or len(set(self.targets)) != len(self.targets):
      raise ValueError(f'{prefix}.targets must be a non-empty set of distinct names from '
                       f'{TARGETS}, got {tuple(self.targets)!r}')


def from_config(config: Any) -> LoRAConfig:
  """The LoRAConfig of a fine-tune config's `lora` section (rank, alpha, targets, full)."""
  return LoRAConfig(rank=int(config.lora.rank), alpha=float(config.lora.alpha),
                    targets=tuple(config.lora.targets), full=bool(config.lora.full))


class AdapterTask:
  """The adapter half of a SmolLM2 fine-tuning task (the training loop's CustomTask):
  what is trained and what stays frozen. A task sets `config` (with a `lora` section),
  `model_config` (SmolLMConfig) and `base` (the frozen pretrained params)."""
  config: Any
  model_config: SmolLMConfig
  base: dict
  init_tree: Any = None   # the run's start when warm-started (`reader_finetune.warm_start`)

  @property
  def lora(self) -> LoRAConfig:
    return from_config(self.config)

  @property
  def frozen(self) -> Optional[dict]:
    """The base params the loss reads frozen (None when every parameter is trained)."""
    return None if self.lora.full else self.base

  def init_params(self, rng: jax.Array) -> Any:
    """Fresh adapters (`init_trainable`), or init_tree when the run is warm-started."""
    if self.init_tree is not None:
      return self.init_tree
    return init_trainable(rng, self.model_config, self.lora, self.base)


def check_layer(layer: Any, config: SmolLMConfig, field: str = 'model.read_layer') -> int:
  """The read-port layer as an int, or ValueError naming `field` and the range."""
  if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not (
      0 <= layer < config.n_layers):
    raise ValueError(f'{field} must be an integer in [0, {config.n_layers - 1}] (the model '
                     f'has {config.n_layers} layers, read ports layers_{{l}}/attn:read), '
                     f'got {layer!r}')
  return int(layer)


def _kernel_shape(config: SmolLMConfig, target: str) -> tuple[int, int]:
  """(I, O) of a projection kernel."""
  e, f = config.width, config.mlp_width
  hq, hk = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
  return {'q_proj': (e, hq), 'k_proj': (e, hk), 'v_proj': (e, hk), 'o_proj': (hq, e),
          'gate_proj': (e, f), 'up_proj': (e, f), 'down_proj': (f, e)}[target]


def init_adapters(rng: jax.Array, config: SmolLMConfig, lora: LoRAConfig) -> dict:
  """{'layers_{l}': {module: {target: {'a': A [I, r], 'b': B [r, O] = 0}}}}.

  A ~ N(0, 1/I) (so A B has unit-scale rows once B learns); B = 0, so the
  adapted model starts as the base model.
  """
  lora.validate()
  out: dict = {}
  keys = jax.random.split(rng, config.n_layers * len(lora.targets))
  i = 0
  for layer in range(config.n_layers):
    mods: dict = {}
    for t in lora.targets:
      n_in, n_out = _kernel_shape(config, t)
      a = jax.random.normal(keys[i], (n_in, lora.rank), config.dtype) * (n_in ** -0.5)
      mods.setdefault(MODULE_OF[t], {})[t] = {'a': a,
                                              'b': jnp.zeros((lora.rank, n_out), config.dtype)}
      i += 1
    out[f'layers_{layer}'] = mods
  return out


def zero_adapters(adapters: dict) -> dict:
  """The same tree with B = 0 everywhere (the adapted model is the base model)."""
  return jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.zeros_like(x) if p[-1].key == 'b' else x, adapters)


def init_trainable(rng: jax.Array, config: SmolLMConfig, lora: LoRAConfig,
                   base: dict) -> dict:
  """The trained tree: adapters, or (lora.full) a copy of the base params."""
  if lora.full:
    return jax.tree.map(jnp.array, base)
  return init_adapters(rng, config, lora)


def merge(base: dict, adapters: dict, lora: LoRAConfig) -> dict:
  """SmolLM params with W' = W + (alpha / r) · A B for every adapted kernel.

  base: the model's `params` dict; adapters: `init_adapters`' tree (any subset
  of its layers/targets). Differentiable in both; the other leaves are base's.
  """
  out = dict(base)
  for lname, mods in adapters.items():
    if lname not in base:
      raise ValueError(f'adapter layer {lname!r} is not in the base model '
                       f'({sum(k.startswith("layers_") for k in base)} layers)')
    layer = dict(base[lname])
    for mod, targets in mods.items():
      m = dict(layer[mod])
      for t, ab in targets.items():
        k = m[t]['kernel']
        delta = (ab['a'] @ ab['b']) * jnp.asarray(lora.scale, ab['a'].dtype)
        m[t] = {**m[t], 'kernel': k + delta.astype(k.dtype)}
      layer[mod] = m
    out[lname] = layer
  return out


def merged(trainable: dict, base: dict | None, lora: LoRAConfig) -> dict:
  """The model params of a trained tree (`init_trainable`'s kind)."""
  if lora.full:
    return trainable
  return merge(base, trainable, lora)


def num_params(tree: Any) -> int:
  return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(tree)))
