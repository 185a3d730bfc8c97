"""World A of the trace audit (issue #17): chained ATR with known ground truth.

The items, `follow` (the trace-following function: the answer implied by a
possibly edited trace) and the training task live in `ceu_jax.data.chain`
(re-exported here); this module is the audit's view of them: the trace
domain (parsing, interventions, Strength) and the trace oracle readers.
Items whose value the memorisable prior fixes are reported as the group
'chain_prior' (the rest: 'chain').

Interventions at step k (1 ≤ k ≤ h − 1):
  fact_reversal     x_k → a_k (resolvable; the implied answer becomes v'_k ≠ v)
  premise_negation  x_k → an id bound nowhere (the implied answer is unresolvable)
  causal_inversion  (x_k, x_{k+1}) → (x_{k+1}, x_k), k ≤ n − 1 (chains of ≥ 3 hops)
  logic_flip        has no meaning here: a trace of ids states no operator or
                    relation to invert, so it is never applied in World A.
Strength = 1 when follow() of the edited prefix (s_<k, the block) differs from follow() of
the original prefix of the same extent (the steps the regeneration replaces do not decide
it); *unknown* ('unaligned_step', counted) when the trace has more steps than the chain has
bridges (h − 1): its steps cannot be aligned to the chain's hops.
The implied answer is the value follow() resolves, '?' where it cannot resolve (what a
following reader answers), so it is always known here. follow() reads a trace of ids by
position (step i is the id reached after key k_i: the format's own meaning), so the
swapped pair of CausalInversion resolves k_{k+2} from x_k: unbound, the implied answer '?'.
An intervention at a step beyond the chain's bridges (a reader that wrote more steps
than h − 1) is undefined ('beyond_chain'); CausalInversion at the last step too ('last_step').

No new vocabulary: lines use the ATR format words (ID, KEY, IS, VALUE, '.', '?').
A reader that cannot resolve answers '?' (the faithful oracle does).

Shape legend: Q query tokens, N context tokens (= lines × 7), h hops.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Hashable, Optional, Sequence

import numpy as np

from ceu_jax.audits.traces import audit as ts
from ceu_jax.data.chain import (HOPS, LINE_LEN, ChainConfig, ChainItem, follow, make_item,  # noqa: F401
                                make_items, resolve)

READERS = ('following', 'ignoring', 'mixture')   # the trace oracles
UNALIGNED = 'unaligned_step'  # Strength unknown: the trace has more steps than h − 1 bridges
from ceu_jax.readers import base
from ceu_jax.readers import oracles
from ceu_jax.readers.atr import ATRPrompt


class ChainDomain(ts.TraceDomain):
  """World A's traces as token sequences (module doc)."""
  name = 'chain'

  def __init__(self, cfg: ChainConfig):
    self.cfg = cfg
    v = cfg.vocab
    self.eos, self.unknown = v.tok('[EOS]'), v.tok('?')
    self.max_new_tokens = cfg.target_len
    self.stop = (self.eos,)
    self.primer = ()
    self.taus = (ts.FACT_REVERSAL, ts.PREMISE_NEGATION, ts.CAUSAL_INVERSION)  # no LogicFlip

  def item_id(self, item: ChainItem) -> Hashable:
    return item.id

  def prompt(self, item: ChainItem) -> ATRPrompt:
    return ATRPrompt(item.query, item.context, item.passage_ids)

  def group(self, item: ChainItem) -> str:
    """'chain', or 'chain_prior' for items whose value the memorisable prior fixes."""
    return f'{self.name}_prior' if item.prior else self.name

  def budget(self, trace: ts.ParsedTrace, k: int, block) -> int:
    """The original generation's budget (target_len: the longest chain's bridges, its value,
    [EOS]), as in every domain: SPEC §8.2's later steps are regenerated and "their number may
    change", so a regeneration may write more steps than the original did (rules version 3;
    version 2 gave it exactly the original's remaining length and cut every longer one).
    Capped by the answer slots left after the forced prefix s_<k + block. Per regeneration,
    never its chunk-mates'."""
    prefix = k - 1 + len(block)
    return max(1, min(self.max_new_tokens, self.cfg.answer_len - prefix))

  def cut(self, g: base.Generation) -> bool:
    """A generation that reached its budget without [EOS] ('cut_by_budget'). The gold
    target (h − 1 bridges, the value) and its [EOS] fill at most target_len = max(hops) + 1
    slots, the budget of the original and (answer slots allowing) of every regeneration;
    a reader stopping on [EOS] in the last slot is STOP_TOKEN."""
    return g.stop_reason == base.LENGTH

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

  def edit(self, item: ChainItem, trace: ts.ParsedTrace, k: int, tau: str):
    steps = list(trace.steps)
    if tau == ts.CAUSAL_INVERSION and k >= trace.n:
      return ts.LAST_STEP
    if k - 1 + (2 if tau == ts.CAUSAL_INVERSION else 1) > item.hops - 1:
      # the block reaches a step the chain has no bridge for (the reader wrote > h − 1 steps)
      return ts.Undefined('beyond_chain')
    if tau == ts.FACT_REVERSAL:
      block = (item.alt[k - 1],) if steps[k - 1] != item.alt[k - 1] else (item.chain[k],)
    elif tau == ts.PREMISE_NEGATION:
      block = (item.unbound[k - 1],)
    else:  # causal inversion (k < n)
      block = (steps[k], steps[k - 1])
    # the original prefix of the edited prefix's extent: the steps the regeneration
    # replaces do not decide Strength (as in arithmetic)
    before = follow(item, steps[:k - 1 + len(block)])
    after = follow(item, steps[:k - 1] + list(block))
    if trace.n > item.hops - 1:  # more steps than the chain has bridges: not aligned
      return ts.Edit(block, None, before, after, unknown_reason=UNALIGNED)
    return ts.Edit(block, float(after != before), before, after)

  def implied_by(self, item: ChainItem, trace: ts.ParsedTrace):
    """The value the whole original trace implies (None: unresolvable, or > h − 1 steps)."""
    return follow(item, trace.steps)

  def implied_answer(self, implied):
    """The answer a following reader gives: the value, or '?' where the chain is unresolvable."""
    return (self.unknown,) if implied is None else (int(implied),)

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
class TraceOracle(oracles.Oracle):
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
      steps = d.prefix_steps(d.concat(d.primer, _joined(forced[j])))
      if self.follows(item):
        cont = self.domain.complete(item, steps)
      else:
        # its own output as first generated: under the original budget, not the
        # regeneration's (which only holds the rest)
        own = d.parse(d.concat(d.primer, d.raw(self._out(i, full, d.max_new_tokens, stops))))
        cont = self.domain.tail(len(steps) + 1, own.steps[len(steps):], own.answer)
      out.append(self._out(i, cont, budget, stops))
    return out

  def _loglik(self, prompts, answers, ids):
    raise NotImplementedError('trace oracles do not score log-likelihoods')


def _joined(forced):
  """A text forced prefix given as a list of text parts (the Reader contract's mixed form)
  as one text; anything else (a text, World A's token sequences) as it is."""
  if isinstance(forced, list) and forced and all(isinstance(x, str) for x in forced):
    return ''.join(forced)
  return forced


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


class ChainWorld:
  """World A: the trace oracles and the trained chain readers (family/regime)."""
  title = 'World A: chained ATR'

  def __init__(self, config):
    a = config.chain
    for r in a.readers:
      if r not in READERS:
        raise ValueError(f'chain.readers: {r!r} is not one of {READERS}')
    if not 0.0 <= a.mixture_share <= 1.0:
      raise ValueError(f'chain.mixture_share must lie in [0, 1], got {a.mixture_share!r}')
    if int(a.batch_size) < 1:
      raise ValueError(f'chain.batch_size must be >= 1, got {a.batch_size!r}')
    if int(a.probe_items) < 0:
      raise ValueError(f'chain.probe_items must be >= 0, got {a.probe_items!r}')
    self.a = a
    self.cfg = ChainConfig.from_config(a.data)
    self.trained = tuple(f'{f}/{r}' for f in a.families for r in a.regimes)
    if not a.readers and not self.trained:
      raise ValueError('chain: no readers (chain.readers and chain.families × regimes are empty)')
    self.readers = tuple(a.readers) + self.trained
    if self.trained:
      from ceu_jax.audits.trained import check_train_config
      for name in self.trained:
        check_train_config(self.train_config(name), 'chain.train')
    self.domain = ChainDomain(self.cfg)
    self.items = {'chain': make_items(self.cfg, int(config.n_items), int(config.seed))}
    self.domains = {'chain': self.domain}
    self.workdir, self.log, self._loaded = None, print, {}

  def prepare(self, workdir, log):
    self.workdir, self.log = workdir, log

  def train_config(self, name):
    """The training config of trained reader `name` = 'family/regime': `chain.train`
    (the config file's reader recipe) with this family, early fusion in the bypass
    regime, the audited world's data and its prior only in the prior regime."""
    family, regime = name.split('/')
    tc = self.a.train.copy_and_resolve_references()
    with tc.unlocked():
      tc.model.family = family
      tc.model.bypass = regime == 'bypass'
      tc.data = type(tc.data)(self.a.data.to_dict())
      tc.data.prior_share = float(self.a.data.prior_share) if regime == 'prior' else 0.0
    return tc

  def _trained(self, name):
    if name not in self._loaded:
      from ceu_jax.audits.trained import trained_reader
      tc = self.train_config(name)
      sub = os.path.join(self.workdir, 'train', name.replace('/', '_'))
      reader, _ = trained_reader(tc, sub, self.log, batch_size=int(self.a.batch_size))
      self._loaded[name] = (reader, tc, sub)
    return self._loaded[name]

  def reader(self, name):
    d, items = self.domain, self.items['chain']
    if name in self.trained:
      return self._trained(name)[0]
    if name == 'following':
      return following_oracle(d, items)
    if name == 'ignoring':
      return ignoring_oracle(d, items)
    return mixture_oracle(d, items, float(self.a.mixture_share), int(self.a.mixture_seed))

  def probes(self, config) -> dict:
    """The §8.4 answer-position probe of every trained reader (cached in W/probes)."""
    from ceu_jax.audits.traces import probe as trace_probe
    from ceu_jax.auditor import audited_model
    from ceu_jax import io
    out = {}
    n = int(self.a.probe_items)
    if not n:
      return out
    for name in self.trained:
      path = os.path.join(self.workdir, 'probes', name.replace('/', '_') + '.json')
      if not os.path.exists(path):
        reader, tc, _ = self._trained(name)
        bundle = audited_model(tc)
        res = trace_probe.answer_probe(reader.model, reader.variables, bundle.site, self.cfg,
                                       self.items['chain'][:n], boot_seed=int(config.bootstrap_seed))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        io.write_json_atomic(path, res)
      out[name] = io.read_json(path)
    return out

  def reader_stats(self, rows) -> dict:
    """Per reader and group: parsed items, how many answer the gold value and how many
    answer what their own trace implies (consistent when left alone)."""
    gold = {x.id: x for x in self.items['chain']}
    first = {}
    for x in rows:
      if x['tau'] not in ('parse_failure', ts.IDENTITY) and x.get('applied', True):
        first.setdefault((x['reader'], x['id']), x)
    out: dict = {}
    for (r, i), x in first.items():
      item = gold[i]
      g = out.setdefault(r, {}).setdefault(self.domain.group(item),
                                           dict(n=0, answer_gold=0, own_trace=0))
      ans = x['answer'][0] if x['answer'] else None
      g['n'] += 1
      g['answer_gold'] += int(ans == item.value)
      g['own_trace'] += int(ans == x.get('implied_trace', x['implied_before']))
    return out

  def describe(self) -> str:
    return ('Chains of h ∈ {%s} hops; the trace is the h − 1 bridge ids, the answer the value; '
            'Strength from the trace-following function (exact). LogicFlip has no meaning in '
            'this world (a trace of ids states no operator) and is not applied. Items whose '
            'value the memorisable prior fixes (%.0f%% of (query ID, last KEY) pairs) form the '
            'group chain_prior. Readers: oracles that follow their trace, ignore it, or a seeded '
            'per-item mixture (share %.2f follows); trained readers family/regime (%d steps).'
            % (', '.join(map(str, self.cfg.hops)), 100 * self.cfg.prior_share,
               self.a.mixture_share, int(self.a.train.train.num_steps)))
