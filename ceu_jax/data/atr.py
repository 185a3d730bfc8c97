"""ATR-insert: synthetic binding-with-retrieval (SPEC §3), in JAX.

`generate_batch(cfg, seed, index, batch_size, split)` is a pure, jitted function
of (seed, index): batch i of seed s is the same in every process and on every
device layout (row r uses the key fold_in(fold_in(fold_in(seed, split), i), r);
all of a row's random choices are bit fields of one atr_lines.Stream of that key).

Example (value_for_key, value_len = 1):
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
# Bumped whenever the examples of (config, seed, split, index) change; part of the
# key of materialised evaluation sets (evalsets.set_key), so none is reused stale.
# 2: one counter-mode Stream of random bit fields per example (atr_lines.Stream).
GENERATOR_VERSION = 2


def split_key(seed: int | jax.Array, split: str) -> jax.Array:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
  return jax.random.fold_in(jax.random.PRNGKey(seed), SPLITS[split])


# ---------------------------------------------------------------- layout maps
@functools.lru_cache(maxsize=64)
def layout(cfg: ATRConfig) -> ATRLayout:
  return ATRLayout.build(cfg)


def place(cfg: ATRConfig, per_line: jax.Array, marker, pad) -> jax.Array:
  """A context-shaped [N] array from per-line values [L, T] (or [L, 1], repeated
  along the line), `marker` at passage starts and `pad` after the last line of a
  passage: the static layout of `ATRLayout`, by reshapes instead of a gather."""
  m, lpp, t = cfg.num_passages, cfg.lines_per_passage, cfg.line_len
  body = jnp.broadcast_to(per_line, (cfg.num_lines, t)).reshape(m, lpp * t)
  head = jnp.full((m, 1), marker, body.dtype)
  tail = jnp.full((m, cfg.passage_len - 1 - lpp * t), pad, body.dtype)
  return jnp.concatenate([head, body, tail], axis=1).reshape(cfg.context_len)


def lines_to_context(cfg: ATRConfig, lines: jax.Array, base: jax.Array | None = None):
  """Scatter line tokens [L, T] into a context [N]; non-line positions from `base`
  (default: [P] at passage starts, [FILL] elsewhere)."""
  lines = lines.astype(jnp.int32)
  if base is None:
    return place(cfg, lines, cfg.vocab.tok("[P]"), cfg.vocab.tok("[FILL]"))
  in_line = jnp.asarray(layout(cfg).line_of_pos) >= 0
  return jnp.where(in_line, place(cfg, lines, 0, 0), base).astype(jnp.int32)


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
  return place(cfg, line_kind[:, None], -1, -1)


def kind_masks(cfg: ATRConfig, line_kind: jax.Array):
  """(distractor_mask, hard_negative_mask) [N] for one example."""
  tk = token_kinds(cfg, line_kind)
  hard = (tk == int(LineKind.HARD_SAME_KEY)) | (tk == int(LineKind.HARD_SAME_ID))
  return tk == int(LineKind.DISTRACTOR), hard


def answer_offsets_mask(cfg: ATRConfig, paraphrased: jax.Array, offsets=None) -> jax.Array:
  """Bool, per offset in `offsets` (default: the [T] offsets of a line): the
  answer-bearing offsets of an evidence line in its format."""
  offs = jnp.arange(cfg.line_len) if offsets is None else offsets
  if cfg.variant == "value_for_key":
    start = atr_lines.VALUE_OFFSET
    return (offs >= start) & (offs < start + cfg.value_len)
  return offs == jnp.where(paraphrased, 1, 3)   # the KEY token


def evidence_masks(cfg: ATRConfig, ev_line, has_evidence, paraphrased):
  """(evidence_mask [N], value_mask [N]) of the line slot `ev_line`."""
  lay = layout(cfg)
  on_line = (jnp.asarray(lay.line_of_pos) == ev_line) & has_evidence
  answer_at = answer_offsets_mask(cfg, paraphrased, jnp.asarray(lay.offset_of_pos))
  return on_line, on_line & answer_at


# ---------------------------------------------------------------- query
def query_fields(cfg: ATRConfig, rng):
  """(q_id, q_key, q_vals [A]) with the ρ prior applied to the gold values.
  `rng`: a PRNG key or an atr_lines.Stream."""
  stream = atr_lines.as_stream(rng)
  q_id = stream.randint((), cfg.n_ids)
  q_key = stream.randint((), cfg.n_keys)
  vals = stream.randint((cfg.value_len,), cfg.n_values)
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
    return q_id, query[4] - v.key_base, jnp.full((cfg.value_len,), -1)
  return q_id, jnp.asarray(-1), query[4:4 + cfg.value_len] - v.value_base


def memorisable(cfg: ATRConfig, query) -> np.ndarray:
  """[B] bool: the query's (ID, KEY) pair has a value fixed by the ρ prior (the
  parametric channel can answer it without the evidence). All False when ρ = 0 or
  for key_for_value (the prior binds (ID, KEY) pairs; that query names no KEY)."""
  query = np.asarray(query)
  if cfg.rho == 0.0 or cfg.variant != "value_for_key":
    return np.zeros(query.shape[0], bool)
  q_id, q_key, _ = jax.vmap(lambda q: parse_query(cfg, q))(jnp.asarray(query))
  return np.asarray(atr_lines.prior_values(cfg, q_id, q_key)[0])


def strata(cfg: ATRConfig, batch) -> dict[str, np.ndarray]:
  """Named [B] masks the grid reports separately (SPEC §6 H1): examples whose D+ holds
  the evidence and whose answer the ρ prior fixes ('memorised'), or does not
  ('evidence_only'), and examples without the evidence ('no_evidence'). Empty
  without a prior."""
  if cfg.rho == 0.0 or cfg.variant != "value_for_key":
    return {}
  mem, ev = memorisable(cfg, batch.query), np.asarray(batch.has_evidence)
  return {"memorised": ev & mem, "evidence_only": ev & ~mem, "no_evidence": ~ev}


def overlap_tokens(cfg: ATRConfig, q_id, q_key, q_vals):
  """The two query tokens that filler lines may mention (lexical-overlap control)."""
  v = cfg.vocab
  second = v.key_base + q_key if cfg.variant == "value_for_key" else v.value_base + q_vals[0]
  return jnp.stack([v.id_base + q_id, second])


# ---------------------------------------------------------------- one example
def _example(cfg: ATRConfig, key: jax.Array) -> dict:
  stream = atr_lines.Stream(key)      # every draw: fresh bit fields of this key
  q_id, q_key, q_vals = query_fields(cfg, stream)
  has_evidence = ~stream.bernoulli(cfg.eta)
  ev_line = stream.randint((), cfg.num_lines)
  is_ev_line = jnp.arange(cfg.num_lines) == ev_line
  kinds = atr_lines.sample_kinds(cfg, stream, cfg.num_lines, cfg.delta)
  ev_kind = jnp.where(has_evidence, int(LineKind.EVIDENCE), int(LineKind.DISTRACTOR))
  kinds = jnp.where(is_ev_line, ev_kind, kinds)
  ids, kkeys, vals = atr_lines.sample_fields(cfg, stream, kinds, q_id, q_key, q_vals)
  paraphrased = stream.bernoulli(cfg.paraphrase_rate, (cfg.num_lines,))
  words = atr_lines.sample_words(cfg, stream, cfg.num_lines,
                                 overlap_tokens(cfg, q_id, q_key, q_vals))
  lines = atr_lines.render(cfg, kinds, paraphrased, ids, kkeys, vals, words)
  context = lines_to_context(cfg, lines)
  query, answer = render_query(cfg, q_id, q_key, q_vals)
  evidence_mask, value_mask = evidence_masks(cfg, ev_line, has_evidence,
                                             (paraphrased & is_ev_line).any())
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
