"""Factory API: build a model from a config, name its read ports, count parameters.

Shape legend: B batch, Q query length, N context length, A answer length, P ports.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from architectures.model import RETRIEVALS, RetrievalModel
from ceu_jax.engine.sites import Site
from architectures.spec import (FAMILIES, PRESETS, REFERENCE_VOCAB, ArchSpec, make_spec,
                                retrieval_layer_indices)

READ_METHOD = "read"


def build_model(model_cfg: Any, *, vocab_size: int, context_len: int, num_passages: int,
                query_len: int, answer_len: int) -> RetrievalModel:
  """The flax module of `model_cfg` (family, preset, retrieval_layers, bypass, dtype)."""
  return RetrievalModel(make_spec(model_cfg, vocab_size=vocab_size, context_len=context_len,
                                  num_passages=num_passages, query_len=query_len,
                                  answer_len=answer_len))


def read_port_sites(model_cfg: Any) -> list[Site]:
  """Every read port of the model, shallowest reader layer first."""
  return [Site(f"reader/block_{i}/retrieval", READ_METHOD)
          for i in retrieval_layer_indices(model_cfg)]


def read_port_site(model_cfg: Any) -> Site:
  """THE read port f of the config (`model.read_port` indexes `read_port_sites`;
  default -1, the last): the one CER trains and every audit scores."""
  sites = read_port_sites(model_cfg)       # validates model.read_port too
  index = model_cfg.get("read_port", -1) if hasattr(model_cfg, "get") else getattr(
      model_cfg, "read_port", -1)
  return sites[index]


def span_decomposition(family: str) -> str:
  """'exact' or 'approximate': how Π_S of the family's read port is computed."""
  if family not in FAMILIES:
    raise ValueError(f"model.family must be one of {FAMILIES}, got {family!r}")
  return RETRIEVALS[family].span_decomposition


def port_mask(spec: ArchSpec, ports: Sequence[int]) -> jax.Array:
  """[P] float mask of the ports in `ports` (for port-restricted patches)."""
  ports = list(ports)
  bad = [p for p in ports if not isinstance(p, (int, np.integer)) or not 0 <= p < spec.num_ports]
  if bad:
    raise ValueError(f"port index must be in range(0, {spec.num_ports}) (P = num_ports of "
                     f"family {spec.family!r}), got {bad}")
  return jnp.zeros((spec.num_ports,), jnp.float32).at[jnp.asarray(ports, jnp.int32)].set(1.0)


def dummy_inputs(spec: ArchSpec, batch: int = 2):
  """Zero-free dummy (query, context, passage_ids, answer) for init / eval_shape."""
  q = jnp.ones((batch, spec.query_len), jnp.int32)
  c = jnp.ones((batch, spec.context_len), jnp.int32)
  pid = jnp.broadcast_to(
      (jnp.arange(spec.context_len) * spec.num_passages) // spec.context_len,
      (batch, spec.context_len)).astype(jnp.int32)
  a = jnp.ones((batch, spec.answer_len), jnp.int32)
  return q, c, pid, a


@functools.partial(jax.jit, static_argnums=0)
def _init(model: RetrievalModel, rng: jax.Array, *inputs: jax.Array):
  """`model.init`, one jitted function for every model: models are frozen dataclasses, so an
  equal model (same config and task sizes) built again reuses the compiled program."""
  return model.init(rng, *inputs)


def init_params(model: RetrievalModel, rng: jax.Array, batch: int = 2):
  """Unboxed parameters of `model` (plain arrays)."""
  variables = _init(model, rng, *dummy_inputs(model.spec, batch))
  return nn.meta.unbox(variables)


def count_params(model: RetrievalModel) -> int:
  """Number of parameters (shape-only: nothing is computed)."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             *dummy_inputs(model.spec, 1)))
  shapes = nn.meta.unbox(shapes)
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))


def reference_param_count(family: str, preset: str, *, vocab_size: int = REFERENCE_VOCAB,
                          context_len: int = 128, num_passages: int = 8, query_len: int = 6,
                          answer_len: int = 1, **cfg: Any) -> int:
  """Parameter count of (family, preset) at reference task sizes."""
  model_cfg = dict(family=family, preset=preset, **cfg)
  return count_params(build_model(model_cfg, vocab_size=vocab_size, context_len=context_len,
                                  num_passages=num_passages, query_len=query_len,
                                  answer_len=answer_len))


def param_table(**sizes: Any) -> dict[str, dict[str, int]]:
  """{preset: {family: parameter count}} at the given (or reference) task sizes."""
  return {p: {f: reference_param_count(f, p, **sizes) for f in FAMILIES} for p in PRESETS}
