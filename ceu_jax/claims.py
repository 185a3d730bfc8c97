"""Claims decided by a rule in code (SPEC §5a): supported / not supported / opposite / untested.

A claim compares two cells scored on the same items (a CER cell and its baseline,
say) through their paired per-item difference, one per training seed:

  per seed s:  d_s = mean_i (x_i^A − x_i^B) over the items both cells score, with a
               paired percentile-bootstrap 95% CI (items resampled jointly);
  across seeds: mean d̄ and sample sd of the d_s.

`RULE` (the one the README quotes), for a claim that predicts the sign of d:
  supported      ≥ 2 seeds, every d_s has the predicted sign, and |d̄| ≥ 2 sd(d_s);
                 with 1 seed: its paired 95% CI excludes 0 on the predicted side
  opposite       the same with the other sign
  not supported  anything else (the seeds disagree, or the spread is too wide)
  untested       no seed has both cells, or one seed without a within-seed CI
A `Claim` may also carry conditions (e.g. "the accuracy cost is at most 0.10"): each
is a named boolean with the numbers it was decided from; a claim whose direction
verdict is 'supported' but a condition fails is 'not supported'.

`table(claims)` prints them: claim, rule, numbers, verdict.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from ceu_jax.metrics.resampling import Aggregate, fmt_ci, paired_difference_ci

SUPPORTED, NOT_SUPPORTED, OPPOSITE, UNTESTED = (
    "supported", "not supported", "opposite", "untested")
MIN_SD_RATIO = 2.0       # |mean| >= MIN_SD_RATIO x sd of the per-seed differences
RULE = ("paired per-seed differences; supported if every seed has the predicted sign and "
        f"|mean| >= {MIN_SD_RATIO:g} sd over seeds (1 seed: its paired 95% CI excludes 0), "
        "opposite if so with the other sign, else not supported; untested without data")


@dataclasses.dataclass(frozen=True)
class SeedDifference:
  seed: str              # the training seed ('-' when the grid has one cell per setting)
  diff: Aggregate        # paired mean difference A − B with its 95% CI and n items


@dataclasses.dataclass(frozen=True)
class Difference:
  """A − B of one metric over seeds (the numbers a verdict is decided from)."""
  metric: str
  per_seed: tuple[SeedDifference, ...]

  @property
  def values(self) -> np.ndarray:
    return np.asarray([s.diff.value for s in self.per_seed if s.diff.value is not None],
                      np.float64)

  @property
  def mean(self) -> float | None:
    v = self.values
    return float(v.mean()) if v.size else None

  @property
  def sd(self) -> float | None:
    v = self.values
    return float(v.std(ddof=1)) if v.size > 1 else None

  def text(self, digits: int = 3) -> str:
    """'+0.412 ± 0.030 over 2 seeds (0: +0.39 [+0.33, +0.45] n=256; 1: ...)'."""
    if self.mean is None:
      return "no paired items"
    f = f"{{:+.{digits}f}}"
    head = f.format(self.mean) + (f" ± {self.sd:.{digits}f}" if self.sd is not None else "")
    seeds = "; ".join(f"{s.seed}: {_ci(s.diff, digits)}" for s in self.per_seed)
    return f"{head} over {len(self.per_seed)} seed{'s' * (len(self.per_seed) != 1)} ({seeds})"


def _ci(a: Aggregate, digits: int) -> str:
  return "n/a" if a.value is None else f"{fmt_ci(a, digits, signed=True)} n={a.n}"


def paired(metric: str, pairs: Sequence[tuple[str, np.ndarray, np.ndarray]], *,
           seed: int = 42, num_resamples: int = 1000) -> Difference:
  """`pairs`: (seed label, a [n], b [n]) per training seed, a[i] and b[i] the two cells'
  values on item i (items one of them cannot score already dropped)."""
  out = []
  for label, a, b in pairs:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    agg = (paired_difference_ci(a, b, seed=seed, num_resamples=num_resamples) if a.size
           else Aggregate(None, None, None, 0))
    out.append(SeedDifference(str(label), agg))
  return Difference(metric, tuple(out))


def direction(d: Difference, sign: int) -> str:
  """The verdict of `RULE` for a predicted sign (+1: A > B, −1: A < B)."""
  v = d.values
  if v.size == 0:
    return UNTESTED
  if v.size == 1:
    a = d.per_seed[[s.diff.value is not None for s in d.per_seed].index(True)].diff
    if a.ci_low is None:        # one seed and no within-seed CI: nothing to decide from
      return UNTESTED
    if sign * a.ci_low > 0 and sign * a.ci_high > 0:
      return SUPPORTED
    if sign * a.ci_low < 0 and sign * a.ci_high < 0:
      return OPPOSITE
    return NOT_SUPPORTED
  wide = abs(v.mean()) < MIN_SD_RATIO * v.std(ddof=1)
  if np.all(sign * v > 0) and not wide:
    return SUPPORTED
  if np.all(sign * v < 0) and not wide:
    return OPPOSITE
  return NOT_SUPPORTED


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim: what it says, the numbers, and its verdict by `RULE` (+ conditions)."""
  name: str                                   # e.g. 'H2 attention, CER evidence'
  statement: str                              # what is claimed, in words
  verdict: str                                # supported | not supported | opposite | untested
  numbers: str                                # the numbers the verdict comes from
  rule: str = RULE


def combine(name: str, statement: str, parts: Sequence[tuple[str, Difference, int]],
            conditions: Sequence[tuple[str, bool | None, str]] = ()) -> Claim:
  """A claim made of directional parts (label, difference, predicted sign) and conditions
  (label, holds (None: untested), numbers). Supported when every part is supported and
  every condition holds; opposite when every part is opposite; untested when a part is
  untested; else not supported."""
  verdicts = [direction(d, sign) for _, d, sign in parts]
  held = [h for _, h, _ in conditions]
  if any(v == UNTESTED for v in verdicts) or any(h is None for h in held):
    verdict = UNTESTED
  elif all(v == SUPPORTED for v in verdicts) and all(held):
    verdict = SUPPORTED
  elif verdicts and all(v == OPPOSITE for v in verdicts):
    verdict = OPPOSITE
  else:
    verdict = NOT_SUPPORTED
  numbers = "; ".join([f"{label} {d.text()} → {v}" for (label, d, _), v in zip(parts, verdicts)]
                      + [f"{label}: {num} → {'holds' if h else 'fails' if h is not None else 'untested'}"
                         for label, h, num in conditions])
  rule = RULE + ("; and " + ", ".join(label for label, _, _ in conditions) if conditions else "")
  return Claim(name, statement, verdict, numbers, rule)


def across(name: str, statement: str, claims: Sequence[Claim]) -> Claim:
  """A claim that holds when every one of `claims` is supported (e.g. H4: H2 for every
  interface): opposite when all are opposite, untested when any is, else not supported."""
  vs = [c.verdict for c in claims]
  if not vs or UNTESTED in vs:
    verdict = UNTESTED
  elif all(v == SUPPORTED for v in vs):
    verdict = SUPPORTED
  elif all(v == OPPOSITE for v in vs):
    verdict = OPPOSITE
  else:
    verdict = NOT_SUPPORTED
  return Claim(name, statement, verdict, "; ".join(f"{c.name}: {c.verdict}" for c in claims),
               "every part supported")


def of_run(name: str, statement: str, agg: "Aggregate | dict | None", sign: int, *,
           against: float = 0.0, label: str = "") -> Claim:
  """A claim decided from one run's estimate and its 95% CI (a companion audit's
  headline): `RULE` with one seed, on value − `against` (e.g. a rate against 0.5)."""
  if not isinstance(agg, Aggregate):
    agg = Aggregate.from_dict(agg)
  shifted = (agg if agg.value is None or not against else
             Aggregate(agg.value - against, None if agg.ci_low is None else agg.ci_low - against,
                       None if agg.ci_high is None else agg.ci_high - against, agg.n))
  d = Difference(label or name, (SeedDifference("run", shifted),))
  verdict = direction(d, sign)
  rel = "<" if sign < 0 else ">"
  numbers = f"{label + ' ' if label else ''}{_ci(agg, 3)} (predicted {rel} {against:g}) → {verdict}"
  return Claim(name, statement, verdict, numbers,
               f"one run: supported if the 95% CI lies {'below' if sign < 0 else 'above'} "
               f"{against:g}, opposite if it lies on the other side, else not supported")


def table(claims: Sequence[Claim]) -> str:
  """Markdown: claim | statement | verdict | numbers (the rule once, below)."""
  lines = ["| claim | statement | verdict | numbers |", "|---|---|---|---|"]
  for c in claims:
    lines.append(f"| {c.name} | {c.statement} | **{c.verdict}** | {c.numbers} |")
  rules = sorted({c.rule for c in claims})
  return "\n".join(lines + [""] + [f"Rule: {r}." for r in rules])


def failed_thresholds(values: Mapping, limits: Mapping,
                      checks: Sequence[tuple[str, str, str]], prefix: str = '') -> list[str]:
  """'<prefix><name> <value> < <least>' for each (name, value key, limit key) check that
  `values` fail against `limits`: why a reader is not competent, naming only what it failed
  (the companion audits' competence rules)."""
  return [f"{prefix}{name} {values[key]:.3f} < {limits[least]}"
          for name, key, least in checks if values[key] < limits[least]]
