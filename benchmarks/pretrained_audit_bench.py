"""Fast causal-tail audit vs the engine's full patched re-runs on SmolLM2-135M (GGUF).

A layer profile: every read port (30 layers) × 3 probes (`engine.Probes`
named full, ev, dis: the whole port, the evidence span, a distractor span) on
token-aligned clean/corrupted prompts of ≥ 100 tokens, patched at the answer
positions (the last reader positions, whose logits score the answer). Two
ways to get the same engine `Profile` (30 `AuditResult`s of 3 probes):

* fast: `fast_patch_audit` (one compiled call: clean + corrupted runs with
  key/value caches, then only the tail recomputed from each layer on);
* reference: `reference_audit`, the generic engine's `engine.record` on D+
  (all ports in one run per probe) and one full `engine.patch` forward of D−
  per (layer, probe), as a plain-hooks tool (pyvene / TransformerLens style)
  would run it.

Both are timed after a warm-up that compiles them (compile excluded) and must
agree. Prints probes/s (probe = one (layer, probe, example) intervention) and
ends with `TARGET pretrained_audit_speedup <x> >= 10 PASS|MISS`.

Usage: python benchmarks/pretrained_audit_bench.py [--batch 2] [--repeats 1]

Shape legend: B batch, T tokens, Q probes, L layers.
"""
from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from ceu_jax import engine

FILLER = ('The city council met on Tuesday to discuss the new library, the repair of '
          'the old bridge and the schedule of the summer festival. ')
EVIDENCE = 'The Eiffel Tower is located in {city}, the capital of France.'
DISTRACTOR = ' The Colosseum is located in Rome, the capital of Italy. '
QUESTION = 'In which city is the Eiffel Tower located'
PROBES = (engine.FULL, engine.EV, engine.DIS)


def build_batch(tok, batch: int):
  """(clean, corrupt `EncodedBatch`, `engine.Probes` [Q, B, T − 1], T)."""
  from ceu_jax.pretrained import answer_positions, char_span_mask, encode_batch, format_prompt
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
  span = np.stack([np.ones_like(bp.valid), ev_mask, dis_mask])[..., :-1]  # [Q, B, T - 1]
  pos = np.broadcast_to(answer_positions(bp.answer_mask), span.shape).copy()
  probes = engine.Probes(span=span, positions=pos, names=PROBES)
  return bp, bm, probes, bp.tokens.shape[1]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--batch', type=int, default=2, help='examples per batch (B)')
  ap.add_argument('--repeats', type=int, default=1, help='timed repetitions of each method')
  ap.add_argument('--n_layers', type=int, default=None,
                  help='keep only the first N layers (a smoke run; the TARGET is for all 30)')
  args = ap.parse_args(argv)

  from ceu_jax.pretrained import (engine_inputs, fast_patch_audit, load_smollm2, load_tokenizer,
                                  read_port_sites, reference_audit)
  config, variables = load_smollm2(n_layers=args.n_layers)
  tok = load_tokenizer()
  bp, bm, probes, t = build_batch(tok, args.batch)
  sites = read_port_sites(config)
  n_probes = config.n_layers * probes.num * args.batch
  print(f'device={jax.devices()[0].platform} B={args.batch} T={t} n_tail={bp.n_tail} '
        f'layers={config.n_layers} probes={probes.names} interventions={n_probes}', flush=True)
  assert t >= 100, f'prompts must be >= 100 tokens, got {t}'
  kw = dict(clean=engine_inputs(bp), corrupt=engine_inputs(bm), n_tail=bp.n_tail)

  def fast(p=probes):
    return jax.block_until_ready(fast_patch_audit(variables, config, probes=p, **kw))

  def reference(p=probes):
    return jax.block_until_ready(reference_audit(variables, config, probes=p, **kw))

  one = probes.replace(span=probes.span[:1], positions=probes.positions[:1],
                       names=probes.names[:1])

  def timed(fn, name, warm):
    t0 = time.perf_counter()
    warm()  # compiles (the reference: one program per layer)
    compile_s = time.perf_counter() - t0
    best = float('inf')
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      out = fn()
      best = min(best, time.perf_counter() - t0)
    print(f'{name:>10}: warm-up {compile_s:7.2f} s, timed {best:7.2f} s, '
          f'{n_probes / best:8.2f} interventions/s', flush=True)
    return out, best

  f_out, f_s = timed(fast, 'fast', fast)
  r_out, r_s = timed(reference, 'reference', lambda: reference(one))
  err = max(float(np.abs(np.asarray(f_out[s].row('L_int', name))
                         - np.asarray(r_out[s].row('L_int', name))).max())
            for s in sites for name in probes.names)
  print(f'max |L_int fast - L_int reference| = {err:.2e}')
  res = f_out[sites[0]]
  print(f"L+ = {np.round(np.asarray(res.L_plus), 3)}  L- = {np.round(np.asarray(res.L_minus), 3)}")
  print('CEU by layer (' + ' / '.join(probes.names) + '), engine scores, mean over examples:')
  for i, s in enumerate(sites):
    ceu = [float(np.asarray(f_out[s].ceu_of(name)).mean()) for name in probes.names]
    print(f'  layer {i:2d}: ' + ' '.join(f'{c:6.3f}' for c in ceu))
  speedup = r_s / f_s
  status = 'PASS' if speedup >= 10 and err < 1e-4 else 'MISS'
  print(f'TARGET pretrained_audit_speedup {speedup:.1f} >= 10 {status}')


if __name__ == '__main__':
  main()
