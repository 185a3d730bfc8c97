"""W/report.md of a grid (SPEC §6), with the plots of `ceu_jax.grid.plots`: a plot
that would show a single x value or no data is not drawn and the report says why.
report.md opens with what was run (cells, steps, seeds, test conditions, which
test set every number comes from, the code); every CEU mean carries the number n of
non-degenerate examples behind it. Rows follow the schema of ceu_jax.grid.aggregate.
"""
from __future__ import annotations

import collections
import os
from typing import Sequence

import numpy as np

from ceu_jax import code_version, io
from ceu_jax.grid import aggregate
from ceu_jax.grid.aggregate import number
from ceu_jax.grid.plots import (FAMILY, REG, Skipped, load_examples, plot_ceu_histograms,
                                plot_k_gain, plot_pareto, plot_vs, series_label)
from ceu_jax.metrics.resampling import fmt_ci


def _fmt_ci(r: dict, metric: str, with_n: bool = False) -> str:
  with_n = with_n and bool(np.isfinite(number(r.get(f"{metric}_n"))))
  return fmt_ci(aggregate.row_aggregate(r, metric), with_n=with_n, missing="–")


CEU_METRICS = ("ceu_ev", "ceu_ev_fixed", "ceu_dis", "ceu_control")
# The tables' metrics: CEU_ev over the non-degenerate examples (SPEC §1) and, beside it,
# over every example with the evidence, degenerate gaps counted as 0 (SPEC §5a), so that a
# change of the degenerate share cannot move the mean unseen.
TABLE_METRICS = ("em", "ceu_ev", "ceu_ev_fixed", "ceu_dis", "supported_0.5")


def summary_table(rows: Sequence[dict], extra: Sequence[str] = ()) -> str:
  """Markdown table, clean condition: per architecture, baseline vs CER cells (and the
  `extra` fields, e.g. other swept fields and the seed). Every CEU mean shows n, the
  non-degenerate examples (with evidence, gap ≥ ε) behind it (for ceu_ev_fixed, every
  example with the evidence)."""
  metrics = TABLE_METRICS
  head = ("| architecture | regulariser | λ_ev | α | k | "
          + "".join(f"{k.split('.')[-1]} | " for k in extra) + "examples | "
          + " | ".join(f"{m} (n)" if m in CEU_METRICS else m for m in metrics) + " |")
  lines = [head, "|" + "---|" * (6 + len(extra) + len(metrics))]
  clean = [r for r in rows if r.get("condition") == "clean"]
  for r in sorted(clean, key=lambda r: (str(r.get(FAMILY)), str(r.get(REG)), r["index"])):
    lines.append(f"| {r.get(FAMILY)} | {r.get(REG)} | {r.get('cer.lambda_ev')} | "
                 f"{r.get('cer.alpha')} | {r.get('cer.k')} | "
                 + "".join(f"{r.get(k)} | " for k in extra) + f"{r.get('em_n', '')} | "
                 + " | ".join(_fmt_ci(r, m, with_n=m in CEU_METRICS) for m in metrics) + " |")
  return "\n".join(lines)


def conditions_table(rows: Sequence[dict]) -> str:
  """Markdown table of every test condition (not only clean), per cell."""
  metrics = TABLE_METRICS
  head = ("| architecture | regulariser | condition | examples | "
          + " | ".join(f"{m} (n)" if m in CEU_METRICS else m for m in metrics) + " |")
  lines = [head, "|" + "---|" * (4 + len(metrics))]
  order = lambda r: (str(r.get(FAMILY)), str(r.get(REG)), r["index"],
                     r.get("condition") != "clean", str(r.get("condition")))
  for r in sorted(rows, key=order):
    lines.append(f"| {r.get(FAMILY)} | {r.get(REG)} | {r.get('condition')} | "
                 f"{r.get('em_n', '')} | "
                 + " | ".join(_fmt_ci(r, m, with_n=m in CEU_METRICS) for m in metrics) + " |")
  return "\n".join(lines)


def _fmt_sd(r: dict, metric: str, with_n: bool = False) -> str:
  """'mean ± sd' over seeds (a seeds.by_setting row); one seed: 'value [CI]'."""
  if int(r.get("n_seeds", 1)) < 2:
    return _fmt_ci(r, metric, with_n)
  v, sd, n = number(r.get(metric)), number(r.get(f"{metric}_sd")), number(r.get(f"{metric}_n"))
  n_txt = f" (n≥{int(n)})" if with_n and np.isfinite(n) else ""
  return ("–" if not np.isfinite(v) else f"{v:.3f} ± {sd:.3f}") + n_txt


def _extra(varying: Sequence[str]) -> list[str]:
  """Swept fields beyond the ones every table shows (architecture, regulariser, λ, α, k)."""
  return [k for k in varying if k not in (FAMILY, REG, "cer.lambda_ev", "cer.alpha", "cer.k")]


def settings_table(agg: Sequence[dict], varying: Sequence[str] = (),
                   conditions: bool = False) -> str:
  """Markdown table of seeds.by_setting rows: mean ± sd over seeds per setting (clean
  condition, or every condition); CEU means with the examples n behind each seed's mean."""
  metrics = TABLE_METRICS[:-1] + ("ceu_control", TABLE_METRICS[-1])
  extra = _extra(varying)
  head = ("| architecture | regulariser | λ_ev | α | k | "
          + "".join(f"{k.split('.')[-1]} | " for k in extra)
          + ("condition | " if conditions else "") + "seeds | "
          + " | ".join(f"{m} (n)" if m in CEU_METRICS else m for m in metrics) + " |")
  lines = [head, "|" + "---|" * (6 + len(extra) + int(conditions) + len(metrics))]
  chosen = agg if conditions else [r for r in agg if r.get("condition") == "clean"]
  order = lambda r: (str(r.get(FAMILY)), str(r.get(REG)), r["index"],
                     r.get("condition") != "clean", str(r.get("condition")))
  for r in sorted(chosen, key=order):
    lines.append(f"| {r.get(FAMILY)} | {r.get(REG)} | {r.get('cer.lambda_ev')} | "
                 f"{r.get('cer.alpha')} | {r.get('cer.k')} | "
                 + "".join(f"{r.get(k)} | " for k in extra)
                 + (f"{r.get('condition')} | " if conditions else "")
                 + f"{r.get('n_seeds')} | "
                 + " | ".join(_fmt_sd(r, m, with_n=m in CEU_METRICS) for m in metrics) + " |")
  return "\n".join(lines)


STRATUM_TEXT = {"memorised": "evidence present, answer memorisable (ρ prior)",
                "evidence_only": "evidence present, answer not memorisable",
                "no_evidence": "the evidence is missing (η): EM only, nothing to use"}


def strata_table(agg: Sequence[dict], varying: Sequence[str] = ()) -> str | None:
  """Markdown table (clean condition): accuracy next to evidence use, overall and per
  stratum — EM, supported-answer rate, share of degenerate gaps (the answer does not
  move when the evidence value is swapped), CEU_ev; mean ± sd over seeds (one seed:
  value [95% CI]). None when the rows carry no strata."""
  clean = [r for r in agg if r.get("condition") == "clean"]
  strata = [s for s in aggregate.STRATA
            if any(np.isfinite(number(r.get(f"em_{s}"))) for r in clean)]
  if not strata:
    return None
  extra = _extra(varying)
  cols = [("em", "EM"), ("supported_0.5", "supported"), ("degenerate", "degenerate")]
  for s in strata:
    cols += [(f"em_{s}", f"EM [{s}]")]
    if s != "no_evidence":               # no span to restore: no CEU, never supported
      cols += [(f"supported_0.5_{s}", f"supported [{s}]"),
               (f"degenerate_{s}", f"degenerate [{s}]"), (f"ceu_ev_{s}", f"CEU_ev (n) [{s}]")]
  head = ("| architecture | regulariser | " + "".join(f"{k.split('.')[-1]} | " for k in extra)
          + "seeds | " + " | ".join(name for _, name in cols) + " |")
  lines = [head, "|" + "---|" * (3 + len(extra) + len(cols))]
  order = lambda r: (str(r.get(FAMILY)), str(r.get(REG)), r["index"])
  for r in sorted(clean, key=order):
    lines.append(f"| {r.get(FAMILY)} | {r.get(REG)} | " + "".join(f"{r.get(k)} | " for k in extra)
                 + f"{r.get('n_seeds', 1)} | "
                 + " | ".join(_fmt_sd(r, m, with_n=m.startswith("ceu_")) for m, _ in cols) + " |")
  legend = "; ".join(f"[{s}] = {STRATUM_TEXT.get(s, s)} (examples: "
                     f"{_n_range(clean, 'em_' + s)})" for s in strata)
  return ("\n".join(lines) + "\n\n" + legend + ". 'degenerate' = share of the examples with "
          "evidence whose gold log-likelihood does not move (gap < ε) when the evidence value "
          "is swapped: the answer does not depend on the evidence there. Supported = correct "
          "AND CEU_ev ≥ 0.5 (a degenerate example is never supported).")


def _n_range(rows: Sequence[dict], metric: str) -> str:
  ns = sorted({int(n) for r in rows if np.isfinite(n := number(r.get(f"{metric}_n")))})
  return "?" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"


def _values(results: Sequence[dict], field: str) -> str:
  vals = sorted({str(v) for r in results
                 if (v := r.get("config", {}).get(field)) is not None}, key=str)
  return ", ".join(vals) if vals else "?"


def _seeds_note(results: Sequence[dict]) -> str:
  from ceu_jax.grid import seeds as seeds_lib  # pylint: disable=g-import-not-at-top
  fields = seeds_lib.setting_fields(results)
  settings = collections.Counter(tuple(str(r["config"].get(k)) for k in fields)
                                 for r in results)
  counts = sorted(set(settings.values()))
  return (f"; {len(settings)} settings with {'/'.join(map(str, counts))} seeds each"
          if counts != [1] else "")


def _conditions(rows: Sequence[dict]) -> list[str]:
  names = []
  for r in sorted(rows, key=lambda r: (r.get("condition") != "clean", str(r.get("condition")))):
    if r.get("condition") not in names:
      names.append(r.get("condition"))
  return names


def _approximate(row: dict) -> bool:
  """The row's span CEUs are approximate: its `approximate_span` flag (True, or 'True' as
  results.csv holds it); for a cell of an earlier version of the code without the flag,
  the family's span decomposition (SPEC §2)."""
  v = row.get("approximate_span")
  if v is None or v == "":
    import architectures  # pylint: disable=g-import-not-at-top
    family = row.get(FAMILY)
    return (family in architectures.FAMILIES
            and architectures.span_decomposition(family) != "exact")
  return v is True or str(v) == "True"


def what_was_run(rows: Sequence[dict], results: Sequence[dict], config=None) -> list[str]:
  """The report's opening: cells, steps, seeds, training data, test conditions and
  which test set every number comes from."""
  out = ["## What was run", ""]
  out.append(f"- {len(results)} cells: architectures {_values(results, FAMILY)}; "
             f"regularisers {_values(results, REG)} (λ_ev {_values(results, 'cer.lambda_ev')},"
             f" α {_values(results, 'cer.alpha')}, k {_values(results, 'cer.k')}).")
  out.append(f"- Training: {_values(results, 'train.num_steps')} steps at batch "
             f"{_values(results, 'train.batch_size')}, seed {_values(results, 'seed')} "
             f"(one seed per cell{_seeds_note(results)}); training data δ "
             f"{_values(results, 'data.delta')}, "
             f"η {_values(results, 'data.eta')}, n {_values(results, 'data.context_len')}, "
             f"ρ {_values(results, 'data.rho')}.")
  runs = [r for r in results if r.get("train_run")]
  partial = [r for r in runs if not r["train_run"].get("completed")]
  if runs:
    steps = sorted({r["train_run"].get("checkpoint_step") for r in runs}, key=str)
    out.append(f"- Checkpoints audited: step {', '.join(map(str, steps))}; "
               + ("every cell's training completed." if not partial else
                  f"**{len(partial)} cells did not complete training**: " + "; ".join(
                      f"{r['cell_id']} ({r['train_run'].get('warning')})" for r in partial)))
  approx = sorted({str(r.get(FAMILY)) for r in rows if _approximate(r)})
  if approx:
    out.append(f"- **Approximate span CEU** (SPEC §2): the read port of {', '.join(approx)} "
               "restricts a span through its slot encoder, so its ceu_ev, ceu_dis and "
               "ceu_control are approximate (its port-restricted patches are exact).")
  conds = _conditions(rows)
  out.append(f"- Test conditions ({len(conds)}): {', '.join(map(str, conds))} — 'clean' is "
             "the training distribution, each other condition shifts one knob (δ, n or η).")
  if config is not None and "eval" in config:
    e = config.eval
    out.append(
        f"- **Which test set.** Every number in this report comes from THE fixed eval set "
        f"of config.eval (split 'eval', seed eval.seed = {e.seed}, {e.num_examples} examples"
        f", D− = {tuple(e.corruptions)[0]}), regenerated under each condition's knob; the "
        "'clean' condition is the very set each cell's training-time evaluation "
        "(cells/<id>/train/eval_final.json) scores, so their EM and CEU agree for the same "
        "checkpoint.")
  else:
    out.append("- Every number comes from the fixed eval set of config.eval (split 'eval'), "
               "the one the training-time evaluation scores.")
  out.append("- CEU values are means over the non-degenerate examples (evidence present, "
             "gap L+ − L− ≥ ε); n beside each mean counts them. ceu_ev_fixed, beside "
             "ceu_ev, is CEU_ev over every example with the evidence, a degenerate gap "
             "counted as 0 (SPEC §5a): its n counts those examples, so a change of the "
             "degenerate share shows there. EM and the supported-answer rate are over all "
             "examples ('examples').")
  return out + [""]


def _cell_list(cells: Sequence[dict]) -> list[str]:
  return [f"- cell {c.get('index')} `{c.get('cell_id')}` "
          f"({', '.join(f'{k}={v}' for k, v in c.get('overrides', [])) or 'base'}), "
          f"{c.get('status', '?')}" for c in cells]


def claims_section(workdir: str, rows: Sequence[dict], results: Sequence[dict]) -> list[str]:
  """SPEC §6's H1–H4 decided by rule (`ceu_jax.grid.paired`) and the paired comparisons
  they come from; also written to W/claims.md."""
  from ceu_jax import claims  # pylint: disable=g-import-not-at-top
  from ceu_jax.grid import paired  # pylint: disable=g-import-not-at-top
  found, comps = paired.grid_claims(workdir, rows, results)
  if not found:
    io.write_text_atomic(os.path.join(workdir, "claims.md"),
                         "No baseline / CER cells in this grid: H1–H4 untested.\n")
    return []
  md = ["## Claims (SPEC §6 H1–H4), decided by rule", "",
        "Verdicts by `ceu_jax.claims.RULE` from the run's files (`ceu_jax/grid/paired.py` "
        "states the thresholds): CER cells against their baseline (same setting and seed) "
        "on the same test items, paired per seed, mean ± sd over seeds.", "",
        claims.table(found), ""]
  if comps:
    md += ["## Paired comparisons, CER − baseline (clean test condition)", "",
           paired.comparisons_table(comps), ""]
  io.write_text_atomic(os.path.join(workdir, "claims.md"), "\n".join(md) + "\n")
  return md


def code_lines(results: Sequence[dict]) -> list[str]:
  """The code that produced the cells (result.json's `code`): one line if all agree,
  else a warning with each version and its number of cells."""
  counts = collections.Counter(code_version.describe(r.get("code")) for r in results)
  if not counts:
    return []
  if len(counts) == 1:
    return [f"Code: {next(iter(counts))} (every cell).", ""]
  return [f"**The cells come from {len(counts)} code versions** (compare them with care): "
          + "; ".join(f"{d} ({n} cells)" for d, n in counts.most_common()) + ".", ""]


def cpu_models(results: Sequence[dict]) -> collections.Counter:
  """The kind of CPU (`code_version.cpu_kind` of result.json's `versions`: model name,
  instruction sets; 'unrecorded CPU' before it was recorded) -> number of cells."""
  return collections.Counter(code_version.cpu_kind(r.get("versions") or {}) for r in results)


def cpu_lines(results: Sequence[dict]) -> list[str]:
  """The CPUs that computed the cells (`cpu_models`): one line if all agree, else a
  warning. XLA:CPU compiles for the CPU it runs on, so the same code and
  seed train to other numbers on another CPU model (README, "Results": 3 of the main
  job's 23 verdicts moved on an Intel host against the AMD host of the record)."""
  counts = cpu_models(results)
  if not counts:
    return []
  if len(counts) == 1:
    return [f"CPU: {next(iter(counts))} (every cell).", ""]
  return [f"**The cells were computed on {len(counts)} kinds of CPU** (XLA:CPU rounds "
          "differently on each: a cell rerun on another kind gives other numbers): "
          + "; ".join(f"{d} ({n} cells)" for d, n in counts.most_common()) + ".", ""]


def write_report(workdir: str, rows: Sequence[dict], results: Sequence[dict],
                 failures: Sequence[dict], title: str = "CEU experiment grid", *,
                 config=None, other_cells: Sequence[dict] = (),
                 excluded: Sequence[dict] = ()) -> str:
  """W/report.md and W/plots/*. `config`: the grid config (for the test-set
  description); `other_cells`: included cells that are not in the current config
  (flagged); `excluded`: such cells that were left out (listed)."""
  plots_dir = os.path.join(workdir, "plots")
  made, skipped = {}, {}

  def draw(key, fn, *args):
    try:
      made[key] = fn(*args)
    except Skipped as e:
      skipped[key] = str(e)

  from ceu_jax.grid import seeds as seeds_lib  # pylint: disable=g-import-not-at-top
  fields = seeds_lib.setting_fields(results)
  agg = seeds_lib.by_setting(rows, fields) if rows else []
  varying = seeds_lib.varying_fields(agg, fields)
  label = lambda r: series_label(r, varying)
  spread = seeds_lib.spread_kind(agg) if agg else ""
  multi = any(int(r.get("n_seeds", 1)) > 1 for r in agg)
  if agg:
    io.write_text_atomic(os.path.join(workdir, "results_seeds.csv"), seeds_lib.to_csv(agg))
    for x in ("delta_test", "n_test", "eta_test"):
      draw(x, lambda x=x: plot_vs(agg, x, stem=os.path.join(
          plots_dir, f"em_ceu_vs_{x.split('_')[0]}"), label=label, band=spread))
    others = [f for f in varying if not f.startswith("cer.") and f != FAMILY]
    draw("pareto", lambda: plot_pareto(agg, os.path.join(plots_dir, "pareto_em_supported"),
                                       label=label, bars=spread, frontier_by=others))
    draw("k", plot_k_gain, agg, os.path.join(plots_dir, "ceu_gain_per_forward_vs_k"), fields)
  draw("hist", plot_ceu_histograms, load_examples(workdir, results, label),
       os.path.join(plots_dir, "ceu_ev_hist_correct"))
  parts = [f"# {title}", "",
           f"{len(results)} cells finished, {len(failures)} failed; "
           f"{len(rows)} rows in results.csv (one per cell × test condition)"
           + (f", {len(agg)} in results_seeds.csv (one per setting × condition, over seeds)"
              if multi else "") + ".", ""]
  parts += code_lines(results) + cpu_lines(results)
  parts += what_was_run(rows, results, config)
  claims_md = claims_section(workdir, rows, results)
  parts += claims_md
  h1 = strata_table(agg, varying) if agg else None
  if h1:
    parts += ["## Accurate, but is the evidence used? (clean test condition, by stratum)", "",
              "SPEC §6 H1: a model can be accurate while its evidence is not causally used. "
              "Values are " + ("mean ± sd over seeds" if multi else
                               "value [95% bootstrap CI] of the one seed") + ".", "", h1, ""]
  if multi:
    parts += ["## Summary over seeds (clean test condition; mean ± sd over seeds (n))", "",
              "Each value is the mean over the setting's seeds of the cells' means, ± the "
              "sample sd over seeds; n is the smallest number of examples behind one "
              "seed's CEU mean (the non-degenerate ones; for ceu_ev_fixed every example "
              "with the evidence). Plots show " + spread + ".", "",
              settings_table(agg, varying), "",
              "## Every cell (one seed each; value [95% bootstrap CI within the seed] (n))", "",
              summary_table(rows, _extra(varying) + ["seed"]), ""]
  else:
    parts += ["## Summary (clean test condition; value [95% bootstrap CI] (n))", "",
              "One seed per setting: the CIs are within that seed; differences between "
              "settings of a few points may be seed noise.", "",
              summary_table(rows, _extra(varying)) if rows else "(no finished cells)", ""]
  if multi:
    parts += ["## Every test condition over seeds (mean ± sd)", "",
              settings_table(agg, varying, conditions=True), ""]
  parts += ["## Every test condition", "", conditions_table(rows), ""]
  captions = {"delta_test": "EM and CEU_ev vs test distractor rate δ",
              "n_test": "EM and CEU_ev vs test context length n",
              "eta_test": "EM and CEU_ev vs test miss rate η",
              "pareto": "Clean EM vs supported-answer rate over (λ, α)",
              "k": "CEU_ev gain per extra forward pass vs k",
              "hist": "CEU_ev histograms, correct vs incorrect"}
  parts += ["## Plots", ""]
  for key, paths in made.items():
    parts += [f"### {captions[key]}", "", f"![{captions[key]}](plots/{os.path.basename(paths[0])})",
              f"([PDF](plots/{os.path.basename(paths[1])}))", ""]
  if skipped:
    parts += ["Not drawn:", ""] + [f"- {captions[k]}: {why}" for k, why in skipped.items()]
    parts += [""]
  if other_cells:
    parts += ["## Cells not in the current config (included as asked)", ""]
    parts += _cell_list(other_cells) + [""]
  if excluded:
    parts += ["## Cells not in the current config (excluded)", "",
              "Left under cells/ by an earlier version of the grid config; not in "
              "results.csv or above (rerun with --include_other_cells to include them).", ""]
    parts += _cell_list(excluded) + [""]
  if failures:
    parts += ["## Failed cells", ""]
    parts += [f"- cell {f['index']} `{f['cell_id']}`: {f['error']}" for f in failures]
  path = os.path.join(workdir, "report.md")
  io.write_text_atomic(path, "\n".join(parts) + "\n")
  return path
