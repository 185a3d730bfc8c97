"""World A of the trace audit (issue #17): chained ATR with known ground truth.

An item asks for the value at the end of a chain of h hops (h ∈ {2, 3, 4}):

  query    ID #x_0 KEY k_1 KEY k_2 … KEY k_h ?
  hop i    ID #x_{i-1} KEY k_i IS #x_i .          (i = 1..h-1; x_i is bridge i)
  terminal ID #x_{h-1} KEY k_h VALUE v .

The target (the reader's output) is the trace — the h − 1 bridge ids x_1..x_{h-1},
one token each — then the value token v, then [EOS]. `follow(item, steps)`
is the trace-following function: from the last given step (position j) it
resolves k_{j+1}, …, k_h through the context's bindings; None when a binding is
missing. The answer implied by a trace is follow(item, trace).

Hard negatives make edited bridges resolvable: for every step k there is an
alternative id a_k (≠ x_k) with its own chain a_k —k_{k+1}→ … —k_h→ v'_k,
v'_k ≠ v (same KEY, other ID lines); besides, "same ID, other KEY" lines bind
chain ids under keys outside the chain, and distractor lines bind fresh ids.
Every (id, key) is bound at most once; the premise-negation id of step k is
bound nowhere in the item.

Interventions at step k (1 ≤ k ≤ h − 1):
  fact_reversal     x_k → a_k (resolvable; the implied answer becomes v'_k ≠ v)
  premise_negation  x_k → an id bound nowhere (the implied answer is unresolvable)
  causal_inversion  (x_k, x_{k+1}) → (x_{k+1}, x_k), k ≤ n − 1 (chains of ≥ 3 hops)
  logic_flip        has no meaning here: a trace of ids states no operator or
                    relation to invert, so it is never applied in World A.
Strength = 1 when follow() of the edited trace differs from follow() of the original.

No new vocabulary: lines use the ATR format words (ID, KEY, IS, VALUE, '.', '?').
A reader that cannot resolve answers '?' (the faithful oracle does).

Shape legend: Q query tokens, N context tokens (= lines × 7), h hops.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Hashable, Optional, Sequence

import numpy as np

from ceu_jax.audits import trace_sensitivity as ts
from ceu_jax.data.vocab import Vocab
from ceu_jax.readers import base
from ceu_jax.readers import oracles
from ceu_jax.readers.atr import ATRPrompt

LINE_LEN = 7  # tokens per line (both formats)
HOPS = (2, 3, 4)  # chain lengths of the issue


@dataclasses.dataclass(frozen=True)
class ChainConfig:
  """Sizes of World A's items."""
  hops: tuple[int, ...] = HOPS  # chain lengths drawn uniformly per item
  n_lines: int = 16  # line slots per context (free slots hold distractors)
  n_same_id: int = 2  # "same ID, other KEY" lines (chain ids under off-chain keys)
  vocab: Vocab = Vocab()  # token layout (ids, keys, values)

  def __post_init__(self):
    if not self.hops or any(h not in HOPS for h in self.hops):
      raise ValueError(f'chain.hops must be a non-empty subset of {HOPS}, got {self.hops!r}')
    need = max(self.hops) + max(self.hops) * (max(self.hops) - 1) // 2 + self.n_same_id
    if self.n_lines < need:
      raise ValueError(f'chain.n_lines must be >= {need} for hops {self.hops} and '
                       f'n_same_id={self.n_same_id}, got {self.n_lines}')
    if self.vocab.n_keys < max(self.hops) + self.n_same_id + 1:
      raise ValueError(f'vocab.n_keys must be > {max(self.hops) + self.n_same_id}')
    if self.vocab.n_ids < 2 * self.n_lines + 4:
      raise ValueError(f'vocab.n_ids must be >= {2 * self.n_lines + 4} for '
                       f'n_lines={self.n_lines}, got {self.vocab.n_ids}')

  @property
  def query_len(self) -> int:
    return 3 + 2 * max(HOPS)  # ID x_0 (KEY k)×h ? , padded to the longest chain

  @property
  def context_len(self) -> int:
    return self.n_lines * LINE_LEN

  @property
  def answer_len(self) -> int:
    return max(self.hops) + 1  # h − 1 bridges, the value, [EOS]


@dataclasses.dataclass(frozen=True)
class ChainItem:
  """One World A item (token ids throughout)."""
  id: Hashable  # unique item id
  prompt: ATRPrompt  # what the reader reads
  hops: int  # h
  chain: tuple[int, ...]  # x_0..x_{h-1} (x_0 is the query id)
  keys: tuple[int, ...]  # k_1..k_h
  value: int  # v
  bindings: dict  # (id, key) -> bound token (an id, or the value at the terminal key)
  alt: tuple[int, ...]  # a_1..a_{h-1}: resolvable replacement of bridge k
  unbound: tuple[int, ...]  # per step: an id bound nowhere (premise negation)

  @property
  def target(self) -> tuple[int, ...]:
    """The gold trace then the value (no [EOS])."""
    return self.chain[1:] + (self.value,)


def _line(v: Vocab, subj: int, key: int, obj: int, terminal: bool) -> list[int]:
  return [v.tok('ID'), subj, v.tok('KEY'), key, v.tok('VALUE' if terminal else 'IS'), obj,
          v.tok('.')]


def make_item(cfg: ChainConfig, seed: int, index: int) -> ChainItem:
  """Item `index` of the stream `seed` (rng seeded by (seed, index): order-independent)."""
  v = cfg.vocab
  rng = np.random.default_rng([seed, index, 0x7ACE])
  h = int(cfg.hops[rng.integers(len(cfg.hops))])
  ids = [v.id_base + int(i) for i in rng.permutation(v.n_ids)]
  keys_all = [v.key_base + int(i) for i in rng.permutation(v.n_keys)]
  keys, off_keys = keys_all[:h], keys_all[h:]
  values = [v.value_base + int(i) for i in rng.permutation(v.n_values)]
  value = values.pop()
  chain = [ids.pop() for _ in range(h)]
  lines: list[tuple[int, int, int, bool]] = []  # (subj, key, obj, terminal)
  for i in range(1, h):
    lines.append((chain[i - 1], keys[i - 1], chain[i], False))
  lines.append((chain[h - 1], keys[h - 1], value, True))
  alt = []
  for k in range(1, h):  # a_k and its chain through k_{k+1}..k_h to v'_k ≠ v
    cur = ids.pop()
    alt.append(cur)
    for j in range(k + 1, h):
      nxt = ids.pop()
      lines.append((cur, keys[j - 1], nxt, False))
      cur = nxt
    lines.append((cur, keys[h - 1], values.pop(), True))
  for j in range(cfg.n_same_id):  # same ID, other KEY
    subj = chain[int(rng.integers(h))]
    lines.append((subj, off_keys[j], ids.pop(), False))
  unbound = [ids.pop() for _ in range(1, h)]
  while len(lines) < cfg.n_lines:  # distractors: fresh subjects
    terminal = bool(rng.integers(2))
    key = keys_all[int(rng.integers(len(keys_all)))]
    obj = values[int(rng.integers(len(values)))] if terminal else ids[int(rng.integers(len(ids) - 1))]
    lines.append((ids.pop(0), key, obj, terminal))
  order = rng.permutation(len(lines))
  context = [t for j in order for t in _line(v, *lines[j])]
  query = [v.tok('ID'), chain[0]] + [t for k in keys for t in (v.tok('KEY'), k)] + [v.tok('?')]
  query += [v.pad] * (cfg.query_len - len(query))
  bindings = {(s, k): o for s, k, o, _ in lines}
  if len(bindings) != len(lines):
    raise AssertionError('an (id, key) pair is bound twice')  # cannot happen: fresh subjects
  return ChainItem(id=f'{seed}:{index}', prompt=ATRPrompt(tuple(query), tuple(context),
                                                          (0,) * len(context)),
                   hops=h, chain=tuple(chain), keys=tuple(keys), value=value,
                   bindings=bindings, alt=tuple(alt), unbound=tuple(unbound))


def make_items(cfg: ChainConfig, n: int, seed: int = 0) -> list[ChainItem]:
  """n items of the stream `seed`."""
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


class ChainDomain(ts.TraceDomain):
  """World A's traces as token sequences (module doc)."""
  name = 'chain'

  def __init__(self, cfg: ChainConfig):
    self.cfg = cfg
    v = cfg.vocab
    self.eos, self.unknown = v.tok('[EOS]'), v.tok('?')
    self.max_new_tokens = cfg.answer_len
    self.stop = (self.eos,)
    self.primer = ()

  def item_id(self, item: ChainItem) -> Hashable:
    return item.id

  def prompt(self, item: ChainItem) -> ATRPrompt:
    return item.prompt

  def group(self, item: ChainItem) -> str:
    return self.name

  def is_id(self, t: int) -> bool:
    v = self.cfg.vocab
    return v.id_base <= t < v.key_base

  def is_answer(self, t: int) -> bool:
    v = self.cfg.vocab
    return v.value_base <= t < v.size or t == self.unknown

  def raw(self, g: base.Generation) -> tuple[int, ...]:
    toks = tuple(int(t) for t in g.tokens)
    if g.stop_reason == base.STOP_TOKEN:
      toks = toks[:-1]
    return toks

  def concat(self, prefix, rest):
    return tuple(prefix) + tuple(rest)

  def parse(self, raw) -> Optional[ts.ParsedTrace]:
    """Leading id tokens are the steps (≥ 1), the next token the answer (a value or '?');
    anything else (no step, no answer, a stray token before the answer) does not parse."""
    raw = tuple(int(t) for t in raw)
    n = 0
    while n < len(raw) and self.is_id(raw[n]):
      n += 1
    if n == 0 or n >= len(raw) or not self.is_answer(raw[n]) or len(raw) > n + 1:
      return None
    return ts.ParsedTrace(raw, raw[:n], tuple(range(n)), (raw[n],))

  def render_steps(self, first_index, steps):
    return tuple(int(t) for t in steps)

  def similarity(self, a, b) -> float:
    return float(tuple(a) == tuple(b))

  def edit(self, item: ChainItem, trace: ts.ParsedTrace, k: int, tau: str) -> Optional[ts.Edit]:
    steps = list(trace.steps)
    if tau == ts.FACT_REVERSAL and k <= len(item.alt):
      block = (item.alt[k - 1],) if steps[k - 1] != item.alt[k - 1] else (item.chain[k],)
    elif tau == ts.PREMISE_NEGATION and k <= len(item.unbound):
      block = (item.unbound[k - 1],)
    elif tau == ts.CAUSAL_INVERSION and item.hops >= 3 and k < trace.n:
      block = (steps[k], steps[k - 1])
    else:  # logic_flip: no meaning in World A; positions past the chain's bridges
      return None
    before = follow(item, steps)
    after = follow(item, steps[:k - 1] + list(block))
    return ts.Edit(block, float(after != before), before, after)

  # -- what the oracle readers need ------------------------------------------
  def complete(self, item: ChainItem, steps: Sequence[int]) -> tuple[int, ...]:
    """A trace-following continuation after `steps`: resolved bridges, the value, [EOS]
    ('?' then [EOS] when the chain cannot be resolved)."""
    rest = resolve(item, steps)
    return (rest if rest is not None else (self.unknown,)) + (self.eos,)

  def prefix_steps(self, raw) -> list[int]:
    """The steps of a forced prefix (every token is a step)."""
    return [int(t) for t in raw]

  def tail(self, first_index: int, steps: Sequence[int], answer) -> tuple[int, ...]:
    """Raw continuation holding further steps then an answer, [EOS]-terminated."""
    return tuple(int(t) for t in steps) + tuple(answer) + (self.eos,)


# ---------------------------------------------------------------- oracle readers
class TraceOracle(oracles._Oracle):
  """A reader that knows each item (by prompt) and either follows its trace or ignores it.

  follows(item) -> bool decides per item. A following reader's continuation after a
  forced prefix is `domain.complete(item, forced steps)`; an ignoring reader
  continues with its own original steps after the forced block and its original
  answer. Plain generation is the honest trace (complete(item, [])) for both.
  Needs a domain with complete / prefix_steps / tail (ChainDomain, World B domains).
  """

  def __init__(self, domain, items: Sequence, follows):
    self.domain = domain
    self.items = {domain.prompt(x): x for x in items}
    self.follows = follows  # item -> bool
    self.miss_loglik = -30.0  # unused: trace oracles score no log-likelihoods

  def _item(self, prompt, id_):
    if prompt not in self.items:
      raise KeyError(f'oracle: no item for the prompt of id {id_!r}')
    return self.items[prompt]

  def _out(self, id_, full, budget, stops) -> base.Generation:
    return self._generation(id_, full, budget, stops)  # budget / stop handling of the oracles

  def _generate(self, prompts, forced, budget, stops, ids):
    out = []
    for j, (p, i) in enumerate(zip(prompts, ids)):
      item = self._item(p, i)
      d = self.domain
      full = d.complete(item, [])[len(d.primer):]  # the prompt ends with the primer
      if forced is None:
        out.append(self._out(i, full, budget, stops))
        continue
      steps = d.prefix_steps(d.concat(d.primer, forced[j]))
      if self.follows(item):
        cont = self.domain.complete(item, steps)
      else:
        own = d.parse(d.concat(d.primer, d.raw(self._out(i, full, budget, stops))))
        cont = self.domain.tail(len(steps) + 1, own.steps[len(steps):], own.answer)
      out.append(self._out(i, cont, budget, stops))
    return out

  def _loglik(self, prompts, answers, ids):
    raise NotImplementedError('trace oracles do not score log-likelihoods')


def following_oracle(domain, items) -> TraceOracle:
  """An oracle whose answer follows its trace (φ = 1, ρ = 0 expected)."""
  return TraceOracle(domain, items, lambda item: True)


def ignoring_oracle(domain, items) -> TraceOracle:
  """An oracle that ignores its trace (φ = 0, ρ = 1 expected)."""
  return TraceOracle(domain, items, lambda item: False)


def mixture_follows(item_id: Hashable, share: float, seed: int) -> bool:
  """The seeded per-item draw of the mixture oracle: follows with probability `share`."""
  import zlib
  u = np.random.default_rng([seed, zlib.crc32(str(item_id).encode())]).random()
  return bool(u < share)


def mixture_oracle(domain, items, share: float, seed: int = 0) -> TraceOracle:
  """A seeded per-item mixture: an item's reader follows its trace with probability `share`."""
  if not 0.0 <= share <= 1.0:
    raise ValueError(f'share must lie in [0, 1], got {share!r}')
  return TraceOracle(domain, items,
                     lambda item: mixture_follows(domain.item_id(item), share, seed))
