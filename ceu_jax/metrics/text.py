"""Answer correctness: SQuAD v1.1 EM / token F1 on strings, EM on token ids (SPEC §5).

The string normalisation is the one of the official SQuAD v1.1 evaluation
script, applied in this order: lowercase, strip every character of
`string.punctuation`, replace the whole words a / an / the by a space, collapse
runs of whitespace. Token F1 is computed over bags of whitespace tokens of the
normalised strings; with several gold answers the maximum over golds is taken.

Edge case kept from v1.1 (it differs from SQuAD v2): when prediction and gold
both normalise to the empty string, EM is 1 but F1 is 0, because F1 is defined
as 0 whenever no token is shared.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Sequence

import numpy as np

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

Golds = str | Sequence[str]


def normalize_answer(text: str) -> str:
  """SQuAD v1.1 normalisation: lower, strip punctuation, drop articles, squash spaces."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def _as_golds(golds: Golds) -> list[str]:
  golds = [golds] if isinstance(golds, str) else list(golds)
  if not golds:
    raise ValueError("at least one gold answer is required")
  return golds


def _single_f1(prediction: str, gold: str) -> float:
  pred_tokens = normalize_answer(prediction).split()
  gold_tokens = normalize_answer(gold).split()
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_tokens)
  recall = num_same / len(gold_tokens)
  return 2.0 * precision * recall / (precision + recall)


def exact_match(prediction: str, golds: Golds) -> float:
  """1.0 iff the normalised prediction equals some normalised gold, else 0.0."""
  pred = normalize_answer(prediction)
  return float(any(pred == normalize_answer(g) for g in _as_golds(golds)))


def token_f1(prediction: str, golds: Golds) -> float:
  """Token-bag F1 between normalised strings, maximised over the gold answers."""
  return max(_single_f1(prediction, g) for g in _as_golds(golds))


def exact_match_batch(predictions: Sequence[str],
                      golds: Sequence[Golds]) -> np.ndarray:
  """Per-example `exact_match` [n] (float64 in {0, 1})."""
  _check_same_length(predictions, golds)
  return np.array([exact_match(p, g) for p, g in zip(predictions, golds)],
                  dtype=np.float64)


def token_f1_batch(predictions: Sequence[str],
                   golds: Sequence[Golds]) -> np.ndarray:
  """Per-example `token_f1` [n] (float64 in [0, 1])."""
  _check_same_length(predictions, golds)
  return np.array([token_f1(p, g) for p, g in zip(predictions, golds)],
                  dtype=np.float64)


def _check_same_length(predictions: Sequence, golds: Sequence) -> None:
  if len(predictions) != len(golds):
    raise ValueError(
        f"{len(predictions)} predictions but {len(golds)} gold entries")


def token_exact_match(predicted_ids: np.ndarray, answer_ids: np.ndarray,
                      pad_id: int = 0) -> np.ndarray:
  """EM on token-id answers [B, A] -> [B] bool (synthetic tasks).

  An example is correct iff the prediction equals the gold answer at every
  position where the gold is not `pad_id`; positions where the gold is padding
  are ignored (the answer length is the gold's). Accepts numpy or jax arrays.
  """
  predicted_ids = np.asarray(predicted_ids)
  answer_ids = np.asarray(answer_ids)
  if predicted_ids.shape != answer_ids.shape or answer_ids.ndim != 2:
    raise ValueError(f"expected equal [B, A] shapes, got {predicted_ids.shape} "
                     f"and {answer_ids.shape}")
  match = (predicted_ids == answer_ids) | (answer_ids == pad_id)
  return match.all(axis=-1)


def teacher_forced_exact_match(logits: np.ndarray, answer_ids: np.ndarray,
                               pad_id: int = 0) -> np.ndarray:
  """EM from teacher-forced logits [B, A, V] and gold answers [B, A] -> [B] bool.

  The prediction is the per-position argmax. If every teacher-forced argmax
  equals the gold token, greedy decoding reproduces the gold answer exactly, so
  this equals EM of the greedy decode (ties are broken towards the lowest id).
  """
  return token_exact_match(np.asarray(logits).argmax(axis=-1), answer_ids,
                           pad_id)
