"""Paired comparisons of grid cells and SPEC §6's H1–H4 decided by `ceu_jax.claims`.

Every cell of a grid is audited on THE same fixed test set (config.eval), so a CER
cell and its baseline — the cell with the same config except the `cer.*` fields
and the same training seed — score the same items. Per seed, each metric's
difference CER − baseline is paired over those items (W/cells/<id>/audit/
examples.csv, the clean condition) with a bootstrap CI; across seeds it is the
mean ± sd of the per-seed differences (`claims.Difference`).

Per-item metrics (SPEC §5, §5a): em = correct; supported = correct and CEU_ev ≥ 0.5
on a non-degenerate gap; ceu_ev = CEU_ev over items with evidence whose gap is
non-degenerate in BOTH cells (the §1 mean, paired); ceu_ev_fixed = CEU_ev over
every item with evidence, degenerate gaps counted as 0; ceu_dis likewise (§1) over
items with a distractor span.

Claims (thresholds are stated, the verdict rule is `claims.RULE`):
  H1 (per architecture, baseline cells): accurate (EM ≥ ACCURATE in every seed) while
     the evidence is not causally used on many correct answers (the share of items
     answered correctly but not supported, EM − supported, has its 95% CI lower bound
     ≥ UNUSED_SHARE in every seed);
  H2 (per architecture × CER variant): CEU_ev up (fixed denominator) and CEU_dis down,
     at an accuracy cost ≤ MAX_EM_COST (mean over seeds); restated with the §1
     denominator;
  H3 (per architecture × CER variant): CER degrades less as δ, n and η grow: one part
     per knob that some test condition raises above its training value (a condition that
     lowers a knob is not H3's), supported when every part is; per knob and seed, the
     mean over its growing conditions c of (EM drop of the baseline − EM drop of CER)
     = mean_c (EM_CER − EM_base)_c − (EM_CER − EM_base)_clean, each term paired over the
     items of its condition (both cells score the same items in every condition; the
     conditions draw different items), its CI from a bootstrap that resamples each
     condition's items on its own (`resampling.stratified_paired_mean`; n = items). A
     seed whose cells predate the per-condition rows (<cell>/conditions/) gets the
     grid rows' value without a CI, as before (n = conditions);
  H4 (per CER variant): H2 holds for every architecture, attention and ssm among them
     (untested without either).
"""
from __future__ import annotations

import csv
import os
from typing import Any, Callable, Sequence

import numpy as np

from ceu_jax import claims
from ceu_jax.engine.probes import DIS
from ceu_jax.grid import aggregate
from ceu_jax.metrics import resampling

ACCURATE = 0.75       # H1: a baseline is "accurate" with at least this clean EM
UNUSED_SHARE = 0.25   # H1: ... and at least this share of items correct without evidence use
MAX_EM_COST = 0.10    # H2: CER's clean EM may drop by at most this much (mean over seeds)
TAU = 0.5             # the supported-answer threshold on CEU_ev
BASELINE = "none"     # cer.regularizer of a baseline cell


def _bool(v: str) -> bool:
  return v in ("1", "True", "true")


def _float(v: str) -> float:
  try:
    return float(v)
  except (TypeError, ValueError):
    return float("nan")


def load_examples(workdir: str, cell_id: str, condition: str = aggregate.CLEAN
                  ) -> dict[str, np.ndarray] | None:
  """One cell's per-item rows of a test condition (default the clean one), sorted by
  example id (None: not there)."""
  path = aggregate.examples_path(os.path.join(workdir, "cells", cell_id), condition)
  if not os.path.exists(path):
    return None
  with open(path, newline="") as f:
    ex = sorted(csv.DictReader(f), key=lambda e: int(e["example_id"]))
  out = dict(example_id=np.asarray([int(e["example_id"]) for e in ex]))
  for k in ("correct", "has_evidence", "dis_found", "degenerate"):
    out[k] = np.asarray([_bool(e[k]) for e in ex])
  for k in ("ceu_ev", "ceu_dis"):
    out[k] = np.asarray([_float(e[k]) for e in ex])
  return out


def _supported(r: dict) -> np.ndarray:
  return r["correct"] & ~r["degenerate"] & (np.nan_to_num(r["ceu_ev"]) >= TAU)


def item_pairs(metric: str, a: dict, b: dict) -> tuple[np.ndarray, np.ndarray]:
  """(values in A, values in B) of `metric` on the items both cells score (module doc)."""
  if not np.array_equal(a["example_id"], b["example_id"]):
    raise ValueError("cells scored different test items; they cannot be paired")
  if metric == "em":
    return a["correct"].astype(float), b["correct"].astype(float)
  if metric == "supported":
    return _supported(a).astype(float), _supported(b).astype(float)
  if metric == "unused":   # correct but not supported (H1), A = B's own rows twice
    return a["correct"].astype(float), _supported(a).astype(float)
  probe = metric.split("_")[1]                     # ceu_ev, ceu_ev_fixed, ceu_dis, ...
  keep = a["has_evidence"] & (a[f"{DIS}_found"] if probe == DIS else True)
  if metric.endswith("_fixed"):
    fa = np.where(a["degenerate"], 0.0, a[f"ceu_{probe}"])
    fb = np.where(b["degenerate"], 0.0, b[f"ceu_{probe}"])
    return fa[keep], fb[keep]
  keep = keep & ~a["degenerate"] & ~b["degenerate"]
  return a[f"ceu_{probe}"][keep], b[f"ceu_{probe}"][keep]


def _setting(res: dict) -> tuple:
  return tuple(sorted((k, str(v)) for k, v in res["config"].items()
                      if not k.startswith("cer.") and k != "seed"))


def _varying(results: Sequence[dict]) -> set:
  keys = {k for r in results for k in r["config"]}
  return {k for k in keys if len({str(r["config"].get(k)) for r in results}) > 1}


def _variant(res: dict, varying: set) -> str:
  """'evidence (lambda_ev=1.0)': the regulariser and the cer.* fields that vary."""
  c = res["config"]
  reg = str(c.get("cer.regularizer", BASELINE))
  extra = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(c.items())
                    if k.startswith("cer.") and k != "cer.regularizer" and k in varying)
  return reg + (f" ({extra})" if extra else "")


def _name(setting: tuple, varying: set) -> str:
  """'attention [eta=0.3]': the family and the other fields that vary between cells."""
  d = dict(setting)
  rest = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in setting
                   if k != "model.family" and k in varying)
  return d.get("model.family", "model") + (f" [{rest}]" if rest else "")


def pair_cells(results: Sequence[dict]) -> list[dict]:
  """[{setting, name, variant, seeds: {seed: (cer result, baseline result)}}] for every
  CER setting with a baseline of the same setting and seed (named by the config fields
  that vary between the grid's cells)."""
  varying = _varying(results)
  base = {(_setting(r), str(r["config"].get("seed", "-"))): r for r in results
          if str(r["config"].get("cer.regularizer", BASELINE)) == BASELINE}
  groups: dict = {}
  for r in results:
    if str(r["config"].get("cer.regularizer", BASELINE)) == BASELINE:
      continue
    seed = str(r["config"].get("seed", "-"))
    b = base.get((_setting(r), seed))
    if b is not None:
      g = groups.setdefault((_setting(r), _variant(r, varying)), {})
      g[seed] = (r, b)
  return [dict(setting=s, name=_name(s, varying), variant=v, seeds=dict(sorted(g.items())))
          for (s, v), g in sorted(groups.items())]


METRICS = ("em", "supported", "ceu_ev", "ceu_ev_fixed", "ceu_dis")


def comparisons(workdir: str, results: Sequence[dict], *, seed: int = 42,
                num_resamples: int = 1000,
                load: Callable[[str, str], Any] = load_examples) -> list[dict]:
  """Per CER setting: {setting, name, variant, seeds, diffs: {metric: claims.Difference}}
  (CER − baseline)."""
  out = []
  for g in pair_cells(results):
    rows = {s: (load(workdir, a["cell_id"]), load(workdir, b["cell_id"]))
            for s, (a, b) in g["seeds"].items()}
    rows = {s: ab for s, ab in rows.items() if ab[0] is not None and ab[1] is not None}
    diffs = {m: claims.paired(m, [(s, *item_pairs(m, a, b)) for s, (a, b) in rows.items()],
                              seed=seed, num_resamples=num_resamples) for m in METRICS}
    out.append(dict(g, diffs=diffs))
  return out


def comparisons_table(comps: Sequence[dict]) -> str:
  """Markdown: one row per CER setting × metric, the per-seed paired differences."""
  lines = ["| setting | CER variant | metric | CER − baseline: mean ± sd over seeds "
           "(per seed: paired diff [95% CI] n) |", "|---|---|---|---|"]
  for c in comps:
    for m, d in c["diffs"].items():
      lines.append(f"| {c['name']} | {c['variant']} | {m} | {d.text()} |")
  return "\n".join(lines)


def _baselines(results: Sequence[dict]) -> dict[tuple, dict[str, dict]]:
  out: dict = {}
  for r in results:
    if str(r["config"].get("cer.regularizer", BASELINE)) == BASELINE:
      out.setdefault(_setting(r), {})[str(r["config"].get("seed", "-"))] = r
  return out


def h1_claims(workdir: str, results: Sequence[dict], *, seed: int = 42,
              num_resamples: int = 1000, load=load_examples) -> list[claims.Claim]:
  out, varying = [], _varying(results)
  for setting, by_seed in sorted(_baselines(results).items()):
    rows = {s: load(workdir, r["cell_id"]) for s, r in sorted(by_seed.items())}
    rows = {s: x for s, x in rows.items() if x is not None}
    em = claims.paired("em", [(s, x["correct"].astype(float), np.zeros(len(x["correct"])))
                              for s, x in rows.items()], seed=seed, num_resamples=num_resamples)
    unused = claims.paired("unused", [(s, *item_pairs("unused", x, x)) for s, x in rows.items()],
                           seed=seed, num_resamples=num_resamples)
    accurate = (None if not rows else
                all(x.diff.value is not None and x.diff.value >= ACCURATE for x in em.per_seed))
    many = (None if not rows else all(x.diff.ci_low is not None and x.diff.ci_low >= UNUSED_SHARE
                                      for x in unused.per_seed))
    out.append(claims.combine(
        f"H1 {_name(setting, varying)}", "the baseline is accurate while its evidence is not "
        "causally used on many correct answers", [],
        [(f"EM ≥ {ACCURATE} in every seed", accurate, em.text()),
         (f"correct-but-unsupported share (EM − supported) ≥ {UNUSED_SHARE} (CI low) in "
          "every seed", many, unused.text())]))
  return out


def h2_claims(comps: Sequence[dict]) -> list[claims.Claim]:
  out = []
  for c in comps:
    em = c["diffs"]["em"]
    cost_ok = None if em.mean is None else (-em.mean <= MAX_EM_COST)
    for label, ev in (("fixed denominator", "ceu_ev_fixed"), ("§1 denominator", "ceu_ev")):
      out.append(claims.combine(
          f"H2 {c['name']}, {c['variant']} ({label})",
          "CER raises CEU_ev and lowers CEU_dis at a small accuracy cost",
          [(f"Δ{ev} > 0", c["diffs"][ev], +1), ("Δceu_dis < 0", c["diffs"]["ceu_dis"], -1)],
          [(f"EM cost ≤ {MAX_EM_COST} (mean over seeds)", cost_ok, em.text())]))
  return out


H3_ITEMS = "per seed paired over each condition's items, n = items"
H3_CONDITIONS = "n = conditions"
# Test-condition knobs (grid.cell.test_conditions' tags): (grid row field, symbol).
KNOBS = {"delta": ("delta_test", "δ"), "n": ("n_test", "n"), "eta": ("eta_test", "η")}


def growing_conditions(cell_rows: dict[str, dict]) -> dict[str, list[str]]:
  """{knob tag: the conditions that raise it above its training value, by value} of one
  cell's grid rows {condition: row} (the clean row holds the training values). A
  condition that lowers a knob (η = 0 below a training η of 0.3) is not one H3 asks about."""
  clean = cell_rows.get(aggregate.CLEAN)
  out: dict = {}
  if clean is None:
    return out
  for c, r in cell_rows.items():
    tag = c.split("=")[0]
    if c == aggregate.CLEAN or tag not in KNOBS:
      continue
    field = KNOBS[tag][0]
    v, trained = aggregate.number(r.get(field)), aggregate.number(clean.get(field))
    if v > trained:
      out.setdefault(tag, []).append((v, c))
  return {tag: [c for _, c in sorted(vc)] for tag, vc in out.items()}


def _h3_items(workdir: str, a: dict, b: dict, conds: Sequence[str], load, *, seed: int,
              num_resamples: int) -> claims.Aggregate | None:
  """H3's per-seed value paired over items (module doc), or None when a cell lacks a
  condition's per-item rows."""
  strata = []
  for cond, weight in [(aggregate.CLEAN, -1.0)] + [(c, 1.0 / len(conds)) for c in conds]:
    ra, rb = load(workdir, a["cell_id"], cond), load(workdir, b["cell_id"], cond)
    if ra is None or rb is None:
      return None
    strata.append((*item_pairs("em", ra, rb), weight))
  return resampling.stratified_paired_mean(strata, seed=seed, num_resamples=num_resamples)


def h3_claims(rows: Sequence[dict], results: Sequence[dict], workdir: str | None = None, *,
              seed: int = 42, num_resamples: int = 1000,
              load=load_examples) -> list[claims.Claim]:
  """From results.csv rows (cell × condition) and, where the cells have them, their
  per-condition per-item rows: per knob that grows at test time (δ, n, η) and per seed,
  the mean over that knob's growing conditions of (baseline's EM drop − CER's EM drop);
  positive = CER degrades more gracefully. One part per knob: supported when every
  knob's part is (module doc)."""
  by_cell: dict = {}
  for r in rows:
    if r.get("em") not in (None, ""):
      by_cell.setdefault(r["cell_id"], {})[str(r["condition"])] = r
  em = lambda cid, c: float(by_cell[cid][c]["em"])
  out = []
  for g in pair_cells(results):
    per_knob: dict = {}     # tag -> ([SeedDifference], [paired over items?], conditions)
    for s, (a, b) in g["seeds"].items():
      ra, rb = by_cell.get(a["cell_id"], {}), by_cell.get(b["cell_id"], {})
      for tag, conds in growing_conditions(ra).items():
        conds = [c for c in conds if c in rb] if aggregate.CLEAN in rb else []
        if not conds:
          continue
        agg = None if workdir is None else _h3_items(
            workdir, a, b, conds, load, seed=seed, num_resamples=num_resamples)
        seeds, paired_items, names = per_knob.setdefault(tag, ([], [], set()))
        paired_items.append(agg is not None)
        names.update(conds)
        if agg is None:
          clean = aggregate.CLEAN
          vals = [(em(b["cell_id"], clean) - em(b["cell_id"], c))
                  - (em(a["cell_id"], clean) - em(a["cell_id"], c)) for c in conds]
          agg = claims.Aggregate(float(np.mean(vals)), None, None, len(vals))
        seeds.append(claims.SeedDifference(s, agg))
    parts = []
    for tag in KNOBS:
      if tag not in per_knob:
        continue
      seeds, paired_items, names = per_knob[tag]
      how = (H3_ITEMS if all(paired_items) else H3_CONDITIONS if not any(paired_items)
             else H3_ITEMS + "; seeds without per-condition rows: n = conditions, no CI")
      values = ", ".join(sorted((c.split("=")[1] for c in names), key=float))
      parts.append((f"{KNOBS[tag][1]} grows ({values}): baseline EM drop − CER EM drop "
                    f"(mean over those conditions; {how})",
                    claims.Difference(f"graceful {tag}", tuple(seeds)), +1))
    name = f"H3 {g['name']}, {g['variant']}"
    statement = "CER loses less EM than the baseline as δ, n and η grow at test time"
    if parts:
      out.append(claims.combine(name, statement, parts))
    else:
      out.append(claims.Claim(name, statement, claims.UNTESTED,
                              "no test condition raises δ, n or η above its training value"))
  return out


H4_FAMILIES = ("attention", "ssm")   # SPEC §6 H4: across attention and SSM interfaces


def h4_claims(comps: Sequence[dict]) -> list[claims.Claim]:
  """H4 per CER variant: the fixed-denominator H2 holds for every architecture compared,
  which must include attention and ssm (else untested, naming the missing ones)."""
  by_variant: dict = {}
  for c in comps:
    cs, fams = by_variant.setdefault(c["variant"], ([], set()))
    cs.extend(x for x in h2_claims([c]) if x.name.endswith("(fixed denominator)"))
    fams.add(dict(c["setting"]).get("model.family"))
  out = []
  for v, (cs, fams) in sorted(by_variant.items()):
    name, statement = f"H4 {v}", "H2 holds for every architecture (attention and SSM among them)"
    missing = [f for f in H4_FAMILIES if f not in fams]
    if missing:
      out.append(claims.Claim(name, statement, claims.UNTESTED,
                              f"no {' or '.join(missing)} cell pairs with a baseline",
                              "every part supported"))
    else:
      out.append(claims.across(name, statement, cs))
  return out


def grid_claims(workdir: str, rows: Sequence[dict], results: Sequence[dict], *,
                seed: int = 42, num_resamples: int = 1000,
                load=load_examples) -> tuple[list[claims.Claim], list[dict]]:
  """(H1–H4 claims, the paired comparisons they come from). Claims are named by the
  config fields that vary between the grid's cells."""
  comps = comparisons(workdir, results, seed=seed, num_resamples=num_resamples, load=load)
  h2 = h2_claims(comps)
  return (h1_claims(workdir, results, seed=seed, num_resamples=num_resamples, load=load) + h2
          + h3_claims(rows, results, workdir, seed=seed, num_resamples=num_resamples,
                      load=load) + h4_claims(comps)), comps
