"""Slow checks of the pretrained model: fast causal patching on the full
30-layer model in float32 at ≥ 100 tokens, every layer × 3 probe kinds.

Shape legend: B batch, T tokens, S probe kinds, L layers.
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


def test_fast_audit_all_layers_float32():
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'benchmarks'))
  import pretrained_audit_bench as bench
  from tests.test_pretrained import _fast_vs_full
  from ceu_jax.pretrained import load_smollm2, load_tokenizer
  config, variables = load_smollm2()
  bp, bm, spans, t = bench.build_batch(load_tokenizer(), 2)
  assert t >= 100
  out = _fast_vs_full(config, variables, bp, bm, spans, layers=range(config.n_layers), atol=1e-4)
  l_int, lp, lm = (np.asarray(out[k]) for k in ('L_int', 'L_plus', 'L_minus'))
  assert (lp - lm > 0.5).all()
  # Restoring the evidence at some layer recovers most of the gap; the
  # distractor span never does.
  ceu = (l_int - lm) / (lp - lm)
  assert ceu[:, 1].max() > 0.5 and ceu[:, 2].max() < 0.2
