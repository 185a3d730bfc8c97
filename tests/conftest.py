"""Shared fixtures: memoised ATR-insert batches as numpy (compiled once per worker)."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator

import jax
import numpy as np
import pytest

from ceu_jax.data import atr, corruptions
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import RetrievalBatch

BATCH = 1024   # one batch size everywhere (also evalsets.CHUNK): one compile per config


def tiny_atr(**overrides) -> ATRConfig:
  """The data section of configs/atr_insert.py:tiny with η = 0.2 (plus overrides)."""
  from configs import atr_insert
  cfg = ATRConfig.from_config(atr_insert.get_config("tiny,eta=0.2").data)
  return dataclasses.replace(cfg, **overrides)


# Several (η, δ, n), both variants, answer lengths 1-3, tiny vocabularies.
ATR_CONFIGS = {
    "vfk_n128": tiny_atr(),
    "kfv_n256": ATRConfig(variant="key_for_value", context_len=256, value_len=2, eta=0.5,
                          delta=0.7, paraphrase_rate=0.3, overlap_rate=0.25,
                          n_ids=32, n_keys=32, n_values=32),
    "vfk_n96": ATRConfig(num_passages=4, context_len=96, value_len=3, eta=0.0, delta=1.0,
                         hard_negative_kinds="same_id", paraphrase_rate=0.5),
    "kfv_n48": ATRConfig(variant="key_for_value", num_passages=3, context_len=48, eta=1.0,
                         delta=0.0, hard_negative_kinds="same_key", filler_rate=0.2,
                         n_ids=2, n_keys=2, n_values=2, n_filler=2),
}


@contextlib.contextmanager
def fast_compile() -> Iterator[None]:
  """Compile with most XLA optimisations off: the data tests are compile-bound."""
  old = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture
def fast_compiled() -> Iterator[None]:
  """The test compiles with most XLA optimisations off (`fast_compile`): for compile-bound
  tests in modules where other tests are not."""
  with fast_compile():
    yield


@pytest.fixture(scope="module")
def fast_compiled_module() -> Iterator[None]:
  """Every test of the module compiles with most XLA optimisations off (`fast_compile`):
  `pytestmark = pytest.mark.usefixtures("fast_compiled_module")` in compile-bound modules."""
  with fast_compile():
    yield


def to_numpy(batch: RetrievalBatch) -> RetrievalBatch:
  return jax.tree.map(np.asarray, batch)


def concat(batches: list[RetrievalBatch]) -> RetrievalBatch:
  return jax.tree.map(lambda *xs: np.concatenate(xs), *batches)


@pytest.fixture(scope="session")
def atr_data() -> Callable[..., RetrievalBatch]:
  """make(cfg, num_examples, seed=0) -> D+ as numpy (first batches of the train stream)."""
  cache: dict = {}

  def make(cfg: ATRConfig, num_examples: int, seed: int = 0) -> RetrievalBatch:
    key = (cfg, num_examples, seed)
    if key not in cache:
      n_batches = -(-num_examples // BATCH)
      with fast_compile():
        parts = [to_numpy(atr.generate_batch(cfg, seed, i, BATCH)) for i in range(n_batches)]
      cache[key] = jax.tree.map(lambda x: x[:num_examples], concat(parts))
    return cache[key]

  return make


@pytest.fixture(scope="session")
def atr_corrupted(atr_data) -> Callable[..., RetrievalBatch]:
  """make(cfg, num_examples, name, seed=0) -> D− of `atr_data(cfg, num_examples, seed)`."""
  cache: dict = {}

  def make(cfg: ATRConfig, num_examples: int, name: str, seed: int = 0) -> RetrievalBatch:
    key = (cfg, num_examples, name, seed)
    if key not in cache:
      plus = atr_data(cfg, num_examples, seed)
      n_batches = -(-num_examples // BATCH)
      parts = []
      with fast_compile():
        for i in range(n_batches):
          chunk = jax.tree.map(lambda x: x[i * BATCH:(i + 1) * BATCH], plus)
          chunk = _pad_to(chunk, BATCH)
          out = corruptions.corrupt(cfg, chunk, name, jax.random.PRNGKey(seed + 99))
          parts.append(to_numpy(out))
      cache[key] = jax.tree.map(lambda x: x[:num_examples], concat(parts))
    return cache[key]

  return make


def _pad_to(batch: RetrievalBatch, size: int) -> RetrievalBatch:
  """Pad a short batch to `size` rows by repeating its last row (same compile)."""
  rows = batch.example_id.shape[0]
  if rows == size:
    return batch
  return jax.tree.map(lambda x: np.concatenate([x, np.repeat(x[-1:], size - rows, 0)]), batch)


# Seconds per module in a full run (2 workers on a shared, loaded 2-core machine; only the
# order matters). With `--dist loadfile` (pyproject addopts) a module runs on one worker, so
# its module fixtures are computed once; modules are sent longest first, so that no long
# module starts last while the other worker idles. Unlisted modules (seconds each) keep
# their collection order, after these.
MODULE_SECONDS = {
    "test_sharding_live.py": 200, "test_smollm2_cer_train.py": 170, "test_train_resume.py": 160,
    "test_multiprocess.py": 140, "test_ssm_closed_form.py": 140, "test_sharded_audit.py": 135,
    "test_decode.py": 130, "test_mediator_job.py": 125, "test_architectures.py": 105,
    "test_smollm2_cer.py": 95, "test_losses_cer.py": 95, "test_grid_e2e.py": 90,
    "test_audit_job.py": 90, "test_pretrained.py": 90, "test_bounds.py": 80,
    "test_answer_presence_job.py": 80, "test_engine_api.py": 70, "test_train_sharding.py": 70,
    "test_audit_bench.py": 70, "test_factqa_train.py": 65, "test_architectures_training.py": 60,
    "test_trace_job.py": 60, "test_train_provenance.py": 60, "test_trace_text.py": 55, "test_trace_identity.py": 120,
    "test_architectures_shared.py": 50, "test_engine_ports.py": 45, "test_readers.py": 40,
    "test_memory_blocked.py": 35, "test_chain_task.py": 30, "test_scale_bench.py": 25,
    "test_corruptions_surface.py": 20, "test_corruptions_properties.py": 20,
    "test_engine_chunk_bench.py": 20, "test_grid_hosts.py": 20, "test_engine_identities.py": 20,
    "test_factqa.py": 20, "test_answer_presence_atr.py": 20, "test_atr_stream.py": 15,
    "test_pretrained_audit.py": 15, "test_atr_prior.py": 15, "test_atr_properties.py": 15,
    "test_cli_configs.py": 15, "test_engine_grad.py": 10, "test_grid_driver.py": 10, "test_accelerator_check.py": 90, "test_bad_input.py": 60, "test_reader_eval_job.py": 30, "test_jobs.py": 15,
}


def pytest_collection_modifyitems(session, config, items):
  """Longest modules first (stable: the order within a module is kept)."""
  del session, config
  items.sort(key=lambda item: -MODULE_SECONDS.get(item.nodeid.split("::")[0].split("/")[-1], 0))
