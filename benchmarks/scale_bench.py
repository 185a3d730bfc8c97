r"""Training cost from XLA's cost analysis, FLOP/s on this CPU, and the paper grid's
estimated device-hours on an H100 and a TPU v5e (issue #20, item 5).

  python -m benchmarks.scale_bench                    # the paper's preset p400k, n = 256, 512; grid
  python -m benchmarks.scale_bench --presets p100k,p400k,p1500k --no_grid   # every preset
  python -m benchmarks.scale_bench --compare_scan_impl= --time_scan_impls=  # new scan only

1. Compiler cost: the real jitted CER `train_step` (ceu_jax.train.state, abstract state
   and batch: nothing runs) is compiled per (preset, family, n, objective) and
   `compiled.cost_analysis()` gives FLOPs and bytes accessed per step; the same for
   the model's forward pass (`jit(model.apply)`), checked against an analytic count
   (matmuls + attention scores + softmax + the SSM's [l, c, s] element-wise work).
   XLA counts a while loop's body once: the step's while loops are listed (only
   the RNG's threefry loops are expected) and any other one is a MISS.
2. CPU FLOP/s: the train step is run at a small batch and timed, next to a plain
   float32 matmul in the same run (its FLOPs also from cost_analysis).
3. The grid: every cell of `configs/paper.py` (each of `paper.VARIANTS`), from
   `ceu_jax.grid.sweep.expand`, costs num_steps x (train-step FLOPs and bytes), plus
   periodic evaluations and the grid's audits at FWD_PER_AUDITED forwards per example
   and corruption (L+, L−, three patched runs, correctness: an upper bound, the
   engine's patched runs recompute only from the read port on). Device-hours =
   max(FLOPs / peak, bytes / bandwidth) / utilisation (roofline), and FLOPs alone.

4. The ssm against attention (issue #37, item 2): every ssm program uses
   `--scan_impl` (default 'chunked', issue #37 item 2's formulation for
   accelerators and what scan_impl 'auto' picks there since the H200 measured it
   faster, 2026-11-30); `--compare_scan_impl` (default 'associative', 'auto's
   accelerator scan before) repeats the ssm's CER-step bytes and the paper grid with that scan,
   so one run prints both estimates. TARGET lines: the grid's H100 roofline hours,
   all variants, <= 300; the ssm's bytes per compiled
   CER step (p400k, n = 256) over attention's, <= 3.0; and the same ratio of CPU
   step time (interleaved timing, first preset and length), <= 3.0 — the goal of
   the bytes ratio, since a memory-bound scan shows in time too, and the CPU time
   is the one time CI can measure. It times the chunked scan; the CPU's own
   ('linear', what 'auto' runs on the CPU since 2026-11-29; `--time_scan_impls`) is
   printed beside it.

The estimate is an estimate: bytes come from the CPU compiler's fusion decisions,
and these models are narrow (E = 48…160), so on an accelerator they are likely
bandwidth- or launch-bound well below the stated utilisation; measure a few steps
on the target device before budgeting.

Shape legend: B batch, Q query length, N context length, A answer length,
T reader positions, E embed, F MLP width, m passages, l = N/m, c SSM channels, s SSM state.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import numpy as np

import architectures
from ceu_jax import io as io_lib
from ceu_jax.data import tasks
from ceu_jax.train import config as config_lib
from ceu_jax import sharding as sharding_lib
from ceu_jax.train import state as state_lib
from ceu_jax.train import task as task_lib
from configs import paper

# Accelerator peaks (dense, no sparsity) and memory bandwidth, with their sources.
DEVICES = {
    "H100 SXM": dict(flops=989e12, bandwidth=3.35e12,
                     source="NVIDIA H100 Tensor Core GPU datasheet: bf16 dense 989 TFLOP/s, "
                            "HBM3 3.35 TB/s"),
    "TPU v5e": dict(flops=197e12, bandwidth=819e9,
                    source="Google Cloud TPU v5e documentation: bf16 197 TFLOP/s per chip, "
                           "HBM2 819 GB/s"),
}
UTILISATION = 0.30     # conservative model-FLOPs (and bandwidth) utilisation
BYTES_RATIO_GOAL = 3.0  # ssm / attention bytes per compiled CER step (issue #37, item 2)
TIME_RATIO_GOAL = 3.0   # ssm / attention CPU CER-step time (see the module docstring)
GRID_HOURS_GOAL = 300.0  # the paper grid's H100 roofline hours, all variants (issue #37)
FWD_PER_AUDITED = 6    # forwards per audited example and corruption (upper bound)
COST_BATCH = 128       # batch of the compiled programs (the paper's train.batch_size)
# Programs compiled only for their cost analysis skip LLVM's optimisations: the
# analysis reads the optimised HLO, which these options leave unchanged (same
# FLOPs and bytes, about half the compile time on this CPU).
COST_ONLY = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
PRESETS = tuple(architectures.PRESETS)


def _cost(compiled) -> dict:
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return {"flops": float(ca.get("flops", 0.0)), "bytes": float(ca.get("bytes accessed", 0.0))}


def _other_loops(hlo: str) -> list[str]:
  """While loops whose body XLA counts once, other than the RNG's (threefry) loops."""
  loops = [line for line in hlo.splitlines() if " while(" in line]
  rng = ("threefry", "_uniform", "_gumbel", "random_bits", "_normal")
  return [line.strip()[:160] for line in loops if not any(r in line for r in rng)]


# 1. Compiler cost ---------------------------------------------------------------

# The ssm's scan for an accelerator (--scan_impl; 'auto' picks 'chunked' there):
# XLA's cost analysis counts a while loop's body once, so the CPU's step-by-step
# scans ('linear', 'fused') would hide the ssm's per-position work; --compare_scan_impl
# prints the associative scan's numbers too.
ACCELERATOR_MODEL = dict(scan_impl="chunked")


def model_overrides(family: str) -> dict:
  """ACCELERATOR_MODEL for the ssm (the other families have no scan: their programs,
  and so the compiled-program caches, do not depend on it)."""
  return dict(ACCELERATOR_MODEL) if family == "ssm" else {}


def cell_config(preset: str, family: str, n: int, regularizer: str, k: int = 2):
  c = paper.get_config()
  c.model.preset, c.model.family, c.data.context_len = preset, family, n
  c.model.overrides = dict(c.model.get("overrides", None) or {}, **model_overrides(family))
  c.cer.regularizer, c.cer.k = regularizer, k
  c.train.batch_size = COST_BATCH
  return c


def program_key(c) -> str:
  """The fields that determine the train step's program (λ, α, η, δ, seed do not)."""
  cer = c.cer
  return json.dumps([c.model.to_dict(), int(c.data.context_len), int(c.data.num_passages),
                     int(c.train.batch_size), cer.regularizer != "none", int(cer.k),
                     str(cer.grad_path), float(cer.beta_swap) > 0,
                     float(cer.lambda_noret) > 0, str(cer.get("granularity", "span"))],
                    sort_keys=True, default=str)


def _train_step(config, batch_size: int):
  """(jitted step, mesh, rules, task, abstract state) of a validated config."""
  config_lib.validate(config, jax.device_count())
  task = task_lib.build_task(config)
  mesh = sharding_lib.make_mesh(config.sharding)
  rules = sharding_lib.rules(config.sharding)
  bs = sharding_lib.batch_sharding(config.sharding, mesh)
  tx = state_lib.make_optimizer(config.train)
  init_fn = state_lib.boxed_init_fn(task.model, tx, task.dummy_inputs)
  abstract, shardings = sharding_lib.state_layout(init_fn, jax.random.PRNGKey(0), mesh, rules)
  step = state_lib.make_train_step(task.model, tx, task.site, task.loss_cfg,
                                   state_shardings=shardings, batch_sharding=bs,
                                   axis_rules=rules, allow_approximate=task.approximate)
  return step, mesh, rules, task, abstract, (init_fn, shardings, bs)


def train_step_cost(config) -> dict:
  """FLOPs and bytes of one compiled train step at config.train.batch_size."""
  b = int(config.train.batch_size)
  step, mesh, rules, task, abstract, _ = _train_step(config, b)
  batch = jax.eval_shape(lambda: task_lib.train_batch(task, 0, b))
  with sharding_lib.mesh_context(mesh), nn.logical_axis_rules(rules):
    compiled = step.lower(abstract, batch, jax.random.PRNGKey(0)).compile(COST_ONLY)
  return {**_cost(compiled), "batch": b, "other_loops": _other_loops(compiled.as_text())}


def _spec(preset: str, family: str, n: int):
  d = tasks.data_config(paper.get_config().data)
  return architectures.build_model(dict(family=family, preset=preset,
                                        overrides=model_overrides(family)),
                                   vocab_size=d.vocab.size,
                                   context_len=n, num_passages=d.num_passages,
                                   query_len=d.query_len, answer_len=d.answer_len)


def forward_cost(preset: str, family: str, n: int, batch: int = COST_BATCH) -> dict:
  """FLOPs and bytes per example of the compiled forward pass (logits)."""
  model = _spec(preset, family, n)
  params = jax.eval_shape(lambda: architectures.init_params(model, jax.random.PRNGKey(0)))
  x = jax.eval_shape(lambda: architectures.dummy_inputs(model.spec, batch))
  cost = _cost(jax.jit(model.apply).lower(params, *x).compile(COST_ONLY))
  return {"flops": cost["flops"] / batch, "bytes": cost["bytes"] / batch,
          "analytic": analytic_forward_flops(model.spec)}


def analytic_forward_flops(s) -> float:
  """Forward FLOPs per example: 2 per multiply-add, 5 per softmax score, plus the
  SSM's element-wise work on [l, c, s] (gates 4, associative scan ~5, readout 2)."""
  e, n, q, a, v, w = (s.embed_dim, s.context_len, s.query_len, s.answer_len, s.vocab_size,
                      s.mixer_width)
  t = s.reader_len

  def attn_block(tokens, keys, heads, mlp):  # projections, scores + AV, softmax, MLP
    return (2 * tokens * 4 * e * e + 2 * 2 * tokens * keys * e + 5 * heads * tokens * keys
            + 2 * tokens * 2 * e * mlp)

  reader = (s.reader_layers * attn_block(t, t, s.reader_heads, s.reader_mlp_dim)
            + 2 * a * e * v + 2 * w * t * e)
  ports = len(s.retrieval_layers)
  if s.family == "attention":
    r = s.read_heads * s.read_head_dim
    enc = s.enc_layers * attn_block(n, n, s.reader_heads, s.enc_mlp_dim) + 2 * w * n * e
    port = (2 * t * e * r + 2 * 2 * n * e * r + 2 * 2 * t * n * r + 5 * s.read_heads * t * n
            + 2 * t * r * e)
  elif s.family == "memory_port":
    m, d, k = s.num_passages, s.mem_dim, s.mem_slots
    l, p = q + n // m, s.num_passages * s.mem_slots
    enc = s.enc_layers * m * attn_block(l, l, s.reader_heads, s.enc_mlp_dim) + 2 * w * n * e
    port = (2 * 2 * n * e * d + 2 * 2 * k * n * d + 5 * k * s.mem_heads * n   # pooling
            + p * 2 * 2 * d * d                                               # slot MLP
            + 2 * t * e * d + 2 * 2 * p * d * d + 2 * t * p * d + 5 * s.mem_heads * t * p
            + t * p * d + 2 * t * d * e)                                      # read
  else:
    c, st, m = s.ssm_inner, s.ssm_state, s.num_passages
    tq = q + n
    enc = s.enc_layers * (2 * tq * e * 2 * c + 2 * tq * s.ssm_conv * c + 2 * tq * c * c
                          + 2 * 2 * tq * c * st + 2 * tq * c * e + 11 * tq * c * st) \
        + 2 * w * tq * e
    port = (2 * 2 * n * e * c + 2 * n * c * c + 2 * n * c * st + 9 * n * c * st
            + 2 * m * n * c * st + 2 * t * e * st + 2 * t * m * c * st + 2 * t * c * e)
  return float(reader + enc + ports * port)


# 2. FLOP/s on this CPU --------------------------------------------------------

def _median_time(fn, reps: int) -> float:
  jax.block_until_ready(fn())
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def matmul_rate(size: int, reps: int) -> dict:
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (size, size), jnp.float32)
  compiled = jax.jit(jnp.matmul).lower(a, b).compile()
  flops = _cost(compiled)["flops"]
  seconds = _median_time(lambda: compiled(a, b), reps)
  return {"flops": flops, "analytic": 2.0 * size ** 3, "seconds": seconds,
          "rate": flops / seconds}


def train_step_program(preset: str, family: str, n: int, batch: int):
  """(run, FLOPs) of the real CER train step (k = 2) at a small batch, compiled and
  warmed up; run() takes one step."""
  config = cell_config(preset, family, n, "evidence")
  config.train.batch_size = batch
  step, mesh, rules, task, _, (init_fn, shardings, bs) = _train_step(config, batch)
  rng = jax.random.PRNGKey(0)
  state = sharding_lib.init_sharded(init_fn, rng, shardings, mesh, rules)
  tb = sharding_lib.shard_batch(task_lib.train_batch(task, 0, batch), bs)
  with sharding_lib.mesh_context(mesh), nn.logical_axis_rules(rules):
    compiled = step.lower(state, tb, rng).compile()
  holder = [state]

  def run():
    holder[0], metrics = compiled(holder[0], tb, rng)
    return metrics
  jax.block_until_ready(run())
  return run, _cost(compiled)["flops"]


def train_step_rates(programs: dict, reps: int) -> dict:
  """{name: seconds, flops, rate} of compiled steps (name -> (run, flops)), timed in
  interleaved rounds (one step of each per round; median), so that background load
  hits all of them alike."""
  times = {name: [] for name in programs}
  for _ in range(reps):
    for name, (run, _) in programs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(run())
      times[name].append(time.perf_counter() - t0)
  out = {}
  for name, (_, flops) in programs.items():
    seconds = statistics.median(times[name])
    out[name] = {"flops": flops, "seconds": seconds, "rate": flops / seconds}
  return out


# 3. The grid ------------------------------------------------------------------

def grid_cells(variant: str):
  from ceu_jax.grid import sweep  # pylint: disable=g-import-not-at-top
  return sweep.expand(paper.get_config(variant))


def cell_cost(c, step_cost, fwd_cost) -> dict:
  """FLOPs and bytes of one cell: train steps, periodic evaluations, the grid's audits."""
  from ceu_jax.grid import cell as cell_lib  # pylint: disable=g-import-not-at-top
  batch = int(c.train.batch_size)
  c = copy.deepcopy(c)
  c.train.batch_size = COST_BATCH
  with c.model.unlocked():
    c.model.overrides = dict(c.model.get("overrides", None) or {},
                             **model_overrides(c.model.family))
  sc = step_cost(c)
  steps, every = int(c.train.num_steps), int(c.train.eval_every)
  evals = (steps // every + (steps % every != 0)) if every else 0
  family, preset, n = c.model.family, c.model.preset, int(c.data.context_len)
  fwd = fwd_cost(preset, family, n)
  per_eval = int(c.eval.num_examples) * len(c.eval.corruptions) * FWD_PER_AUDITED
  out = {}
  for q in ("flops", "bytes"):
    out[f"train_{q}"] = steps * sc[q] * batch / COST_BATCH
    out[f"eval_{q}"] = evals * per_eval * fwd[q]
    out[f"audit_{q}"] = sum(
        int(c.eval.num_examples) * FWD_PER_AUDITED
        * fwd_cost(preset, family, int(d.context_len))[q]
        for _, d in cell_lib.test_conditions(c))
    out[q] = out[f"train_{q}"] + out[f"eval_{q}"] + out[f"audit_{q}"]
  return out


def device_hours(flops: float, nbytes: float) -> dict:
  """{device: {roofline_h, compute_bound_h}} of work with these FLOPs and bytes."""
  out = {}
  for name, d in DEVICES.items():
    compute = flops / (d["flops"] * UTILISATION) / 3600
    memory = nbytes / (d["bandwidth"] * UTILISATION) / 3600
    out[name] = {"compute_bound_h": compute, "roofline_h": max(compute, memory)}
  return out


def grid_cost(cells, step_cost, fwd_cost) -> dict:
  """Per family and in total: FLOPs, bytes and device-hours (roofline summed per cell).

  A cell that its own config validation rejects is counted under `invalid`.
  """
  keys = [f"{p}_{q}" for p in ("train", "eval", "audit") for q in ("flops", "bytes")]
  zero = lambda: {**{k: 0.0 for k in keys + ["flops", "bytes"]}, "cells": 0,
                  "hours": {d: {"compute_bound_h": 0.0, "roofline_h": 0.0} for d in DEVICES}}
  out, invalid = {"total": zero()}, []
  for cell in cells:
    try:
      cost = cell_cost(cell.config, step_cost, fwd_cost)
    except ValueError as e:
      invalid.append(f"cell {cell.index} ({cell.label()}): {e}")
      continue
    hours = device_hours(cost["flops"], cost["bytes"])
    for group in ("total", cell.config.model.family):
      agg = out.setdefault(group, zero())
      for k in keys + ["flops", "bytes"]:
        agg[k] += cost[k]
      agg["cells"] += 1
      for d, h in hours.items():
        for k, v in h.items():
          agg["hours"][d][k] += v
  out["invalid"] = invalid
  return out


def _target(name: str, value: float, op: str, goal: float) -> str:
  ok = value <= goal if op == "<=" else value >= goal
  return f"TARGET {name} {value:.3f} {op} {goal} {'PASS' if ok else 'MISS'}"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser()
  ap.add_argument("--presets", default=paper.get_config().model.preset,
                  help=f"comma-separated, of {PRESETS} (default: configs/paper.py's)")
  ap.add_argument("--families", default=",".join(architectures.FAMILIES))
  ap.add_argument("--lengths", default="256,512", help="n of the per-preset table")
  ap.add_argument("--matmul", type=int, default=2048, help="size of the reference matmul")
  ap.add_argument("--time_batch", type=int, default=8, help="batch of the timed train step")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--no_grid", action="store_true", help="skip the paper-grid estimate")
  ap.add_argument("--scan_impl", default=ACCELERATOR_MODEL["scan_impl"],
                  choices=("chunked", "associative", "sequential"),
                  help="the ssm's scan_impl for every compiled program (the accelerator's)")
  ap.add_argument("--compare_scan_impl", default="associative",
                  help="also the ssm's CER-step bytes and the paper grid with this scan_impl "
                       "(before issue #37: associative); '' to skip")
  ap.add_argument("--time_scan_impls", default="linear",
                  help="comma-separated: also time the ssm's CPU train step with these "
                       "scan_impls (linear: what 'auto' runs on CPU); '' for none")
  ap.add_argument("--json", default="", help="also write the results here (atomically)")
  args = ap.parse_args(argv)
  presets, families = args.presets.split(","), args.families.split(",")
  lengths = [int(v) for v in args.lengths.split(",")]
  bad = [p for p in presets if p not in PRESETS] + [f for f in families
                                                     if f not in architectures.FAMILIES]
  if bad:
    raise SystemExit(f"--presets must be in {PRESETS} and --families in "
                     f"{architectures.FAMILIES}, got {bad}")
  ACCELERATOR_MODEL["scan_impl"] = args.scan_impl
  print(f"devices: {jax.devices()}  cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f}  "
        f"cost batch {COST_BATCH}  ssm scan_impl {args.scan_impl}", flush=True)
  steps, fwds, out = {}, {}, {"presets": {}, "scan_impl": args.scan_impl}

  def step_cost(c):
    key = program_key(c)
    if key not in steps:
      t0 = time.perf_counter()
      steps[key] = train_step_cost(c)
      print(f"  compiled train step {c.model.family}/{c.model.preset} n={c.data.context_len} "
            f"{c.cer.regularizer} k={c.cer.k} in {time.perf_counter() - t0:.0f} s", flush=True)
    return steps[key]

  def fwd_cost(preset, family, n):
    key = (preset, family, n, json.dumps(model_overrides(family), sort_keys=True))
    if key not in fwds:
      fwds[key] = forward_cost(preset, family, n)
    return fwds[key]

  mm = matmul_rate(args.matmul, args.reps)
  print(f"matmul {args.matmul}^3 float32: {mm['flops'] / 1e9:.2f} GFLOP (2·M·K·N = "
        f"{mm['analytic'] / 1e9:.2f}), {1e3 * mm['seconds']:.1f} ms, "
        f"{mm['rate'] / 1e9:.1f} GFLOP/s", flush=True)
  print(f"\n{'preset':<7} {'family':<12} {'n':>5} {'objective':<9} {'GFLOP/ex':>9} "
        f"{'MB/ex':>8} {'fwd GFLOP/ex':>12} {'analytic':>9} {'ratio':>6}")
  ratios, loops = {}, []
  for preset in presets:
    for family in families:
      for n in lengths:
        f = fwd_cost(preset, family, n)
        ratio = f["flops"] / f["analytic"]
        ratios[(preset, family, n)] = ratio
        for reg in ("none", "evidence"):
          sc = step_cost(cell_config(preset, family, n, reg))
          loops += sc["other_loops"]
          print(f"{preset:<7} {family:<12} {n:>5} {reg if reg != 'none' else 'plain':<9} "
                f"{sc['flops'] / sc['batch'] / 1e9:>9.3f} {sc['bytes'] / sc['batch'] / 1e6:>8.1f} "
                f"{f['flops'] / 1e9:>12.4f} {f['analytic'] / 1e9:>9.4f} {ratio:>6.2f}",
                flush=True)
          out["presets"][f"{preset}/{family}/{n}/{reg}"] = dict(
              step_flops_per_example=sc["flops"] / sc["batch"],
              step_bytes_per_example=sc["bytes"] / sc["batch"],
              forward_flops_per_example=f["flops"], analytic_forward_flops=f["analytic"])

  # The ssm's CER-step bytes against attention's (TARGET), and with the old scan.
  bytes_ratio = {}
  if "ssm" in families and "attention" in families:
    per_ex = lambda c: step_cost(c)["bytes"] / step_cost(c)["batch"]
    att = per_ex(cell_config("p400k", "attention", 256, "evidence"))
    for impl in dict.fromkeys([args.scan_impl] + [v for v in [args.compare_scan_impl] if v]):
      ACCELERATOR_MODEL["scan_impl"] = impl
      bytes_ratio[impl] = per_ex(cell_config("p400k", "ssm", 256, "evidence")) / att
      print(f"p400k n=256 CER step bytes, ssm ({impl}) / attention: "
            f"{att * bytes_ratio[impl] / 1e6:,.1f} / {att / 1e6:,.1f} MB per example = "
            f"{bytes_ratio[impl]:.2f}", flush=True)
    ACCELERATOR_MODEL["scan_impl"] = args.scan_impl
  out["ssm_over_attention_cer_step_bytes_p400k_n256"] = bytes_ratio

  preset, n = time_at = presets[0], lengths[0]
  print(f"\nCPU: real CER train step (k = 2, batch {args.time_batch}, {preset} n={n}) vs the "
        f"matmul; interleaved rounds, median of {args.reps}")
  programs = {}
  timed = [(f, args.scan_impl if f == "ssm" else None) for f in families]
  if "ssm" in families:
    timed += [("ssm", v) for v in args.time_scan_impls.split(",") if v and v != args.scan_impl]
  for family, impl in timed:
    if impl:
      ACCELERATOR_MODEL["scan_impl"] = impl
    t0 = time.perf_counter()
    name = family if impl in (None, args.scan_impl) else f"{family}/{impl}"
    programs[name] = train_step_program(preset, family, n, args.time_batch)
    print(f"  compiled {name} in {time.perf_counter() - t0:.0f} s", flush=True)
  ACCELERATOR_MODEL["scan_impl"] = args.scan_impl
  rates = train_step_rates(programs, args.reps)
  for name, r in rates.items():
    print(f"  {name:<12} {r['flops'] / 1e9:.2f} GFLOP/step, "
          f"{1e3 * r['seconds']:.0f} ms, {r['rate'] / 1e9:.1f} GFLOP/s = "
          f"{100 * r['rate'] / mm['rate']:.0f}% of the matmul's", flush=True)
  print(f"  (load average {os.getloadavg()[0]:.2f})")
  out.update(matmul=mm, cpu_rates=rates)

  grids = [args.scan_impl] + [v for v in [args.compare_scan_impl] if v and v != args.scan_impl]
  grid_hours = None
  for impl in grids if not args.no_grid else []:
    ACCELERATOR_MODEL["scan_impl"] = impl
    print(f"\nPaper grid (configs/paper.py) at utilisation {UTILISATION:.0%} (assumed), "
          f"ssm scan_impl {impl}:")
    for name, d in DEVICES.items():
      print(f"  {name}: {d['source']}")
    out["grid" if impl == args.scan_impl else f"grid_{impl}"] = grid_out = {}
    for variant in paper.VARIANTS:
      try:
        cells = grid_cells(variant)
      except ValueError as e:  # printed, never hidden
        print(f"  {variant:<11} skipped: configs/paper.py:{variant} does not expand: {e}")
        grid_out[variant] = {"error": str(e)}
        continue
      g = grid_cost(cells, step_cost, fwd_cost)
      grid_out[variant] = g
      print(f"  {variant}: {len(cells)} cells"
            + (f", {len(g['invalid'])} rejected by validation, e.g. {g['invalid'][0]}"
               if g["invalid"] else ""))
      for group in [k for k in g if k not in ("invalid",)]:
        r = g[group]
        if not r["cells"]:
          continue
        share = "/".join(f"{r[f'{p}_flops'] / r['flops']:.1%}" for p in ("train", "eval", "audit"))
        print(f"    {group:<12} {r['cells']:>4} cells {r['flops'] / 1e18:8.3f} EFLOP "
              f"{r['bytes'] / 1e18:8.3f} EB (train/eval/audit FLOPs {share}); " + "; ".join(
                  f"{d}: {h['roofline_h']:,.0f} h roofline, {h['compute_bound_h']:,.1f} h "
                  f"FLOPs only" for d, h in r["hours"].items()), flush=True)
    total = sum(g["total"]["hours"]["H100 SXM"]["roofline_h"] for g in grid_out.values()
                if "total" in g)
    print(f"  all variants, ssm scan_impl {impl}: {total:,.0f} H100-hours (roofline)")
    grid_out["h100_roofline_h"] = total
    if impl == args.scan_impl:
      grid_hours = total
  ACCELERATOR_MODEL["scan_impl"] = args.scan_impl
  print("  (estimate: see the module docstring for what it leaves out)")

  print()
  print(_target("matmul_flops_over_2mkn", mm["flops"] / mm["analytic"], "<=", 1.01))
  for (preset, family, n), r in sorted(ratios.items()):
    print(_target(f"forward_flops_compiler_vs_analytic_{preset}_{family}_n{n}",
                  max(r, 1 / r), "<=", 2.0))
  print(_target("uncounted_while_loops_in_train_steps", len(set(loops)), "<=", 0))
  if grid_hours is not None:
    print(_target("paper_grid_h100_roofline_hours", grid_hours, "<=", GRID_HOURS_GOAL))
  if args.scan_impl in bytes_ratio:
    print(_target("ssm_over_attention_cer_step_bytes_p400k_n256", bytes_ratio[args.scan_impl],
                  "<=", BYTES_RATIO_GOAL))
  if "ssm" in rates and "attention" in rates:
    print(_target("ssm_over_attention_cer_step_time_cpu_{}_n{}".format(*time_at),
                  rates["ssm"]["seconds"] / rates["attention"]["seconds"], "<=", TIME_RATIO_GOAL))
  if args.json:
    io_lib.write_json_atomic(args.json, json.loads(json.dumps(out, default=str)))
  return out


if __name__ == "__main__":
  main()
