"""Seeds of a grid: mean ± sd over training seeds per setting and test condition (SPEC §6).

A grid that sweeps `seed` (the training seed: initialisation and data stream; the
eval set is config.eval's, the same for every seed) has one cell per seed of each
setting. `by_setting` folds the rows of aggregate.py (one per cell × condition)
into one row per setting × condition:

  <config fields except seed>, condition, eta_test, delta_test, n_test
  n_seeds, seeds                       how many cells, which seeds ("0 1 2")
  <m>                                  mean over the seeds of the cells' means
  <m>_sd                               sample sd over seeds (ddof 1; NaN for one seed)
  <m>_lo, <m>_hi                       one seed: its bootstrap CI (within the seed);
                                       several: mean ± sd (the seed spread)
  <m>_n                                examples behind each cell's mean (the smallest)
  <m>_seed_ci                          every seed's "value [lo, hi]", for the tables

for every metric of aggregate.METRICS that the rows carry. Plots and tables draw
these rows, so their bands and error bars are the seed spread whenever there is
more than one seed, and within-seed CIs otherwise (report.md says which).
"""
from __future__ import annotations

import collections
import csv
import io as _io
from typing import Sequence

import numpy as np

from ceu_jax.grid import aggregate
from ceu_jax.grid.aggregate import number
from ceu_jax.metrics.resampling import fmt_ci

SEED = "seed"
# Columns that differ between the cells of one setting (never part of the setting).
PER_CELL = ("cell_id", "index", SEED)


def setting_fields(results: Sequence[dict]) -> list[str]:
  """The config fields that identify a setting: every field of the cells' configs
  (results' "config", flattened) except the seed."""
  keys = set()
  for res in results:
    keys.update(res.get("config", {}))
  return sorted(keys - {SEED})


def varying_fields(rows: Sequence[dict], fields: Sequence[str]) -> list[str]:
  """The `fields` that take more than one value in these rows (what was swept)."""
  return [k for k in fields if len({str(r.get(k)) for r in rows}) > 1]


def _key(r: dict, fields: Sequence[str]) -> tuple:
  return tuple(str(r.get(k)) for k in fields) + (str(r.get("condition")),)


def by_setting(rows: Sequence[dict], fields: Sequence[str]) -> list[dict]:
  """One row per (setting, condition): mean ± sd over seeds (module doc); `fields`:
  the config fields of a setting (`setting_fields(results)`)."""
  groups: dict[tuple, list[dict]] = collections.OrderedDict()
  for r in sorted(rows, key=lambda r: (number(r.get("index")), number(r.get(SEED)))):
    groups.setdefault(_key(r, fields), []).append(r)
  out = []
  for members in groups.values():
    seeds = [r.get(SEED) for r in members]
    if len({str(s) for s in seeds}) != len(seeds):
      raise ValueError(f"grid rows: one setting and condition ({members[0].get('condition')}) "
                       f"holds cells {[r.get('cell_id') for r in members]} with repeated seed "
                       f"values {seeds}: sweep `seed` (and nothing else that a setting shares)")
    first = members[0]
    row = {k: first.get(k) for k in fields}
    row.update({k: first.get(k) for k in aggregate.CONDITION_FIELDS if k in first})
    row["index"] = min(number(r.get("index")) for r in members)
    row["n_seeds"] = len(members)
    row["seeds"] = " ".join(str(s) for s in seeds)
    for m in aggregate.METRICS:
      if not any(m in r for r in members):
        continue
      vals = np.asarray([number(r.get(m)) for r in members])
      ok = vals[np.isfinite(vals)]
      mean = float(ok.mean()) if ok.size else np.nan
      sd = float(ok.std(ddof=1)) if ok.size > 1 else np.nan
      row[m], row[f"{m}_sd"] = mean, sd
      if len(members) == 1:
        row[f"{m}_lo"], row[f"{m}_hi"] = number(first.get(f"{m}_lo")), number(first.get(f"{m}_hi"))
      else:
        row[f"{m}_lo"], row[f"{m}_hi"] = mean - sd, mean + sd
      ns = [number(r.get(f"{m}_n")) for r in members]
      ns = [n for n in ns if np.isfinite(n)]
      row[f"{m}_n"] = int(min(ns)) if ns else None
      row[f"{m}_seed_ci"] = "; ".join(_ci_text(r, m) for r in members)
    out.append(row)
  return out


def _ci_text(r: dict, m: str) -> str:
  return fmt_ci(aggregate.row_aggregate(r, m), missing="–")


def spread_kind(rows: Sequence[dict]) -> str:
  """What the bands and error bars of plots drawn from `by_setting` rows show."""
  counts = sorted({int(r.get("n_seeds", 1)) for r in rows})
  if counts == [1]:
    return "95% bootstrap CI within the one seed"
  if counts[0] == 1:
    return (f"± 1 sd over seeds ({'/'.join(map(str, counts))} seeds per setting; "
            "within-seed 95% CI where a setting has one seed)")
  return f"± 1 sd over {'/'.join(map(str, counts))} seeds"


def to_csv(rows: Sequence[dict]) -> str:
  """W/results_seeds.csv: settings first, then condition, seeds and metrics."""
  keys: list[str] = []
  for r in rows:
    keys.extend(k for k in r if k not in keys)
  metric_cols = {f"{m}{x}" for m in aggregate.METRICS for x in ("", "_sd", "_lo", "_hi", "_n",
                                                                   "_seed_ci")}
  front = [k for k in keys if k not in metric_cols and k not in aggregate.CONDITION_FIELDS
           and k not in ("index", "n_seeds", "seeds")]
  front += [k for k in aggregate.CONDITION_FIELDS if k in keys]
  front += ["n_seeds", "seeds"]
  order = front + [k for k in keys if k not in front]
  buf = _io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=order, lineterminator="\n")
  writer.writeheader()
  for r in rows:
    writer.writerow({k: ("" if v is None else v) for k, v in r.items()})
  return buf.getvalue()
