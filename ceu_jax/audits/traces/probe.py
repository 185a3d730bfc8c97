"""SPEC §8.4 companion of the trace audit (World A): a position probe at the answer with the trace fixed.

For a trained chain reader (a read port, `ceu_jax.data.chain` items):
  D+  = the item, answer = [gold trace x_1..x_{h-1}, v, EOS] (teacher forced);
  D−  = the same context with the first hop re-bound, (x_0, k_1) IS a_1 instead of
        x_1: the gold trace now runs through the alternative chain to v'_1 ≠ v,
        but the forced trace x_1..x_{h-1} still resolves to v (its lines are kept);
  L±  = log p(v | q, D±, trace) at the value slot h − 1.
ΔL = L+ − L− is the effect of the context on the answer that bypasses the
stated trace (≈ 0 for a reader whose answer reads the trace: following the
forced trace gives v in both). CEU_answer = restoration of L by patching the
read port at the answer position only (from D+ into D−): how much of that
bypass flows through the read at the answer itself.

Items are probed per chain length h (the value slot differs) and pooled.
Shape legend: B items of one chain length, N context tokens.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ceu_jax import engine
from ceu_jax.audits import position_probe
from ceu_jax.data import chain
from ceu_jax.metrics.resampling import mean_ci
from ceu_jax.retrieval_adapter import ModelInputs

PROBE = 'answer'


def rebind_first_hop(item: chain.ChainItem) -> tuple[int, ...]:
  """[N] the item's context with (x_0, k_1) bound to a_1 instead of x_1."""
  ctx = list(item.context)
  L = chain.LINE_LEN
  hits = [p for p in range(0, len(ctx), L)
          if ctx[p + 1] == item.chain[0] and ctx[p + 3] == item.keys[0]]
  if len(hits) != 1 or ctx[hits[0] + 5] != item.chain[1]:
    raise AssertionError(f'item {item.id!r}: the first hop line is not unique')
  ctx[hits[0] + 5] = item.alt[0]
  return tuple(ctx)


def _inputs(cfg: chain.ChainConfig, items: Sequence[chain.ChainItem], contexts) -> ModelInputs:
  arr = lambda rows: np.asarray(rows, np.int32)
  return ModelInputs(arr([x.query for x in items]), arr(contexts),
                     arr([x.passage_ids for x in items]),
                     arr([chain.answer_tokens(cfg, x) for x in items]))


def answer_probe(model: Any, variables: Any, site: engine.Site, cfg: chain.ChainConfig,
                 items: Sequence[chain.ChainItem], *, eps: float = 1e-3,
                 boot_seed: int = 42) -> dict:
  """ΔL (bypass of the trace) and CEU at the answer position, per chain length and pooled."""
  items = list(items)
  if not items:
    raise ValueError('answer_probe needs at least one item')
  out, dl, ceu, deg = {'by_hops': {}}, [], [], []
  for h in sorted({x.hops for x in items}):
    sub = [x for x in items if x.hops == h]
    plus = _inputs(cfg, sub, [x.context for x in sub])
    minus = _inputs(cfg, sub, [rebind_first_hop(x) for x in sub])
    r = position_probe.slot_probe(model, variables, site, plus, minus, [h - 1], name=PROBE,
                                  eps=eps, boot_seed=boot_seed)
    p = r.pop('per_item')
    out['by_hops'][str(h)] = r
    dl += p['delta_L']
    ceu += p['ceu']
    deg += p['degenerate']
  dl, ceu, deg = (np.asarray(x) for x in (dl, ceu, deg))
  out.update(delta_L=mean_ci(dl, seed=boot_seed).to_dict(),
             ceu_answer=mean_ci(ceu[~deg.astype(bool)], seed=boot_seed).to_dict(),
             n=int(dl.size), n_degenerate=int(deg.sum()), eps=eps)
  return out
