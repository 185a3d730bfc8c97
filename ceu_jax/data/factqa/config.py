"""Factual-QA task configuration, validated on creation (field names follow ATRConfig)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

SOURCES = ("squad", "nq")
NQ_SWAPS = ("dataset", "equal_length")
SPLITS = {"train": 0, "eval": 1, "test": 2}          # stream split -> code
PREPARED_SPLIT = {"train": "train", "eval": "validation", "test": "test"}
ID_STRIDE = 1 << 20   # example_id = SPLITS[split] * ID_STRIDE + index of the example in its split


def _check_unit(name: str, value: Any) -> None:
  if (not isinstance(value, (int, float, np.floating)) or isinstance(value, bool)
      or not 0.0 <= value <= 1.0):
    raise ValueError(f"data.{name} must be in [0, 1], got {value!r}")


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
  if (not isinstance(value, (int, np.integer)) or isinstance(value, bool)
      or value < lo or (hi is not None and value > hi)):
    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    raise ValueError(f"data.{name} must be an integer {rng}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class FactQAConfig:
  """Knobs of the factual-QA stream. Every field is validated on creation."""
  num_passages: int = 8            # m: passages in the retrieved bundle
  context_len: int = 512           # n: total context tokens (m passages x n/m tokens)
  query_len: int = 32              # Q: [BOS] + question tokens (longer questions are skipped)
  answer_len: int = 8              # A: answer tokens, PAD-padded (longer answers are skipped)
  lines_per_passage: int = 4       # sentence slots per passage (L = m x lines_per_passage)
  eta: float = 0.0                 # η: miss probability (evidence line left out of its passage)
  delta: float = 0.3               # δ: probability that a non-evidence passage holds distractors
  sources: tuple[str, ...] = SOURCES  # which prepared sources to use (squad, nq)
  counterfactual: bool = False     # invented-name slice: answers replaced by invented names
  nq_swap: str = "dataset"         # NQ entity swap: the dataset's own entity ('dataset', the
                                   # mention slot is padded when lengths differ) or a same-type
                                   # entity of equal token length ('equal_length')

  def __post_init__(self):
    object.__setattr__(self, "sources", tuple(self.sources))
    bad = [s for s in self.sources if s not in SOURCES]
    if not self.sources or bad:
      raise ValueError(f"data.sources must be a non-empty subset of {SOURCES}, "
                       f"got {self.sources!r}")
    if not isinstance(self.counterfactual, (bool, np.bool_)):
      raise ValueError(f"data.counterfactual must be a bool, got {self.counterfactual!r}")
    if self.nq_swap not in NQ_SWAPS:
      raise ValueError(f"data.nq_swap must be one of {NQ_SWAPS}, got {self.nq_swap!r}")
    _check_unit("eta", self.eta)
    _check_unit("delta", self.delta)
    _check_int("num_passages", self.num_passages, 1, 256)
    _check_int("query_len", self.query_len, 4, 512)
    _check_int("answer_len", self.answer_len, 1, 64)
    _check_int("lines_per_passage", self.lines_per_passage, 1, 64)
    _check_int("context_len", self.context_len, 1)
    if self.context_len % self.num_passages or self.passage_len < 16:
      raise ValueError(
          f"data.context_len must be a multiple of data.num_passages (= {self.num_passages}) "
          f"with at least 16 tokens per passage (>= {16 * self.num_passages}), "
          f"got {self.context_len}")

  @classmethod
  def from_config(cls, cfg: Mapping[str, Any]) -> "FactQAConfig":
    """Build from an ml_collections ConfigDict / mapping; unknown fields are errors."""
    items = dict(cfg.items()) if hasattr(cfg, "items") else dict(cfg)
    items.pop("task", None)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(items) - known)
    if unknown:
      raise ValueError(f"data: unknown field(s) {unknown}; known fields: {sorted(known)}")
    return cls(**items)

  @property
  def passage_len(self) -> int:
    return self.context_len // self.num_passages

  @property
  def num_lines(self) -> int:
    return self.num_passages * self.lines_per_passage

  @property
  def max_line_len(self) -> int:
    """Longest line that fits a passage (after its [P] marker)."""
    return self.passage_len - 1

  @property
  def target_len(self) -> int:
    """Length of the gold answer y* (as ATRConfig.target_len)."""
    return self.answer_len

  @property
  def vocab(self):
    """The shipped tokenizer (has .size, .pad, .encode, .decode), like ATRConfig.vocab."""
    from ceu_jax.data.factqa import tokenizer  # pylint: disable=import-outside-toplevel
    return tokenizer.shipped_tokenizer()
