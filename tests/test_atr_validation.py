"""Bad input raises ValueError naming the field and its allowed range, before any
jitted function is traced or compiled (checked with the jit cache sizes and a
trace counter on the per-example generator)."""
from __future__ import annotations

import math

import ml_collections
import numpy as np
import pytest

from ceu_jax.data import atr, corruptions
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import RetrievalBatch
from tests.conftest import tiny_atr


@pytest.fixture
def no_compile(monkeypatch):
  """Asserts, after the test body, that nothing was traced or compiled."""
  traces = []
  original = atr._example
  monkeypatch.setattr(atr, "_example", lambda *a: traces.append(1) or original(*a))
  before = (atr._generate._cache_size(), corruptions._corrupt._cache_size())
  yield
  assert not traces
  assert (atr._generate._cache_size(), corruptions._corrupt._cache_size()) == before


BAD_FIELDS = [
    ("eta", -0.1, r"data\.eta must be in \[0, 1\]"),
    ("eta", 1.5, r"data\.eta must be in \[0, 1\]"),
    ("eta", math.nan, r"data\.eta must be in \[0, 1\]"),
    ("delta", -0.01, r"data\.delta must be in \[0, 1\]"),
    ("delta", 1.01, r"data\.delta must be in \[0, 1\]"),
    ("rho", 2.0, r"data\.rho must be in \[0, 1\]"),
    ("value_len", 0, r"data\.value_len must be an integer \[1, 8\]"),
    ("context_len", 32, r"data\.context_len must be a multiple of data\.num_passages "
                        r"\(= 8\) and >= .* = 64"),
    ("context_len", 130, r"data\.context_len must be a multiple"),
    ("variant", "value", r"data\.variant must be one of"),
]


@pytest.mark.parametrize("field, value, message", BAD_FIELDS)
def test_bad_config_field(field, value, message, no_compile):
  with pytest.raises(ValueError, match=message):
    ATRConfig(**{field: value})


def test_answer_len_is_derived_and_the_old_field_name_is_explained():
  assert ATRConfig(value_len=3).answer_len == 3
  assert ATRConfig(value_len=3, variant="key_for_value").answer_len == 1
  with pytest.raises(ValueError, match=r"data\.answer_len .* data\.value_len"):
    ATRConfig.from_config({"task": "atr_insert", "answer_len": 2})


@pytest.mark.parametrize("field, value, message", BAD_FIELDS[:3] + BAD_FIELDS[6:8])
def test_bad_config_from_experiment_config(field, value, message, no_compile):
  """The same checks through ATRConfig.from_config on a config section."""
  from configs import atr_insert
  data = atr_insert.get_config("tiny").data
  data[field] = value
  with pytest.raises(ValueError, match=message):
    ATRConfig.from_config(data)


def test_unknown_config_field(no_compile):
  with pytest.raises(ValueError, match=r"unknown field\(s\) \['etta'\]"):
    ATRConfig.from_config(ml_collections.ConfigDict({"etta": 0.1}))


def _zero_batch(cfg: ATRConfig, size: int = 4) -> RetrievalBatch:
  shapes = dict(query=(cfg.query_len,), context=(cfg.context_len,),
                passage_ids=(cfg.context_len,), answer=(cfg.answer_len,), has_evidence=(),
                line_kind=(cfg.num_lines,), example_id=())
  fields = {}
  for name in RetrievalBatch.__dataclass_fields__:
    shape = shapes.get(name, (cfg.context_len,))
    dtype = bool if name.endswith("mask") or name in ("has_evidence", "passage_start") \
        else np.int32
    fields[name] = np.zeros((size,) + shape, dtype)
  return RetrievalBatch(**fields)


def test_unknown_corruption(no_compile):
  cfg = tiny_atr()
  with pytest.raises(ValueError, match=r"corruption must be one of \('value_swap'"):
    corruptions.corrupt(cfg, _zero_batch(cfg), "value_shuffle", np.zeros(2, np.uint32))


@pytest.mark.parametrize("delta", [-0.5, 1.5])
def test_bad_injection_strength(delta, no_compile):
  cfg = tiny_atr()
  with pytest.raises(ValueError, match=r"delta must be in \[0, 1\]"):
    corruptions.corrupt(cfg, _zero_batch(cfg), "distractor_injection",
                        np.zeros(2, np.uint32), delta=delta)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), r"batch_size must be an integer >= 1"),
    (dict(split="valid"), r"split must be one of"),
    (dict(seed=-1), r"seed and index must be >= 0"),
])
def test_bad_generate_arguments(kwargs, message, no_compile):
  args = dict(seed=0, index=0, batch_size=4, split="train") | kwargs
  with pytest.raises(ValueError, match=message):
    atr.generate_batch(tiny_atr(), **args)
