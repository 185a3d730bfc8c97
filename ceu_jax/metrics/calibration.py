"""NLL, expected calibration error and Brier score (SPEC §5).

Per-example quantities are returned as arrays so that `bootstrap` can put a CI
on their mean; ECE is not a per-example mean and has a batched form
(`ece_resampled`) for the bootstrap instead.

Conventions:
- Confidence is either the maximum class probability (`confidence='max'`) or
  the probability the model gives to its predicted answer
  (`confidence='predicted'`, e.g. the sequence probability of a greedy or
  beam-decoded answer, or of a predicted class that is not the argmax).
- ECE uses `num_bins` equal-width bins over [0, 1], right-closed:
  bin b holds confidences in (b/B, (b+1)/B], and confidence 0 falls in bin 0.
  ECE = Σ_b (n_b / n) |acc_b − conf_b| over non-empty bins.
- Brier, multi-class form: Σ_k (p_k − 1[k = y])² per example, in [0, 2].
  Brier, binary form: (confidence − correct)² per example, in [0, 1]; this is
  the form for open-ended answers, scoring the confidence in the prediction
  against its correctness.
"""
from __future__ import annotations

import numpy as np

DEFAULT_NUM_BINS = 15


def nll(gold_loglik: np.ndarray, num_tokens: np.ndarray | None = None
        ) -> np.ndarray:
  """Per-example NLL −log p(y* | q, D) [n]; per token if num_tokens [n] given."""
  out = -np.asarray(gold_loglik, dtype=np.float64)
  if num_tokens is not None:
    out = out / np.maximum(np.asarray(num_tokens, dtype=np.float64), 1.0)
  return out


def confidence_from_probs(probs: np.ndarray, labels: np.ndarray,
                          predictions: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
  """(confidence [n], correct [n] bool) from class probabilities [n, K].

  Without `predictions` the prediction is the argmax and the confidence is the
  maximum probability; with `predictions` [n] the confidence is the
  probability of the predicted class.
  """
  probs = np.asarray(probs, dtype=np.float64)
  labels = np.asarray(labels)
  if predictions is None:
    predictions = probs.argmax(axis=-1)
  predictions = np.asarray(predictions)
  confidence = np.take_along_axis(probs, predictions[:, None], axis=-1)[:, 0]
  return confidence, predictions == labels


def _bin_index(confidence: np.ndarray, num_bins: int) -> np.ndarray:
  """Right-closed equal-width bin of each confidence in [0, 1]."""
  idx = np.ceil(confidence * num_bins).astype(np.int64) - 1
  return np.clip(idx, 0, num_bins - 1)


def _check_confidence(confidence: np.ndarray) -> None:
  if np.any(~np.isfinite(confidence)) or np.any(
      (confidence < 0.0) | (confidence > 1.0)):
    raise ValueError("confidences must be finite and lie in [0, 1]")


def ece_resampled(confidence: np.ndarray, correct: np.ndarray,
                  num_bins: int = DEFAULT_NUM_BINS) -> np.ndarray:
  """ECE of each row of [R, n] confidences / correctness -> [R]."""
  confidence = np.asarray(confidence, dtype=np.float64)
  correct = np.asarray(correct, dtype=np.float64)
  _check_confidence(confidence)
  r, n = confidence.shape
  flat = (_bin_index(confidence, num_bins)
          + num_bins * np.arange(r)[:, None]).ravel()
  size = r * num_bins
  count = np.bincount(flat, minlength=size)
  conf_sum = np.bincount(flat, weights=confidence.ravel(), minlength=size)
  acc_sum = np.bincount(flat, weights=correct.ravel(), minlength=size)
  gap = np.abs(acc_sum - conf_sum).reshape(r, num_bins)
  return gap.sum(axis=1) / n


def ece(confidence: np.ndarray, correct: np.ndarray,
        num_bins: int = DEFAULT_NUM_BINS) -> float:
  """Expected calibration error of [n] confidences against [n] correctness."""
  confidence = np.asarray(confidence, dtype=np.float64)
  if confidence.size == 0:
    raise ValueError("ECE of an empty sample is undefined")
  return float(ece_resampled(confidence[None], np.asarray(correct)[None],
                             num_bins)[0])


def reliability_bins(confidence: np.ndarray, correct: np.ndarray,
                     num_bins: int = DEFAULT_NUM_BINS) -> dict:
  """Reliability-diagram data: per bin edges, count, mean confidence, accuracy.

  Empty bins have count 0 and None for the means (JSON-able lists).
  """
  confidence = np.asarray(confidence, dtype=np.float64)
  correct = np.asarray(correct, dtype=np.float64)
  _check_confidence(confidence)
  idx = _bin_index(confidence, num_bins)
  count = np.bincount(idx, minlength=num_bins)
  conf_sum = np.bincount(idx, weights=confidence, minlength=num_bins)
  acc_sum = np.bincount(idx, weights=correct, minlength=num_bins)

  def means(total):
    return [float(t / c) if c else None for t, c in zip(total, count)]

  return {
      "edges": np.linspace(0.0, 1.0, num_bins + 1).tolist(),
      "count": count.tolist(),
      "confidence": means(conf_sum),
      "accuracy": means(acc_sum),
  }


def brier_multiclass(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """Per-example multi-class Brier Σ_k (p_k − 1[k = y])² [n], in [0, 2]."""
  probs = np.asarray(probs, dtype=np.float64)
  onehot = np.zeros_like(probs)
  np.put_along_axis(onehot, np.asarray(labels)[:, None], 1.0, axis=-1)
  return ((probs - onehot) ** 2).sum(axis=-1)


def brier_binary(confidence: np.ndarray, correct: np.ndarray) -> np.ndarray:
  """Per-example binary Brier (confidence − correct)² [n], in [0, 1]."""
  confidence = np.asarray(confidence, dtype=np.float64)
  _check_confidence(confidence)
  return (confidence - np.asarray(correct, dtype=np.float64)) ** 2


def teacher_forced_confidence(logits: np.ndarray, answer_ids: np.ndarray,
                              pad_id: int = 0) -> np.ndarray:
  """Confidence [B] in the argmax answer from teacher-forced logits [B, A, V].

  exp(Σ_i max_v log p_i(v)) over positions where the gold is not `pad_id`.
  For single-token answers this is the maximum class probability. For longer
  answers it is the probability of the greedy decode whenever that decode is
  correct (the teacher-forced prefix is then the decoded one); when an earlier
  token is wrong the later factors are conditioned on the gold prefix, so the
  value only approximates the greedy-sequence probability.
  """
  logits = np.asarray(logits, dtype=np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  max_logp = -np.log(np.exp(shifted).sum(axis=-1))     # log of the max prob
  keep = np.asarray(answer_ids) != pad_id
  return np.exp(np.where(keep, max_logp, 0.0).sum(axis=-1))
