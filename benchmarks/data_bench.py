"""ATR-insert generation speed: jitted JAX generator vs the pure-Python reference.

  python -m benchmarks.data_bench            # n = 512, default sizes
  python -m benchmarks.data_bench --n 128 --jax_batches 5

Both produce every RetrievalBatch field for the same task distribution
(ceu_jax.data.atr vs ceu_jax.data.reference_atr). The JAX rate is measured after
compilation, on the default device, with `block_until_ready` (and, separately,
including the copy of every field to host numpy); the reference rate is wall
time of `reference_atr.generate`. Both rates come from this one run, so their
ratio is measured under the same machine load. The last line is
  TARGET data_gen_speedup_n512 <ratio> >= 50 PASS|MISS

On CPU the JAX generator used to be bound by threefry hashes (~1,100 per example
at n = 512); it now takes every draw of an example as a packed bit field of one
counter-mode stream (atr_lines.Stream, 218 hashes) and lays tokens and masks out
by reshapes and compares, not gathers. Run it pinned to one core (`taskset -c 1`) on a shared
machine; the ratio moves with load.
"""
from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from ceu_jax.data import atr, reference_atr
from ceu_jax.data.atr_config import ATRConfig

TARGET = 50.0


def bench_config(n: int) -> ATRConfig:
  """The data section of configs/atr_insert.py (base) at context length n."""
  return ATRConfig(variant="value_for_key", num_passages=8, context_len=n, value_len=1,
                   eta=0.1, delta=0.3, rho=0.0, overlap_rate=0.25, filler_rate=0.5,
                   paraphrase_rate=0.1, n_ids=64, n_keys=64, n_values=64, n_filler=64)


def jax_rate(cfg: ATRConfig, batch_size: int, batches: int, to_host: bool) -> float:
  """Examples/s of `generate_batch` after a warm-up (compile) call."""
  jax.block_until_ready(atr.generate_batch(cfg, 0, 0, batch_size))
  start = time.perf_counter()
  for i in range(1, batches + 1):
    batch = atr.generate_batch(cfg, 0, i, batch_size)
    if to_host:
      jax.tree.map(np.asarray, batch)
    else:
      jax.block_until_ready(batch)
  return batch_size * batches / (time.perf_counter() - start)


def reference_rate(cfg: ATRConfig, examples: int) -> float:
  sampler = reference_atr.ReferenceATR(cfg)      # prior table built outside the timing
  start = time.perf_counter()
  reference_atr.generate(cfg, seed=0, num_examples=examples, sampler=sampler)
  return examples / (time.perf_counter() - start)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=512, help="context length")
  parser.add_argument("--batch_size", type=int, default=4096, help="JAX batch size")
  parser.add_argument("--jax_batches", type=int, default=20, help="timed JAX batches")
  parser.add_argument("--reference_examples", type=int, default=2000,
                      help="examples timed for the pure-Python reference")
  args = parser.parse_args(argv)
  cfg = bench_config(args.n)
  device = jax.devices()[0]
  ref = reference_rate(cfg, args.reference_examples)
  fast = jax_rate(cfg, args.batch_size, args.jax_batches, to_host=False)
  host = jax_rate(cfg, args.batch_size, max(1, args.jax_batches // 4), to_host=True)
  print(f"ATR-insert generation, n = {cfg.context_len}, m = {cfg.num_passages}, "
        f"lines = {cfg.num_lines}, JAX device: {device.platform} ({device.device_kind})")
  print(f"  {'generator':<34} {'examples/s':>12} {'x reference':>12}")
  for name, rate in ((f"pure-Python reference", ref),
                     (f"jitted JAX (batch {args.batch_size})", fast),
                     ("jitted JAX + copy to host numpy", host)):
    print(f"  {name:<34} {rate:>12,.0f} {rate / ref:>12.1f}")
  speedup = fast / ref
  verdict = "PASS" if speedup >= TARGET else "MISS"
  print(f"TARGET data_gen_speedup_n{cfg.context_len} {speedup:.1f} >= {TARGET:g} {verdict}")


if __name__ == "__main__":
  main()
