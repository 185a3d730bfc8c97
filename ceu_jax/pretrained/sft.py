"""Supervised fine-tuning rows of SmolLM2 readers (LoRA): packing and the target loss.

Shared by the World B reader fine-tunes (`ceu_jax.audits.traces.finetune`: arithmetic
traces; `ceu_jax.audits.mediator.finetune`: checklists). An encoded row is
  (ids, n_target, answer_flags): the whole token sequence (prompt, anything forced, then the
  target), how many of its last tokens are the target (the loss reads them), and per target
  token whether it belongs to the answer (the metric train_answer_acc).
`pack` left-pads rows into a batch; `target_loss` is the mean next-token NLL over the target
tokens, computed from the logits of the last n_tail positions only.

Shape legend: B rows, T = max_len tokens, n = n_tail target positions scored, V vocabulary.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax.pretrained import lora as lora_lib
from ceu_jax.pretrained import model as M
from ceu_jax.pretrained.model import SmolLMConfig

Encoded = tuple[list[int], int, list[bool]]   # (ids, n_target, answer flags over the target)


def check_fit(encoded: Sequence[Encoded], max_len: int, n_tail: int, names: Sequence[str],
              len_field: str = 'data.max_len', tail_field: str = 'data.max_target_tokens',
              what: str = 'training rows') -> None:
  """ValueError naming the field, the longest row and the length it needs when any row is
  longer than max_len tokens or its target longer than n_tail (a run checks all its rows
  this way before anything compiles; `pack` would stop at the first such row mid-run)."""
  for i, field, limit in ((0, len_field, max_len), (1, tail_field, n_tail)):
    need = [len(e[0]) if i == 0 else e[1] for e in encoded]
    if need and max(need) > limit:
      j = int(np.argmax(need))
      part = 'row' if i == 0 else 'target'
      k = sum(n > limit for n in need)
      raise ValueError(f'{field}={limit} is too short for the {len(need)} {what}: {k} of '
                       f'them {"has" if k == 1 else "have"} a longer {part} (the longest: '
                       f'{need[j]} tokens, item {names[j]}); {field} must be >= {need[j]}')


def pack(encoded: Sequence[Encoded], max_len: int, n_tail: int, names: Sequence[str],
         len_field: str = 'data.max_len', tail_field: str = 'data.max_target_tokens') -> dict:
  """tokens / valid / loss_mask / answer_mask [B, max_len], left-padded; ValueError naming
  the row (`names`) and the fields when a row is longer than max_len or its target longer
  than n_tail tokens."""
  from ceu_jax.pretrained.tokenizer import PAD_ID
  b = len(encoded)
  out = dict(tokens=np.full((b, max_len), PAD_ID, np.int32), valid=np.zeros((b, max_len), bool),
             loss_mask=np.zeros((b, max_len), bool), answer_mask=np.zeros((b, max_len), bool))
  for i, ((ids, n_t, flags), name) in enumerate(zip(encoded, names)):
    if len(ids) > max_len or n_t > n_tail:
      raise ValueError(f'item {name}: row of {len(ids)} tokens (max {len_field}={max_len}), '
                       f'target of {n_t} (max {tail_field}={n_tail})')
    out['tokens'][i, max_len - len(ids):] = ids
    out['valid'][i, max_len - len(ids):] = True
    out['loss_mask'][i, max_len - n_t:] = True
    out['answer_mask'][i, max_len - n_t:] = flags
  return out


def target_loss(trainable: Any, base: Optional[dict], batch: dict, *, config: SmolLMConfig,
                lora: lora_lib.LoRAConfig, n_tail: int) -> tuple[jax.Array, dict]:
  """(mean NLL per target token, metrics); differentiable in `trainable`."""
  params = lora_lib.merged(trainable, base, lora)
  tokens = batch['tokens']
  logits = M.SmolLM(config).apply({'params': params}, tokens[:, :-1], batch['valid'][:, :-1],
                                  n_logits=n_tail)                       # [B, n, V]
  tgt = tokens[:, -n_tail:]
  logp = jax.nn.log_softmax(M.as_f32(logits), axis=-1)
  tok = jnp.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
  m, am = batch['loss_mask'][:, -n_tail:], batch['answer_mask'][:, -n_tail:]
  mf = m.astype(jnp.float32)
  nll = -(tok * mf).sum() / jnp.maximum(mf.sum(), 1.0)
  hit = jnp.argmax(logits, -1) == tgt
  answer_ok = jnp.all(hit | ~am, -1) & am.any(-1)
  return nll, {'loss': nll, 'task_nll': nll,
               'token_acc': (hit * mf).sum() / jnp.maximum(mf.sum(), 1.0),
               'train_answer_acc': answer_ok.mean()}
