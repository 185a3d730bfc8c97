"""ATR-insert: synthetic binding-with-retrieval (SPEC §3), in JAX.

`generate_batch(cfg, seed, index, batch_size, split)` is a pure, jitted function
of (seed, index): batch i of seed s is the same in every process and on every
device layout (row r uses the key fold_in(fold_in(fold_in(seed, split), i), r)).

Example (value_for_key, answer_len = 1):
  query   : [BOS] ID #17 KEY k_9 VALUE          -> answer: v_3
  context : [P] NOTE w_4 .. . ID #2 KEY k_9 VALUE v_8 . ... ID #17 KEY k_9 VALUE v_3 . ...

Shape legend: B batch, N context, L line slots, T line length, Q query, A answer.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax.data import atr_lines
from ceu_jax.data.atr_config import ATRConfig, ATRLayout
from ceu_jax.data.types import LineKind, RetrievalBatch

SPLITS = {"train": 0, "eval": 1, "test": 2}


def split_key(seed: int | jax.Array, split: str) -> jax.Array:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
  return jax.random.fold_in(jax.random.PRNGKey(seed), SPLITS[split])


# ---------------------------------------------------------------- layout maps
@functools.lru_cache(maxsize=64)
def layout(cfg: ATRConfig) -> ATRLayout:
  return ATRLayout.build(cfg)


def lines_to_context(cfg: ATRConfig, lines: jax.Array, base: jax.Array | None = None):
  """Scatter line tokens [L, T] into a context [N]; non-line positions from `base`
  (default: [P] at passage starts, [FILL] elsewhere)."""
  lay = layout(cfg)
  if base is None:
    base = jnp.where(lay.passage_start, cfg.vocab.tok("[P]"), cfg.vocab.tok("[FILL]"))
  line = jnp.asarray(np.maximum(lay.line_of_pos, 0))
  tokens = lines[line, jnp.asarray(lay.offset_of_pos)]
  return jnp.where(jnp.asarray(lay.line_of_pos) >= 0, tokens, base).astype(jnp.int32)


def context_to_lines(cfg: ATRConfig, context: jax.Array) -> jax.Array:
  """Gather the line tokens [L, T] out of a context [N]."""
  lay = layout(cfg)
  starts = np.zeros(cfg.num_lines, np.int64)
  for pos in np.nonzero((lay.line_of_pos >= 0) & (lay.offset_of_pos == 0))[0]:
    starts[lay.line_of_pos[pos]] = pos
  index = starts[:, None] + np.arange(cfg.line_len)[None, :]
  return context[jnp.asarray(index)]


def token_kinds(cfg: ATRConfig, line_kind: jax.Array) -> jax.Array:
  """Per-token line kind [N] (-1 outside lines) from per-line kinds [L]."""
  line = jnp.asarray(layout(cfg).line_of_pos)
  return jnp.where(line >= 0, line_kind[jnp.maximum(line, 0)], -1)


def kind_masks(cfg: ATRConfig, line_kind: jax.Array):
  """(distractor_mask, hard_negative_mask) [N] for one example."""
  tk = token_kinds(cfg, line_kind)
  hard = (tk == int(LineKind.HARD_SAME_KEY)) | (tk == int(LineKind.HARD_SAME_ID))
  return tk == int(LineKind.DISTRACTOR), hard


def answer_offsets_mask(cfg: ATRConfig, paraphrased: jax.Array) -> jax.Array:
  """[T] bool: the answer-bearing offsets of an evidence line in its format."""
  offs = jnp.arange(cfg.line_len)
  if cfg.variant == "value_for_key":
    start = atr_lines.VALUE_OFFSET
    return (offs >= start) & (offs < start + cfg.answer_len)
  return offs == jnp.where(paraphrased, 1, 3)   # the KEY token


def evidence_masks(cfg: ATRConfig, ev_line, has_evidence, paraphrased):
  """(evidence_mask [N], value_mask [N]) of the line slot `ev_line`."""
  lay = layout(cfg)
  on_line = (jnp.asarray(lay.line_of_pos) == ev_line) & has_evidence
  answer_at = answer_offsets_mask(cfg, paraphrased)[jnp.asarray(lay.offset_of_pos)]
  return on_line, on_line & answer_at


# ---------------------------------------------------------------- query
def query_fields(cfg: ATRConfig, key: jax.Array):
  """(q_id, q_key, q_vals [A]) with the ρ prior applied to the gold values."""
  k_id, k_key, k_vals = jax.random.split(key, 3)
  q_id = atr_lines.randint(k_id, (), cfg.n_ids)
  q_key = atr_lines.randint(k_key, (), cfg.n_keys)
  vals = atr_lines.randint(k_vals, (cfg.answer_len,), cfg.n_values)
  vals = atr_lines.apply_prior(cfg, q_id[None], q_key[None], vals[None])[0]
  return q_id, q_key, vals


def render_query(cfg: ATRConfig, q_id, q_key, q_vals):
  """(query [Q], answer [A_target]) token ids."""
  v = cfg.vocab
  t = v.tok
  id_tok, key_tok = v.id_base + q_id, v.key_base + q_key
  val_tok = v.value_base + q_vals
  if cfg.variant == "value_for_key":
    query = jnp.stack([t("[BOS]"), t("ID"), id_tok, t("KEY"), key_tok, t("VALUE")])
    return query.astype(jnp.int32), val_tok.astype(jnp.int32)
  head = jnp.stack([t("[BOS]"), t("ID"), id_tok, t("VALUE")])
  query = jnp.concatenate([head, val_tok, jnp.asarray([t("KEY")])])
  return query.astype(jnp.int32), key_tok[None].astype(jnp.int32)


def parse_query(cfg: ATRConfig, query: jax.Array):
  """Inverse of render_query: (q_id, q_key, q_vals). q_key is -1 for key_for_value
  (unknown from the query); q_vals is -1 for value_for_key."""
  v = cfg.vocab
  q_id = query[2] - v.id_base
  if cfg.variant == "value_for_key":
    return q_id, query[4] - v.key_base, jnp.full((cfg.answer_len,), -1)
  return q_id, jnp.asarray(-1), query[4:4 + cfg.answer_len] - v.value_base


def overlap_tokens(cfg: ATRConfig, q_id, q_key, q_vals):
  """The two query tokens that filler lines may mention (lexical-overlap control)."""
  v = cfg.vocab
  second = v.key_base + q_key if cfg.variant == "value_for_key" else v.value_base + q_vals[0]
  return jnp.stack([v.id_base + q_id, second])


# ---------------------------------------------------------------- one example
def _example(cfg: ATRConfig, key: jax.Array) -> dict:
  keys = jax.random.split(key, 8)
  q_id, q_key, q_vals = query_fields(cfg, keys[0])
  has_evidence = jax.random.uniform(keys[1]) >= cfg.eta
  ev_line = atr_lines.randint(keys[2], (), cfg.num_lines)
  kinds = atr_lines.sample_kinds(cfg, keys[3], cfg.num_lines, cfg.delta)
  ev_kind = jnp.where(has_evidence, int(LineKind.EVIDENCE), int(LineKind.DISTRACTOR))
  kinds = kinds.at[ev_line].set(ev_kind)
  ids, kkeys, vals = atr_lines.sample_fields(cfg, keys[4], kinds, q_id, q_key, q_vals)
  paraphrased = jax.random.uniform(keys[5], (cfg.num_lines,)) < cfg.paraphrase_rate
  words = atr_lines.sample_words(cfg, keys[6], cfg.num_lines,
                                 overlap_tokens(cfg, q_id, q_key, q_vals))
  lines = atr_lines.render(cfg, kinds, paraphrased, ids, kkeys, vals, words)
  context = lines_to_context(cfg, lines)
  query, answer = render_query(cfg, q_id, q_key, q_vals)
  evidence_mask, value_mask = evidence_masks(cfg, ev_line, has_evidence, paraphrased[ev_line])
  distractor_mask, hard_mask = kind_masks(cfg, kinds)
  lay = layout(cfg)
  return dict(
      query=query, context=context, passage_ids=jnp.asarray(lay.passage_of_pos),
      answer=answer, has_evidence=has_evidence, evidence_mask=evidence_mask,
      value_mask=value_mask, distractor_mask=distractor_mask,
      hard_negative_mask=hard_mask, passage_start=jnp.asarray(lay.passage_start),
      line_ids=jnp.asarray(lay.line_of_pos), line_kind=kinds,
      changed_mask=jnp.zeros((cfg.context_len,), bool))


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _generate(cfg: ATRConfig, seed, index, batch_size: int, split: str) -> RetrievalBatch:
  batch_key = jax.random.fold_in(split_key(seed, split), index)
  rows = jnp.arange(batch_size)
  row_keys = jax.vmap(lambda r: jax.random.fold_in(batch_key, r))(rows)
  fields = jax.vmap(functools.partial(_example, cfg))(row_keys)
  example_id = (jnp.asarray(index, jnp.int32) * batch_size + rows).astype(jnp.int32)
  return RetrievalBatch(example_id=example_id, **fields)


def generate_batch(cfg: ATRConfig, seed: int, index: int, batch_size: int,
                   split: str = "train") -> RetrievalBatch:
  """Batch `index` of the stream (seed, split): a pure function of its arguments."""
  if not isinstance(cfg, ATRConfig):
    raise TypeError(f"cfg must be an ATRConfig, got {type(cfg).__name__}")
  if split not in SPLITS:
    raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
  if int(index) < 0 or int(seed) < 0:
    raise ValueError(f"seed and index must be >= 0, got seed={seed}, index={index}")
  return _generate(cfg, jnp.uint32(seed), jnp.int32(index), int(batch_size), split)
