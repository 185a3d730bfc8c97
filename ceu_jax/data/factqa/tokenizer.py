"""The factual-QA subword tokenizer: a small BPE trained on the prepared corpus.

Ids 0..len(SPECIAL_TOKENS)-1 are the specials below ([PAD] = 0 as everywhere in
ceu-jax). Text is NFKC-normalised and pre-split on whitespace and punctuation, so a
clause tokenised piece by piece (prefix | answer | suffix) keeps word boundaries.
"""
from __future__ import annotations

import functools
import pathlib
from typing import Iterable, Sequence

from ceu_jax.data.factqa import storage

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[BOS]", "[EOS]", "[P]", "[FILL]", "[UNK]",
                                   "[MASK]", "[REMOVED]", "[SEP]")
VOCAB_SIZE = 8000
ALPHABET_SIZE = 300
PAD, BOS, EOS, PSEP = 0, 1, 2, 3


def _import_tokenizers():
  try:
    import tokenizers  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ImportError("factqa needs the `tokenizers` package: "
                      "pip install 'ceu-jax[factqa]' (or pip install tokenizers)") from None
  return tokenizers


def train(lines: Iterable[str], vocab_size: int = VOCAB_SIZE):
  """Train the BPE tokenizer on `lines` (deterministic for a fixed input order)."""
  tk = _import_tokenizers()
  tok = tk.Tokenizer(tk.models.BPE(unk_token="[UNK]"))
  tok.normalizer = tk.normalizers.NFKC()
  tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
  lines = list(lines)
  alphabet = _alphabet(lines, tok.normalizer)
  trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                   special_tokens=list(SPECIAL_TOKENS),
                                   initial_alphabet=alphabet, limit_alphabet=len(alphabet),
                                   show_progress=False)
  tok.train_from_iterator(lines, trainer=trainer)
  return tok


def _alphabet(lines: list[str], normalizer, size: int = ALPHABET_SIZE) -> list[str]:
  """The `size` most frequent non-space characters (ties by code point): a fixed alphabet,
  since the trainer's own `limit_alphabet` breaks frequency ties arbitrarily."""
  counts: dict[str, int] = {}
  for line in lines:
    for ch in normalizer.normalize_str(line):
      if not ch.isspace():
        counts[ch] = counts.get(ch, 0) + 1
  ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
  return [ch for ch, _ in ranked[:size]]


class FactTokenizer:
  """Encode / decode with the shipped tokenizer (`shipped/tokenizer.json.gz`)."""

  def __init__(self, json_text: str):
    tk = _import_tokenizers()
    self._tok = tk.Tokenizer.from_str(json_text)
    self.vocab_size = self._tok.get_vocab_size()
    for i, name in enumerate(SPECIAL_TOKENS):
      if self._tok.token_to_id(name) != i:
        raise ValueError(f"tokenizer special {name!r} is not id {i}")

  @classmethod
  def from_dir(cls, root: pathlib.Path = storage.SHIPPED_DIR) -> "FactTokenizer":
    return cls(storage.read_gz_text(root / storage.TOKENIZER_FILE))

  @property
  def size(self) -> int:
    """Vocabulary size (the model's embedding rows)."""
    return self.vocab_size

  @property
  def pad(self) -> int:
    return PAD

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids if text else []

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def n_tokens(self, text: str) -> int:
    return len(self.encode(text))

  def decode(self, ids: Iterable[int], skip_pad: bool = True) -> str:
    ids = [int(i) for i in ids if not (skip_pad and int(i) == PAD)]
    return " ".join(self._tok.id_to_token(i) or f"<{i}>" for i in ids)


@functools.lru_cache(maxsize=4)
def shipped_tokenizer(root: str = str(storage.SHIPPED_DIR)) -> FactTokenizer:
  return FactTokenizer.from_dir(pathlib.Path(root))
