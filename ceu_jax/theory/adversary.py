"""T2 on trained models: surface-matched adversarial distractor sets.

The adversary searches the generator's own distractor family. For one
evidence-present example with evidence line e (format σ: standard or
paraphrase), the candidate pool holds, for each of up to `max_slots`
non-evidence line slots, `value_draws` hard negatives of each kind (same KEY
under another ID, same ID with another KEY), rendered by
`data.atr_lines.render` in σ with the line length of every line and never
carrying the gold answer. A candidate set substitutes its lines into their
slots (at most one candidate per slot), so the context keeps its length,
layout and the evidence line untouched. `lower_bound.adversarial_search`
finds the set of at most `budget` substitutions with the lowest
gold-vs-best-alternative logit margin; the example counts as answered wrongly
under attack iff that margin is ≤ 0.

Shape legend: L line slots, T line length, K candidates, N context.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax.data import atr, atr_lines, corruptions
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import LineKind, RetrievalBatch
from ceu_jax.theory import lower_bound
from ceu_jax.theory.measure import TrainedModel, model_logits
from ceu_jax.theory.upper_bound import logit_margin

HARD_KINDS = (int(LineKind.HARD_SAME_KEY), int(LineKind.HARD_SAME_ID))


@dataclasses.dataclass(frozen=True)
class Pool:
  """Candidate substitutions of one example."""
  slot: np.ndarray      # [K] line slot each candidate replaces
  lines: np.ndarray     # [K, T] the candidate line tokens


def _pool_kinds(num_slots: int, value_draws: int) -> np.ndarray:
  """[K] kinds: per slot, value_draws lines of each hard-negative kind."""
  per_slot = np.repeat(np.array(HARD_KINDS), value_draws)
  return np.tile(per_slot, num_slots).astype(np.int32)


@functools.partial(jax.jit, static_argnums=(0,))
def _render_pool(cfg: ATRConfig, kinds, key, query, answer, paraphrased):
  """[K, T] hard-negative lines of the given kinds for one example, format σ."""
  k_fields, k_val = jax.random.split(key)
  q_id, q_key, q_vals = corruptions.gold_fields(cfg, query, answer)
  ids, keys, vals = atr_lines.sample_fields(cfg, k_fields, kinds, q_id, q_key, q_vals)
  if cfg.variant == "value_for_key":   # never the gold value
    clash = vals[:, 0] == q_vals[0]
    other = atr_lines.other_than(k_val, jnp.full(vals.shape[:1], q_vals[0]), cfg.n_values)
    vals = vals.at[:, 0].set(jnp.where(clash, other, vals[:, 0]))
  words = jnp.zeros((kinds.shape[0], cfg.line_len - 2), jnp.int32)
  para = jnp.full(kinds.shape, paraphrased)
  return atr_lines.render(cfg, kinds, para, ids, keys, vals, words)


def candidate_pool(cfg: ATRConfig, ex: dict, key: jax.Array, *, max_slots: int,
                   value_draws: int) -> Pool:
  """The candidate pool of one example (numpy fields of a RetrievalBatch row)."""
  kinds = np.asarray(ex["line_kind"])
  ev = int(np.argmax(kinds == int(LineKind.EVIDENCE)))
  lines = np.asarray(atr.context_to_lines(cfg, jnp.asarray(ex["context"])))
  paraphrased = bool(lines[ev, 0] == cfg.vocab.tok("KEY"))
  free = np.array([s for s in range(cfg.num_lines) if s != ev])
  k_perm, k_pool = jax.random.split(key)
  free = np.asarray(jax.random.permutation(k_perm, free))[:max_slots]
  pool_kinds = _pool_kinds(len(free), value_draws)
  cand = _render_pool(cfg, jnp.asarray(pool_kinds), k_pool, jnp.asarray(ex["query"]),
                      jnp.asarray(ex["answer"]), paraphrased)
  return Pool(np.repeat(free, 2 * value_draws), np.asarray(cand))


class ExampleScorer:
  """score_fn(candidate set) -> gold logit margin of one example.

  Greedy/beam search asks for all one-candidate extensions of a set in a row;
  on a cache miss the scorer evaluates every admissible extension of the
  best-scoring cached parent in one padded batch, so a search step costs one
  forward pass instead of K.
  """

  def __init__(self, tm: TrainedModel, ex: dict, pool: Pool):
    self.tm, self.ex, self.pool = tm, ex, pool
    line_of_pos = atr.layout(tm.data_cfg).line_of_pos
    self.positions = [np.nonzero(line_of_pos == s)[0] for s in range(tm.data_cfg.num_lines)]
    self.cache: dict[tuple, float] = {}
    self.forwards = 0

  def admissible(self, cand: tuple) -> bool:
    slots = self.pool.slot[list(cand)]
    return len(set(slots.tolist())) == len(cand)

  def context(self, cand: tuple) -> np.ndarray:
    """[N] context with the candidates' lines substituted into their slots."""
    ctx = np.array(self.ex["context"])
    for j in cand:
      ctx[self.positions[self.pool.slot[j]]] = self.pool.lines[j]
    return ctx

  def _evaluate(self, sets: list[tuple]) -> None:
    k = len(self.pool.slot) + 1
    ctx = np.stack([self.context(s) for s in sets])
    ctx = np.concatenate([ctx, np.repeat(ctx[:1], k - len(sets), 0)])
    rep = lambda x: np.repeat(np.asarray(x)[None], k, 0)
    inputs = (rep(self.ex["query"]), ctx, rep(self.ex["passage_ids"]), rep(self.ex["answer"]))
    z = np.asarray(model_logits(self.tm.model, self.tm.variables, inputs), np.float64)
    margins = logit_margin(z, np.asarray(inputs[3]))
    self.forwards += 1
    for s, m in zip(sets, margins[:len(sets)]):
      self.cache[s] = float(m)

  def _parent(self, cand: tuple) -> tuple:
    subs = [tuple(x for x in cand if x != i) for i in cand]
    subs = [s for s in subs if s in self.cache]
    return min(subs, key=self.cache.get) if subs else ()

  def __call__(self, cand: tuple) -> float:
    cand = tuple(sorted(cand))
    if cand not in self.cache:
      parent = self._parent(cand)
      kids = {tuple(sorted(parent + (j,))) for j in range(len(self.pool.slot))
              if j not in parent}
      kids = sorted(s for s in kids if self.admissible(s) and s not in self.cache)
      self._evaluate(sorted({cand, *kids}) if cand else [cand])
    return self.cache[cand]


def attack(tm: TrainedModel, batch: RetrievalBatch, key: jax.Array, *, budget: int,
           max_slots: int, value_draws: int, beam_width: int = 1, log=None
           ) -> dict[str, np.ndarray]:
  """Worst-case matched-distractor search on every example of `batch`.

  Returns [B] arrays: clean_margin, worst_margin, clean_correct (margin > 0),
  adv_correct, n_substituted (size of the worst set) and forwards (batched
  forward passes spent).
  """
  fields = {f: np.asarray(getattr(batch, f)) for f in batch.__dataclass_fields__}
  out = {k: [] for k in ("clean_margin", "worst_margin", "n_substituted", "forwards")}
  for i in range(batch.batch_size):
    ex = {f: v[i] for f, v in fields.items()}
    pool = candidate_pool(tm.data_cfg, ex, jax.random.fold_in(key, i),
                          max_slots=max_slots, value_draws=value_draws)
    scorer = ExampleScorer(tm, ex, pool)
    res = lower_bound.adversarial_search(scorer, len(pool.slot), budget,
                                         beam_width=beam_width,
                                         admissible=scorer.admissible)
    for k, v in (("clean_margin", res.base_score), ("worst_margin", res.worst_score),
                 ("n_substituted", len(res.worst_set)), ("forwards", scorer.forwards)):
      out[k].append(v)
    if log is not None and (i + 1) % 32 == 0:
      log(f"[bounds] T2 {tm.name}: {i + 1}/{batch.batch_size} examples attacked")
  res = {k: np.asarray(v) for k, v in out.items()}
  res["clean_correct"] = res["clean_margin"] > 0
  res["adv_correct"] = res["worst_margin"] > 0
  return res
