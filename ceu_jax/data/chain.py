"""Chained ATR (World A of the trace audit, SPEC §8.2, issue #17): items and the training task.

An item asks for the value at the end of a chain of h hops (h ∈ {2, 3, 4}):

  query    ID #x_0 KEY k_1 KEY k_2 … KEY k_h ?
  hop i    ID #x_{i-1} KEY k_i IS #x_i .          (i = 1..h-1; x_i is bridge i)
  terminal ID #x_{h-1} KEY k_h VALUE v .

The target is the trace — the h − 1 bridge ids x_1..x_{h-1}, one token each —
then the value v, then [EOS] (right-padded with PAD to `answer_len`).
`follow(item, steps)` resolves the rest of a (possibly edited, possibly
partial) trace through the context's bindings; None when a binding is missing.

Hard negatives make edited bridges resolvable: for every step k there is an
alternative id a_k (≠ x_k) with its own chain a_k —k_{k+1}→ … —k_h→ v'_k,
v'_k ≠ v; "same ID, other KEY" lines bind chain ids under keys outside the
chain; distractor lines bind fresh ids. Every (id, key) is bound at most once;
`unbound[k-1]` is an id bound nowhere in the item.

Memorisable prior (`prior_share` > 0): a fixed share of the (x_0, k_h) pairs
(query id, last key) has a fixed value (a table drawn from `world_seed`, the
same for every split); an item whose pair is fixed gets that value as v (its
context binds it as usual), so a reader can answer it from the query alone.
`ChainItem.prior` marks these items.

Layout: `n_lines` lines of 7 tokens in `num_passages` equal passages
(passage_ids = position // (N / num_passages), the layout memory ports need).
No new vocabulary: the ATR format words (ID, KEY, IS, VALUE, '.', '?', [EOS]).

Task API (`ceu_jax.data.tasks`, name 'atr_chain'): `generate_batch(cfg, seed,
index, batch_size, split)` (a pure function of its arguments; rows seeded by
(seed, split, index, row)) and `corrupt(cfg, batch, 'value_swap', key)` (the
gold chain's terminal VALUE → another value; the answer is kept).

Shape legend: B batch, Q query tokens, N context tokens (= lines × 7), L lines, A answer slots.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Hashable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax.data.types import LineKind, RetrievalBatch
from ceu_jax.data.validation import check_int, check_unit, from_mapping
from ceu_jax.data.vocab import Vocab

LINE_LEN = 7  # tokens per line (hop and terminal lines)
HOPS = (2, 3, 4)  # chain lengths of the issue
SPLITS = {'train': 0, 'eval': 1, 'test': 2}
CORRUPTIONS = ('value_swap',)
_SALT = 0x7ACE


@dataclasses.dataclass(frozen=True)
class ChainConfig:
  """Sizes of the chain world; every field is validated on creation."""
  hops: tuple[int, ...] = HOPS  # chain lengths drawn uniformly per item
  n_lines: int = 16  # line slots per context (free slots hold distractors)
  n_same_id: int = 2  # "same ID, other KEY" lines (chain ids under off-chain keys)
  num_passages: int = 4  # passages of equal length (must divide n_lines)
  n_ids: int = 64  # ID vocabulary size
  n_keys: int = 64  # KEY vocabulary size
  n_values: int = 64  # VALUE vocabulary size
  n_filler: int = 32  # filler-word vocabulary size (layout only: chains use none)
  prior_share: float = 0.0  # share of (x_0, k_h) pairs with a fixed value (memorisable prior)
  world_seed: int = 0  # seed of the prior table (shared by every split)
  answer_slots: int = 0  # A (0: 2 × (max hop + 1), room for a forced prefix plus a regeneration)

  def __post_init__(self):
    hops = tuple(int(h) for h in self.hops)
    object.__setattr__(self, 'hops', hops)
    if not hops or any(h not in HOPS for h in hops):
      raise ValueError(f'chain.hops must be a non-empty subset of {HOPS}, got {self.hops!r}')
    need = max(hops) + max(hops) * (max(hops) - 1) // 2 + self.n_same_id
    check_int('n_same_id', self.n_same_id, 0)
    if self.n_lines < need:
      raise ValueError(f'chain.n_lines must be >= {need} for hops {hops} and '
                       f'n_same_id={self.n_same_id}, got {self.n_lines}')
    check_int('num_passages', self.num_passages, 1)
    if self.n_lines % self.num_passages:
      raise ValueError(f'chain.num_passages must divide n_lines = {self.n_lines}, '
                       f'got {self.num_passages}')
    for name in ('n_ids', 'n_keys', 'n_values', 'n_filler'):
      check_int(name, getattr(self, name), 2)
    if self.n_keys < max(hops) + self.n_same_id + 1:
      raise ValueError(f'chain.n_keys must be > {max(hops) + self.n_same_id}, got {self.n_keys}')
    if self.n_ids < 2 * self.n_lines + 4:
      raise ValueError(f'chain.n_ids must be >= {2 * self.n_lines + 4} for '
                       f'n_lines={self.n_lines}, got {self.n_ids}')
    if self.n_values < max(hops) + 1:
      raise ValueError(f'chain.n_values must be >= {max(hops) + 1}, got {self.n_values}')
    check_unit('prior_share', self.prior_share)
    check_int('world_seed', self.world_seed, 0)
    check_int('answer_slots', self.answer_slots, 0)
    if self.answer_slots and self.answer_slots < max(hops) + 1:
      raise ValueError(f'chain.answer_slots must be 0 or >= {max(hops) + 1} (trace, value, '
                       f'[EOS]), got {self.answer_slots}')

  @classmethod
  def from_config(cls, cfg) -> 'ChainConfig':
    return from_mapping(cls, cfg)

  @property
  def vocab(self) -> Vocab:
    return Vocab(n_filler=self.n_filler, n_ids=self.n_ids, n_keys=self.n_keys,
                 n_values=self.n_values)

  @property
  def query_len(self) -> int:
    return 3 + 2 * max(HOPS)  # ID x_0 (KEY k)×h ? , padded to the longest chain

  @property
  def context_len(self) -> int:
    return self.n_lines * LINE_LEN

  @property
  def num_lines(self) -> int:
    return self.n_lines

  @property
  def target_len(self) -> int:
    """Tokens of the longest target: h − 1 bridges, the value, [EOS]."""
    return max(self.hops) + 1

  @property
  def answer_len(self) -> int:
    return self.answer_slots or 2 * self.target_len


@dataclasses.dataclass(frozen=True)
class ChainItem:
  """One item (token ids throughout)."""
  id: Hashable  # unique item id
  query: tuple[int, ...]  # [Q]
  context: tuple[int, ...]  # [N]
  passage_ids: tuple[int, ...]  # [N]
  hops: int  # h
  chain: tuple[int, ...]  # x_0..x_{h-1} (x_0 is the query id)
  keys: tuple[int, ...]  # k_1..k_h
  value: int  # v
  bindings: dict  # (id, key) -> bound token (an id, or the value at the terminal key)
  alt: tuple[int, ...]  # a_1..a_{h-1}: resolvable replacement of bridge k
  unbound: tuple[int, ...]  # per step: an id bound nowhere (premise negation)
  line_kind: tuple[int, ...] = ()  # [L] LineKind of each line slot
  prior: bool = False  # v comes from the memorisable prior table

  @property
  def target(self) -> tuple[int, ...]:
    """The gold trace then the value (no [EOS])."""
    return self.chain[1:] + (self.value,)


def _line(v: Vocab, subj: int, key: int, obj: int, terminal: bool) -> list[int]:
  return [v.tok('ID'), subj, v.tok('KEY'), key, v.tok('VALUE' if terminal else 'IS'), obj,
          v.tok('.')]


@functools.lru_cache(maxsize=8)
def prior_table(cfg: ChainConfig) -> tuple[np.ndarray, np.ndarray]:
  """(fixed [n_ids, n_keys] bool, value index [n_ids, n_keys]) of the prior (world_seed)."""
  rng = np.random.default_rng([cfg.world_seed, _SALT, 1])
  fixed = rng.random((cfg.n_ids, cfg.n_keys)) < cfg.prior_share
  return fixed, rng.integers(cfg.n_values, size=(cfg.n_ids, cfg.n_keys))


def _make(cfg: ChainConfig, rng: np.random.Generator, item_id: Hashable) -> ChainItem:
  v = cfg.vocab
  h = int(cfg.hops[rng.integers(len(cfg.hops))])
  ids = [v.id_base + int(i) for i in rng.permutation(v.n_ids)]
  keys_all = [v.key_base + int(i) for i in rng.permutation(v.n_keys)]
  keys, off_keys = keys_all[:h], keys_all[h:]
  values = [v.value_base + int(i) for i in rng.permutation(v.n_values)]
  value = values.pop()
  chain = [ids.pop() for _ in range(h)]
  prior = False
  if cfg.prior_share > 0:
    fixed, table = prior_table(cfg)
    a, b = chain[0] - v.id_base, keys[-1] - v.key_base
    if fixed[a, b]:  # the drawn value goes back; the fixed one leaves the pool of v'_k
      values.append(value)
      prior, value = True, v.value_base + int(table[a, b])
      values.remove(value)
  lines: list[tuple[int, int, int, bool, int]] = []  # (subj, key, obj, terminal, kind)
  ev, hard_key, hard_id, dis = (int(LineKind.EVIDENCE), int(LineKind.HARD_SAME_KEY),
                                int(LineKind.HARD_SAME_ID), int(LineKind.DISTRACTOR))
  for i in range(1, h):
    lines.append((chain[i - 1], keys[i - 1], chain[i], False, ev))
  lines.append((chain[h - 1], keys[h - 1], value, True, ev))
  alt = []
  for k in range(1, h):  # a_k and its chain through k_{k+1}..k_h to v'_k ≠ v
    cur = ids.pop()
    alt.append(cur)
    for j in range(k + 1, h):
      nxt = ids.pop()
      lines.append((cur, keys[j - 1], nxt, False, hard_key))
      cur = nxt
    lines.append((cur, keys[h - 1], values.pop(), True, hard_key))
  for j in range(cfg.n_same_id):  # same ID, other KEY
    subj = chain[int(rng.integers(h))]
    lines.append((subj, off_keys[j], ids.pop(), False, hard_id))
  unbound = [ids.pop() for _ in range(1, h)]
  while len(lines) < cfg.n_lines:  # distractors: fresh subjects
    terminal = bool(rng.integers(2))
    key = keys_all[int(rng.integers(len(keys_all)))]
    obj = values[int(rng.integers(len(values)))] if terminal else ids[int(rng.integers(len(ids) - 1))]
    lines.append((ids.pop(0), key, obj, terminal, dis))
  order = rng.permutation(len(lines))
  context = [t for j in order for t in _line(v, *lines[j][:4])]
  query = [v.tok('ID'), chain[0]] + [t for k in keys for t in (v.tok('KEY'), k)] + [v.tok('?')]
  query += [v.pad] * (cfg.query_len - len(query))
  bindings = {(s, k): o for s, k, o, _, _ in lines}
  if len(bindings) != len(lines):
    raise AssertionError('an (id, key) pair is bound twice')  # cannot happen: fresh subjects
  plen = cfg.context_len // cfg.num_passages
  return ChainItem(id=item_id, query=tuple(query), context=tuple(context),
                   passage_ids=tuple(p // plen for p in range(cfg.context_len)),
                   hops=h, chain=tuple(chain), keys=tuple(keys), value=value,
                   bindings=bindings, alt=tuple(alt), unbound=tuple(unbound),
                   line_kind=tuple(lines[j][4] for j in order), prior=prior)


def make_item(cfg: ChainConfig, seed: int, index: int) -> ChainItem:
  """Item `index` of the audit stream `seed` (rng seeded by (seed, index): order-independent)."""
  return _make(cfg, np.random.default_rng([seed, index, _SALT]), f'{seed}:{index}')


def make_items(cfg: ChainConfig, n: int, seed: int = 0) -> list[ChainItem]:
  """n items of the audit stream `seed`."""
  if not isinstance(n, int) or n < 1:
    raise ValueError(f'n_items must be an int >= 1, got {n!r}')
  return [make_item(cfg, seed, i) for i in range(n)]


def resolve(item: ChainItem, steps: Sequence[int]) -> Optional[tuple[int, ...]]:
  """The rest of the trace and the value after `steps` (bridges at positions 1..j), or None."""
  j = len(steps)
  if j > item.hops - 1:
    return None
  cur = item.chain[0] if j == 0 else int(steps[-1])
  rest = []
  for i in range(j + 1, item.hops + 1):  # resolve k_i
    cur = item.bindings.get((cur, item.keys[i - 1]))
    if cur is None:
      return None
    rest.append(cur)
  return tuple(rest)


def follow(item: ChainItem, steps: Sequence[int]) -> Optional[int]:
  """The answer implied by a (possibly edited, possibly partial) trace; None: unresolvable."""
  rest = resolve(item, steps)
  return None if rest is None else rest[-1]


# ---------------------------------------------------------------- the training task
def answer_tokens(cfg: ChainConfig, item: ChainItem) -> tuple[int, ...]:
  """[A] the target: trace, value, [EOS], right-padded with PAD."""
  t = item.target + (cfg.vocab.tok('[EOS]'),)
  return t + (cfg.vocab.pad,) * (cfg.answer_len - len(t))


def to_batch(cfg: ChainConfig, items: Sequence[ChainItem], example_id) -> RetrievalBatch:
  """Stack items into a RetrievalBatch (docs/conventions.md §1); evidence = the gold
  chain's lines, value_mask = the terminal VALUE token, hard negatives = the alternative
  chains and the same-ID lines."""
  n, b = cfg.context_len, len(items)
  kinds = np.asarray([x.line_kind for x in items], np.int32)          # [B, L]
  per_pos = np.repeat(kinds, LINE_LEN, axis=1)                        # [B, N]
  ev = per_pos == int(LineKind.EVIDENCE)
  ctx = np.asarray([x.context for x in items], np.int32)
  val = ev & (ctx == cfg.vocab.tok('VALUE'))
  val = np.roll(val, 1, axis=1)                                       # the token after VALUE
  hard = (per_pos == int(LineKind.HARD_SAME_KEY)) | (per_pos == int(LineKind.HARD_SAME_ID))
  pid = np.asarray([x.passage_ids for x in items], np.int32)
  start = np.zeros((b, n), bool)
  start[:, 1:] = pid[:, 1:] != pid[:, :-1]
  start[:, 0] = True
  arr = lambda x, dt=np.int32: jnp.asarray(np.asarray(x, dt))
  return RetrievalBatch(
      query=arr([x.query for x in items]), context=arr(ctx), passage_ids=arr(pid),
      answer=arr([answer_tokens(cfg, x) for x in items]), has_evidence=arr(np.ones(b), bool),
      evidence_mask=arr(ev, bool), value_mask=arr(val, bool),
      distractor_mask=arr(per_pos == int(LineKind.DISTRACTOR), bool),
      hard_negative_mask=arr(hard, bool), passage_start=arr(start, bool),
      line_ids=arr(np.broadcast_to(np.arange(n) // LINE_LEN, (b, n))), line_kind=arr(kinds),
      changed_mask=arr(np.zeros((b, n)), bool), example_id=arr(example_id))


def generate_batch(cfg: ChainConfig, seed: int, index: int, batch_size: int,
                   split: str = 'train') -> RetrievalBatch:
  """Batch `index` of the stream (seed, split): a pure function of its arguments."""
  if not isinstance(cfg, ChainConfig):
    raise TypeError(f'cfg must be a ChainConfig, got {type(cfg).__name__}')
  if split not in SPLITS:
    raise ValueError(f'split must be one of {sorted(SPLITS)}, got {split!r}')
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f'batch_size must be an integer >= 1, got {batch_size!r}')
  if int(index) < 0 or int(seed) < 0:
    raise ValueError(f'seed and index must be >= 0, got seed={seed}, index={index}')
  items = [_make(cfg, np.random.default_rng([int(seed), SPLITS[split], int(index), r, _SALT]),
                 f'{split}:{index}:{r}') for r in range(int(batch_size))]
  return to_batch(cfg, items, int(index) * int(batch_size) + np.arange(int(batch_size)))


def corrupt(cfg: ChainConfig, batch: RetrievalBatch, name: str, key, delta=None
            ) -> RetrievalBatch:
  """value_swap: the gold chain's terminal VALUE → another value (key-seeded); same
  length, evidence at the same positions, the answer unchanged."""
  del delta
  if name not in CORRUPTIONS:
    raise ValueError(f'atr_chain corruption must be one of {CORRUPTIONS}, got {name!r}')
  v = cfg.vocab
  shift = jax.random.randint(key, batch.context.shape, 1, cfg.n_values)
  swapped = v.value_base + (batch.context - v.value_base + shift) % cfg.n_values
  val = batch.value_mask
  return batch.replace(context=jnp.where(val, swapped, batch.context).astype(jnp.int32),
                       changed_mask=val)
