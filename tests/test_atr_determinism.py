"""Determinism: batch i of seed s is identical in separate processes; different
seeds (and indices, splits) give different batches."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from ceu_jax.data import atr
from ceu_jax.data.types import RetrievalBatch
from tests.conftest import ATR_CONFIGS, BATCH, fast_compile

ROOT = Path(__file__).resolve().parents[1]
SEED, INDEX = 7, 3

_CHILD = """
from ceu_jax.data import atr
from tests.conftest import ATR_CONFIGS, BATCH
from tests.test_atr_determinism import digest
print(digest(atr.generate_batch(ATR_CONFIGS["vfk_n128"], {seed}, {index}, BATCH)))
"""


def digest(batch: RetrievalBatch) -> str:
  h = hashlib.sha256()
  for name in sorted(batch.__dataclass_fields__):
    h.update(name.encode())
    h.update(np.ascontiguousarray(np.asarray(getattr(batch, name))).tobytes())
  return h.hexdigest()


def test_same_batch_in_two_processes():
  """A fresh interpreter and this process produce the same bytes for batch INDEX
  of seed SEED (both with XLA optimisations off, as the tests compile)."""
  code = _CHILD.format(seed=SEED, index=INDEX)
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
             JAX_DISABLE_MOST_OPTIMIZATIONS="1")
  child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, text=True, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  with fast_compile():
    here = digest(atr.generate_batch(ATR_CONFIGS["vfk_n128"], SEED, INDEX, BATCH))
  out, err = child.communicate(timeout=300)
  assert child.returncode == 0, err[-2000:]
  assert out.strip().splitlines()[-1] == here


def test_different_seeds_indices_splits_differ(atr_data):
  cfg = ATR_CONFIGS["vfk_n128"]
  with fast_compile():
    base = atr.generate_batch(cfg, 0, 0, BATCH)
    again = atr.generate_batch(cfg, 0, 0, BATCH)
    other_seed = atr.generate_batch(cfg, 1, 0, BATCH)
    other_index = atr.generate_batch(cfg, 0, 1, BATCH)
  assert digest(base) == digest(again)
  for other in (other_seed, other_index):
    same_rows = (np.asarray(other.context) == np.asarray(base.context)).all(1)
    assert same_rows.mean() < 0.01
    assert not np.array_equal(np.asarray(other.query), np.asarray(base.query))
  # Batch 1 of the stream is the second block of the fixture's examples.
  np.testing.assert_array_equal(np.asarray(other_index.context),
                                atr_data(cfg, 2 * BATCH).context[BATCH:])
  assert jax.tree.structure(base) == jax.tree.structure(other_seed)
