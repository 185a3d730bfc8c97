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

Randomness: every sampler takes a PRNG key or a `Stream` (bit fields of one key's
counter-mode threefry words, packed several to a word; its docstring says which
draws are exact). The generator passes one Stream per example: at n = 512 that is
218 threefry hashes per example, where 1,085 separate 32-bit draws (one hash
each) and 22 key splits used to be.
"""
from __future__ import annotations

import math

import jax
import jax.extend.random as jax_random_ext
import jax.numpy as jnp

from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import LineKind

VALUE_OFFSET = 5  # value tokens start at this offset in both evidence formats
STREAM_TAG = 0xA7A1  # first counter word of every Stream block (jax.random's own
                     # threefry counters have 0 there), so no block is shared with
                     # jax.random.split / fold_in / bits of the same key


# ---------------------------------------------------------------- random fields
def _is_power_of_two(n: int) -> bool:
  return n >= 1 and n & (n - 1) == 0


class Stream:
  """Random bit fields of one PRNG key, without key splits (a trace-time object).

  Rows of n random words come from threefry2x32(key, (STREAM_TAG, j)), j = a
  block counter; one hash of n blocks gives two rows (jax.random.bits keeps 32 of
  its 64 bits). A draw of shape (n, ...) takes, per trailing index, a `width`-bit
  slot of a row of n words (first fit: draws of the same leading size n share
  rows, so small fields pack several to a word). Every field is a contiguous [n]
  vector, which XLA on CPU vectorises well. No bit is used twice.

  Exactness (f: a w-bit field, uniform on [0, 2^w)):
    randint(n), n a power of two : f, w = log2 n               exact
    randint(n), other n <= 16    : f mod n, w = 16    P off by < n / 2^16 relative
    randint(n), other n          : f mod n, w = 32    P off by < n / 2^32 relative
    bernoulli(p)                 : f < p 2^w, w the smallest <= 16 with p 2^w whole
                                   (exact for 0, 1, 1/2, 1/4, ..), else w = 16 and
                                   P = round(p 2^16) / 2^16, off by <= 2^-17
  """

  def __init__(self, key: jax.Array):
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    self._key = (key[0], key[1])
    self._blocks = 0                      # blocks hashed so far
    self._rows: dict[int, list] = {}      # n -> [[words [n], free bits], ...]
    self._spare: dict[int, jax.Array] = {}  # n -> second row of the last hash

  def _new_row(self, n: int) -> jax.Array:
    spare = self._spare.pop(n, None)
    if spare is not None:
      return spare
    block = jnp.arange(self._blocks, self._blocks + n, dtype=jnp.uint32)
    self._blocks += n
    tag = jnp.full((n,), STREAM_TAG, jnp.uint32)
    row, self._spare[n] = jax_random_ext.threefry2x32_p.bind(*self._key, tag, block)
    return row

  def _slot(self, n: int, width: int) -> jax.Array:
    """[n] uint32 fields of `width` bits from the first row of n words with room."""
    rows = self._rows.setdefault(n, [])
    row = next((r for r in rows if r[1] >= width), None)
    if row is None:
      row = [self._new_row(n), 32]
      rows.append(row)
    shift = 32 - row[1]
    row[1] -= width
    if width == 32:
      return row[0]
    return (row[0] >> jnp.uint32(shift)) & jnp.uint32((1 << width) - 1)

  def fields(self, shape, width: int) -> jax.Array:
    """uint32 of `shape`, each uniform on [0, 2^width) (width 0..32)."""
    shape = tuple(shape)
    if width == 0 or 0 in shape:
      return jnp.zeros(shape, jnp.uint32)
    n = shape[0] if shape else 1
    cols = [self._slot(n, width) for _ in range(math.prod(shape[1:]))]
    return jnp.stack(cols, axis=1).reshape(shape)

  def randint(self, shape, n: int) -> jax.Array:
    """int32 of `shape`, uniform on [0, n) (see the class docstring)."""
    if _is_power_of_two(n):
      return self.fields(shape, n.bit_length() - 1).astype(jnp.int32)
    width = 16 if n <= 16 else 32
    return (self.fields(shape, width) % jnp.uint32(n)).astype(jnp.int32)

  def bernoulli(self, p: float, shape=()) -> jax.Array:
    """bool of `shape`, True with probability p (a Python float in [0, 1])."""
    p = float(p)
    width = next((w for w in range(17) if (p * 2 ** w).is_integer()), 16)
    threshold = round(p * 2 ** width)
    if threshold in (0, 2 ** width):
      return jnp.full(tuple(shape), threshold > 0)
    return self.fields(shape, width) < jnp.uint32(threshold)


def as_stream(rng) -> Stream:
  """A Stream from a PRNG key (raw uint32[2] or typed), or the Stream itself."""
  return rng if isinstance(rng, Stream) else Stream(rng)


def randint(rng, shape, n: int) -> jax.Array:
  """Uniform int32 in [0, n) of `shape` from a key or a Stream (see Stream)."""
  return as_stream(rng).randint(shape, n)


def other_than(rng, x: jax.Array, n: int) -> jax.Array:
  """Uniform draw from {0..n-1} \\ {x}, elementwise over x (key or Stream)."""
  return (x + 1 + randint(rng, jnp.shape(x), n - 1)) % n


# ---------------------------------------------------------------- line sampling
def prior_values(cfg: ATRConfig, ids: jax.Array, keys: jax.Array):
  """The ρ prior table: (is_fixed [...], fixed values [..., A]) per (ID, KEY) pair.

  A pure function of (world_seed, ID, KEY): the same in every split and process.
  """
  world = jax.random.PRNGKey(cfg.world_seed)

  def one(i, k):
    stream = Stream(jax.random.fold_in(world, i * cfg.n_keys + k))
    return stream.bernoulli(cfg.rho), stream.randint((cfg.value_len,), cfg.n_values)

  flat_fixed, flat_vals = jax.vmap(one)(ids.reshape(-1), keys.reshape(-1))
  return (flat_fixed.reshape(ids.shape),
          flat_vals.reshape(ids.shape + (cfg.value_len,)))


def apply_prior(cfg: ATRConfig, ids, keys, vals):
  """Replace vals by the fixed value wherever the (ID, KEY) pair is fixed."""
  if cfg.rho == 0.0:
    return vals
  fixed, fixed_vals = prior_values(cfg, ids, keys)
  return jnp.where(fixed[..., None], fixed_vals, vals)


def sample_kinds(cfg: ATRConfig, rng, num: int, delta: float) -> jax.Array:
  """Kinds of `num` non-evidence lines: hard negative w.p. δ, else filler/distractor.
  `rng`: a PRNG key or a Stream (as for every sampler below)."""
  stream = as_stream(rng)
  hard = stream.bernoulli(delta, (num,))
  if cfg.hard_negative_kinds == "both":
    same_key = stream.bernoulli(0.5, (num,))
  else:
    same_key = jnp.full((num,), cfg.hard_negative_kinds == "same_key")
  hard_kind = jnp.where(same_key, int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID))
  filler = stream.bernoulli(cfg.filler_rate, (num,))
  plain = jnp.where(filler, int(LineKind.FILLER), int(LineKind.DISTRACTOR))
  return jnp.where(hard, hard_kind, plain).astype(jnp.int32)


def sample_fields(cfg: ATRConfig, rng, kinds: jax.Array, q_id, q_key, q_vals):
  """(ids [L], keys [L], vals [L, A]) of lines of the given kinds."""
  stream = as_stream(rng)
  num = kinds.shape[0]
  other_id = other_than(stream, jnp.full((num,), q_id), cfg.n_ids)
  other_key = other_than(stream, jnp.full((num,), q_key), cfg.n_keys)
  rand_vals = stream.randint((num, cfg.value_len), cfg.n_values)
  is_ev = kinds == int(LineKind.EVIDENCE)
  share_id = is_ev | (kinds == int(LineKind.HARD_SAME_ID))
  share_second = is_ev | (kinds == int(LineKind.HARD_SAME_KEY))
  ids = jnp.where(share_id, q_id, other_id)
  if cfg.variant == "value_for_key":
    keys = jnp.where(share_second, q_key, other_key)
    vals = apply_prior(cfg, ids, keys, rand_vals)
    vals = jnp.where(is_ev[:, None], q_vals[None, :], vals)
  else:
    keys = jnp.where(is_ev, q_key, other_key)
    first = other_than(stream, jnp.full((num,), q_vals[0]), cfg.n_values)
    other_vals = rand_vals.at[:, 0].set(first)
    vals = jnp.where(share_second[:, None], q_vals[None, :], other_vals)
  return ids, keys, vals


def sample_words(cfg: ATRConfig, rng, num: int, overlap_tokens=None):
  """Filler words [L, W] as token ids; with `overlap_tokens` (two token ids), a
  share `overlap_rate` of lines mention both query tokens at random slots."""
  stream = as_stream(rng)
  vocab = cfg.vocab
  n_words = cfg.line_len - 2
  words = vocab.filler_base + stream.randint((num, n_words), cfg.n_filler)
  if overlap_tokens is None or cfg.overlap_rate == 0.0:
    return words
  hit = stream.bernoulli(cfg.overlap_rate, (num,))
  p1 = stream.randint((num,), n_words)
  p2 = other_than(stream, p1, n_words)
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
  vals = lines[:, VALUE_OFFSET:VALUE_OFFSET + cfg.value_len] - vocab.value_base
  return paraphrased, id_tok - vocab.id_base, key_tok - vocab.key_base, vals
