"""Fast causal patching vs sequential full re-runs on SmolLM2-135M (GGUF).

A layer profile: every read port (30 layers) × 3 probe kinds (full site,
evidence span, distractor span) on token-aligned clean/corrupted prompts of
≥ 100 tokens, patched at the last n_tail input positions (those whose logits
score the answer). Two ways to get the same 90 L_int values per example:

* fast: `fast_patch_audit` (one compiled call: clean + corrupted runs with
  key/value caches, then only the tail recomputed from each layer on);
* sequential: one full patched forward per probe (`patched_run`, through
  `nn.intercept_methods`), plus the clean recordings and the L+/L− runs.

Both are timed after a warm-up that compiles them (compile excluded) and must
agree. Prints
probes/s (probe = one (layer, kind, example) intervention) and ends with
`TARGET pretrained_audit_speedup <x> >= 10 PASS|MISS`.

Usage: python benchmarks/pretrained_audit_bench.py [--batch 2] [--repeats 1]

Shape legend: B batch, T tokens, S probe kinds, L layers.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

FILLER = ('The city council met on Tuesday to discuss the new library, the repair of '
          'the old bridge and the schedule of the summer festival. ')
EVIDENCE = 'The Eiffel Tower is located in {city}, the capital of France.'
DISTRACTOR = ' The Colosseum is located in Rome, the capital of Italy. '
QUESTION = 'In which city is the Eiffel Tower located'


def build_batch(tok, batch: int):
  """Clean/corrupted encodings and the [S, B, T] probe span masks."""
  from ceu_jax.pretrained import char_span_mask, encode_batch, format_prompt
  clean, corr, ranges = [], [], []
  for i in range(batch):
    pre = FILLER * (2 + i % 2)
    ev, dis = EVIDENCE.format(city='Paris'), DISTRACTOR
    clean.append(format_prompt(pre + ev + dis + FILLER, QUESTION))
    corr.append(format_prompt(pre + EVIDENCE.format(city='Lyon') + dis + FILLER, QUESTION))
    a = clean[-1].index(ev)
    b = clean[-1].index(dis.strip())
    ranges.append(([(a, a + len(ev))], [(b, b + len(dis.strip()))]))
  answers = ['Paris'] * batch
  bp, bm = encode_batch(tok, clean, answers), encode_batch(tok, corr, answers)
  assert (bp.valid == bm.valid).all(), 'corruption must be token-aligned'
  ev_mask = char_span_mask(tok, clean, [r[0] for r in ranges], bp)
  dis_mask = char_span_mask(tok, clean, [r[1] for r in ranges], bp)
  assert ((bp.tokens != bm.tokens) <= ev_mask).all()
  spans = np.stack([np.ones_like(bp.valid), ev_mask, dis_mask])
  return bp, bm, spans, bp.tokens.shape[1]


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--batch', type=int, default=2, help='examples per batch (B)')
  ap.add_argument('--repeats', type=int, default=1, help='timed repetitions of each method')
  args = ap.parse_args()

  from ceu_jax.pretrained import (answer_loglik, fast_patch_audit, load_smollm2, load_tokenizer,
                                  patched_run, record_ports, tail_loglik)
  config, variables = load_smollm2()
  tok = load_tokenizer()
  bp, bm, spans, t = build_batch(tok, args.batch)
  n = bp.n_tail
  n_kinds = spans.shape[0]
  n_probes = config.n_layers * n_kinds * args.batch
  print(f'device={jax.devices()[0].platform} B={args.batch} T={t} n_tail={n} '
        f'layers={config.n_layers} kinds={n_kinds} (full, evidence, distractor) '
        f'probes={n_probes}', flush=True)
  assert t >= 100, f'prompts must be >= 100 tokens, got {t}'
  spans_j = jnp.asarray(spans)

  def fast():
    out = fast_patch_audit(variables, config, bp.tokens, bm.tokens, bp.valid, bp.answer_mask,
                           spans_j, n)
    return jax.tree.map(np.asarray, out)

  def sequential(layers=range(config.n_layers)):
    lp = answer_loglik(variables, config, bp.tokens, bp.valid, bp.answer_mask, n)
    lm = answer_loglik(variables, config, bm.tokens, bm.valid, bm.answer_mask, n)
    l_int = np.zeros((config.n_layers, n_kinds, args.batch), np.float32)
    for s in range(n_kinds):
      span = spans_j[s][:, :-1]
      clean = record_ports(variables, config, *bp.inputs, span, n)
      for layer in layers:
        logits = patched_run(variables, config, *bm.inputs, jnp.int32(layer), clean, span, n,
                             n_logits=n)
        l_int[layer, s] = np.asarray(tail_loglik(logits, bm.tokens, bp.answer_mask))
    return {'L_plus': np.asarray(lp), 'L_minus': np.asarray(lm), 'L_int': l_int}

  def timed(fn, name, warm):
    t0 = time.perf_counter()
    warm()  # compiles
    compile_s = time.perf_counter() - t0
    best = float('inf')
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      out = fn()
      best = min(best, time.perf_counter() - t0)
    print(f'{name:>10}: warm-up {compile_s:7.2f} s, timed {best:7.2f} s, '
          f'{n_probes / best:8.2f} probes/s', flush=True)
    return out, best

  f_out, f_s = timed(fast, 'fast', fast)
  s_out, s_s = timed(sequential, 'sequential', lambda: sequential(layers=[0]))
  err = float(np.abs(f_out['L_int'] - s_out['L_int']).max())
  print(f'max |L_int fast - L_int sequential| = {err:.2e}')
  print(f"L+ = {np.round(f_out['L_plus'], 3)}  L- = {np.round(f_out['L_minus'], 3)}")
  gap = np.maximum(f_out['L_plus'] - f_out['L_minus'], 1e-6)
  ceu = np.clip((f_out['L_int'] - f_out['L_minus']) / gap, 0, 1).mean(-1)  # [L, S]
  print('CEU by layer (full / evidence / distractor), mean over examples:')
  for layer in range(config.n_layers):
    print(f'  layer {layer:2d}: ' + ' '.join(f'{c:6.3f}' for c in ceu[layer]))
  speedup = s_s / f_s
  status = 'PASS' if speedup >= 10 and err < 1e-3 else 'MISS'
  print(f'TARGET pretrained_audit_speedup {speedup:.1f} >= 10 {status}')


if __name__ == '__main__':
  main()
