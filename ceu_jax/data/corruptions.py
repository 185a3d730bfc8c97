"""ATR-insert corruptions C: D+ -> D− (SPEC §3), all token-aligned.

Each corruption is a pure function `(cfg, batch, key) -> batch` (plus `delta`
for distractor injection). D− has the same length as D+ and every line at the
same positions; only tokens inside the corrupted span change (`changed_mask`).

Field conventions of the returned batch:
- `evidence_mask` and `value_mask` keep pointing at E(D+) — the positions of
  the clean evidence line — so that span patches address the same tokens in both runs;
- `context`, `line_kind`, `distractor_mask`, `hard_negative_mask` describe D−;
- `has_evidence` says whether D− still supports the gold answer (False after
  value_swap, evidence_swap and removal; unchanged by injection and paraphrase);
- examples without evidence are returned unchanged by the evidence corruptions.

Shape legend: B batch, N context, L line slots, T line length.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from ceu_jax.data import atr, atr_lines
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import LineKind, RetrievalBatch


def gold_fields(cfg: ATRConfig, query: jax.Array, answer: jax.Array):
  """(q_id, q_key, q_vals) of one example from its query and gold answer."""
  q_id, q_key, q_vals = atr.parse_query(cfg, query)
  v = cfg.vocab
  if cfg.variant == "value_for_key":
    return q_id, q_key, answer - v.value_base
  return q_id, answer[0] - v.key_base, q_vals


def _evidence_line(line_kind: jax.Array) -> jax.Array:
  return jnp.argmax(line_kind == int(LineKind.EVIDENCE))


def _hard_kind(cfg: ATRConfig, key: jax.Array) -> jax.Array:
  if cfg.hard_negative_kinds == "both":
    same_key = jax.random.bernoulli(key)
  else:
    same_key = jnp.asarray(cfg.hard_negative_kinds == "same_key")
  return jnp.where(same_key, int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID))


def _with_lines(cfg, ex, lines, kinds, has_evidence):
  """Rebuild one example's D− fields from modified lines and kinds."""
  context = atr.lines_to_context(cfg, lines, base=ex["context"])
  distractor, hard = atr.kind_masks(cfg, kinds)
  return dict(ex, context=context, line_kind=kinds, has_evidence=has_evidence,
              distractor_mask=distractor, hard_negative_mask=hard,
              changed_mask=context != ex["context"])


# ------------------------------------------------------------- per example
def _value_swap(cfg: ATRConfig, ex: dict, key: jax.Array) -> dict:
  v, tok = cfg.vocab, ex["context"]
  if cfg.variant == "value_for_key":
    swapped = v.value_base + atr_lines.other_than(key, tok - v.value_base, cfg.n_values)
  else:
    swapped = v.key_base + atr_lines.other_than(key, tok - v.key_base, cfg.n_keys)
  context = jnp.where(ex["value_mask"], swapped, tok).astype(jnp.int32)
  return dict(ex, context=context, has_evidence=jnp.zeros_like(ex["has_evidence"]),
              changed_mask=context != tok)


def _evidence_swap(cfg: ATRConfig, ex: dict, key: jax.Array) -> dict:
  k_kind, k_fields, k_val = jax.random.split(key, 3)
  lines, kinds = atr.context_to_lines(cfg, ex["context"]), ex["line_kind"]
  ev = _evidence_line(kinds)
  para, q_id, q_key, q_vals = (x[ev] for x in atr_lines.parse(cfg, lines))
  hard = _hard_kind(cfg, k_kind)[None]
  ids, keys, vals = atr_lines.sample_fields(cfg, k_fields, hard, q_id, q_key, q_vals)
  if cfg.variant == "value_for_key":   # the hard negative never carries the gold value
    clash = vals[0, 0] == q_vals[0]
    vals = vals.at[0, 0].set(jnp.where(clash, atr_lines.other_than(k_val, q_vals[0],
                                                                   cfg.n_values), vals[0, 0]))
  words = jnp.zeros((1, cfg.line_len - 2), jnp.int32)
  new = atr_lines.render(cfg, hard, para[None], ids, keys, vals, words)[0]
  has = ex["has_evidence"]
  lines = lines.at[ev].set(jnp.where(has, new, lines[ev]))
  kinds = kinds.at[ev].set(jnp.where(has, hard[0], kinds[ev]))
  return _with_lines(cfg, ex, lines, kinds, jnp.zeros_like(has))


def _fresh_lines(cfg: ATRConfig, ex: dict, key: jax.Array, kinds: jax.Array):
  """Lines [L, T] of the given kinds, sampled as the generator samples them."""
  k_fields, k_para, k_words = jax.random.split(key, 3)
  q_id, q_key, q_vals = gold_fields(cfg, ex["query"], ex["answer"])
  ids, keys, vals = atr_lines.sample_fields(cfg, k_fields, kinds, q_id, q_key, q_vals)
  paraphrased = jax.random.uniform(k_para, (cfg.num_lines,)) < cfg.paraphrase_rate
  words = atr_lines.sample_words(cfg, k_words, cfg.num_lines,
                                 atr.overlap_tokens(cfg, q_id, q_key, q_vals))
  return atr_lines.render(cfg, kinds, paraphrased, ids, keys, vals, words)


def _removal(cfg: ATRConfig, ex: dict, key: jax.Array) -> dict:
  """The evidence passage is replaced by a filler passage of equal length (SPEC §3):
  every line of it becomes a freshly sampled filler line ("NOTE w w w ."), so D− loses
  the evidence and gains no evidence-format line (no hard negative) that a patch of
  E(D+) would leave in place."""
  lines, kinds = atr.context_to_lines(cfg, ex["context"]), ex["line_kind"]
  passage_of_line = jnp.asarray(atr.layout(cfg).passage_of_line)
  ev = _evidence_line(kinds)
  gone = (passage_of_line == passage_of_line[ev]) & ex["has_evidence"]
  fresh_kinds = jnp.full_like(kinds, int(LineKind.FILLER))
  fresh = _fresh_lines(cfg, ex, key, fresh_kinds)
  lines = jnp.where(gone[:, None], fresh, lines)
  kinds = jnp.where(gone, fresh_kinds, kinds)
  return _with_lines(cfg, ex, lines, kinds, jnp.zeros_like(ex["has_evidence"]))


def _distractor_injection(cfg: ATRConfig, ex: dict, key: jax.Array, delta: float) -> dict:
  k_kind, k_lines = jax.random.split(key)
  lines, kinds = atr.context_to_lines(cfg, ex["context"]), ex["line_kind"]
  new_kinds = atr_lines.sample_kinds(dataclasses.replace(cfg, filler_rate=0.0), k_kind,
                                     cfg.num_lines, delta)
  hard = (new_kinds != int(LineKind.DISTRACTOR)) & (kinds != int(LineKind.EVIDENCE))
  rendered = _fresh_lines(cfg, ex, k_lines, new_kinds)
  lines = jnp.where(hard[:, None], rendered, lines)
  kinds = jnp.where(hard, new_kinds, kinds)
  return _with_lines(cfg, ex, lines, kinds, ex["has_evidence"])


def _paraphrase(cfg: ATRConfig, ex: dict, key: jax.Array) -> dict:
  del key
  lines, kinds = atr.context_to_lines(cfg, ex["context"]), ex["line_kind"]
  ev = _evidence_line(kinds)
  para, ids, keys, vals = (x[ev][None] for x in atr_lines.parse(cfg, lines))
  words = jnp.zeros((1, cfg.line_len - 2), jnp.int32)
  new = atr_lines.render(cfg, kinds[ev][None], ~para, ids, keys, vals, words)[0]
  lines = lines.at[ev].set(jnp.where(ex["has_evidence"], new, lines[ev]))
  return _with_lines(cfg, ex, lines, kinds, ex["has_evidence"])


_PER_EXAMPLE: dict[str, Callable] = {
    "value_swap": _value_swap,
    "evidence_swap": _evidence_swap,
    "removal": _removal,
    "distractor_injection": _distractor_injection,
    "paraphrase": _paraphrase,
}
CORRUPTIONS = tuple(_PER_EXAMPLE)
# Bumped when a corruption's D− for the same (config, seed, example) changes; part of the
# key of materialised evaluation sets that hold it (evalsets.set_key), so none is reused
# stale. removal 2: the evidence passage becomes a filler passage (SPEC §3; 394501b).
VERSIONS = {"removal": 2}


@functools.partial(jax.jit, static_argnums=(0, 1, 4))
def _corrupt(cfg: ATRConfig, name: str, batch: RetrievalBatch, key: jax.Array,
             delta: float | None) -> RetrievalBatch:
  fn = _PER_EXAMPLE[name]
  if name == "distractor_injection":
    fn = functools.partial(fn, delta=delta)
  fields = {f: getattr(batch, f) for f in batch.__dataclass_fields__ if f != "example_id"}
  row_keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(batch.example_id)
  out = jax.vmap(functools.partial(fn, cfg))(fields, row_keys)
  return batch.replace(**out)


def corrupt(cfg: ATRConfig, batch: RetrievalBatch, name: str, key: jax.Array,
            delta: float | None = None) -> RetrievalBatch:
  """Apply corruption `name` (one of CORRUPTIONS) to a D+ batch, giving D−.

  Row r uses fold_in(key, example_id[r]), so a corrupted eval set is a pure
  function of (key, example ids). `delta` (strength in [0, 1]) is required for
  distractor_injection and defaults to cfg.delta.
  """
  if name not in _PER_EXAMPLE:
    raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {name!r}")
  if name == "distractor_injection":
    delta = cfg.delta if delta is None else delta
    if not isinstance(delta, (int, float)) or not 0.0 <= delta <= 1.0:
      raise ValueError(f"distractor_injection delta must be in [0, 1], got {delta!r}")
    delta = float(delta)
  else:
    delta = None
  return _corrupt(cfg, name, batch, key, delta)


def value_swap(cfg, batch, key):
  """v* -> v' (a different value) in the evidence line."""
  return corrupt(cfg, batch, "value_swap", key)


def evidence_swap(cfg, batch, key):
  """The evidence line -> a hard-negative line (other ID or other KEY, other value)."""
  return corrupt(cfg, batch, "evidence_swap", key)


def removal(cfg, batch, key):
  """The evidence passage -> a freshly drawn passage of equal length without it."""
  return corrupt(cfg, batch, "removal", key)


def distractor_injection(cfg, batch, key, delta=None):
  """Non-evidence lines -> hard negatives with probability δ (evidence kept)."""
  return corrupt(cfg, batch, "distractor_injection", key, delta)


def paraphrase(cfg, batch, key):
  """The evidence line re-rendered in the other format, same answer."""
  return corrupt(cfg, batch, "paraphrase", key)
