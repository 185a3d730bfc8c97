"""T1–T3 verdicts decided by a rule in code (SPEC §7, issue #33 item 7).

Each verdict is read from the sections of `bounds.json` (so anyone can re-derive it
from the run's file) with the claims module's one-run rule (`claims.of_run`: a
95% CI on the predicted side of a reference is 'supported', on the other side
'opposite', across it 'not supported') and its vocabulary. The rules:

T1  (restoration in log-likelihood space equals restoration in logit space up to a
    term that vanishes as the logit perturbation shrinks)
    * every trained model: the Spearman rank correlation between the perturbation
      size and |R_ll − R_logit| over its examples, with a bootstrap CI over
      examples, lies above 0 (`claims.of_run`, the error grows with the
      perturbation);
    * condition: on the exact two-channel model (coupling 0, T1's regime) the
      largest |R_ll − R_logit| never grows as the perturbation shrinks.
T2  (matched distractors lower accuracy by Ω(1 − α))
    * every model: its worst-case accuracy drop has a 95% CI above 0;
    * the model with the lowest mean CEU_ev loses more than the one with the
      highest, by the paired per-item drop difference on the same attacked items
      (`claims.paired`, CI above 0);
    * condition: those two models' 1 − CEU_ev CIs are disjoint (else the spread
      of CEU cannot test the dependence, and T2 is untested).
    Parts combine as in `claims.combine`.
T3  (unsupported rate ≤ η + (1 − η) exp(−c α γ(δ))) at every (δ, η) point with a
    defined, non-vacuous (< 1) bound: `claims.of_run` on the unsupported rate
    against the point bound, predicted below — 'supported' (CI below the bound),
    'not supported' (CI contains it) or 'opposite' (CI above it: a significant
    violation). Then
      supported      no point is a significant violation;
      opposite       more than `MAJORITY` of the points are significant violations;
      not supported  some, but not more than `MAJORITY`, are;
      untested       no point has a defined, non-vacuous bound.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ceu_jax import claims
from ceu_jax.claims import NOT_SUPPORTED, OPPOSITE, SUPPORTED, UNTESTED
from ceu_jax.metrics.resampling import Aggregate, fmt_ci

MAJORITY = 0.5      # T3 is 'opposite' when more than this share of points violate it significantly

T1_RULE = ("every trained model: Spearman(perturbation, |R_ll − R_logit|) 95% CI above 0; "
           "and on the exact two-channel model the max |diff| never grows as s shrinks")
T2_RULE = ("every model's worst-case drop CI above 0, and the paired per-item drop difference "
           "(lowest − highest mean CEU_ev model) CI above 0, given their 1 − CEU_ev CIs are "
           "disjoint (else untested)")
T3_RULE = ("per (δ, η) point with a bound < 1: the unsupported rate's 95% CI against the point "
           "bound (below: consistent, contains: within CI, above: significant violation); "
           "supported if no significant violation, opposite if more than "
           f"{MAJORITY:.0%} of the points are, else not supported; untested without a bound")


def _agg(d) -> Aggregate:
  return d if isinstance(d, Aggregate) else Aggregate.from_dict(d)


def _diff(label: str, agg) -> claims.Difference:
  return claims.Difference(label, (claims.SeedDifference("run", _agg(agg)),))


# --------------------------------------------------------------- T1


def t1_verdict(t1: Mapping) -> claims.Claim:
  """From bounds.json's `t1`: trained[name]['spearman'] (an Aggregate dict) and
  synthetic['coupling 0'] (scales, max_abs_diff per scale)."""
  parts = [(f"{name}: Spearman(perturbation, abs diff)", _diff(name, d.get("spearman")), +1)
           for name, d in t1["trained"].items()]
  synth = t1["synthetic"].get("coupling 0") or {}
  sweep, scales = synth.get("max_abs_diff") or [], synth.get("scales") or []
  if not sweep or len(sweep) != len(scales) or any(x is None for x in sweep):
    cond = None
    text = "no two-channel sweep"
  else:
    sweep = [sweep[i] for i in np.argsort(scales)]
    cond = bool(np.all(np.diff(np.asarray(sweep, np.float64)) >= 0))
    text = f"max abs diff {sweep[0]:.2g} at the smallest s … {sweep[-1]:.2g} at the largest"
  claim = claims.combine(
      "T1", "restoration in log-likelihood space equals logit space up to a term that "
      "vanishes as the perturbation shrinks", parts,
      [("two-channel max abs diff non-decreasing in s", cond, text)])
  return _with_rule(claim, T1_RULE)


# --------------------------------------------------------------- T2


def t2_verdict(t2: Mapping) -> claims.Claim:
  """From bounds.json's `t2`: points (name, one_minus_ceu, drop) and `paired`: the
  paired drop difference {'low': name, 'high': name, 'diff': Aggregate dict}."""
  points = list(t2["points"])
  parts = [(f"{p['name']} drop", _diff(p["name"], p["drop"]), +1) for p in points]
  pair = t2.get("paired") or {}
  conditions = []
  if len(points) < 2 or not pair:
    conditions.append(("two models with different CEU_ev", None, "fewer than 2 models"))
  else:
    by = {p["name"]: _agg(p["one_minus_ceu"]) for p in points}
    lo, hi = by[pair["low"]], by[pair["high"]]     # low / high mean CEU_ev
    disjoint = (None not in (lo.ci_low, lo.ci_high, hi.ci_low, hi.ci_high)
                and (lo.ci_low > hi.ci_high or hi.ci_low > lo.ci_high))
    conditions.append((f"1 − CEU_ev of {pair['low']} and {pair['high']} apart",
                       True if disjoint else None,
                       f"{fmt_ci(lo)} vs {fmt_ci(hi)}"))
    parts.append((f"drop {pair['low']} − {pair['high']} (paired)",
                  _diff("paired drop", pair["diff"]), +1))
  claim = claims.combine(
      "T2", "surface-matched distractors lower accuracy by Ω(1 − mean CEU_ev): every "
      "model loses accuracy, and the lower its CEU_ev the more", parts, conditions)
  return _with_rule(claim, T2_RULE)


# --------------------------------------------------------------- T3


def t3_points(reports: Mapping) -> list[dict]:
  """Per (δ, η) point with a defined bound < 1: its `claims.of_run` verdict."""
  out = []
  for label, rep in reports.items():
    for eta, rate, bound in zip(rep["etas"], rep["rates"], rep["bound"]):
      if bound is None or not np.isfinite(bound) or bound >= 1.0:
        continue
      c = claims.of_run(f"{label}, η={eta:g}", "unsupported rate ≤ bound", rate, -1,
                        against=float(bound))
      out.append({"delta": label, "eta": float(eta), "rate": _agg(rate), "bound": float(bound),
                  "verdict": c.verdict})
  return out


def t3_verdict(reports: Mapping, *, name: str = "T3") -> claims.Claim:
  """From bounds.json's `t3.reports` (label → etas, rates, bound)."""
  pts = t3_points(reports)
  n = len(pts)
  count = {v: sum(p["verdict"] == v for p in pts) for v in (SUPPORTED, NOT_SUPPORTED, OPPOSITE)}
  if n == 0:
    verdict = UNTESTED
  elif count[OPPOSITE] == 0:
    verdict = SUPPORTED
  elif count[OPPOSITE] > MAJORITY * n:
    verdict = OPPOSITE
  else:
    verdict = NOT_SUPPORTED
  above = [f"{p['delta']} η={p['eta']:g}: {fmt_ci(p['rate'])} > {p['bound']:.3f}"
           for p in pts if p["verdict"] == OPPOSITE]
  numbers = (f"{n} points with a bound < 1: {count[SUPPORTED]} with the rate's CI below the "
             f"bound, {count[NOT_SUPPORTED]} with the bound inside the CI, {count[OPPOSITE]} "
             "significant violations" + (f" ({'; '.join(above)})" if above else ""))
  return claims.Claim(name, "unsupported-answer rate ≤ η + (1 − η)·exp(−ĉ α γ(δ))",
                      verdict, numbers, T3_RULE)


def _with_rule(claim: claims.Claim, rule: str) -> claims.Claim:
  return claims.Claim(claim.name, claim.statement, claim.verdict, claim.numbers, rule)


def all_verdicts(res: Mapping) -> list[claims.Claim]:
  """T1, T2, T3 (primary ĉ) and T3 with the alternative ĉ, from a bounds.json dict."""
  t3 = res["t3"]
  return [t1_verdict(res["t1"]), t2_verdict(res["t2"]), t3_verdict(t3["reports"]),
          t3_verdict(t3["reports_alt_c"], name="T3 (alternative ĉ)")]


def as_json(verdicts: Sequence[claims.Claim]) -> list[dict]:
  return [{"claim": c.name, "statement": c.statement, "verdict": c.verdict,
           "numbers": c.numbers, "rule": c.rule} for c in verdicts]
