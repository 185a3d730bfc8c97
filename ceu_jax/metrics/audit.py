"""`summarize_audit`: the JSON-able per-condition summary of audit and grid reports."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ceu_jax.engine.probes import DIS, EV, SPAN_PROBES
from ceu_jax.metrics import resampling as bs
from ceu_jax.metrics import calibration
from ceu_jax.metrics import summary

Rows = Mapping[str, np.ndarray]


def _n_rows(rows: Rows) -> int:
  if not rows:
    raise ValueError("rows is empty")
  lengths = {k: len(np.asarray(v)) for k, v in rows.items()}
  if len(set(lengths.values())) != 1:
    raise ValueError(f"rows must be aligned; lengths {lengths}")
  return next(iter(lengths.values()))


def _get(rows: Rows, key: str, dtype=np.float64) -> np.ndarray | None:
  return np.asarray(rows[key], dtype=dtype) if key in rows else None


def _degenerate(rows: Rows, eps: float) -> np.ndarray | None:
  if "degenerate" in rows:
    return _get(rows, "degenerate", bool)
  if "L_plus" in rows and "L_minus" in rows:
    return (_get(rows, "L_plus") - _get(rows, "L_minus")) < eps
  return None


def _ceu(rows: Rows, kind: str, eps: float) -> np.ndarray | None:
  if f"ceu_{kind}" in rows:
    return _get(rows, f"ceu_{kind}")
  if all(k in rows for k in (f"L_int_{kind}", "L_minus", "L_plus")):
    return summary.stabilised_ceu(rows[f"L_int_{kind}"], rows["L_minus"],
                                  rows["L_plus"], eps)[0]
  return None


def _accuracy(rows: Rows, boot: dict) -> dict:
  out = {}
  if "correct" in rows:
    out["em"] = bs.mean_ci(_get(rows, "correct"), **boot).to_dict()
  if "f1" in rows:
    out["f1"] = bs.mean_ci(_get(rows, "f1"), **boot).to_dict()
  return out


def _nll(rows: Rows, boot: dict) -> dict:
  if "L_plus" not in rows:
    return {}
  out = {"nll": bs.mean_ci(calibration.nll(rows["L_plus"]), **boot).to_dict()}
  if "num_tokens" in rows:
    per_token = calibration.nll(rows["L_plus"], rows["num_tokens"])
    out["nll_per_token"] = bs.mean_ci(per_token, **boot).to_dict()
  return out


def _calibration(rows: Rows, num_bins: int, boot: dict) -> dict:
  out = {}
  if "confidence" in rows and "correct" in rows:
    conf, corr = _get(rows, "confidence"), _get(rows, "correct")
    out["ece"] = bs.bootstrap(
        lambda c, y: calibration.ece_resampled(c, y, num_bins), conf, corr,
        **boot).to_dict()
    out["brier_binary"] = bs.mean_ci(calibration.brier_binary(conf, corr),
                                     **boot).to_dict()
  if "probs" in rows and "labels" in rows:
    brier = calibration.brier_multiclass(rows["probs"], rows["labels"])
    out["brier_multiclass"] = bs.mean_ci(brier, **boot).to_dict()
  if out:
    out["num_bins"] = num_bins
  return out


def _deltas(rows: Rows, boot: dict) -> dict:
  if "L_minus" not in rows:
    return {}
  l_minus = _get(rows, "L_minus")
  sources = {"delta_L": "L_plus", **{f"delta_{p}": f"L_int_{p}" for p in SPAN_PROBES}}
  return {name: summary.delta_stats(_get(rows, key) - l_minus, **boot)
          for name, key in sources.items() if key in rows}


# Per probe: the row column (bool) that says the probe's span exists for the example.
PROBE_EXISTS = {DIS: f"{DIS}_found"}


def _ceu_sections(rows: Rows, degenerate: np.ndarray | None, eps: float,
                  taus: Sequence[float], boot: dict) -> dict:
  ceus = {k: c for k in SPAN_PROBES
          if (c := _ceu(rows, k, eps)) is not None}
  if not ceus:
    return {}
  if degenerate is None:
    raise ValueError("CEU rows need a 'degenerate' flag or L_plus and L_minus")
  correct = _get(rows, "correct", bool) if "correct" in rows else None
  n = len(degenerate)
  evidence = _get(rows, "has_evidence", bool) if "has_evidence" in rows else np.ones(n, bool)
  out: dict = {"ceu": {}}
  for k, c in ceus.items():
    keep = evidence & (_get(rows, PROBE_EXISTS[k], bool) if PROBE_EXISTS.get(k) in rows
                       else True)
    out["ceu"][k] = summary.ceu_distribution(
        c[keep], degenerate[keep], None if correct is None else correct[keep], **boot)
    out["ceu"][k]["n_without_span"] = int((~keep).sum())
    # SPEC §5a: beside the §1 mean (non-degenerate examples), the mean over every example
    # with the span, degenerate gaps counted as 0 (no evidence effect to restore).
    out["ceu"][k]["fixed_denominator"] = summary.ceu_fixed_denominator(
        c[keep], degenerate[keep], **boot)
  if EV in ceus and correct is not None:
    # Every example is in the denominator; one without evidence is never supported.
    out["supported_answer_rate"] = summary.supported_answer_rate(
        correct, np.where(evidence, ceus[EV], 0.0), degenerate | ~evidence, taus, **boot)
  return out


def summarize_audit(rows: Rows, *, taus: Sequence[float] = summary.DEFAULT_TAUS,
                    eps: float = summary.DEFAULT_EPS,
                    num_bins: int = calibration.DEFAULT_NUM_BINS,
                    num_resamples: int = bs.DEFAULT_RESAMPLES,
                    seed: int = bs.DEFAULT_SEED,
                    level: float = bs.DEFAULT_LEVEL) -> dict:
  """JSON-able summary of one evaluated condition (SPEC §5).

  Input `rows`: aligned per-example arrays [n] (all optional; a section is
  produced iff its inputs are present):
    correct      bool, EM of the answer on D+ (token-id or SQuAD EM).
    f1           float, token F1 on D+.
    L_plus, L_minus  float, gold log-likelihoods log p(y*|q,D+), log p(y*|q,D−).
    L_int_ev, L_int_dis, L_int_control  float, gold log-likelihood of the
                 evidence / distractor / control patched runs.
    ceu_ev, ceu_dis, ceu_control  float, stabilised CEU; when absent they are
                 computed from L_int_*, L_minus, L_plus with `eps`.
    degenerate   bool, gap flag; when absent it is L_plus − L_minus < eps.
    has_evidence bool, D+ holds the evidence; CEU statistics are over these
                 examples only (the others have no span to restore).
    dis_found    bool, a distractor span exists; CEU_dis is over these only.
    num_tokens   int, answer length (adds NLL per token).
    confidence   float in [0, 1], confidence in the predicted answer.
    probs [n, K], labels [n]  class probabilities and gold class.

  Output (every aggregate is a record {value, ci_low, ci_high, n}; value and
  CI are None when n = 0):
    n                 int, number of examples.
    n_degenerate      int, degenerate examples with evidence (iff the flag is known).
    n_without_evidence  int, examples whose D+ lacks the evidence (iff has_evidence).
    accuracy          {em, f1}: means over all examples.
    nll               mean −L_plus; nll_per_token when num_tokens is given.
    calibration       {ece, brier_binary (from confidence, correct),
                       brier_multiclass (from probs, labels), num_bins}.
    deltas            {delta_L = L+ − L−, delta_ev = L_int_ev − L−, delta_dis,
                       delta_control}: each {mean, median}, over all examples
                       (degenerate ones included).
    ceu               {ev, dis, control}: each {all, correct, incorrect}: each
                       {mean, median, q10, q25} over non-degenerate examples
                       with the probe's span, plus n_degenerate {all, correct,
                       incorrect} (counts) and n_without_span (examples
                       without evidence, or without a distractor for dis).
    supported_answer_rate  {"0.25", "0.5", "0.75" (str(τ) with %g)}: share of
                       all examples correct AND with evidence AND
                       non-degenerate AND CEU_ev ≥ τ.
    settings          {taus, eps, num_bins, num_resamples, seed, level}.
  """
  n = _n_rows(rows)
  boot = {"num_resamples": num_resamples, "seed": seed, "level": level}
  degenerate = _degenerate(rows, eps)
  out: dict = {"n": n}
  evidence = _get(rows, "has_evidence", bool) if "has_evidence" in rows else None
  if degenerate is not None:
    out["n_degenerate"] = int((degenerate if evidence is None else degenerate & evidence).sum())
  if evidence is not None:
    out["n_without_evidence"] = int((~evidence).sum())
  sections = {"accuracy": _accuracy(rows, boot),
              "calibration": _calibration(rows, num_bins, boot),
              "deltas": _deltas(rows, boot)}
  out.update({k: v for k, v in sections.items() if v})
  out.update(_nll(rows, boot))
  out.update(_ceu_sections(rows, degenerate, eps, taus, boot))
  out["settings"] = {"taus": [float(t) for t in taus], "eps": eps,
                     "num_bins": num_bins, **boot}
  return out


def summarize_groups(rows: Rows, by: str, **kwargs) -> dict[str, dict]:
  """`summarize_audit` per value of rows[by] (e.g. a stratum); keys are str."""
  keys = np.asarray(rows[by])
  return {str(g): summarize_audit(
      {k: np.asarray(v)[keys == g] for k, v in rows.items() if k != by},
      **kwargs) for g in np.unique(keys)}
