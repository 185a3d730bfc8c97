"""`run_bounds`: the theorem-style plots T1–T3 (SPEC §7) on trained models.

  python -m experiments.bounds --config configs/bounds.py:tiny --workdir W

1. Trains every model of `config.models` (resumably; finished ones skipped)
   in W/models/<name>/ with `ceu_jax.train.train_and_evaluate`.
2. T1: per example, evidence-span restoration in log-likelihood vs logit space
   on each trained model, and the exact two-channel model's sweep.
3. T2: per model, worst-case accuracy drop under surface-matched adversarial
   distractor sets (`theory.adversary`) against 1 − mean CEU_ev.
4. T3: for `config.t3.model`, the unsupported-answer rate over test-time η
   and δ against η + (1 − η) exp(−ĉ α̂ γ̂(δ)), ĉ fitted on a held-out split.
Writes W/plots/{t1,t2,t3}.{png,pdf}, W/bounds.md and W/bounds.json.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import jax
import ml_collections
import numpy as np

from ceu_jax import claims, io, jobs
from ceu_jax.metrics.resampling import Aggregate, fmt_ci
from ceu_jax.theory import (adversary, bounds_plots, lower_bound, measure, plots, stats,
                            two_channel, upper_bound)
from ceu_jax.theory import bounds_report as report

Log = Callable[[str], None]


def model_config(config, overrides) -> ml_collections.ConfigDict:
  """The training config of one model: config.model_base with dotted overrides."""
  c = ml_collections.ConfigDict(config.model_base.to_dict())
  for key, value in overrides:
    section, field = key.rsplit(".", 1)
    node = c
    for part in section.split("."):
      node = node[part]
    node[field] = value
  c.seed = int(config.seed)
  return c


def train_models(config, workdir: str, log: Log) -> dict[str, ml_collections.ConfigDict]:
  """Trains (or resumes) every model; skips the completed ones."""
  from ceu_jax.train import checkpoint, train_and_evaluate
  out = {}
  for i, (name, overrides) in enumerate(config.models):
    cfg, mdir = model_config(config, overrides), os.path.join(workdir, "models", name)
    status = checkpoint.read_status(mdir) or {}
    steps = int(cfg.train.num_steps)
    if status.get("status") == "completed" and int(status.get("step", -1)) == steps:
      log(f"[bounds] model {i + 1}/{len(config.models)} {name}: trained, skipped")
    else:
      tic = time.time()
      log(f"[bounds] model {i + 1}/{len(config.models)} {name}: training {steps} steps")
      train_and_evaluate(cfg, mdir)
      log(f"[bounds] model {name}: trained in {time.time() - tic:.0f}s")
    out[name] = cfg
  return out


def _key(config, *tags: int) -> jax.Array:
  key = jax.random.PRNGKey(int(config.eval.seed))
  for t in tags:
    key = jax.random.fold_in(key, t)
  return key


def _measure(config, tm, clean) -> dict[str, np.ndarray]:
  e = config.eval
  return measure.measure_set(tm, clean, str(e.corruption), _key(config, 1),
                             batch_size=int(e.batch_size), probe_chunk=e.probe_chunk,
                             eps=float(e.eps))


# --------------------------------------------------------------- T1


def run_t1(config, models, log: Log) -> dict:
  """Trained-model T1 results and the two-channel sweeps."""
  t = config.t1
  trained = {}
  for name, tm in models.items():
    clean = measure.eval_set(tm.data_cfg, int(config.eval.seed), int(t.num_examples))
    trained[name] = measure.t1_trained(tm, clean, str(t.corruption), _key(config, 2),
                                       int(config.eval.batch_size))
    log(f"[bounds] T1 {name}: {int(np.isfinite(trained[name].diff).sum())} examples, "
        f"{trained[name].n_degenerate} degenerate")
  synthetic = {}
  for coupling in sorted({0.0, float(t.synthetic_coupling), 0.5}):
    model = two_channel.make_two_channel(other_coupling=coupling, seed=int(config.seed))
    synthetic[f"coupling {coupling:g}"] = two_channel.t1_sweep(
        model, t.scales, num_examples=int(t.synthetic_examples), seed=int(config.seed))
  return {"trained": trained, "synthetic": synthetic}


# --------------------------------------------------------------- T2


def run_t2(config, models, base_rows, log: Log) -> dict:
  """Adversarial matched-distractor search per model and the T2 points."""
  s, boot = config.t2, _boot(config)
  points, attacks = [], {}
  for name, tm in models.items():
    n = int(s.num_examples)
    clean = measure.eval_set(tm.data_cfg, int(config.eval.seed), n,
                             delta=float(config.t3.base_delta))
    tic = time.time()
    res = adversary.attack(tm, clean, _key(config, 3), budget=int(s.budget),
                           max_slots=int(s.max_slots), value_draws=int(s.value_draws),
                           beam_width=int(s.beam_width), log=log)
    rows = base_rows[name]
    points.append(lower_bound.t2_model_point(
        name, rows["ceu_ev"][:n], res["clean_correct"], res["adv_correct"],
        supported=rows["has_evidence"][:n], degenerate=rows["degenerate"][:n], **boot))
    attacks[name] = res
    log(f"[bounds] T2 {name}: clean acc {points[-1].clean_accuracy:.3f} -> "
        f"{points[-1].adversarial_accuracy:.3f} under attack ({time.time() - tic:.0f}s, "
        f"{int(res['forwards'].sum())} batched forwards)")
  summary = lower_bound.t2_summary(points, n_resamples=int(config.eval.num_resamples),
                                   seed=int(config.seed))
  return {"points": points, "attacks": attacks, "summary": summary,
          "paired": t2_paired(config, points, attacks, base_rows)}


def t2_paired(config, points, attacks, base_rows) -> dict:
  """Paired per-item accuracy-drop difference, lowest − highest mean CEU_ev model, on
  the evidence-present attacked items they share (the T2 verdict's dependence part)."""
  if len(points) < 2:
    return {}
  order = sorted(points, key=lambda p: p.one_minus_ceu.floats()[0])
  high, low = order[0].name, order[-1].name          # highest / lowest mean CEU_ev
  n = int(config.t2.num_examples)
  sup = (np.asarray(base_rows[low]["has_evidence"][:n], bool)
         & np.asarray(base_rows[high]["has_evidence"][:n], bool))
  drop = {name: (np.asarray(attacks[name]["clean_correct"], np.float64)
                 - np.asarray(attacks[name]["adv_correct"], np.float64))[sup]
          for name in (low, high)}
  diff = claims.paired("accuracy drop", [("run", drop[low], drop[high])],
                       seed=int(config.seed), num_resamples=int(config.eval.num_resamples))
  return {"low": low, "high": high, "diff": diff.per_seed[0].diff}


# --------------------------------------------------------------- T3


def _boot(config) -> dict:
  return {"n_resamples": int(config.eval.num_resamples), "seed": int(config.seed)}


def _t3_rows(config, tm, log: Log) -> dict[float, list[dict]]:
  """Per δ, per η: measured rows of a fresh test set (different examples each)."""
  r, e = config.t3, config.eval
  out = {}
  for di, delta in enumerate(r.deltas):
    out[float(delta)] = []
    for ei, eta in enumerate(r.etas):
      clean = measure.eval_set(tm.data_cfg, int(e.seed) + 1 + 100 * di + ei,
                               int(e.num_examples), eta=float(eta), delta=float(delta))
      out[float(delta)].append(_measure(config, tm, clean))
    log(f"[bounds] T3 {tm.name}: δ={float(delta):g} measured at {len(r.etas)} η")
  return out


def _cat(rows: list[dict], key: str) -> np.ndarray:
  return np.concatenate([x[key] for x in rows])


def advantage(rows: dict) -> np.ndarray:
  """Per-example margin for ĉ: CEU_ev,i · (m+_i − m−_i) (NaN where degenerate)."""
  return upper_bound.evidence_advantage(rows["ceu_ev"], rows["swap_margin"])


def _unsupported(rows: dict, tau: float) -> np.ndarray:
  return upper_bound.unsupported(rows["correct"], rows["ceu_ev"], rows["has_evidence"], tau)


def heldout_rows(config, tm) -> dict[str, np.ndarray]:
  """Measured rows of the held-out ('eval' split) set at η = 0, δ = base δ."""
  r, e = config.t3, config.eval
  held = measure.eval_set(tm.data_cfg, int(e.seed), int(e.heldout_examples),
                          split="eval", delta=float(r.base_delta))
  return _measure(config, tm, held)


def fit_c(config, rows: dict, method: str, log: Log) -> Aggregate:
  """ĉ from held-out rows: error = unsupported, margin = `advantage`."""
  errors, adv = _unsupported(rows, float(config.t3.tau)), advantage(rows)
  usable = np.isfinite(adv) & (adv > 0)
  if not usable.any():
    c = Aggregate(None, None, None, 0, int(adv.size),
                  note=f"method={method}; no held-out example with advantage > 0: c undefined")
  else:
    c = upper_bound.estimate_c(adv, errors, method=method,
                               n_resamples=int(config.eval.num_resamples),
                               seed=int(config.seed))
  log(f"[bounds] T3 ĉ ({method}) = {fmt_ci(c, style='g', missing='n/a')} "
      f"on n={c.n} held-out examples ({c.n_excluded} excluded: advantage ≤ 0 or degenerate)")
  return c


def run_t3(config, tm, log: Log) -> dict:
  """Rates by (δ, η), α, γ(δ), ĉ and the reports (primary and alternative ĉ)."""
  r, boot = config.t3, _boot(config)
  by_delta = _t3_rows(config, tm, log)
  tau, base = float(r.tau), float(r.base_delta)
  rates = {d: upper_bound.rate_by_eta([_unsupported(x, tau) for x in rows], **boot)
           for d, rows in by_delta.items()}
  # The rate split in two: the realised miss share (the bound's η) and the unsupported
  # rate where the evidence is present (the bound's exp(−c α γ) term).
  split = {d: [{"miss_share": float(1.0 - np.mean(x["has_evidence"])),
                "present_unsupported": stats.rate_estimate(
                    _unsupported(x, tau), np.asarray(x["has_evidence"], bool), **boot)}
               for x in rows] for d, rows in by_delta.items()}
  alphas, gammas = {}, {}
  for d, rows in by_delta.items():
    present = _cat(rows, "has_evidence")
    alphas[d] = upper_bound.estimate_alpha(_cat(rows, "ceu_ev"), present,
                                           _cat(rows, "degenerate"), **boot)
    gammas[d] = upper_bound.estimate_gamma(_cat(rows, "margin_plus"),
                                           _cat(rows, "margin_minus"), present, **boot)
  alpha = alphas[base] if base in alphas else alphas[min(alphas, key=lambda x: abs(x - base))]
  method = str(r.c_method)
  other = "envelope" if method == "mle" else "mle"
  held = heldout_rows(config, tm)
  c, c_alt = fit_c(config, held, method, log), fit_c(config, held, other, log)
  reports = upper_bound.t3_reports_by_delta(r.etas, rates, alpha, gammas, c)
  alt = upper_bound.t3_reports_by_delta(r.etas, rates, alpha, gammas, c_alt)
  return {"model": tm.name, "rates": rates, "alpha": alpha, "alphas": alphas,
          "gammas": gammas, "c": c, "c_alt": c_alt, "reports": reports,
          "reports_alt": alt, "heldout_rows": held, "by_delta": by_delta, "split": split}


# --------------------------------------------------------------- driver


def _plots(config, workdir: str, t1: dict, t2: dict, t3: dict) -> dict[str, list[str]]:
  pdir = os.path.join(workdir, "plots")
  out = {"t1": bounds_plots.plot_t1_bounds(t1["trained"], t1["synthetic"],
                                           os.path.join(pdir, "t1"), str(config.t1.corruption)),
         "t2": plots.plot_t2(t2["points"], os.path.join(pdir, "t2"), t2["summary"],
                             title=report.t2_title(config))}
  out["t3"] = bounds_plots.plot_t3_bounds(
      t3["reports"], t3["gammas"], t3["alphas"], os.path.join(pdir, "t3"),
      title=f"T3 upper bound, model {t3['model']}", caption=report.t3_caption(config, t3))
  return out


def run_bounds(config, workdir: str, *, log: Log = print) -> dict:
  """Trains the models, measures T1–T3, writes plots, bounds.md and bounds.json."""
  tic = time.time()
  raw_log, log = log, lambda msg: raw_log(f"{msg} [{time.time() - tic:.0f}s]")
  os.makedirs(workdir, exist_ok=True)
  cfgs = train_models(config, workdir, log)
  models = {name: measure.load_trained(name, cfg, os.path.join(workdir, "models", name))
            for name, cfg in cfgs.items()}
  if str(config.t3.model) not in models:
    raise ValueError(f"t3.model {config.t3.model!r} is not one of {sorted(models)}")
  base_rows = {}
  for name, tm in models.items():
    clean = measure.eval_set(tm.data_cfg, int(config.eval.seed), int(config.eval.num_examples),
                             delta=float(config.t3.base_delta))
    base_rows[name] = _measure(config, tm, clean)
    log(f"[bounds] {name}: accuracy {base_rows[name]['correct'].mean():.3f}, mean CEU_ev "
        f"{np.nanmean(base_rows[name]['ceu_ev']):.3f}")
  t1 = run_t1(config, models, log)
  t2 = run_t2(config, models, base_rows, log)
  t3 = run_t3(config, models[str(config.t3.model)], log)
  paths = _plots(config, workdir, t1, t2, t3)
  result = report.to_json(config, base_rows, t1, t2, t3, paths, time.time() - tic)
  result["versions"] = jobs.versions()   # the code (version, git commit) and libraries
  io.write_json_atomic(os.path.join(workdir, "bounds.json"), result)
  io.write_text_atomic(os.path.join(workdir, "bounds.md"), report.markdown(config, result))
  log(f"[bounds] wrote {workdir}/bounds.md, bounds.json and plots/ "
      f"({time.time() - tic:.0f}s)")
  return result
