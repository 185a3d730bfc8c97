"""Vmapped (chunked) engine audit vs sequential patched re-runs (issue #4, acceptance 7).

  python -m benchmarks.audit_bench [--quick] [--preset p400k] [--batch 32]
      [--context_len 256] [--chunk_size 16] [--repeats 5] [--ks 1,4,16,64]

For each family (attention, ssm, memory_port) and k random span probes
(contiguous windows of one ATR line's length, drawn per probe and example):
* engine:     `engine.audit` of the k probes (L+, L−, L_int, scores) in one
              compiled call, probes vmapped in chunks of --chunk_size;
* sequential: what TransformerLens' patching helpers / pyvene do, jitted once
              and called k times: per probe a full clean (source) forward that
              records Π_S h(D+) and a full patched forward on D−; plus one plain
              forward for L− (same outputs as the engine);
* forward:    one plain forward (loglik on D−).
memory_port's span decomposition is approximate: its spans run with
allow_approximate=True (the timing is what matters here).

Suffix share s (measured, not assumed):
  u = one sequential probe, timed: the jitted clean forward (recording Π_S h(D+))
      + patched forward on D−;
  w = the per-probe work alone, timed: the engine's vmapped probe function is
      split by partial evaluation (as the engine's hoisting does); everything
      that does not depend on the probe (both runs up to and including the
      site's output, and what the port derives from them alone: the ssm
      port's per-token contributions) is computed once and fed in, and the
      jitted remainder
      (Π_S h on D+ and D−, the patched site, the suffix after it) is timed on
      one probe (also on one chunk, per probe, to show memory-boundness);
  s = w / u;  ideal speedup k / (1 + k·s)   (sequential k·u vs engine u + k·w).
  Cross-check printed too: suffix by subtraction F − T_prefix, T_prefix the
  forward cut at the read port (returns h; XLA drops the rest).
Every timing: warm-up call first (compile excluded), block_until_ready, the
median of --repeats runs; the measurements of one family are interleaved
round-robin so that the shared machine's load drifts hit them alike. Wall
time is primary (TARGETs); process CPU time is shown too (robust to load).
Memory per chunk (printed per family): the loop-invariant residuals that the
probe loop reads (computed once per call; for ssm they hold the read port's
contributions, [B, N, inner, state] float32 per read layer for each of D+ and
D−) and XLA's temporaries for one chunk of the loop body (memory analysis of
its compiled executable).
Ends with `TARGET <name> <measured> <op> <goal> PASS|MISS` lines.

Shape legend: K probes, B batch, N context tokens.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

import architectures
from ceu_jax import auditor, engine
from ceu_jax.data import atr, corruptions
from ceu_jax.engine import hoist
from ceu_jax.engine.sites import run_hooked
from ceu_jax.retrieval_adapter import ModelInputs
from configs import atr_insert

KS = (1, 4, 16, 64)
METHOD = __doc__.split("(measured, not assumed):")[1].split("Every timing")[0].rstrip()
QUICK = dict(preset="p100k", batch=8, context_len=128, repeats=3, ks="1,16,64")
FULL = dict(preset="p100k", batch=32, context_len=256, repeats=3, ks=",".join(map(str, KS)))


@dataclasses.dataclass
class Setup(auditor.OfAuditedModel):
  """One family's audited model (`ceu_jax.auditor`), variables and inputs."""
  family: str
  audited: auditor.AuditedModel
  variables: Any
  clean: ModelInputs
  corrupt: ModelInputs
  span_len: int


def make_setup(family: str, preset: str, context_len: int, batch: int,
               seed: int = 0) -> Setup:
  """Untrained model (timing does not depend on the weights), ATR D+ / value-swap D−."""
  config = atr_insert.get_config(f"base,family={family},preset={preset},"
                                 f"context_len={context_len}")
  bundle = auditor.audited_model(config)
  data = bundle.data_cfg
  variables = architectures.init_params(bundle.model, jax.random.PRNGKey(seed))
  clean = atr.generate_batch(data, seed, 0, batch, "eval")
  corrupt = corruptions.corrupt(data, clean, "value_swap", jax.random.PRNGKey(seed + 1))
  return Setup(family, bundle, variables, ModelInputs.of(clean), ModelInputs.of(corrupt),
               data.line_len)


def random_spans(key: jax.Array, k: int, batch: int, n: int, length: int) -> jax.Array:
  """[K, B, N] bool: a random window of `length` tokens per probe and example."""
  start = jax.random.randint(key, (k, batch, 1), 0, n - length + 1)
  pos = jnp.arange(n)[None, None]
  return (pos >= start) & (pos < start + length)


# ------------------------------------------------------------------ the three methods
def engine_audit(st: Setup, chunk_size: int) -> Callable:
  """probes -> AuditResult (the engine's own jit; compiled once per K)."""
  def run(probes):
    return engine.audit(st.loglik_fn, st.variables, clean=st.clean, corrupt=st.corrupt,
                        site=st.site, probes=probes, chunk_size=chunk_size,
                        allow_approximate=st.approximate)
  return run


def sequential_probe(st: Setup) -> Callable:
  """(variables, clean, corrupt, span [B, N]) -> (L+, L_int): a full clean
  (source) forward recording Π_S h(D+), then a full patched forward on D−."""
  kw = dict(allow_approximate=st.approximate)

  @jax.jit
  def one(variables, clean, corrupt, span):
    l_plus, rec = engine.record(st.loglik_fn, variables, clean, st.site, span_mask=span, **kw)
    l_int = engine.patch(st.loglik_fn, variables, corrupt, st.site, rec[st.site],
                         span_mask=span, **kw)
    return l_plus, l_int
  return one


def sequential_audit(st: Setup, one: Callable | None = None) -> Callable:
  """spans [K, B, N] -> (L+, L−, L_int [K, B]): the jitted probe `one` (see
  `sequential_probe`) called k times, plus one plain forward for L−."""
  one = one or sequential_probe(st)
  minus = jax.jit(st.loglik_fn)

  def run(spans):
    outs = [one(st.variables, st.clean, st.corrupt, s) for s in spans]
    return outs[0][0], minus(st.variables, st.corrupt), jnp.stack([o[1] for o in outs])
  return run


def forward(st: Setup) -> Callable:
  f = jax.jit(st.loglik_fn)
  return lambda: f(st.variables, st.corrupt)


def prefix(st: Setup) -> Callable:
  """The forward cut at the read port (returns h; XLA drops the rest): for the
  cross-check suffix ≈ F − T_prefix."""
  site = st.site

  @jax.jit
  def cut(variables, inputs):
    got = {}

    def action(call):
      got["h"] = h = call.run()
      return h
    run_hooked(st.loglik_fn, variables, inputs, {site: action})
    return got["h"]
  return lambda: cut(st.variables, st.corrupt)


def split_probe_work(st: Setup, spans: jax.Array) -> tuple[Callable, list]:
  """(jitted body, residuals): the engine's vmapped probe function on `spans`
  [C, B, N] split by partial evaluation (as the engine's hoisting does).

  Everything that does not depend on the probe — both runs up to and
  including the site's output, and what the port computes from them alone
  (ssm: the per-token contributions) — is computed once here: the residuals.
  ``body(residuals, spans)`` is what is left (Π_S h on D+ and D−, the patched
  site, the suffix after it).
  """
  fn = engine.runner.probe_fn(st.loglik_fn, st.site, allow_approximate=st.approximate)
  split = hoist.split(fn, (st.variables, st.clean, st.corrupt), engine.Probes(span=spans))
  body = jax.jit(lambda res, span: split.apply(res, engine.Probes(span=span)))
  return body, split.residuals


def probe_work(st: Setup, spans: jax.Array) -> Callable:
  """Thunk timing the per-probe work alone for `spans` [C, B, N] (see
  `split_probe_work`)."""
  body, residuals = split_probe_work(st, spans)
  return lambda: body(residuals, spans)


def chunk_memory(st: Setup, spans: jax.Array) -> dict:
  """Memory of one chunk of probes `spans` [C, B, N]: the loop-invariant
  residuals (computed once per call, shared by every chunk; their largest
  shapes) and XLA's temporaries for one call of the loop body."""
  body, residuals = split_probe_work(st, spans)
  by_shape = collections.Counter(tuple(r.shape) for r in residuals)
  largest = sorted(by_shape.items(), key=lambda kv: -kv[1] * math.prod(kv[0]))[:3]
  stats = body.lower(residuals, spans).compile().memory_analysis()
  return dict(residual_bytes=sum(r.nbytes for r in residuals), largest=largest,
              temp_bytes=getattr(stats, "temp_size_in_bytes", None))


# ------------------------------------------------------------------ timing
def sample(f: Callable[[], Any]) -> tuple[float, float]:
  """(wall, process CPU) seconds of one call, to block_until_ready."""
  t, c = time.perf_counter(), time.process_time()
  jax.block_until_ready(f())
  return time.perf_counter() - t, time.process_time() - c


def time_round_robin(fns: dict[str, Callable[[], Any]], repeats: int
                     ) -> dict[str, dict[str, float]]:
  """{name: {wall, cpu}} medians; one warm-up call each, then interleaved repeats."""
  for f in fns.values():
    jax.block_until_ready(f())
  got = {name: [] for name in fns}
  for _ in range(repeats):
    for name, f in fns.items():
      got[name].append(sample(f))
  return {name: dict(wall=statistics.median(w for w, _ in v),
                     cpu=statistics.median(c for _, c in v)) for name, v in got.items()}


def ideal_speedup(k: int, s: float) -> float:
  return k / (1 + k * s)


def check_agree(eng: Callable, seq: Callable, spans: jax.Array) -> float:
  """Max |L_int engine − L_int sequential| (they compute the same numbers)."""
  res = eng(engine.span_probes(spans))
  _, _, l_int = seq(spans)
  return float(jnp.max(jnp.abs(res.L_int - l_int)))


# Probes per vmapped chunk per family when --chunk_size is not given (else 16,
# the audit configs' value). Empty since issue #23: the ssm port used to re-run
# its read scan per probe (a chunk of 16 materialised 16 scans and was
# memory-bound on CPU, so ssm ran in chunks of 4); its Π_S is now a masked sum
# of per-token contributions computed once per call, and 16 suits it too.
DEFAULT_CHUNK: dict[str, int] = {}


def chunk_for(family: str, args) -> int:
  return args.chunk_size or DEFAULT_CHUNK.get(family, 16)


def bench_family(family: str, args) -> dict:
  chunk_size = chunk_for(family, args)
  st = make_setup(family, args.preset, args.context_len, args.batch, args.seed)
  b, n = st.clean.context.shape
  keys = jax.random.split(jax.random.PRNGKey(args.seed + 7), len(args.ks))
  spans = {k: random_spans(key, k, b, n, st.span_len) for k, key in zip(args.ks, keys)}
  one = sequential_probe(st)
  eng, seq = engine_audit(st, chunk_size), sequential_audit(st, one)
  big = spans[max(args.ks)]
  err = check_agree(eng, seq, spans[min(args.ks)])
  chunk = big[:min(chunk_size, len(big))]
  fns = {"forward": forward(st), "prefix": prefix(st),
         "seq_probe": lambda: one(st.variables, st.clean, st.corrupt, big[0]),
         "probe_work_1": probe_work(st, big[:1]),
         "probe_work_chunk": probe_work(st, chunk)}
  for k in args.ks:
    probes = engine.span_probes(spans[k])
    fns[f"engine_{k}"] = lambda p=probes: eng(p)
    fns[f"seq_{k}"] = lambda s=spans[k]: seq(s)
  return dict(times=time_round_robin(fns, args.repeats), agree=err,
              approximate=st.approximate, chunk=len(chunk), memory=chunk_memory(st, chunk))


def shares(t: dict, clock: str) -> dict[str, float]:
  """u, w, s on one clock ('wall' or 'cpu'); see the module docstring."""
  f = t["forward"][clock]
  u = t["seq_probe"][clock]
  w = t["probe_work_1"][clock]
  return dict(forward=f, u=u, w=w, s=w / u, suffix_sub=f - t["prefix"][clock])


# ------------------------------------------------------------------ report
def family_rows(r: dict, ks) -> list[dict]:
  t = r["times"]
  rows = []
  for k in ks:
    row = dict(k=k)
    for clock in ("wall", "cpu"):
      e, q = t[f"engine_{k}"][clock], t[f"seq_{k}"][clock]
      ideal = ideal_speedup(k, shares(t, clock)["s"])
      row[clock] = dict(engine=e, seq=q, speedup=q / e, ideal=ideal,
                        ratio=(q / e) / ideal, per_probe=e / k)
    rows.append(row)
  return rows


def _ms(x: float) -> str:
  return f"{1e3 * x:.1f}"


def print_family(family: str, r: dict, rows: list[dict]) -> None:
  t = r["times"]
  note = "  (memory_port spans: approximate Π_S, allow_approximate=True)" if r["approximate"] else ""
  print(f"\n[{family}]{note}  max |L_int engine - sequential| = {r['agree']:.2e}")
  for clock in ("wall", "cpu"):
    sh = shares(t, clock)
    chunk = t["probe_work_chunk"][clock] / r["chunk"]
    print(f"  {clock:>4}: forward F {_ms(sh['forward'])} ms, sequential probe u {_ms(sh['u'])} ms, "
          f"per-probe work w {_ms(sh['w'])} ms (in a vmapped chunk of {r['chunk']}: "
          f"{_ms(chunk)} ms/probe), s = w/u = {sh['s']:.4f}; cross-check: suffix by "
          f"subtraction F - T_prefix = {_ms(sh['suffix_sub'])} ms ({sh['suffix_sub'] / sh['forward']:.3f} F)")
  m = r["memory"]
  temp = "n/a" if m["temp_bytes"] is None else f"{m['temp_bytes'] / 2**20:.1f} MiB"
  shapes = ", ".join(f"{n}x{list(shape)}" for shape, n in m["largest"])
  print(f"  memory: loop-invariant residuals {m['residual_bytes'] / 2**20:.1f} MiB once per call "
        f"(largest: {shapes}); per chunk of {r['chunk']}: {temp} XLA temporaries")
  print(f"  {'k':>3} {'engine ms':>10} {'seq ms':>10} {'speedup':>8} {'ideal':>7} {'ratio':>6} "
        f"{'ms/probe':>9} | cpu: {'speedup':>8} {'ideal':>7} {'ratio':>6} {'ms/probe':>9}")
  for row in rows:
    w, c = row["wall"], row["cpu"]
    print(f"  {row['k']:>3} {_ms(w['engine']):>10} {_ms(w['seq']):>10} {w['speedup']:>8.2f} "
          f"{w['ideal']:>7.2f} {w['ratio']:>6.2f} {1e3 * w['per_probe']:>9.2f} |      "
          f"{c['speedup']:>8.2f} {c['ideal']:>7.2f} {c['ratio']:>6.2f} {1e3 * c['per_probe']:>9.2f}",
          flush=True)


def targets(all_rows: dict[str, list[dict]]) -> list[tuple]:
  out = []
  for family, rows in all_rows.items():
    by_k = {w["k"]: w["wall"] for w in rows}
    for k in (16, 64):
      if k in by_k:
        out.append((f"audit_speedup_vs_ideal_k{k}_{family}", by_k[k]["ratio"], ">=", 0.8))
    if 16 in by_k and 64 in by_k:
      out.append((f"audit_per_probe_k64_over_k16_{family}",
                  by_k[64]["per_probe"] / by_k[16]["per_probe"], "<=", 1.0))
  return out


def target_line(name: str, value: float, op: str, goal: float) -> str:
  ok = value >= goal if op == ">=" else value <= goal
  return f"TARGET {name} {value:.3f} {op} {goal} {'PASS' if ok else 'MISS'}"


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help=f"small run: {QUICK}")
  ap.add_argument("--preset", choices=tuple(architectures.PRESETS))
  ap.add_argument("--batch", type=int)
  ap.add_argument("--context_len", type=int)
  ap.add_argument("--repeats", type=int)
  ap.add_argument("--ks", help="comma-separated probe counts")
  ap.add_argument("--chunk_size", type=int, default=None,
                  help=f"probes per vmapped chunk (default 16, per family {DEFAULT_CHUNK})")
  ap.add_argument("--families", default=",".join(architectures.FAMILIES))
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  for name, value in (QUICK if args.quick else FULL).items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  args.ks = tuple(int(v) for v in str(args.ks).split(","))
  args.families = tuple(args.families.split(","))
  return args


def main(argv=None) -> list[str]:
  args = parse_args(argv)
  start = time.time()
  print(f"audit_bench: preset={args.preset} batch={args.batch} context_len={args.context_len} "
        f"chunk_size={args.chunk_size or f'16 (per family: {DEFAULT_CHUNK})'} ks={args.ks} repeats={args.repeats} "
        f"device={jax.devices()[0].platform} cpus={len(os.sched_getaffinity(0))} "
        f"loadavg={os.getloadavg()[0]:.2f},{os.getloadavg()[1]:.2f},{os.getloadavg()[2]:.2f}")
  print("How s is measured:" + METHOD)
  all_rows = {}
  for family in args.families:
    r = bench_family(family, args)
    all_rows[family] = family_rows(r, args.ks)
    print_family(family, r, all_rows[family])
  load = os.getloadavg()
  print(f"\nloadavg at end {load[0]:.2f},{load[1]:.2f},{load[2]:.2f}; "
        f"total {time.time() - start:.0f} s")
  lines = [target_line(*t) for t in targets(all_rows)]
  print("\n".join(lines))
  return lines


if __name__ == "__main__":
  main()
