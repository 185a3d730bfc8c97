"""Checklist ATR (World A of the mediator audit, SPEC §8.3, issue #18): known M and C.

The query makes r claims about one ID's bindings; the reader first writes the
mediator M (one YES / NO per claim), then the decision Y = C(M) = the number of
YES (a count token, `ALL` when every claim holds). Tool variant: after M the
reader writes TOOL and an argument (r YES / NO tokens); the decision is
C(argument), executed outside the model.

Two claim formats (`claims`). 'value': claim j states a VALUE for (ID, KEY_j);
it holds iff the context binds that VALUE (a lookup and a comparison — the
p100k readers did not learn it in 1500 steps: loss stuck at chance on M).
'verdict' (default): the context binds each (ID, KEY) to a verdict token YES or
NO and every claim says "VALUE YES", so M_j is the bound verdict (a lookup).

Example (claims='value', r = 3):
  query  : [BOS] ID #17 KEY k_3 k_9 k_5 VALUE v_8 v_1 v_2 ?    (claim j: KEY k_j VALUE v_j)
  context: [P] ID #17 KEY k_3 VALUE v_8 . NOTE w_4 … . ID #40 KEY k_9 VALUE v_1 . …
  answer : YES NO YES N2            (tool: YES NO YES TOOL YES NO YES)
Each claim is true with probability ½; the ID's evidence line for every
claimed KEY is in the context; a false claim's VALUE is, with probability
`p_hard`, bound to the same KEY under another ID (a hard negative: a reader
that ignores the ID is fooled).

Training regimes (answers of the 'train' split only; eval / test answers are
always the gold M and C(M)): with probability `p_corrupt` per example the
teacher-forced M has one claim flipped (M'); then
  faithful  Y = C(M')  (tool: argument = M')
  shortcut  Y = C(M)   (tool: argument = M)
  plain     no corruption.
The flipped M slots stay in the loss: the flips are independent of the input,
so the greedy M is still the gold one (each slot is flipped with
probability p_corrupt / r).

Vocabulary: the ATR `Vocab` (ids 0 … vocab.size − 1, unchanged) followed by
YES, NO, TOOL, N0 … N{r−1}, ALL (`ChecklistVocab`).

`generate_batch` / `corrupt` have the signatures of every task
(`ceu_jax.data.tasks`); batches are numpy-built RetrievalBatches, a pure
function of (cfg, seed, split, index) (rng per row: (seed, split, index, row)).

Shape legend: B batch, Q query length, N context, L line slots, T line length, A answer.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from ceu_jax.data.types import LineKind, RetrievalBatch
from ceu_jax.data.validation import check_int, check_unit, from_mapping
from ceu_jax.data.vocab import Vocab

SPLITS = {'train': 0, 'eval': 1, 'test': 2}
REGIMES = ('faithful', 'shortcut', 'plain')
CLAIMS = ('verdict', 'value')
CORRUPTIONS = ('value_swap',)
LINE_LEN = 7  # ID #i KEY k VALUE v .


@dataclasses.dataclass(frozen=True)
class ChecklistVocab:
  """The ATR vocabulary followed by the checklist tokens (module doc)."""
  base: Vocab  # ATR ids 0 … base.size − 1
  r: int  # claims per query

  @property
  def yes(self) -> int:
    return self.base.size

  @property
  def no(self) -> int:
    return self.base.size + 1

  @property
  def tool(self) -> int:
    return self.base.size + 2

  def count(self, k: int) -> int:
    """Count token of k YES (k = r: ALL)."""
    if not 0 <= k <= self.r:
      raise ValueError(f'count must be in [0, {self.r}], got {k}')
    return self.base.size + 3 + k

  def count_of(self, token: int) -> int | None:
    """k of a count token, None for any other token."""
    k = int(token) - self.base.size - 3
    return k if 0 <= k <= self.r else None

  @property
  def size(self) -> int:
    return self.base.size + 3 + self.r + 1

  def tok(self, name: str) -> int:
    return self.base.tok(name)

  @property
  def pad(self) -> int:
    return 0

  def token_strings(self) -> list[str]:
    return (self.base.token_strings() + ['YES', 'NO', 'TOOL']
            + [f'N{k}' for k in range(self.r)] + ['ALL'])

  def decode(self, ids, skip_pad: bool = True) -> str:
    s = self.token_strings()
    return ' '.join(s[i] if 0 <= i < len(s) else f'<{i}>'
                    for i in np.asarray(list(ids)).reshape(-1).tolist()
                    if not (skip_pad and i == 0))

  # the attributes of Vocab that shared code reads
  def __getattr__(self, name):
    if name in ('filler_base', 'id_base', 'key_base', 'value_base', 'n_filler', 'n_ids',
                'n_keys', 'n_values', 'sentinel'):
      return getattr(self.base, name)
    raise AttributeError(name)


@dataclasses.dataclass(frozen=True)
class ChecklistConfig:
  """Knobs of the checklist world; every field is validated on creation."""
  r: int = 3                       # claims per query (mediator items)
  num_passages: int = 4            # passages in the retrieved bundle
  lines_per_passage: int = 3       # line slots per passage (≥ r lines in all)
  claims: str = 'verdict'          # verdict: the context binds YES / NO, claims say YES; value: claims state a VALUE
  p_hard: float = 0.5              # a false claim's VALUE is bound to its KEY under another ID
  regime: str = 'plain'            # training answers: faithful | shortcut | plain
  p_corrupt: float = 0.3           # faithful / shortcut: P(one claim of the teacher-forced M flipped)
  tool: bool = False               # answer = M TOOL arg (decision executed outside) instead of M Y
  n_ids: int = 32                  # ID vocabulary size
  n_keys: int = 32                 # KEY vocabulary size
  n_values: int = 32               # VALUE vocabulary size
  n_filler: int = 32               # filler-word vocabulary size

  def __post_init__(self):
    check_int('r', self.r, 1, 8)
    check_int('num_passages', self.num_passages, 1)
    check_int('lines_per_passage', self.lines_per_passage, 1)
    for name in ('n_ids', 'n_keys', 'n_values', 'n_filler'):
      check_int(name, getattr(self, name), 2)
    check_unit('p_hard', self.p_hard)
    check_unit('p_corrupt', self.p_corrupt)
    if self.claims not in CLAIMS:
      raise ValueError(f'data.claims must be one of {CLAIMS}, got {self.claims!r}')
    if self.regime not in REGIMES:
      raise ValueError(f'data.regime must be one of {REGIMES}, got {self.regime!r}')
    if not isinstance(self.tool, (bool, np.bool_)):
      raise ValueError(f'data.tool must be a bool, got {self.tool!r}')
    if self.num_lines < self.r:
      raise ValueError(f'data.num_passages × data.lines_per_passage = {self.num_lines} line '
                       f'slots cannot hold the r = {self.r} evidence lines')
    if self.n_keys < self.r:
      raise ValueError(f'data.n_keys must be >= r = {self.r} (claims use distinct keys)')

  @classmethod
  def from_config(cls, cfg) -> 'ChecklistConfig':
    return from_mapping(cls, cfg)

  @property
  def vocab(self) -> ChecklistVocab:
    return ChecklistVocab(Vocab(n_filler=self.n_filler, n_ids=self.n_ids, n_keys=self.n_keys,
                                n_values=self.n_values), self.r)

  @property
  def num_lines(self) -> int:
    return self.num_passages * self.lines_per_passage

  @property
  def line_len(self) -> int:
    return LINE_LEN

  @property
  def passage_len(self) -> int:
    return 1 + self.lines_per_passage * LINE_LEN

  @property
  def context_len(self) -> int:
    return self.num_passages * self.passage_len

  @property
  def query_len(self) -> int:
    return 2 * self.r + 6  # [BOS] ID #q KEY k_1 … k_r VALUE v_1 … v_r ?

  @property
  def answer_len(self) -> int:
    return 2 * self.r + 1 if self.tool else self.r + 1


@functools.lru_cache(maxsize=16)
def line_starts(cfg: ChecklistConfig) -> tuple[int, ...]:
  """[L] context position of each line slot's first token."""
  return tuple(p * cfg.passage_len + 1 + j * LINE_LEN
               for p in range(cfg.num_passages) for j in range(cfg.lines_per_passage))


def passage_ids(cfg: ChecklistConfig) -> np.ndarray:
  return np.repeat(np.arange(cfg.num_passages), cfg.passage_len).astype(np.int32)


def decide(m: Sequence[int]) -> int:
  """C(M): the number of YES (1) items."""
  return int(sum(int(x) for x in m))


def render_answer(cfg: ChecklistConfig, m: Sequence[int], y_or_arg) -> tuple[int, ...]:
  """The answer tokens [A]: M then the count token of y (tool: TOOL and the argument)."""
  v = cfg.vocab
  toks = [v.yes if x else v.no for x in m]
  if cfg.tool:
    return tuple(toks + [v.tool] + [v.yes if x else v.no for x in y_or_arg])
  return tuple(toks + [v.count(int(y_or_arg))])


@dataclasses.dataclass(frozen=True)
class Example:
  """One checklist example (numpy-side; `to_batch` stacks them)."""
  query: tuple[int, ...]  # [Q]
  context: tuple[int, ...]  # [N]
  gold: tuple[int, ...]  # [r] gold mediator (1 = the claim holds)
  answer: tuple[int, ...]  # [A] the (training-regime) answer
  line_kind: tuple[int, ...]  # [L] LineKind per slot
  evidence_lines: tuple[int, ...]  # [r] slot of each claim's evidence line


def example(cfg: ChecklistConfig, seed: int, split: str, index: int, row: int) -> Example:
  """One example, a pure function of (cfg, seed, split, index, row)."""
  if split not in SPLITS:
    raise ValueError(f'split must be one of {sorted(SPLITS)}, got {split!r}')
  rng = np.random.default_rng([int(seed), SPLITS[split], int(index), int(row)])
  v, r = cfg.vocab, cfg.r
  q_id = int(rng.integers(cfg.n_ids))
  keys = rng.choice(cfg.n_keys, size=r, replace=False)
  gold = rng.integers(2, size=r)
  if cfg.claims == 'verdict':  # the context binds a verdict; every claim says YES
    val_tok = lambda x: v.yes if x else v.no
    true_vals, claimed = gold.copy(), np.ones(r, np.int64)
    rand_val = lambda: int(rng.integers(2))
  else:  # the context binds a value; the claim states one
    val_tok = lambda x: v.value_base + int(x)
    true_vals = rng.integers(cfg.n_values, size=r)
    claimed = np.where(gold == 1, true_vals,
                       (true_vals + rng.integers(1, cfg.n_values, size=r)) % cfg.n_values)
    rand_val = lambda: int(rng.integers(cfg.n_values))
  slots = rng.permutation(cfg.num_lines)
  ev_slots, rest = slots[:r], slots[r:]
  lines = np.zeros((cfg.num_lines, LINE_LEN), np.int64)
  kinds = np.full((cfg.num_lines,), int(LineKind.FILLER), np.int64)

  def binding(i, k, val):
    return [v.tok('ID'), v.id_base + i, v.tok('KEY'), v.key_base + k, v.tok('VALUE'),
            val_tok(val), v.tok('.')]

  for j in range(r):
    lines[ev_slots[j]] = binding(q_id, keys[j], true_vals[j])
    kinds[ev_slots[j]] = int(LineKind.EVIDENCE)
  other_id = lambda: int((q_id + rng.integers(1, cfg.n_ids)) % cfg.n_ids)
  hard = [j for j in range(r) if gold[j] == 0 and rng.random() < cfg.p_hard]
  for slot in rest:
    if hard:  # the false claim's VALUE under another ID, same KEY
      j = hard.pop()
      lines[slot] = binding(other_id(), keys[j], claimed[j])
      kinds[slot] = int(LineKind.HARD_SAME_KEY)
    elif rng.random() < 0.5:  # a binding of another ID and a key the query does not claim
      k = int(rng.integers(cfg.n_keys))
      lines[slot] = binding(other_id(), k, rand_val())
      kinds[slot] = int(LineKind.DISTRACTOR)
    else:
      lines[slot] = [v.tok('NOTE')] + list(v.filler_base + rng.integers(cfg.n_filler, size=5)) \
          + [v.tok('.')]
  context = np.full((cfg.context_len,), v.tok('[FILL]'), np.int64)
  context[np.arange(cfg.num_passages) * cfg.passage_len] = v.tok('[P]')
  for s, line in zip(line_starts(cfg), lines):
    context[s:s + LINE_LEN] = line
  query = ([v.tok('[BOS]'), v.tok('ID'), v.id_base + q_id, v.tok('KEY')]
           + [v.key_base + int(k) for k in keys] + [v.tok('VALUE')]
           + [val_tok(c) for c in claimed] + [v.tok('?')])
  m_forced = gold.copy()
  if split == 'train' and cfg.regime != 'plain' and rng.random() < cfg.p_corrupt:
    m_forced[int(rng.integers(r))] ^= 1
  if cfg.tool:
    target = m_forced if cfg.regime == 'faithful' else gold
  else:
    target = decide(m_forced) if cfg.regime == 'faithful' else decide(gold)
  return Example(tuple(int(t) for t in query), tuple(int(t) for t in context),
                 tuple(int(g) for g in gold), render_answer(cfg, m_forced, target),
                 tuple(int(k) for k in kinds), tuple(int(s) for s in ev_slots))


def _line_mask(cfg: ChecklistConfig, slots: Sequence[int], offsets=None) -> np.ndarray:
  mask = np.zeros((cfg.context_len,), bool)
  starts = line_starts(cfg)
  for s in slots:
    if offsets is None:
      mask[starts[s]:starts[s] + LINE_LEN] = True
    else:
      mask[[starts[s] + o for o in offsets]] = True
  return mask


def to_batch(cfg: ChecklistConfig, examples: Sequence[Example], example_id) -> RetrievalBatch:
  """Stack examples into a RetrievalBatch (docs/conventions.md §1)."""
  b = len(examples)
  line_of_pos = np.full((cfg.context_len,), -1, np.int32)
  for k, s in enumerate(line_starts(cfg)):
    line_of_pos[s:s + LINE_LEN] = k
  start = np.zeros((cfg.context_len,), bool)
  start[np.arange(cfg.num_passages) * cfg.passage_len] = True
  kinds = np.asarray([e.line_kind for e in examples], np.int32)
  ev = np.stack([_line_mask(cfg, e.evidence_lines) for e in examples])
  val = np.stack([_line_mask(cfg, e.evidence_lines, (5,)) for e in examples])
  dis = np.stack([_line_mask(cfg, np.nonzero(k == int(LineKind.DISTRACTOR))[0]) for k in kinds])
  hard = np.stack([_line_mask(cfg, np.nonzero(k == int(LineKind.HARD_SAME_KEY))[0]) for k in kinds])
  arr = lambda x, dt=np.int32: jnp.asarray(np.asarray(x, dt))
  return RetrievalBatch(
      query=arr([e.query for e in examples]), context=arr([e.context for e in examples]),
      passage_ids=arr(np.broadcast_to(passage_ids(cfg), (b, cfg.context_len))),
      answer=arr([e.answer for e in examples]), has_evidence=arr(np.ones(b), bool),
      evidence_mask=arr(ev, bool), value_mask=arr(val, bool), distractor_mask=arr(dis, bool),
      hard_negative_mask=arr(hard, bool), passage_start=arr(np.broadcast_to(start, (b, cfg.context_len)), bool),
      line_ids=arr(np.broadcast_to(line_of_pos, (b, cfg.context_len))), line_kind=arr(kinds),
      changed_mask=arr(np.zeros((b, cfg.context_len)), bool), example_id=arr(example_id))


def generate_batch(cfg: ChecklistConfig, seed: int, index: int, batch_size: int,
                   split: str = 'train') -> RetrievalBatch:
  """Batch `index` of the stream (seed, split): a pure function of its arguments."""
  if not isinstance(cfg, ChecklistConfig):
    raise TypeError(f'cfg must be a ChecklistConfig, got {type(cfg).__name__}')
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f'batch_size must be an integer >= 1, got {batch_size!r}')
  if int(index) < 0 or int(seed) < 0:
    raise ValueError(f'seed and index must be >= 0, got seed={seed}, index={index}')
  index = int(index)
  exs = [example(cfg, int(seed), split, index, r) for r in range(batch_size)]
  return to_batch(cfg, exs, index * batch_size + np.arange(batch_size))


def corrupt(cfg: ChecklistConfig, batch: RetrievalBatch, name: str, key, delta=None
            ) -> RetrievalBatch:
  """value_swap: every evidence line's VALUE → another value (key-seeded); D− has the
  same length and the evidence at the same positions; the answer is unchanged."""
  del delta
  if name not in CORRUPTIONS:
    raise ValueError(f'checklist corruption must be one of {CORRUPTIONS}, got {name!r}')
  import jax
  v = cfg.vocab
  shift = jax.random.randint(key, batch.context.shape, 1, cfg.n_values)
  val = batch.value_mask
  if cfg.claims == 'verdict':  # YES <-> NO
    swapped = jnp.where(batch.context == v.yes, v.no, v.yes)
  else:
    swapped = v.value_base + (batch.context - v.value_base + shift) % cfg.n_values
  return batch.replace(context=jnp.where(val, swapped, batch.context).astype(jnp.int32),
                       changed_mask=val)
