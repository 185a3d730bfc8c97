"""ATR-insert task configuration (SPEC §3), validated before anything compiles.

`ATRConfig` is a frozen, hashable dataclass so that it can be a static argument
of jitted generators. `ATRLayout` holds the static token layout derived from it
(numpy index maps from context positions to line slots and offsets).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from ceu_jax.data.validation import check_int, check_unit, from_mapping
from ceu_jax.data.vocab import Vocab

VARIANTS = ("value_for_key", "key_for_value")
HARD_NEGATIVE_KINDS = ("both", "same_key", "same_id")


@dataclasses.dataclass(frozen=True)
class ATRConfig:
  """Knobs of the ATR-insert generator. Every field is validated on creation."""
  variant: str = "value_for_key"   # query asks VALUE of (ID, KEY), or KEY of (ID, VALUE)
  num_passages: int = 8            # m: passages in the retrieved bundle
  context_len: int = 128           # n: total context tokens (m passages x n/m tokens)
  value_len: int = 1               # value tokens per binding (the answer for value_for_key)
  eta: float = 0.0                 # η: miss probability (evidence replaced by a same-format line)
  delta: float = 0.3               # δ: probability that a non-evidence line is a hard negative
  rho: float = 0.0                 # ρ: share of (ID, KEY) pairs whose value is fixed (prior)
  overlap_rate: float = 0.0        # share of filler lines that mention the query's ID and KEY
  filler_rate: float = 0.5         # share of plain non-evidence lines in filler (non-evidence) format
  paraphrase_rate: float = 0.0     # share of evidence-format lines rendered in the paraphrase format
  hard_negative_kinds: str = "both"  # which hard negatives: same_key, same_id or both
  n_ids: int = 64                  # ID vocabulary size
  n_keys: int = 64                 # KEY vocabulary size
  n_values: int = 64               # VALUE vocabulary size
  n_filler: int = 64               # filler-word vocabulary size
  world_seed: int = 0              # fixes the ρ prior table (shared by train and eval)

  def __post_init__(self):
    if self.variant not in VARIANTS:
      raise ValueError(f"data.variant must be one of {VARIANTS}, got {self.variant!r}")
    if self.hard_negative_kinds not in HARD_NEGATIVE_KINDS:
      raise ValueError(f"data.hard_negative_kinds must be one of {HARD_NEGATIVE_KINDS}, "
                       f"got {self.hard_negative_kinds!r}")
    for name in ("eta", "delta", "rho", "overlap_rate", "filler_rate", "paraphrase_rate"):
      check_unit(name, getattr(self, name))
    if self.variant == "key_for_value" and self.rho > 0:
      raise ValueError(f"data.rho must be 0 with data.variant 'key_for_value', got "
                       f"{self.rho}: the prior fixes the VALUE of an (ID, KEY) pair, which "
                       "a key_for_value query does not ask (its lines would break the prior)")
    check_int("value_len", self.value_len, 1, 8)
    check_int("num_passages", self.num_passages, 1)
    for name in ("n_ids", "n_keys", "n_values", "n_filler"):
      check_int(name, getattr(self, name), 2)
    check_int("world_seed", self.world_seed, 0)
    check_int("context_len", self.context_len, 1)
    need = self.num_passages * (1 + self.line_len)
    if self.context_len % self.num_passages or self.context_len < need:
      raise ValueError(
          f"data.context_len must be a multiple of data.num_passages "
          f"(= {self.num_passages}) and >= num_passages * (1 + line_len) = {need} "
          f"(line_len = {self.line_len} for value_len = {self.value_len}), "
          f"got {self.context_len}")

  @classmethod
  def from_config(cls, cfg: Mapping[str, Any]) -> "ATRConfig":
    """Build from an ml_collections ConfigDict / mapping; unknown fields are errors."""
    if "answer_len" in (cfg.keys() if hasattr(cfg, "keys") else cfg):
      raise ValueError("data.answer_len is not a field of ATR-insert: value tokens per binding "
                       "are data.value_len (the answer length A follows from it and "
                       "data.variant)")
    return from_mapping(cls, cfg)

  # Derived static quantities.
  @property
  def line_len(self) -> int:
    """Tokens per line: 'ID #i KEY k_j VALUE v.. .' = 6 + value_len."""
    return 6 + self.value_len

  @property
  def passage_len(self) -> int:
    return self.context_len // self.num_passages

  @property
  def lines_per_passage(self) -> int:
    return (self.passage_len - 1) // self.line_len

  @property
  def num_lines(self) -> int:
    return self.num_passages * self.lines_per_passage

  @property
  def query_len(self) -> int:
    return 6 if self.variant == "value_for_key" else 5 + self.value_len

  @property
  def answer_len(self) -> int:
    """A: length of the gold answer y* (the model's answer length)."""
    return self.value_len if self.variant == "value_for_key" else 1

  @property
  def vocab(self) -> Vocab:
    return Vocab(n_filler=self.n_filler, n_ids=self.n_ids, n_keys=self.n_keys,
                 n_values=self.n_values)


@dataclasses.dataclass(frozen=True)
class ATRLayout:
  """Static map from context positions to (passage, line slot, offset)."""
  line_of_pos: np.ndarray     # [N] int32, line slot or -1
  offset_of_pos: np.ndarray   # [N] int32, offset within the line (0 outside lines)
  passage_of_pos: np.ndarray  # [N] int32
  passage_start: np.ndarray   # [N] bool
  passage_of_line: np.ndarray  # [L] int32

  @classmethod
  def build(cls, cfg: ATRConfig) -> "ATRLayout":
    pos = np.arange(cfg.context_len)
    passage = pos // cfg.passage_len
    within = pos % cfg.passage_len - 1           # -1 is the passage marker [P]
    slot = within // cfg.line_len
    in_line = (within >= 0) & (slot < cfg.lines_per_passage)
    line = np.where(in_line, passage * cfg.lines_per_passage + slot, -1)
    offset = np.where(in_line, within % cfg.line_len, 0)
    lines = np.arange(cfg.num_lines)
    return cls(line_of_pos=line.astype(np.int32), offset_of_pos=offset.astype(np.int32),
               passage_of_pos=passage.astype(np.int32),
               passage_start=(pos % cfg.passage_len == 0),
               passage_of_line=(lines // cfg.lines_per_passage).astype(np.int32))
