"""Engine chunk size: time per probe at every power-of-two chunk C, and the
chunk the engine's rule picks (`ceu_jax.engine.chunking`), on several models.

  python -m benchmarks.engine_chunk_bench [--quick] [--k 32] [--repeats 3]
      [--models lm_w64,lm_w128,attention,ssm,memory_port]

Models (untrained: timing does not depend on the weights):
* lm_w64 / lm_w128: a pre-LN decoder of stock ``nn.MultiHeadDotProductAttention``
  layers (4 layers, width 64 / 128, batch 16 × 64 / 32 × 128 tokens; the
  second is the SPEC §9 configuration), site = layer 2's attention through
  `engine.Attention` (span probes over the sequence);
* attention / ssm / memory_port: the project's architectures at preset p100k,
  batch 32 × 256 context tokens, site = the last read port (as audit_bench).
For each model: `engine.audit` of K random span probes (windows) at
chunk_size C ∈ {1, 2, 4, …, K}, each timed as the median of --repeats calls
after a warm-up (compile excluded), the chunk sizes interleaved round-robin so
that load drifts hit them alike. The rule's C is computed from the measured
per-probe working set w (printed) and the backend; 'auto' compiles to the same
program as that fixed C, so its time is read from that row.

Ends with `TARGET <name> <measured> <op> <goal> PASS|MISS`: for every model,
t(auto) / t(best C) ≤ 1.2, and t(C=16) / t(auto) (the old fixed default
against the rule) printed for reference.

Shape legend: K probes, C probes per chunk, B batch, L sequence, N context
tokens, D width.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ceu_jax import engine
from ceu_jax.engine import chunking

QUICK = dict(k=8, repeats=2, models="lm_w64,attention")
FULL = dict(k=32, repeats=3, models="lm_w64,lm_w128,attention,ssm,memory_port")


class Block(nn.Module):
  heads: int

  @nn.compact
  def __call__(self, x, mask):
    d = x.shape[-1]
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, name="attn")(
        nn.LayerNorm()(x), mask=mask)
    return x + nn.Dense(d)(nn.gelu(nn.Dense(4 * d)(nn.LayerNorm()(x))))


class LM(nn.Module):
  width: int
  layers: int = 4
  vocab: int = 256

  @nn.compact
  def __call__(self, tokens):                      # [B, L] -> logits [B, L, V]
    x = nn.Embed(self.vocab, self.width)(tokens)
    mask = nn.make_causal_mask(tokens)
    for l in range(self.layers):
      x = Block(self.width // 16, name=f"block_{l}")(x, mask)
    return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def lm_setup(width: int, batch: int, length: int, seed: int = 0):
  """(loglik_fn, variables, clean, corrupt, site, span length, N, approximate)."""
  model = LM(width)
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(1, 256, (batch, length)), jnp.int32)
  gold = jnp.asarray(rng.integers(1, 256, (batch,)), jnp.int32)
  corrupt = tokens.at[:, length // 4].set((tokens[:, length // 4] + 7) % 256)
  variables = model.init(jax.random.key(seed), tokens)

  def loglik_fn(v, inputs):
    toks, y = inputs
    logp = jax.nn.log_softmax(model.apply(v, toks)[:, -1])
    return jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]

  site = engine.Site("block_2/attn", adapter=engine.Attention())
  return (loglik_fn, variables, (tokens, gold), (corrupt, gold), site,
          max(2, length // 16), length, False)


def arch_setup(family: str, batch: int = 32, context_len: int = 256):
  from benchmarks import audit_bench  # the project's architectures, as there
  st = audit_bench.make_setup(family, "p100k", context_len, batch)
  return (st.loglik_fn, st.variables, st.clean, st.corrupt, st.site,
          st.span_len, st.clean[1].shape[1], st.approximate)


SETUPS: dict[str, Callable[[], tuple]] = {
    "lm_tiny": lambda: lm_setup(16, 2, 16),      # smoke test only
    "lm_w64": lambda: lm_setup(64, 16, 64),
    "lm_w128": lambda: lm_setup(128, 32, 128),
    "attention": lambda: arch_setup("attention"),
    "ssm": lambda: arch_setup("ssm"),
    "memory_port": lambda: arch_setup("memory_port"),
}


def random_spans(key, k: int, batch: int, n: int, length: int) -> jax.Array:
  """[K, B, N] bool: a random window of ``length`` tokens per probe, example."""
  start = jax.random.randint(key, (k, batch, 1), 0, n - length + 1)
  pos = jnp.arange(n)[None, None]
  return (pos >= start) & (pos < start + length)


def bench_model(name: str, k: int, repeats: int) -> dict[str, Any]:
  ll, v, clean, corrupt, site, span_len, n, approx = SETUPS[name]()
  batch = jax.tree.leaves(clean)[0].shape[0]
  probes = engine.span_probes(random_spans(jax.random.key(1), k, batch, n, span_len))
  fn = engine.runner.probe_fn(ll, site, allow_approximate=approx)
  w = chunking.per_probe_bytes(fn, (v, clean, corrupt), probes)
  auto_c = chunking.rule(w, k)
  assert auto_c == chunking.choose(fn, (v, clean, corrupt), probes)
  sizes = [c for c in (1, 2, 4, 8, 16, 32, 64, 128) if c <= k]

  def run(c):
    return lambda: engine.audit(ll, v, clean=clean, corrupt=corrupt, site=site,
                                probes=probes, chunk_size=c,
                                allow_approximate=approx).L_int
  fns = {c: run(c) for c in sizes}
  ref = None
  for c, f in fns.items():                        # warm-up (compile) + agree
    out = np.asarray(jax.block_until_ready(f()))
    if ref is None:
      ref = out
    np.testing.assert_allclose(out, ref, atol=1e-4)
  times = {c: [] for c in sizes}
  for _ in range(repeats):
    for c, f in fns.items():
      t = time.perf_counter()
      jax.block_until_ready(f())
      times[c].append(time.perf_counter() - t)
  med = {c: statistics.median(ts) for c, ts in times.items()}
  best = min(med, key=med.get)
  return dict(name=name, w=w, auto=auto_c, best=best, times=med, k=k)


def target_line(name: str, value: float, op: str, goal: float) -> str:
  ok = value <= goal if op == "<=" else value >= goal
  return f"TARGET {name} {value:.3f} {op} {goal} {'PASS' if ok else 'MISS'}"


def main(argv=None) -> list[str]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help=f"small run: {QUICK}")
  ap.add_argument("--k", type=int)
  ap.add_argument("--repeats", type=int)
  ap.add_argument("--models")
  args = ap.parse_args(argv)
  for key, value in (QUICK if args.quick else FULL).items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  load = os.getloadavg()
  print(f"engine_chunk_bench: k={args.k} repeats={args.repeats} "
        f"device={jax.devices()[0].platform} cpus={len(os.sched_getaffinity(0))} "
        f"budget={chunking.BUDGET.get(jax.default_backend(), 0) / chunking.MiB:.0f} MiB "
        f"loadavg={load[0]:.2f},{load[1]:.2f},{load[2]:.2f}", flush=True)
  lines = []
  for name in args.models.split(","):
    r = bench_model(name, args.k, args.repeats)
    row = "  ".join(f"C={c}: {1e3 * t / r['k']:.2f}" for c, t in r["times"].items())
    print(f"{name}: w={r['w'] / chunking.MiB:.2f} MiB/probe  auto C={r['auto']}  "
          f"best C={r['best']}  ms/probe  {row}", flush=True)
    t_auto = r["times"][r["auto"]]
    lines.append(target_line(f"chunk_auto_over_best_{name}",
                             t_auto / r["times"][r["best"]], "<=", 1.2))
    if 16 in r["times"]:
      print(f"  fixed C=16 / auto: {r['times'][16] / t_auto:.2f}")
  load = os.getloadavg()
  print(f"loadavg at end {load[0]:.2f},{load[1]:.2f},{load[2]:.2f}")
  print("\n".join(lines))
  return lines


if __name__ == "__main__":
  main()
