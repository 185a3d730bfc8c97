"""T2 (lower bound): adversarial matched-distractor search and summaries.

SPEC §7 / paper 000, "Theorem 2": if E[CEU_f] < α on supported examples,
surface-matched distractor injection can reduce accuracy by Ω(1 − α).

The search is model-independent: the caller supplies

  score_fn(candidate_set) -> gold score,

where candidate_set is a tuple of indices into the caller's list of
surface-matched distractor candidates (same format σ as the evidence), and the
gold score is anything the adversary wants to make small: the gold logit, the
gold-vs-best-alternative margin, or an array of those over examples (reduced by
`reduce`, default mean). The search finds the set of at most `budget`
candidates with the lowest score. Building candidates and running the model
belong to the caller (data generator and models).

Summaries compare, across models, the worst-case accuracy drop
acc(D+) − acc(D+ ∪ worst set) with 1 − mean CEU on supported examples.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Sequence

import numpy as np
from scipy import stats as sps

from ceu_jax.metrics import resampling
from ceu_jax.metrics.resampling import DEFAULT_RESAMPLES, DEFAULT_SEED, Aggregate
from ceu_jax.theory.stats import as_bool_array, as_float_array, mean_estimate

CandidateSet = tuple[int, ...]
ScoreFn = Callable[[CandidateSet], "float | np.ndarray"]


@dataclasses.dataclass(frozen=True)
class SearchResult:
  """Outcome of an adversarial distractor search.

  Attributes:
    worst_set: the candidate set with the lowest score found.
    worst_score: its (reduced) score.
    base_score: the score of the empty set (no injected distractors).
    n_evals: number of distinct score_fn calls.
    best_by_size: lowest score found at each set size 0..budget reached.
  """
  worst_set: CandidateSet
  worst_score: float
  base_score: float
  n_evals: int
  best_by_size: tuple[float, ...]

  @property
  def drop(self) -> float:
    """base_score − worst_score (≥ 0)."""
    return self.base_score - self.worst_score


class _CachedScore:
  """Memoises score_fn on canonical keys and counts evaluations."""

  def __init__(self, score_fn: ScoreFn, reduce: Callable, ordered: bool):
    self._fn, self._reduce, self._ordered = score_fn, reduce, ordered
    self._cache: dict[CandidateSet, float] = {}

  def key(self, cand: CandidateSet) -> CandidateSet:
    return cand if self._ordered else tuple(sorted(cand))

  def __call__(self, cand: CandidateSet) -> float:
    k = self.key(cand)
    if k not in self._cache:
      self._cache[k] = float(self._reduce(np.asarray(self._fn(k))))
    return self._cache[k]

  @property
  def n_evals(self) -> int:
    return len(self._cache)


def _expand(beams, num_candidates, score, admissible, max_evals):
  """All admissible one-candidate extensions of the beams, scored."""
  out: dict[CandidateSet, float] = {}
  for cand, _ in beams:
    for j in range(num_candidates):
      new = score.key(cand + (j,))
      if j in cand or new in out or not admissible(new):
        continue
      if max_evals is not None and score.n_evals >= max_evals:
        return out
      out[new] = score(new)
  return out


def adversarial_search(
    score_fn: ScoreFn,
    num_candidates: int,
    budget: int,
    *,
    beam_width: int = 1,
    ordered: bool = False,
    admissible: Callable[[CandidateSet], bool] | None = None,
    max_evals: int | None = None,
    reduce: Callable[[np.ndarray], float] = np.mean,
) -> SearchResult:
  """Greedy (beam_width=1) or beam search for the worst distractor set.

  Args:
    score_fn: candidate set -> gold score (lower is worse for the model).
    num_candidates: size of the candidate pool (indices 0..K−1).
    budget: maximum number of injected distractors.
    beam_width: number of partial sets kept per step.
    ordered: if True, insertion order matters (sets are sequences);
      otherwise sets are canonicalised by sorting and scored once.
    admissible: optional constraint (e.g. a token budget or surface matching).
    max_evals: optional cap on distinct score_fn calls.
    reduce: maps an array-valued score to a float.

  Returns:
    SearchResult; the search keeps going to the full budget even when a
    step does not improve, because set effects need not be monotone.
  """
  score = _CachedScore(score_fn, reduce, ordered)
  admissible = admissible or (lambda _: True)
  base = score(())
  beams: list[tuple[CandidateSet, float]] = [((), base)]
  worst, by_size = ((), base), [base]
  for _ in range(budget):
    scored = _expand(beams, num_candidates, score, admissible, max_evals)
    if not scored:
      break
    beams = sorted(scored.items(), key=lambda kv: kv[1])[:beam_width]
    by_size.append(beams[0][1])
    if beams[0][1] < worst[1]:
      worst = beams[0]
  return SearchResult(worst[0], worst[1], base, score.n_evals, tuple(by_size))


def exhaustive_search(
    score_fn: ScoreFn,
    num_candidates: int,
    budget: int,
    reduce: Callable[[np.ndarray], float] = np.mean,
) -> SearchResult:
  """The exact worst unordered set of size ≤ budget (small pools only)."""
  score = _CachedScore(score_fn, reduce, ordered=False)
  base = score(())
  worst, by_size = ((), base), [base]
  for size in range(1, budget + 1):
    best = min(((c, score(c)) for c in
                itertools.combinations(range(num_candidates), size)),
               key=lambda kv: kv[1])
    by_size.append(best[1])
    if best[1] < worst[1]:
      worst = best
  return SearchResult(worst[0], worst[1], base, score.n_evals, tuple(by_size))


def adversarial_correct(results: Sequence[SearchResult]) -> np.ndarray:
  """Per-example correctness after the attack, for margin-valued scorers.

  With score_fn returning the gold-vs-best-alternative margin of one example,
  the example stays correct under its worst set iff worst_score > 0.
  """
  return np.array([r.worst_score > 0 for r in results], dtype=bool)


# --------------------------------------------------------------- summaries


@dataclasses.dataclass(frozen=True)
class ModelPoint:
  """One model on the T2 plot: x = 1 − mean CEU, y = worst-case accuracy drop."""
  name: str
  one_minus_ceu: Aggregate
  drop: Aggregate
  clean_accuracy: float
  adversarial_accuracy: float


def accuracy_drop(clean_correct, adv_correct, mask=None, **boot) -> Aggregate:
  """Paired-bootstrap estimate of acc(clean) − acc(adversarial) over mask."""
  clean = as_bool_array(clean_correct).reshape(-1).astype(np.float64)
  adv = as_bool_array(adv_correct).reshape(-1).astype(np.float64)
  keep = as_bool_array(mask, clean.size).reshape(-1)
  return mean_estimate(clean - adv, keep, **boot)


def t2_model_point(
    name: str,
    ceu,
    clean_correct,
    adv_correct,
    supported=None,
    degenerate=None,
    **boot,
) -> ModelPoint:
  """Summarises one model on its supported (evidence-present) examples.

  Degenerate examples are excluded from the CEU mean and counted; the
  accuracy drop uses every supported example.
  """
  ceu = as_float_array(ceu).reshape(-1)
  sup = as_bool_array(supported, ceu.size).reshape(-1)
  keep = sup if degenerate is None else sup & ~as_bool_array(degenerate)
  one_minus = mean_estimate(1.0 - ceu, keep, **boot)
  drop = accuracy_drop(clean_correct, adv_correct, sup, **boot)
  clean = as_bool_array(clean_correct).reshape(-1)[sup].mean()
  adv = as_bool_array(adv_correct).reshape(-1)[sup].mean()
  return ModelPoint(name, one_minus, drop, float(clean), float(adv))


def t2_summary(
    points: Sequence[ModelPoint],
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict:
  """Across-model relation between worst-case drop and 1 − mean CEU.

  Returns a dict with
    slope: least-squares k in drop ≈ k (1 − CEU) (through the origin),
      with a bootstrap CI over models (`slope_lo`, `slope_hi`);
    min_ratio: min over models of drop / (1 − CEU), the empirical constant
      of the Ω(1 − α) claim (NaN where 1 − CEU = 0);
    spearman, spearman_p: rank correlation across models (NaN for < 3);
    n_models.
  """
  x = np.array([p.one_minus_ceu.floats()[0] for p in points])
  y = np.array([p.drop.floats()[0] for p in points])
  slope_fn = lambda a, b: float((a * b).sum() / max((a * a).sum(), 1e-300))
  slope, lo, hi = resampling.bootstrap_scalar(
      slope_fn, x, y, num_resamples=n_resamples, seed=seed, strict=False).floats()
  with np.errstate(divide="ignore", invalid="ignore"):
    ratios = np.where(x > 0, y / x, np.nan)
  rho, p = (sps.spearmanr(x, y) if len(points) >= 3 else (np.nan, np.nan))
  return {"slope": slope, "slope_lo": lo, "slope_hi": hi,
          "min_ratio": float(np.nanmin(ratios)) if np.any(x > 0) else np.nan,
          "spearman": float(rho), "spearman_p": float(p),
          "n_models": len(points)}
