"""The five-sentinel panel and the C2a/C2b verdicts (SPEC §8.1, seed 001).

On the ans_in_compile = 1 stratum with B2: conditions B1 (raw context), B2
(compiled), the five sentinels and PLACEBO (placebo spans → '[MASK]').
E = mean(F1_[MASK] − F1_B2). C2a: each alternative sentinel s passes if the CI
of d_s = mean(F1_s − F1_[MASK]) contains 0, or |d_s| < 1.0, or
|d_s| < 0.20·|E|; the panel passes with ≥ 3 of 4. C2b: d = mean(F1_B2 −
F1_PLACEBO) passes if its CI contains 0 or |d| < 0.50·|E|. An Aggregate with
no CI (a fixture of published means) counts as a CI that excludes 0.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

import numpy as np

from ceu_jax.audits.answer_presence import audit as ap
from ceu_jax.metrics.resampling import Aggregate, mean_ci, paired_difference_ci

SENTINELS = ap.TEXT_SENTINELS  # panel name -> text sentinel (ATR: atr_world.ATR_SENTINELS)
ALTERNATIVES = ('[REMOVED]', 'natural', 'word', 'symbol')
C2A_ABS = 1.0  # |d_s| below this passes
C2A_REL = 0.20  # |d_s| below this fraction of |E| passes
C2A_MIN_PASS = 3  # alternatives that must pass
C2B_REL = 0.50  # |d| below this fraction of |E| passes


@dataclasses.dataclass(frozen=True)
class Verdicts:
  """The C2a/C2b decision and its ingredients."""
  E: float  # mean(F1_[MASK] − F1_B2)
  d: dict  # alternative -> Aggregate of mean(F1_s − F1_[MASK])
  passed: dict  # alternative -> bool
  c2a_pass: bool  # ≥ 3 of 4 alternatives pass (else '[MASK] residual is sentinel-fragile')
  c2b_d: Aggregate  # mean(F1_B2 − F1_PLACEBO)
  c2b_pass: bool

  @property
  def n_pass(self) -> int:
    return sum(self.passed.values())

  def summary(self) -> str:
    a = f"C2a {'PASS' if self.c2a_pass else 'FAIL'} ({self.n_pass}/{len(self.passed)})"
    return f"{a}, C2b {'PASS' if self.c2b_pass else 'FAIL'}"


def decide(E: float, d: Mapping[str, Aggregate], c2b_d: Aggregate) -> Verdicts:
  """Apply the C2a/C2b rules to E, the four d_s and d(B2 − PLACEBO)."""
  passed = {s: bool(a.contains(0.0) or abs(a.value) < C2A_ABS or abs(a.value) < C2A_REL * abs(E))
            for s, a in d.items()}
  c2b = bool(c2b_d.contains(0.0) or abs(c2b_d.value) < C2B_REL * abs(E))
  return Verdicts(float(E), dict(d), passed, sum(passed.values()) >= C2A_MIN_PASS, c2b_d, c2b)


def decide_from_means(means: Mapping[str, float]) -> Verdicts:
  """Verdicts from published condition means only (no CIs: treated as excluding 0).

  means: 'B2', '[MASK]', the four alternatives and 'PLACEBO' (F1 × 100).
  """
  E = means['[MASK]'] - means['B2']
  d = {s: Aggregate(means[s] - means['[MASK]'], None, None, 0) for s in ALTERNATIVES}
  return decide(E, d, Aggregate(means['B2'] - means['PLACEBO'], None, None, 0))


def panel_f1(reader, records: Sequence[ap.Record], *, medium=None,
             scorer: Optional[ap.Scorer] = None, **text_kwargs) -> dict:
  """F1 × 100 [n] per condition on the records whose compiled context holds the gold.

  Returns {'ids', 'B1', 'B2', five sentinels, 'PLACEBO', 'placebo_spans'} and
  'no_placebo' (ids left out: no room for a non-answer span, so PLACEBO would
  be B2 itself). The sentinels are `medium.for_panel()`'s (on ATR every arm is
  padded to the longest sentinel). Records without raw_context are rejected (B1
  needs it). `scorer` shares answers with the main audit (same reader).
  """
  if scorer is None:
    medium = medium or (ap.TextMedium(**text_kwargs) if text_kwargs else ap.TEXT)
    scorer = ap.Scorer(reader, medium)
  pm = scorer.medium.for_panel()
  recs = [r for r in records if pm.present(r.context, r.golds)]
  missing = [r.id for r in recs if r.raw_context is None]
  if missing:
    raise ValueError(f'raw_context is required for the sentinel panel; missing for ids {missing[:10]}')
  pl = {r.id: pm.placebo(r.context, r.golds, r.id, pm.sentinels['[MASK]']) for r in recs}
  out = {'no_placebo': [r.id for r in recs if pl[r.id][1] == 0]}
  recs = [r for r in recs if pl[r.id][1] > 0]
  out['ids'] = [r.id for r in recs]

  def f1(contexts):
    return scorer(recs, contexts)[0]
  out['B1'] = f1([r.raw_context for r in recs])
  out['B2'] = f1([r.context for r in recs])
  for name, s in pm.sentinels.items():
    out[name] = f1([pm.remove(r.context, r.golds, s) for r in recs])
  out['PLACEBO'] = f1([pl[r.id][0] for r in recs])
  out['placebo_spans'] = np.array([pl[r.id][1] for r in recs])
  return out


def panel(f1: Mapping[str, np.ndarray], *, seed: int = ap.CI_SEED) -> tuple[list[dict], Verdicts]:
  """Panel rows (condition, F1 CI, paired Δ vs B1 — PLACEBO vs B2) and the verdicts."""
  rows = []
  if len(f1['B2']) == 0:
    raise ValueError('the sentinel panel needs at least one record with the gold in its compiled context')
  for c in ('B1', 'B2', *SENTINELS, 'PLACEBO'):
    ref = 'B2' if c == 'PLACEBO' else 'B1'
    rows.append(dict(condition=c, f1=mean_ci(f1[c], seed=seed), vs=ref,
                     delta=None if c == 'B1' else paired_difference_ci(f1[c], f1[ref], seed=seed)))
  E = float(np.mean(np.asarray(f1['[MASK]']) - np.asarray(f1['B2'])))
  d = {s: paired_difference_ci(f1[s], f1['[MASK]'], seed=seed) for s in ALTERNATIVES}
  return rows, decide(E, d, paired_difference_ci(f1['B2'], f1['PLACEBO'], seed=seed))


def panel_table(rows: Sequence[dict], verdicts: Verdicts) -> str:
  """Markdown table of the panel, with E and the verdicts beneath."""
  fmt = ap.fmt
  lines = ['| condition | n | F1 | Δ (vs) [95% CI] |', '|---|---:|---:|---|']
  for x in rows:
    delta = '—' if x['delta'] is None else f"{fmt(x['delta'])} (vs {x['vs']})"
    lines.append(f"| {x['condition']} | {x['f1'].n} | {x['f1'].value:.2f} | {delta} |")
  lines += ['', f'E = {verdicts.E:+.2f}; ' + ', '.join(
      f"d[{s}] = {fmt(a)} {'pass' if verdicts.passed[s] else 'fail'}" for s, a in verdicts.d.items()),
      '', verdicts.summary()]
  return '\n'.join(lines)
