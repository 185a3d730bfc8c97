"""Line-level sampling and rendering for ATR-insert (one example, all line slots).

Formats (every line is `cfg.line_len` = 6 + A tokens, same punctuation):
  standard   : ID #i KEY k_j VALUE v_1 .. v_A .
  paraphrase : KEY k_j OF #i IS v_1 .. v_A .      (value tokens at the same offsets)
  filler     : NOTE w w .. w .                    (4 + A filler words)

Shape legend: L line slots, A answer (value) tokens, W = 4 + A filler words,
T = 6 + A tokens per line.

Query fields: (q_id, q_key, q_vals). For `value_for_key` the query names (ID, KEY)
and asks the VALUE; for `key_for_value` it names (ID, VALUE) and asks the KEY.
Hard negatives share exactly one query field: HARD_SAME_ID shares the ID;
HARD_SAME_KEY shares the second query field (the KEY, or the VALUE for
key_for_value).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import LineKind

VALUE_OFFSET = 5  # value tokens start at this offset in both evidence formats


def randint(key: jax.Array, shape, n: int) -> jax.Array:
  """Uniform int32 in [0, n) from one 32-bit draw per value (bits mod n; the bias,
  at most n / 2^32, is far below anything a test or a model could see). Half the
  random bits of jax.random.randint, which is what the generator's speed hinges on."""
  return (jax.random.bits(key, shape, jnp.uint32) % jnp.uint32(n)).astype(jnp.int32)


def other_than(key: jax.Array, x: jax.Array, n: int) -> jax.Array:
  """Uniform draw from {0..n-1} \\ {x}, elementwise over x."""
  return (x + 1 + randint(key, jnp.shape(x), n - 1)) % n


def prior_values(cfg: ATRConfig, ids: jax.Array, keys: jax.Array):
  """The ρ prior table: (is_fixed [...], fixed values [..., A]) per (ID, KEY) pair.

  A pure function of (world_seed, ID, KEY): the same in every split and process.
  """
  world = jax.random.PRNGKey(cfg.world_seed)

  def one(i, k):
    k_fixed, k_vals = jax.random.split(jax.random.fold_in(world, i * cfg.n_keys + k))
    fixed = jax.random.uniform(k_fixed) < cfg.rho
    vals = randint(k_vals, (cfg.answer_len,), cfg.n_values)
    return fixed, vals

  flat_fixed, flat_vals = jax.vmap(one)(ids.reshape(-1), keys.reshape(-1))
  return (flat_fixed.reshape(ids.shape),
          flat_vals.reshape(ids.shape + (cfg.answer_len,)))


def apply_prior(cfg: ATRConfig, ids, keys, vals):
  """Replace vals by the fixed value wherever the (ID, KEY) pair is fixed."""
  if cfg.rho == 0.0:
    return vals
  fixed, fixed_vals = prior_values(cfg, ids, keys)
  return jnp.where(fixed[..., None], fixed_vals, vals)


def sample_kinds(cfg: ATRConfig, key: jax.Array, num: int, delta: float) -> jax.Array:
  """Kinds of `num` non-evidence lines: hard negative w.p. δ, else filler/distractor."""
  k_hard, k_which, k_fill = jax.random.split(key, 3)
  hard = jax.random.uniform(k_hard, (num,)) < delta
  if cfg.hard_negative_kinds == "both":
    same_key = jax.random.bernoulli(k_which, 0.5, (num,))
  else:
    same_key = jnp.full((num,), cfg.hard_negative_kinds == "same_key")
  hard_kind = jnp.where(same_key, int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID))
  filler = jax.random.uniform(k_fill, (num,)) < cfg.filler_rate
  plain = jnp.where(filler, int(LineKind.FILLER), int(LineKind.DISTRACTOR))
  return jnp.where(hard, hard_kind, plain).astype(jnp.int32)


def sample_fields(cfg: ATRConfig, key: jax.Array, kinds: jax.Array, q_id, q_key, q_vals):
  """(ids [L], keys [L], vals [L, A]) of lines of the given kinds."""
  num = kinds.shape[0]
  k_oid, k_okey, k_vals, k_ovals = jax.random.split(key, 4)
  other_id = other_than(k_oid, jnp.full((num,), q_id), cfg.n_ids)
  rand_vals = randint(k_vals, (num, cfg.answer_len), cfg.n_values)
  is_ev = kinds == int(LineKind.EVIDENCE)
  share_id = is_ev | (kinds == int(LineKind.HARD_SAME_ID))
  share_second = is_ev | (kinds == int(LineKind.HARD_SAME_KEY))
  ids = jnp.where(share_id, q_id, other_id)
  if cfg.variant == "value_for_key":
    other_key = other_than(k_okey, jnp.full((num,), q_key), cfg.n_keys)
    keys = jnp.where(share_second, q_key, other_key)
    vals = apply_prior(cfg, ids, keys, rand_vals)
    vals = jnp.where(is_ev[:, None], q_vals[None, :], vals)
  else:
    other_key = other_than(k_okey, jnp.full((num,), q_key), cfg.n_keys)
    keys = jnp.where(is_ev, q_key, other_key)
    first = other_than(k_ovals, jnp.full((num,), q_vals[0]), cfg.n_values)
    other_vals = rand_vals.at[:, 0].set(first)
    vals = jnp.where(share_second[:, None], q_vals[None, :], other_vals)
  return ids, keys, vals


def sample_words(cfg: ATRConfig, key: jax.Array, num: int, overlap_tokens=None):
  """Filler words [L, W] as token ids; with `overlap_tokens` (two token ids), a
  share `overlap_rate` of lines mention both query tokens at random slots."""
  vocab = cfg.vocab
  n_words = cfg.line_len - 2
  k_w, k_o, k_p1, k_p2 = jax.random.split(key, 4)
  words = vocab.filler_base + randint(k_w, (num, n_words), cfg.n_filler)
  if overlap_tokens is None or cfg.overlap_rate == 0.0:
    return words
  hit = jax.random.uniform(k_o, (num,)) < cfg.overlap_rate
  p1 = randint(k_p1, (num,), n_words)
  p2 = other_than(k_p2, p1, n_words)
  slots = jnp.arange(n_words)[None, :]
  words = jnp.where(hit[:, None] & (slots == p1[:, None]), overlap_tokens[0], words)
  words = jnp.where(hit[:, None] & (slots == p2[:, None]), overlap_tokens[1], words)
  return words


def render(cfg: ATRConfig, kinds, paraphrased, ids, keys, vals, words) -> jax.Array:
  """Tokens [L, T] of lines from their kinds, formats and fields."""
  vocab = cfg.vocab
  num = kinds.shape[0]
  t = vocab.tok

  def col(x):
    return jnp.broadcast_to(jnp.asarray(x, jnp.int32), (num,))[:, None]

  id_tok, key_tok = vocab.id_base + ids, vocab.key_base + keys
  val_tok = vocab.value_base + vals
  standard = jnp.concatenate([col(t("ID")), col(id_tok), col(t("KEY")), col(key_tok),
                              col(t("VALUE")), val_tok, col(t("."))], axis=1)
  para = jnp.concatenate([col(t("KEY")), col(key_tok), col(t("OF")), col(id_tok),
                          col(t("IS")), val_tok, col(t("."))], axis=1)
  filler = jnp.concatenate([col(t("NOTE")), words, col(t("."))], axis=1)
  evidence_format = jnp.where(paraphrased[:, None], para, standard)
  is_filler = (kinds == int(LineKind.FILLER))[:, None]
  return jnp.where(is_filler, filler, evidence_format).astype(jnp.int32)


def parse(cfg: ATRConfig, lines: jax.Array):
  """Inverse of `render` for evidence-format lines: (paraphrased, ids, keys, vals)."""
  vocab = cfg.vocab
  paraphrased = lines[:, 0] == vocab.tok("KEY")
  id_tok = jnp.where(paraphrased, lines[:, 3], lines[:, 1])
  key_tok = jnp.where(paraphrased, lines[:, 1], lines[:, 3])
  vals = lines[:, VALUE_OFFSET:VALUE_OFFSET + cfg.answer_len] - vocab.value_base
  return paraphrased, id_tok - vocab.id_base, key_tok - vocab.key_base, vals
