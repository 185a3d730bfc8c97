"""Each family learns ATR-insert; without bypass the read port is the only channel (issue #3).

The slow tests are the acceptance runs (minutes on 2 CPU cores each); the
unmarked test is a tiny version (a few steps, the loss goes down).
Shape legend: B batch, A answer length, V vocabulary.
"""
from __future__ import annotations

import numpy as np
import pytest

import architectures
from tests import arch_training

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


# Steps that reached >= 95% EM (one CPU core, lr 3e-3, batch 64; see docs/architectures.md).
# memory_port: 10,000 (was 6,000). The blocked encoder computes the dense one's function
# (tests/test_memory_blocked.py, values and gradients at 1e-5), but its float reassociation
# moved this run's trajectory: the passage-matching transition (EM ~1/8 -> ~1) came near
# step 3,500 instead of 1,750, and the 6,000-step cosine ended at EM 0.887. It is this late
# transition, not a different function, so the schedule is longer: 0.971 (issue #37).
ACCEPTANCE_STEPS = {"attention": 3000, "ssm": 2000, "memory_port": 10000}


@pytest.mark.parametrize("family", list(architectures.FAMILIES))
def test_tiny_training_loss_decreases(family):
  data = arch_training.tiny_data_config()
  res = arch_training.train(dict(family=family, preset="p100k"), data, steps=16,
                            batch_size=16, lr=3e-3, warmup=2)
  assert np.isfinite(res.losses).all()
  assert np.mean(res.losses[-4:]) < np.mean(res.losses[:4]), res.losses


@pytest.mark.slow
@pytest.mark.parametrize("family", list(architectures.FAMILIES))
def test_family_learns_atr_insert_and_needs_its_port(family):
  data = arch_training.tiny_data_config()  # n = 128, rho = 0, delta = 0.3
  cfg = dict(family=family, preset="p100k", bypass=False)
  res = arch_training.train(cfg, data, steps=ACCEPTANCE_STEPS[family], batch_size=64, lr=3e-3)
  em = arch_training.evaluate(res, data)
  assert em >= 0.95, (family, em)
  site = architectures.read_port_site(cfg).path
  ablated = arch_training.evaluate(res, data, transform=arch_training.mean_ablation(site))
  assert ablated <= 3.0 / data.n_values, (family, ablated)  # chance is 1 / n_values
