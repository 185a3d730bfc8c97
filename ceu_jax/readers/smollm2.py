"""SmolLM2-135M-Instruct as a `Reader`: text in, text out.

Prompts are strings (plain mode: fed as they are) or, in chat mode, a user
message / a list of (role, content) messages rendered with ChatML from the
GGUF's chat template (`readers.chat`). Decoding is the cached batched greedy
decoder of `ceu_jax.pretrained.decode` (one compile per batch size × length
bucket; a long shared prefix of a batch is computed once).

Token-level conventions (what the tests check against the uncached reference):
* a prompt is `encode(formatted prompt)`; a forced prefix is appended as
  `encode(prefix)` (or as given, when it is a token list), and the continuation
  is the greedy continuation of the concatenated ids;
* a gold answer is scored as `encode(answer_prefix + answer)` after the prompt
  (`answer_prefix` = ' ' in plain mode unless the answer starts with
  whitespace, '' in chat mode: the reply starts a line);
* `<|im_end|>` (the end-of-turn token) stops generation unless eos_stop=False;
  a stop string equal to a special token's text is treated as that token.
"""
from __future__ import annotations

from typing import Hashable, Optional, Sequence, Union

import numpy as np

from ceu_jax.pretrained import decode as D
from ceu_jax.pretrained.tokenizer import encode
from ceu_jax.readers import base
from ceu_jax.readers.chat import ChatPrompt, ChatTemplate, gguf_chat_template

EOS_TEXT = '<|im_end|>'


class SmolLM2Reader(base.Reader[ChatPrompt, Union[str, Sequence[int]]]):
  """Greedy SmolLM2 reader (see the module doc)."""

  def __init__(self, variables: dict, config, tokenizer, *, chat: bool = False,
               chat_template: Optional[ChatTemplate] = None, system: Optional[str] = None,
               settings: D.DecodeSettings = D.DecodeSettings(), eos_stop: bool = True):
    if chat and chat_template is None:
      raise ValueError('chat=True needs a chat_template (the GGUF file has none)')
    self.config = config
    self.tokenizer = tokenizer
    self.chat = chat  # ChatML formatting (else plain prompts)
    self.template = chat_template
    self.system = system  # system message (None: the template's default)
    self.eos_stop = eos_stop  # <|im_end|> ends generation
    self.eos_id = tokenizer.token_to_id(EOS_TEXT)
    self.special = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()
                    if t.special}  # special-token text -> id
    self.answer_prefix = '' if chat else ' '
    self.max_len = config.max_len  # prompt + generated tokens
    self.decoder = D.Decoder(variables, config, self.decode, settings)

  @classmethod
  def from_pretrained(cls, path: Optional[str] = None, n_layers: Optional[int] = None,
                      **kwargs) -> 'SmolLM2Reader':
    """The installed SmolLM2-135M-Instruct (see `ceu_jax.pretrained`); kwargs as __init__."""
    from ceu_jax.pretrained import load_smollm2, load_tokenizer
    config, variables = load_smollm2(path, n_layers=n_layers)
    if kwargs.get('chat') and 'chat_template' not in kwargs:
      text = gguf_chat_template(path)
      kwargs['chat_template'] = None if text is None else ChatTemplate.from_template(text)
    return cls(variables, config, load_tokenizer(path), **kwargs)

  # -- text <-> ids ----------------------------------------------------------
  def decode(self, ids: Sequence[int]) -> str:
    """Text of token ids (special tokens dropped)."""
    return self.tokenizer.decode([int(i) for i in ids])

  def format(self, prompt: ChatPrompt) -> str:
    """The text fed to the model for one prompt."""
    if self.chat:
      return self.template.render(prompt, self.system)
    if not isinstance(prompt, str):
      raise ValueError(f'plain-mode prompts must be strings, got {type(prompt).__name__} '
                       '(chat messages need chat=True)')
    return prompt

  def prompt_ids(self, prompt: ChatPrompt) -> list[int]:
    return encode(self.tokenizer, self.format(prompt))

  def _ids(self, x: Union[str, Sequence[Union[int, str]]]) -> list[int]:
    """Token ids of a string, or of a sequence of token ids and strings (each string
    tokenised in place: a forced prefix that keeps the reader's own tokens)."""
    if isinstance(x, str):
      return encode(self.tokenizer, x)
    out: list[int] = []
    for part in x:
      out.extend(encode(self.tokenizer, part) if isinstance(part, str) else [int(part)])
    return out

  def prefix_tokens(self, generation: base.Generation, n_chars: int) -> Optional[list[int]]:
    """The generation's own token ids whose decoded text is exactly text[:n_chars] (the
    first such cut), None when no token boundary falls at n_chars."""
    want = generation.text[:n_chars]
    if n_chars < 0 or len(want) != n_chars:
      return None
    toks = list(generation.tokens)
    for j in range(len(toks) + 1):
      got = self.decode(toks[:j])
      if got == want:
        return toks[:j]
      if len(got) > n_chars + 4:  # past the cut (a split multi-byte character decodes short)
        return None
    return None

  def _encode_prompts(self, prompts, ids) -> list[list[int]]:
    rows = [self.prompt_ids(p) for p in prompts]
    empty = [i for i, r in zip(ids, rows) if not r]
    if empty:
      raise ValueError(f'prompts of items {empty[:10]} encode to 0 tokens '
                       '(a prompt needs at least one token)')
    return rows

  # -- Reader ----------------------------------------------------------------
  def _generate(self, prompts, forced, budget, stops, ids):
    rows = self._encode_prompts(prompts, ids)
    if forced is not None:
      rows = [r + self._ids(f) for r, f in zip(rows, forced)]
    base.check_fit(ids, [len(r) + budget for r in rows], self.max_len,
                   f'prompt tokens + max_new_tokens={budget}')
    strings, tokens = stops
    stop_ids = set(tokens) | {self.special[s] for s in strings if s in self.special}
    strings = tuple(s for s in strings if s not in self.special)
    if self.eos_stop:
      stop_ids.add(self.eos_id)
    raw = self.decoder.generate(rows, budget, sorted(stop_ids), strings)
    return [self._generation(i, g) for i, g in zip(ids, raw)]

  def _generation(self, id_: Hashable, g: D.RawGeneration) -> base.Generation:
    if g.stop_reason == D.STOP_TOKEN:
      text, stop = self.decode(g.tokens[:-1]), g.stop
    elif g.stop_reason == D.STOP_STRING:
      text, stop = self.decode(g.tokens)[:g.text_end], g.stop
    else:
      text, stop = self.decode(g.tokens), None
    return base.Generation(id_, text, g.tokens, g.stop_reason, stop)

  def _loglik(self, prompts, answers, ids) -> np.ndarray:
    rows = self._encode_prompts(prompts, ids)
    ans = []
    for a in answers:
      if isinstance(a, str) and a and not a[:1].isspace():
        a = self.answer_prefix + a
      ans.append(self._ids(a))
    base.check_fit(ids, [len(r) + len(a) for r, a in zip(rows, ans)], self.max_len,
                   'prompt + answer tokens')
    return self.decoder.loglik(rows, ans)
