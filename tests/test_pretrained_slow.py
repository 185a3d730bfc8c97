"""Slow checks of the pretrained model: the fast causal-tail audit on the full
30-layer model in float32 at ≥ 100 tokens, every layer × 3 probe kinds,
against the engine's full patched re-runs (`reference_audit`).

Shape legend: B batch, T tokens, Q probes, L layers.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from ceu_jax.pretrained import gguf_loader

_WHY = gguf_loader.is_available()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_WHY is not None, reason=f'pretrained model unavailable: {_WHY}')]

# float32: L_int (≈ −30 … −1 nats) through two different computation orders;
# measured max |Δ| 1.6e-5 on this batch (benchmarks/pretrained_audit_bench.py).
ATOL_F32 = 1e-4


def test_fast_audit_all_layers_float32():
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'benchmarks'))
  import pretrained_audit_bench as bench
  from tests.test_pretrained import _fast_vs_reference
  from ceu_jax.pretrained import load_smollm2, load_tokenizer, read_port_sites
  config, variables = load_smollm2()
  bp, bm, probes, t = bench.build_batch(load_tokenizer(), 2)
  assert t >= 100
  out = _fast_vs_reference(config, variables, bp, bm, probes, layers=range(config.n_layers),
                           atol=ATOL_F32)
  assert (np.asarray(out.results[0].delta_L) > 0.5).all()
  # Restoring the evidence at some layer recovers most of the gap; the
  # distractor span never does.
  ceu = {name: np.stack([np.asarray(out[s].ceu_of(name)) for s in read_port_sites(config)])
         for name in ('ev', 'dis')}
  assert ceu['ev'].max() > 0.5 and ceu['dis'].max() < 0.2
