"""The control probe (SPEC §1: a random non-evidence span of the evidence's length,
expected ≈ 0) never lies on tokens the corruption changed, for every corruption; where
the corruption changes only evidence tokens (value swap, the grid's D−) it is the span
the lines alone give (the main job's recorded controls stay as they were)."""
import jax
import numpy as np
import pytest

from ceu_jax import retrieval_adapter as adapter
from ceu_jax.data import corruptions
from tests.conftest import ATR_CONFIGS, fast_compile

N = 256


@pytest.mark.parametrize("name", corruptions.CORRUPTIONS)
@pytest.mark.parametrize("cfg_name", ["vfk_n128", "kfv_n256"])
def test_control_span_avoids_changed_tokens(atr_data, atr_corrupted, cfg_name, name):
  cfg = ATR_CONFIGS[cfg_name]
  clean = jax.tree.map(np.asarray, atr_data(cfg, N))
  corrupt = jax.tree.map(np.asarray, atr_corrupted(cfg, N, name))
  keys = adapter.example_keys(jax.random.PRNGKey(5), clean.example_id)
  with fast_compile():
    mask, contiguous = (np.asarray(x) for x in adapter.control_mask(clean, corrupt, keys))
    old = np.asarray(adapter.control_mask(
        clean, corrupt.replace(changed_mask=np.zeros_like(corrupt.changed_mask)), keys)[0])
  ev, changed = clean.evidence_mask.astype(bool), corrupt.changed_mask.astype(bool)
  has = ev.any(-1)
  # the evidence's length, off the evidence, inside the lines, off the changed tokens
  np.testing.assert_array_equal(mask.sum(-1), ev.sum(-1))
  assert not (mask & ev).any() and not (mask & (clean.line_ids < 0)).any()
  assert not (mask & changed).any(), int((mask & changed).any(-1).sum())
  assert contiguous[has].mean() > 0.9
  if not (changed & ~ev).any():          # only evidence tokens changed: the same draws
    np.testing.assert_array_equal(mask, old)
  if name == "value_swap":
    assert changed.any() and not (changed & ~ev).any()
