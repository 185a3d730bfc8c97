"""Forward+backward time and peak memory per family vs context length n (issues #3, #20).

  python benchmarks/arch_bench.py [--preset p100k] [--batch 8] [--reps 3]

Two sweeps over n:
  fixed_m  m = 8 passages, each n/8 tokens long (all three families);
  fixed_l  passages of l = 16 tokens, m = n/16 of them (memory_port, with
           attention as the quadratic reference): n grows by retrieving more
           passages, the regime in which memory_port's passage-wise encoder
           (m blocks of (q + l)^2) is linear in n. At fixed m its cost is
           m (q + n/m)^2, still quadratic for long passages (printed, no target).
The three families at one preset have the same parameter count at every n and m
(no parameter depends on them). Time: median wall time of a jitted value_and_grad of
the teacher-forced NLL. Peak memory: XLA's buffer assignment for that compiled
step (arguments + outputs + temporaries, `compiled.memory_analysis()`).
Growth exponent: least-squares slope of log(quantity) against log(n).
Ends with `TARGET <name> <measured> <op> <goal> PASS|MISS` lines.

Shape legend: B batch, Q query length, N context length, A answer length.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
import optax

import architectures

LENGTHS = (128, 256, 512, 1024, 2048)
VOCAB, PASSAGES, QUERY_LEN, ANSWER_LEN = 180, 8, 6, 1
PASSAGE_LEN = 16  # l of the fixed_l sweep


def _batch(n: int, batch: int, passages: int, seed: int = 0):
  r = np.random.RandomState(seed)
  q = r.randint(3, VOCAB, (batch, QUERY_LEN))
  c = r.randint(3, VOCAB, (batch, n))
  pid = np.broadcast_to((np.arange(n) * passages) // n, (batch, n))
  a = r.randint(3, VOCAB, (batch, ANSWER_LEN))
  return tuple(jnp.asarray(x, jnp.int32) for x in (q, c, pid, a))


def measure(family: str, preset: str, n: int, batch: int, reps: int,
            passages: int = PASSAGES) -> dict:
  cfg = dict(family=family, preset=preset)
  model = architectures.build_model(cfg, vocab_size=VOCAB, context_len=n, num_passages=passages,
                                    query_len=QUERY_LEN, answer_len=ANSWER_LEN)
  params = architectures.init_params(model, jax.random.PRNGKey(0))
  x = _batch(n, batch, passages)

  def loss(p, q, c, pid, a):
    logits = model.apply(p, q, c, pid, a)
    return optax.softmax_cross_entropy_with_integer_labels(logits, a).mean()

  step = jax.jit(jax.value_and_grad(loss))
  compiled = step.lower(params, *x).compile()
  mem = compiled.memory_analysis()
  peak = (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
          - mem.alias_size_in_bytes) if mem is not None else float("nan")
  jax.block_until_ready(compiled(params, *x))
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(compiled(params, *x))
    times.append(time.perf_counter() - t)
  return dict(params=architectures.count_params(model), seconds=statistics.median(times),
              peak_bytes=float(peak))


def slope(ns, ys) -> float:
  """Least-squares exponent k of y ∝ n^k."""
  return float(np.polyfit(np.log(np.asarray(ns, float)), np.log(np.asarray(ys, float)), 1)[0])


def sweep(name: str, families, lengths, args) -> dict:
  """{family: {params, time_exp, mem_exp}} of one sweep, printing one row per (family, n)."""
  results = {}
  for family in families:
    rows = []
    for n in lengths:
      m = PASSAGES if name == "fixed_m" else n // args.passage_len
      r = measure(family, args.preset, n, args.batch, args.reps, passages=m)
      rows.append(r)
      print(f"{name:<8} {family:<12} {n:>5} {m:>4} {r['params']:>9,d} "
            f"{1e3 * r['seconds']:>11.1f} {r['peak_bytes'] / 2**20:>9.1f}", flush=True)
    results[family] = dict(
        params={r["params"] for r in rows},
        time_exp=slope(lengths, [r["seconds"] for r in rows]),
        mem_exp=slope(lengths, [r["peak_bytes"] for r in rows]))
  return results


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--preset", default="p100k", choices=tuple(architectures.PRESETS))
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
  ap.add_argument("--passage_len", type=int, default=PASSAGE_LEN,
                  help="l of the fixed_l sweep (each length must be a multiple)")
  args = ap.parse_args(argv)
  lengths = [int(v) for v in args.lengths.split(",")]
  bad = [n for n in lengths if n % args.passage_len or n % PASSAGES]
  if bad:
    raise SystemExit(f"--lengths must be multiples of --passage_len (= {args.passage_len}) "
                     f"and of {PASSAGES}, got {bad}")
  print(f"devices: {jax.devices()}  preset={args.preset} batch={args.batch} "
        f"cpus={os.cpu_count()} affinity={len(os.sched_getaffinity(0))} "
        f"load={os.getloadavg()[0]:.2f}")
  print(f"{'sweep':<8} {'family':<12} {'n':>5} {'m':>4} {'params':>9} {'fwd+bwd ms':>11} "
        f"{'peak MiB':>9}")
  fixed_m = sweep("fixed_m", architectures.FAMILIES, lengths, args)
  fixed_l = sweep("fixed_l", ("memory_port", "attention"), lengths, args)
  print()
  for name, results in (("fixed_m", fixed_m), ("fixed_l", fixed_l)):
    for family, r in results.items():
      print(f"{name:<8} {family:<12} growth exponent in n: time {r['time_exp']:.2f}  "
            f"memory {r['mem_exp']:.2f}")
  counts = [c for res in (fixed_m, fixed_l) for r in res.values() for c in r["params"]]
  spread = 100.0 * (max(counts) - min(counts)) / min(counts)
  targets = [
      ("ssm_time_exponent", fixed_m["ssm"]["time_exp"], "<=", 1.2),
      ("ssm_memory_exponent", fixed_m["ssm"]["mem_exp"], "<=", 1.2),
      ("attention_memory_exponent_minus_ssm", fixed_m["attention"]["mem_exp"]
       - fixed_m["ssm"]["mem_exp"], ">=", 0.3),
      ("memory_port_time_exponent_fixed_l", fixed_l["memory_port"]["time_exp"], "<=", 1.2),
      ("memory_port_memory_exponent_fixed_l", fixed_l["memory_port"]["mem_exp"], "<=", 1.2),
      ("attention_memory_exponent_minus_memory_port_fixed_l",
       fixed_l["attention"]["mem_exp"] - fixed_l["memory_port"]["mem_exp"], ">=", 0.3),
      ("param_spread_percent", spread, "<=", 3.0),
  ]
  for name, value, op, goal in targets:
    ok = value <= goal if op == "<=" else value >= goal
    print(f"TARGET {name} {value:.3f} {op} {goal} {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
  main()
