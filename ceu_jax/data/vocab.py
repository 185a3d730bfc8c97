"""Vocabulary of the synthetic retrieval tasks: named specials, sentinels, detokenizer.

Layout (token ids, in order): the fixed specials and format words of `SPECIALS`,
then `n_filler` filler words `w_0..`, `n_ids` ids `#0..`, `n_keys` keys `k_0..`,
`n_values` values `v_0..`. The layout is a pure function of the four sizes, so a
`Vocab` is cheap to rebuild anywhere (no files).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

# Fixed tokens. The first block are structural specials; then the words of the
# line formats; then the tokens used by the five answer-presence sentinels.
SPECIALS: tuple[str, ...] = (
    "[PAD]", "[BOS]", "[EOS]", "[P]", "[FILL]",
    "ID", "KEY", "VALUE", "OF", "IS", "NOTE", ".", "?",
    "[MASK]", "[REMOVED]", "content", "was", "removed", "something", "@@@",
)

# The five sentinels of the answer-presence audit (SPEC §8), as token strings.
SENTINELS: dict[str, tuple[str, ...]] = {
    "mask": ("[MASK]",),
    "removed": ("[REMOVED]",),
    "deletion_phrase": ("content", "was", "removed"),
    "generic_word": ("something",),
    "symbol": ("@@@",),
}


@dataclasses.dataclass(frozen=True)
class Vocab:
  """Token ids of the ATR-insert vocabulary."""
  n_filler: int = 64   # filler words w_i used by non-evidence lines
  n_ids: int = 64      # entity ids #i
  n_keys: int = 64     # keys k_i
  n_values: int = 64   # values v_i

  def __post_init__(self):
    for name in ("n_filler", "n_ids", "n_keys", "n_values"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 2:
        raise ValueError(f"vocab.{name} must be an integer >= 2, got {value!r}")

  # Offsets of each block.
  @property
  def filler_base(self) -> int:
    return len(SPECIALS)

  @property
  def id_base(self) -> int:
    return self.filler_base + self.n_filler

  @property
  def key_base(self) -> int:
    return self.id_base + self.n_ids

  @property
  def value_base(self) -> int:
    return self.key_base + self.n_keys

  @property
  def size(self) -> int:
    return self.value_base + self.n_values

  def tok(self, name: str) -> int:
    """Id of a named special / format token, e.g. vocab.tok('ID')."""
    try:
      return SPECIALS.index(name)
    except ValueError:
      raise KeyError(f"unknown special token {name!r}; known: {SPECIALS}") from None

  @property
  def pad(self) -> int:
    return 0

  def sentinel(self, name: str) -> tuple[int, ...]:
    """Token ids of one of the five sentinels (keys of SENTINELS)."""
    if name not in SENTINELS:
      raise KeyError(f"unknown sentinel {name!r}; known: {sorted(SENTINELS)}")
    return tuple(self.tok(t) for t in SENTINELS[name])

  def token_strings(self) -> list[str]:
    return (list(SPECIALS)
            + [f"w_{i}" for i in range(self.n_filler)]
            + [f"#{i}" for i in range(self.n_ids)]
            + [f"k_{i}" for i in range(self.n_keys)]
            + [f"v_{i}" for i in range(self.n_values)])

  def encode(self, text: str | Sequence[str]) -> list[int]:
    """Whitespace tokenizer (inverse of `decode`) for tests and the CLI."""
    words = text.split() if isinstance(text, str) else list(text)
    index = {s: i for i, s in enumerate(self.token_strings())}
    try:
      return [index[w] for w in words]
    except KeyError as e:
      raise KeyError(f"token {e.args[0]!r} is not in the vocabulary") from None

  def decode(self, ids: Iterable[int], skip_pad: bool = True) -> str:
    strings = self.token_strings()
    out = []
    for i in np.asarray(list(ids)).reshape(-1).tolist():
      if skip_pad and i == self.pad:
        continue
      out.append(strings[i] if 0 <= i < len(strings) else f"<{i}>")
    return " ".join(out)
