"""SmolLM2's output head: `ceu_jax.pretrained.model.unembed` vs the plain x · tableᵀ.

  python -m benchmarks.unembed_bench                   # V = 49,152, D = 576 (SmolLM2-135M)
  python -m benchmarks.unembed_bench --rows 4,128 --reps 3
  python -m benchmarks.unembed_bench --generate 8      # also: greedy generation A/B, batch 8

Both compute the logits of N hidden rows against the tied embedding table, jitted, on
random float32 inputs of SmolLM2's shape; median of `--reps` calls after compilation, in
this one run. N = 4 is a decode step of batch 4 (the audits' generation), 128 an answer
tail, 1,024 a prompt's logits. On XLA:CPU with YNNPACK fusions off (what `ceu_jax` sets,
ceu_jax/xla_cpu.py) the plain product picks a slow kernel for some N (4, 128, 256 here;
8–64 run about equally fast either way); `unembed` lays the same product out as table · xᵀ. --generate B adds an end-to-end A/B: SmolLM2-135M (30 layers, the installed weights)
generates B chat prompts x 48 greedy tokens with either output head, 3 interleaved rounds
after compiling each, and reports the median seconds and whether the texts are identical.
The last lines are
  TARGET unembed_speedup_rows<N> <plain / unembed> >= 1.0 PASS|MISS   (every N)
  TARGET unembed_decode_step_speedup <ratio at N = 4> >= 3.0 PASS|MISS
"""
from __future__ import annotations

import argparse
import statistics
import time

import ceu_jax  # noqa: F401  (the library's XLA:CPU settings, before JAX starts)
import jax
import numpy as np

from ceu_jax.pretrained.model import unembed


def _median_ms(f, *args, reps: int) -> float:
  f(*args).block_until_ready()
  out = []
  for _ in range(reps):
    t = time.perf_counter()
    f(*args).block_until_ready()
    out.append((time.perf_counter() - t) * 1e3)
  return statistics.median(out)


def generation_ab(batch: int, new_tokens: int = 48, rounds: int = 3) -> None:
  """Greedy generation with `unembed` vs the plain product as SmolLM2's output head."""
  from ceu_jax.pretrained import model as M  # pylint: disable=g-import-not-at-top
  from ceu_jax.readers import SmolLM2Reader  # pylint: disable=g-import-not-at-top
  heads = {"unembed": M.unembed, "plain": lambda x, t: x @ t.T}
  reader = SmolLM2Reader.from_pretrained(chat=True)
  prompts = [[("user", f"Question {i}: what is {i} plus {i + 3}? Explain step by step.")]
             for i in range(batch)]
  times, texts = {k: [] for k in heads}, {}
  try:
    for _ in range(rounds):
      for name, head in heads.items():
        M.unembed = head
        jax.clear_caches()
        reader.generate(prompts, max_new_tokens=new_tokens)   # compile
        t = time.perf_counter()
        out = reader.generate(prompts, max_new_tokens=new_tokens)
        times[name].append(time.perf_counter() - t)
        texts[name] = [g.text for g in out]
  finally:
    M.unembed = heads["unembed"]
  print(f"generation, batch {batch} x {new_tokens} tokens, 30 layers (median of {rounds}):")
  for name, ts in times.items():
    print(f"  {name:8s} {statistics.median(ts):.2f} s  (rounds {', '.join(f'{x:.2f}' for x in ts)})")
  print(f"  identical texts: {texts['unembed'] == texts['plain']}")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--vocab", type=int, default=49152, help="V (SmolLM2: 49,152)")
  p.add_argument("--width", type=int, default=576, help="D (SmolLM2-135M: 576)")
  p.add_argument("--rows", default="1,4,8,16,64,128,1024", help="comma list of N")
  p.add_argument("--reps", type=int, default=5, help="timed calls per N (median)")
  p.add_argument("--generate", type=int, default=0,
                 help="batch size of a SmolLM2 greedy-generation A/B (0: off)")
  a = p.parse_args(argv)
  rows = [int(r) for r in a.rows.split(",")]
  rng = np.random.default_rng(0)
  table = jax.numpy.asarray(rng.standard_normal((a.vocab, a.width), np.float32))
  plain = jax.jit(lambda x, t: x @ t.T)
  fast = jax.jit(unembed)
  print(f"backend {jax.default_backend()}; V = {a.vocab}, D = {a.width}; median of {a.reps}")
  print(f"{'rows':>6} {'x @ table.T':>12} {'unembed':>10} {'ratio':>7}")
  ratios = {}
  for n in rows:
    x = jax.numpy.asarray(rng.standard_normal((n, a.width), np.float32))
    np.testing.assert_allclose(np.asarray(fast(x, table)), np.asarray(plain(x, table)),
                               rtol=1e-4, atol=1e-4)
    t_plain, t_fast = _median_ms(plain, x, table, reps=a.reps), _median_ms(fast, x, table,
                                                                          reps=a.reps)
    ratios[n] = t_plain / t_fast
    print(f"{n:6d} {t_plain:9.2f} ms {t_fast:7.2f} ms {ratios[n]:7.2f}")
  if a.generate:
    generation_ab(a.generate)
  for n, r in ratios.items():
    print(f"TARGET unembed_speedup_rows{n} {r:.2f} >= 1.0 {'PASS' if r >= 1.0 else 'MISS'}")
  if 4 in ratios:
    r = ratios[4]
    print(f"TARGET unembed_decode_step_speedup {r:.2f} >= 3.0 {'PASS' if r >= 3.0 else 'MISS'}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
