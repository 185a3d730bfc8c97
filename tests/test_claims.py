"""ceu_jax/claims.py and ceu_jax/grid/paired.py: verdicts on synthetic results whose
answers are known, borderline cases on each side of the rule."""
from __future__ import annotations

import re

import numpy as np
import pytest

from ceu_jax import claims
from ceu_jax.grid import paired
from ceu_jax.metrics.resampling import Aggregate


def _diff(values, cis=None):
  cis = cis or [(None, None)] * len(values)
  return claims.Difference("m", tuple(claims.SeedDifference(str(i), Aggregate(v, lo, hi, 10))
                                      for i, (v, (lo, hi)) in enumerate(zip(values, cis))))


@pytest.mark.parametrize("values,sign,verdict", [
    ([2.0, 2.5], +1, claims.SUPPORTED),        # same sign, mean 2.25 >= 2 x sd 0.35
    ([1.0, 3.0], +1, claims.NOT_SUPPORTED),    # same sign, but mean 2.0 < 2 x sd 2.83
    # two seeds x, y: supported iff (x + y) / 2 >= 2 |y - x| / sqrt(2); for x = 1, y <= 2.0938
    ([1.0, 2.09], +1, claims.SUPPORTED),       # mean 1.545 >= 2 x sd 1.5415
    ([1.0, 2.10], +1, claims.NOT_SUPPORTED),   # mean 1.550 <  2 x sd 1.5556
    ([1.0, -0.1], +1, claims.NOT_SUPPORTED),   # the seeds disagree
    ([-2.0, -2.2], +1, claims.OPPOSITE),
    ([-2.0, -2.2], -1, claims.SUPPORTED),
    ([], +1, claims.UNTESTED),
])
def test_direction_rule(values, sign, verdict):
  assert claims.direction(_diff(values), sign) == verdict


def test_one_seed_is_decided_by_its_paired_ci():
  assert claims.direction(_diff([0.3], [(0.01, 0.5)]), +1) == claims.SUPPORTED
  assert claims.direction(_diff([0.3], [(-0.01, 0.5)]), +1) == claims.NOT_SUPPORTED
  assert claims.direction(_diff([-0.3], [(-0.5, -0.01)]), +1) == claims.OPPOSITE


def test_paired_difference_per_seed_and_across_seeds():
  rng = np.random.default_rng(0)
  b = rng.random(200)
  d = claims.paired("x", [("0", b + 0.1, b), ("1", b + 0.3, b)], num_resamples=200)
  assert [round(s.diff.value, 12) for s in d.per_seed] == [0.1, 0.3]
  assert d.mean == pytest.approx(0.2) and d.sd == pytest.approx(np.std([0.1, 0.3], ddof=1))
  assert d.per_seed[0].diff.ci_low == pytest.approx(0.1) and d.per_seed[0].diff.n == 200


def test_combine_needs_every_part_and_condition():
  up, down = _diff([2.0, 2.5]), _diff([-1.0, -1.1])
  c = claims.combine("H", "s", [("a", up, +1), ("b", down, -1)], [("cost", True, "0.01")])
  assert c.verdict == claims.SUPPORTED and "cost: 0.01 → holds" in c.numbers
  c = claims.combine("H", "s", [("a", up, +1), ("b", down, -1)], [("cost", False, "0.3")])
  assert c.verdict == claims.NOT_SUPPORTED
  c = claims.combine("H", "s", [("a", up, +1), ("b", up, -1)])
  assert c.verdict == claims.NOT_SUPPORTED
  c = claims.combine("H", "s", [("a", down, +1), ("b", up, -1)])
  assert c.verdict == claims.OPPOSITE
  assert claims.combine("H", "s", [("a", _diff([]), +1)]).verdict == claims.UNTESTED
  assert claims.across("H4", "s", [c, c]).verdict == claims.OPPOSITE
  table = claims.table([c])
  assert "| H | s | **opposite** |" in table and "Rule: paired per-seed" in table


# ---------------------------------------------------------------- the grid's claims
def _rows(correct, ceu_ev, degenerate, ceu_dis=None):
  n = len(correct)
  return dict(example_id=np.arange(n), correct=np.asarray(correct, bool),
              has_evidence=np.ones(n, bool), dis_found=np.ones(n, bool),
              degenerate=np.asarray(degenerate, bool),
              ceu_ev=np.where(degenerate, np.nan, ceu_ev),
              ceu_dis=np.where(degenerate, np.nan, ceu_dis if ceu_dis is not None else 0.2))


def test_item_pairs_fixed_vs_section_1_denominator():
  base = _rows([1, 1, 1, 1], [0.9, 0.9, 0.0, 0.0], [False, False, True, True])
  cer = _rows([1, 1, 1, 0], [0.9, 0.9, 0.8, 0.8], [False, False, False, False])
  a, b = paired.item_pairs("ceu_ev", cer, base)       # §1: both non-degenerate only
  assert list(a) == [0.9, 0.9] and list(b) == [0.9, 0.9]
  a, b = paired.item_pairs("ceu_ev_fixed", cer, base)  # every item, degenerate = 0
  assert list(a) == [0.9, 0.9, 0.8, 0.8] and list(b) == [0.9, 0.9, 0.0, 0.0]
  a, b = paired.item_pairs("supported", cer, base)
  assert list(a) == [1, 1, 1, 0] and list(b) == [1, 1, 0, 0]


def _grid(n_seeds, em_cost, ev_gain, dis_drop, families=("attention", "ssm"),
          drops=(0.1, 0.3)):
  """Synthetic results + per-cell rows: baseline EM 0.9 with CEU_ev 0.2 on 200 items;
  the CER cell gains CEU_ev and loses CEU_dis by the given amounts (seed jitter 0.01);
  under the shifted condition δ = 0.9 (200 other items) CER loses drops[0] of EM and the
  baseline drops[1]. `load(workdir, cell_id, condition='clean')` gives a cell's rows."""
  rng = np.random.default_rng(1)
  results, rows, ex = [], [], {}
  for fam in families:
    for s in range(n_seeds):
      for reg in ("none", "evidence"):
        cid = f"{fam}-{reg}-{s}"
        cer = reg != "none"
        jitter = 0.01 * s
        n = 200
        p = 0.9 - (em_cost + jitter if cer else 0)
        correct = rng.random(n) < p
        shifted = rng.random(n) < p - drops[0 if cer else 1]
        ev = np.full(n, 0.2 + ((ev_gain + jitter) if cer else 0.0))
        dis = np.full(n, 0.3 - ((dis_drop + jitter) if cer else 0.0))
        ex[cid, "clean"] = _rows(correct, ev, np.zeros(n, bool), dis)
        ex[cid, "delta=0.9"] = _rows(shifted, ev, np.zeros(n, bool), dis)
        results.append(dict(cell_id=cid, config={"model.family": fam, "seed": s,
                                                 "cer.regularizer": reg}))
        rows += [dict(cell_id=cid, condition="clean", em=float(correct.mean()),
                      delta_test=0.3),
                 dict(cell_id=cid, condition="delta=0.9", em=float(shifted.mean()),
                      delta_test=0.9)]
  return results, rows, (lambda workdir, cid, condition="clean": ex.get((cid, condition)))


def _verdicts(cs):
  return {c.name: c.verdict for c in cs}


def test_grid_claims_known_verdicts():
  results, rows, load = _grid(3, em_cost=0.02, ev_gain=0.5, dis_drop=0.1)
  cs, comps = paired.grid_claims("W", rows, results, num_resamples=100, load=load)
  v = _verdicts(cs)
  assert v["H1 attention"] == claims.SUPPORTED        # EM ~0.9, CEU_ev 0.2: unused share ~0.9
  assert v["H2 attention, evidence (fixed denominator)"] == claims.SUPPORTED
  assert v["H2 ssm, evidence (§1 denominator)"] == claims.SUPPORTED
  assert v["H3 attention, evidence"] == claims.SUPPORTED   # CER drops 0.1, baseline 0.3
  assert v["H4 evidence"] == claims.SUPPORTED
  assert "| attention | evidence | ceu_ev_fixed | +0.510" in paired.comparisons_table(comps)


def test_grid_claims_fail_when_the_accuracy_cost_is_large_or_ceu_falls():
  results, rows, load = _grid(3, em_cost=0.3, ev_gain=0.5, dis_drop=0.1)
  v = _verdicts(paired.grid_claims("W", rows, results, num_resamples=100, load=load)[0])
  assert v["H2 attention, evidence (fixed denominator)"] == claims.NOT_SUPPORTED
  assert v["H4 evidence"] == claims.NOT_SUPPORTED
  results, rows, load = _grid(3, em_cost=0.0, ev_gain=-0.1, dis_drop=-0.1)
  v = _verdicts(paired.grid_claims("W", rows, results, num_resamples=100, load=load)[0])
  assert v["H2 attention, evidence (fixed denominator)"] == claims.OPPOSITE


def test_h3_is_paired_over_each_conditions_items_and_equals_the_rows_difference():
  """SPEC §5a: per seed, H3's value is the grid rows' difference of EM drops, now with a
  CI from the items (each condition's resampled on its own, the two cells' values of an
  item jointly); one seed is decided by that CI. Cells without per-condition rows (runs
  before they were kept) get the rows' value and no CI, as before: one seed untested."""
  results, rows, load = _grid(1, em_cost=0.0, ev_gain=0.0, dis_drop=0.0, families=("ssm",))
  em = {(r["cell_id"], r["condition"]): r["em"] for r in rows}
  want = ((em["ssm-none-0", "clean"] - em["ssm-none-0", "delta=0.9"])
          - (em["ssm-evidence-0", "clean"] - em["ssm-evidence-0", "delta=0.9"]))
  [c] = paired.h3_claims(rows, results, "W", num_resamples=200, load=load)
  assert c.verdict == claims.SUPPORTED and paired.H3_ITEMS in c.numbers, c.numbers
  [d] = re.findall(r"0: ([+-]\d\.\d+) \[([+-]\d\.\d+), ([+-]\d\.\d+)\] n=(\d+)", c.numbers)
  assert abs(float(d[0]) - want) < 1e-3 and float(d[1]) > 0 and int(d[3]) == 2 * 200
  old = lambda w, cid, condition="clean": load(w, cid) if condition == "clean" else None
  for kwargs in (dict(load=old), {}):          # no per-condition rows / no workdir
    [c] = paired.h3_claims(rows, results, *(("W",) if kwargs else ()), **kwargs)
    assert c.verdict == claims.UNTESTED and paired.H3_CONDITIONS in c.numbers
    assert f"0: {want:+.3f} n=1" in c.numbers, c.numbers
  # the baseline loses less than CER: opposite
  results, rows, load = _grid(1, 0.0, 0.0, 0.0, families=("ssm",), drops=(0.3, 0.05))
  [c] = paired.h3_claims(rows, results, "W", num_resamples=200, load=load)
  assert c.verdict == claims.OPPOSITE, c.numbers


def test_h3_asks_about_knobs_that_grow_one_part_each():
  """SPEC §6 H3 'as δ, n and η grow': a condition that lowers a knob below its training
  value is left out; each growing knob is a part, and H3 is supported only when every part
  is (CER better as δ grows but worse as η grows: not supported)."""
  results, rows, load = _grid(2, 0.0, 0.0, 0.0, families=("ssm",), drops=(0.1, 0.3))
  rng = np.random.default_rng(5)
  ex = {}
  for r in results:
    cid, cer = r["cell_id"], r["config"]["cer.regularizer"] != "none"
    for cond, eta, p in (("eta=0.0", 0.0, 0.3 if cer else 0.95),   # lowers η: not H3's
                         ("eta=0.6", 0.6, 0.3 if cer else 0.8)):   # CER degrades more
      ex[cid, cond] = _rows(rng.random(200) < p, np.full(200, .2), np.zeros(200, bool))
      rows.append(dict(cell_id=cid, condition=cond, em=float(ex[cid, cond]["correct"].mean()),
                       eta_test=eta))
  for r in rows:
    if r["condition"] == "clean":
      r["eta_test"] = 0.3
  both = lambda w, cid, condition="clean": ex.get((cid, condition)) or load(w, cid, condition)
  clean = {r["condition"]: r for r in rows if r["cell_id"] == "ssm-none-0"}
  assert paired.growing_conditions(clean) == {"delta": ["delta=0.9"], "eta": ["eta=0.6"]}
  [c] = paired.h3_claims(rows, results, "W", num_resamples=200, load=both)
  assert "δ grows (0.9)" in c.numbers and "η grows (0.6)" in c.numbers, c.numbers
  assert "0.0" not in c.numbers.split("η grows")[1].split(")")[0]
  assert c.verdict == claims.NOT_SUPPORTED, c.numbers
  assert "→ supported" in c.numbers.split("η grows")[0]          # the δ part
  assert c.numbers.split("η grows")[1].rstrip().endswith("→ opposite")
  only_lower = [r for r in rows if r["condition"] in ("clean", "eta=0.0")]
  [c] = paired.h3_claims(only_lower, results, "W", load=both)
  assert c.verdict == claims.UNTESTED and "no test condition raises" in c.numbers


def test_h4_needs_attention_and_ssm():
  """SPEC §6 H4 'across attention and SSM interfaces': without an ssm pair it is untested."""
  results, rows, load = _grid(3, em_cost=0.02, ev_gain=0.5, dis_drop=0.1,
                              families=("attention", "memory_port"))
  v = _verdicts(paired.grid_claims("W", rows, results, num_resamples=100, load=load)[0])
  assert v["H2 attention, evidence (fixed denominator)"] == claims.SUPPORTED
  assert v["H4 evidence"] == claims.UNTESTED


def test_h1_not_supported_when_the_evidence_is_used():
  results, rows, load = _grid(2, em_cost=0.0, ev_gain=0.0, dis_drop=0.0)
  ex = {r["cell_id"]: load("W", r["cell_id"]) for r in results}
  for cid, x in ex.items():
    x["ceu_ev"] = np.full(len(x["ceu_ev"]), 0.95)
  v = _verdicts(paired.h1_claims("W", results, num_resamples=100, load=lambda w, c: ex[c]))
  assert v["H1 attention"] == claims.NOT_SUPPORTED


def test_of_run_decides_one_run_by_its_ci():
  sup = claims.of_run("r", "x below 0", dict(value=-0.2, ci_low=-0.3, ci_high=-0.1, n=40), -1)
  opp = claims.of_run("r", "x below 0", dict(value=0.2, ci_low=0.1, ci_high=0.3, n=40), -1)
  wide = claims.of_run("r", "x below 0", dict(value=-0.1, ci_low=-0.3, ci_high=0.1, n=40), -1)
  none = claims.of_run("r", "x below 0", None, -1)
  assert [c.verdict for c in (sup, opp, wide, none)] == [
      claims.SUPPORTED, claims.OPPOSITE, claims.NOT_SUPPORTED, claims.UNTESTED]
  # against a threshold: a rate of 0.7 [0.6, 0.8] is above 0.5, 0.55 [0.45, 0.65] is not
  assert claims.of_run("r", "", dict(value=0.7, ci_low=0.6, ci_high=0.8, n=9), 1,
                       against=0.5).verdict == claims.SUPPORTED
  assert claims.of_run("r", "", dict(value=0.55, ci_low=0.45, ci_high=0.65, n=9), 1,
                       against=0.5).verdict == claims.NOT_SUPPORTED
