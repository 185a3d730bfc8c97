"""Retrieval models with a named read port: attention, ssm and memory_port families.

Public API (docs/conventions.md §2-§4):
  build_model(model_cfg, *, vocab_size, context_len, num_passages, query_len, answer_len)
  read_port_sites(model_cfg) -> [engine.Site]; read_port_site(model_cfg) -> THE port f
  FAMILIES, PRESETS, SCAN_IMPLS (the ssm's `scan_impl` choices),
  span_decomposition(family), port_mask(spec, ports),
  count_params(model), init_params(model, rng), describe(config) -> str
  ContextMemory: what every family's context encoder hands its read port(s)

`build_model` is the one way to build a model: the modules (architectures/model.py,
the shared prologue.py and port.py, one file per family) are not exported.
"""
from architectures.api import (build_model, count_params, dummy_inputs, init_params,
                               param_table, port_mask, read_port_site, read_port_sites,
                               reference_param_count, span_decomposition)
from architectures.describe import describe, describe_rows
from architectures.port import ContextMemory
from architectures.spec import (FAMILIES, PRESETS, RETRIEVAL_LAYERS, SCAN_IMPLS, ArchSpec,
                                make_spec, validate_model_config)

__all__ = [
    "FAMILIES", "PRESETS", "RETRIEVAL_LAYERS", "SCAN_IMPLS", "ArchSpec", "ContextMemory", "build_model",
    "count_params", "describe", "describe_rows", "dummy_inputs", "init_params", "make_spec",
    "param_table", "port_mask", "read_port_site", "read_port_sites", "reference_param_count",
    "span_decomposition", "validate_model_config",
]
