"""Factual-QA task configuration, validated on creation (field names follow ATRConfig)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from ceu_jax.data.validation import check_int, check_unit, from_mapping

SOURCES = ("squad", "nq")
NQ_SWAPS = ("dataset", "equal_length")
SPLITS = {"train": 0, "eval": 1, "test": 2}          # stream split -> code
PREPARED_SPLIT = {"train": "train", "eval": "validation", "test": "test"}
ID_STRIDE = 1 << 20   # example_id = SPLITS[split] * ID_STRIDE + index of the example in its split


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
    check_unit("eta", self.eta)
    check_unit("delta", self.delta)
    check_int("num_passages", self.num_passages, 1, 256)
    check_int("query_len", self.query_len, 4, 512)
    check_int("answer_len", self.answer_len, 1, 64)
    check_int("lines_per_passage", self.lines_per_passage, 1, 64)
    check_int("context_len", self.context_len, 1)
    if self.context_len % self.num_passages or self.passage_len < 16:
      raise ValueError(
          f"data.context_len must be a multiple of data.num_passages (= {self.num_passages}) "
          f"with at least 16 tokens per passage (>= {16 * self.num_passages}), "
          f"got {self.context_len}")

  @classmethod
  def from_config(cls, cfg: Mapping[str, Any]) -> "FactQAConfig":
    """Build from an ml_collections ConfigDict / mapping; unknown fields are errors."""
    return from_mapping(cls, cfg)

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
  def vocab(self):
    """The shipped tokenizer (has .size, .pad, .encode, .decode), like ATRConfig.vocab."""
    from ceu_jax.data.factqa import tokenizer  # pylint: disable=import-outside-toplevel
    return tokenizer.shipped_tokenizer()
