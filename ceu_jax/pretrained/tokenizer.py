"""SmolLM2 tokenizer rebuilt from the GGUF file, prompt format, batch encoding.

The GGUF file stores the byte-level BPE vocabulary (`tokenizer.ggml.tokens`),
the merges (`tokenizer.ggml.merges`, "a b" strings) and the token types (3 =
control/special). SmolLM's pre-tokenizer splits digits individually, then
applies the GPT-2 byte-level regex (no prefix space, no BOS).

Batches are *left*-padded so that the answer tokens of every row end at the
last position (what the fast causal patcher expects).

Shape legend: B batch, T padded sequence length.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import numpy as np

from ceu_jax.pretrained.gguf_loader import (INSTALL_HINT, PretrainedModelError,
                                            open_gguf)

PAD_ID = 2  # tokenizer.ggml.padding_token_id (<|im_end|>); pads are masked anyway


def _require_tokenizers():
  try:
    import tokenizers
  except ImportError as e:
    raise PretrainedModelError(
        f'the `tokenizers` package is required ({e}). Install with: {INSTALL_HINT}') from e
  return tokenizers


def tokenizer_from_gguf(reader) -> 'tokenizers.Tokenizer':  # noqa: F821
  """A `tokenizers.Tokenizer` from the vocab and merges of a GGUF reader."""
  tk = _require_tokenizers()
  from tokenizers import decoders, models, pre_tokenizers
  f = reader.fields
  if f.get('tokenizer.ggml.model') is None or f['tokenizer.ggml.model'].contents() != 'gpt2':
    raise PretrainedModelError('GGUF file has no byte-level BPE (gpt2) tokenizer')
  tokens = f['tokenizer.ggml.tokens'].contents()
  merges = [tuple(m.split(' ', 1)) for m in f['tokenizer.ggml.merges'].contents()]
  types = f['tokenizer.ggml.token_type'].contents()
  vocab = {t: i for i, t in enumerate(tokens)}
  tok = tk.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                byte_fallback=False))
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
  ])
  tok.decoder = decoders.ByteLevel()
  special = [t for t, ty in zip(tokens, types) if ty == 3]
  tok.add_special_tokens([tk.AddedToken(s, special=True, normalized=False) for s in special])
  return tok


@functools.lru_cache(maxsize=2)
def load_tokenizer(path: Optional[str] = None) -> 'tokenizers.Tokenizer':  # noqa: F821
  """The SmolLM2 tokenizer of the (default) GGUF file (cached)."""
  return tokenizer_from_gguf(open_gguf(path))


def format_prompt(context: str, question: str) -> str:
  """`Context: … Question: …? Answer:` (the answer is scored after this)."""
  q = question.strip().rstrip('?').rstrip()
  return f'Context: {context.strip()}\nQuestion: {q}?\nAnswer:'


def encode(tokenizer, text: str) -> list[int]:
  """Token ids of `text` (no BOS/EOS is added)."""
  return tokenizer.encode(text, add_special_tokens=False).ids


@dataclasses.dataclass
class EncodedBatch:
  """Left-padded prompt + answer batch (numpy)."""
  tokens: np.ndarray  # [B, T] int32, PAD_ID at pads
  valid: np.ndarray  # [B, T] bool, False at pads
  answer_mask: np.ndarray  # [B, T] bool, True at answer tokens (scored)
  prompt_len: np.ndarray  # [B] int32, unpadded prompt lengths
  answer_len: np.ndarray  # [B] int32, answer lengths in tokens

  @property
  def n_tail(self) -> int:
    """Positions whose logits score the answers: the max answer length.

    The model reads `inputs` (tokens[:, :-1]); its last n_tail positions
    predict the answer tokens.
    """
    return max(int(self.answer_len.max()), 1)

  @property
  def inputs(self) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, valid) [B, T - 1] fed to the model when scoring the answer."""
    return self.tokens[:, :-1], self.valid[:, :-1]


def encode_batch(tokenizer, prompts: Sequence[str],
                 answers: Optional[Sequence[str]] = None,
                 max_len: Optional[int] = None, pad_to: Optional[int] = None,
                 answer_prefix: str = ' ') -> EncodedBatch:
  """Tokenize prompt+answer pairs, left-padded to one length.

  The answer is tokenized on its own (prefixed with `answer_prefix` unless it
  already starts with whitespace) and appended to the prompt tokens, so the
  scored tokens are exactly the answer's. Raises ValueError when a row is
  longer than `max_len` (e.g. `config.max_len`).
  """
  answers = [''] * len(prompts) if answers is None else list(answers)
  if len(answers) != len(prompts):
    raise ValueError(f'{len(prompts)} prompts but {len(answers)} answers')
  rows, plen, alen = [], [], []
  for p, a in zip(prompts, answers):
    pi = encode(tokenizer, p)
    if a and not a[:1].isspace():
      a = answer_prefix + a
    ai = encode(tokenizer, a) if a else []
    rows.append(pi + ai), plen.append(len(pi)), alen.append(len(ai))
  t = max(len(r) for r in rows)
  if max_len is not None and t > max_len:
    raise ValueError(f'input of {t} tokens exceeds the maximum length {max_len}')
  if pad_to is not None:
    if pad_to < t:
      raise ValueError(f'pad_to={pad_to} is shorter than the longest row ({t} tokens)')
    t = pad_to
  b = len(rows)
  tokens = np.full((b, t), PAD_ID, np.int32)
  valid = np.zeros((b, t), bool)
  answer_mask = np.zeros((b, t), bool)
  for i, r in enumerate(rows):
    tokens[i, t - len(r):] = r
    valid[i, t - len(r):] = True
    if alen[i]:
      answer_mask[i, t - alen[i]:] = True
  return EncodedBatch(tokens, valid, answer_mask, np.asarray(plen, np.int32),
                      np.asarray(alen, np.int32))


def char_span_mask(tokenizer, prompts: Sequence[str],
                   char_spans: Sequence[Sequence[tuple[int, int]]],
                   batch: EncodedBatch) -> np.ndarray:
  """[B, T] bool: the tokens of `batch` overlapping the character ranges.

  prompts are the strings `batch` was built from; char_spans[i] lists
  (start, end) ranges in prompts[i] (e.g. the evidence sentence). Handles the
  left padding of `encode_batch`.
  """
  out = np.zeros(batch.valid.shape, bool)
  t = out.shape[1]
  for i, (p, ranges) in enumerate(zip(prompts, char_spans)):
    enc = tokenizer.encode(p, add_special_tokens=False)
    off = t - int(batch.valid[i].sum())  # first real position
    for j, (a, b) in enumerate(enc.offsets):
      if any(a < e and b > s for s, e in ranges):
        out[i, off + j] = True
  return out
