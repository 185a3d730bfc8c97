r"""Step time of plain training vs CER with k = 1, 2, 3 probes (issue #5, item 7).

  python -m benchmarks.train_bench                       # configs/atr_insert.py:tiny
  python -m benchmarks.train_bench --config=configs/atr_insert.py:tiny,family=ssm \
      --steps=20 --rounds=5
  python -m benchmarks.train_bench --config=configs/atr_insert.py:base,family=ssm \
      --scan_impl=chunked          # the ssm with another selective scan than 'auto'

Each variant is the real jitted `train_step` (same model, optimizer, batch) with
`cer.regularizer` none (plain), evidence (k = 1) or evidence_distractor (k = 2,
3). After compiling, the variants are timed in interleaved rounds of `--steps`
steps each (so that background load hits all of them alike) and the median
per-step time is reported with its ratio to plain. SPEC §4 expects about
(2 + k) forwards per example for CER against 1 for plain training; the CER loss
records the port in the forward on D+ that gives L+ and EM, so D+ runs once.
The last line is `TARGET cer_k3_step_ratio_<family> <x> <= <goal> PASS|MISS`, the
goal per family from issue #37 (`GOALS`; `--target` overrides it).

SmolLM2 fine-tuning (issue #21): `--smollm2=cpu` (an argument of
configs/smollm2_cer.py) times the loop's step of `ceu_jax.finetune.task` on
SmolLM2-135M with LoRA: plain (cer.regularizer none), CER at k = 3 by the causal
tail (`model.cer_path` tail) and CER at k = 3 by full recompute (cer_path full),
and ends with `TARGET cer_step_cost_k3 <x> <= 3.0 PASS|MISS` (tail / plain).
  python -m benchmarks.train_bench --smollm2=cpu --steps=2 --rounds=3
"""
from __future__ import annotations

import copy
import statistics
import time

import jax
from absl import app, flags
from ml_collections import config_flags

from ceu_jax.train import config as config_lib
from ceu_jax import sharding as sharding_lib
from ceu_jax.train import state as state_lib
from ceu_jax.train import task as task_lib

VARIANTS_ALL = (("plain", "none", 1), ("cer_k1", "evidence", 1),
                ("cer_k2", "evidence_distractor", 2), ("cer_k3", "evidence_distractor", 3))

# CER k = 3 / plain step-time goals per family (issue #37, item 3); others: DEFAULT_GOAL.
GOALS = {"attention": 2.5, "memory_port": 2.5, "ssm": 3.0}
DEFAULT_GOAL = 3.0

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/atr_insert.py:tiny", "Config file.",
                                lock_config=False)
flags.DEFINE_integer("steps", 10, "Timed steps per variant per round.")
flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds.")
flags.DEFINE_float("target", None, "Target CER(k=3) / plain step-time ratio (default: "
                   f"the family's goal, {GOALS}, else {DEFAULT_GOAL}; SmolLM2: {DEFAULT_GOAL}).")
flags.DEFINE_list("variants", [v[0] for v in VARIANTS_ALL],
                  "Variants to time (plain is always timed: the ratios are to it).")
flags.DEFINE_string("smollm2", "", "configs/smollm2_cer.py argument (e.g. 'cpu'): time "
                    "SmolLM2 fine-tuning steps instead of --config's model.")
flags.DEFINE_string("scan_impl", "", "ssm only: the selective scan to time (model override "
                    "scan_impl, one of architectures.spec.SCAN_IMPLS; default: the model's, "
                    "'auto'), e.g. 'associative' on an accelerator where 'auto' runs "
                    "'chunked'.")


def build_variant(config, regularizer: str, k: int):
  """(train_step, state, batch, rng) of one variant, compiled and warmed up."""
  config = copy.deepcopy(config)
  config.cer.regularizer, config.cer.k = regularizer, k
  config_lib.validate(config, jax.device_count())
  task = task_lib.build_task(config)
  mesh = sharding_lib.make_mesh(config.sharding)
  rules = sharding_lib.rules(config.sharding)
  batch_sharding = sharding_lib.batch_sharding(config.sharding, mesh)
  tx = state_lib.make_optimizer(config.train)
  init_fn = state_lib.boxed_init_fn(task.model, tx, task.dummy_inputs)
  rng = jax.random.PRNGKey(0)
  _, shardings = sharding_lib.state_layout(init_fn, rng, mesh, rules)
  state = sharding_lib.init_sharded(init_fn, rng, shardings, mesh, rules)
  step = state_lib.make_train_step(task.model, tx, task.site, task.loss_cfg,
                                   state_shardings=shardings, batch_sharding=batch_sharding,
                                   axis_rules=rules, allow_approximate=task.approximate)
  batch = sharding_lib.shard_batch(task_lib.train_batch(task, 0, int(config.train.batch_size)),
                                   batch_sharding)
  state, metrics = step(state, batch, rng)       # compile
  jax.block_until_ready(metrics)
  return [step, state, batch, rng]


def time_steps(variant: list, n: int) -> float:
  step, state, batch, rng = variant
  jax.block_until_ready(state)
  start = time.perf_counter()
  for _ in range(n):
    state, metrics = step(state, batch, rng)
  jax.block_until_ready((state, metrics))
  variant[1] = state
  return (time.perf_counter() - start) / n


SMOLLM2_VARIANTS = (("plain", "none", "tail"), ("cer_k3", "evidence_distractor", "tail"),
                    ("cer_k3_full", "evidence_distractor", "full"))


def build_smollm2_variants(arg: str) -> dict:
  """name -> [train_step, state, batch, rng] of the SmolLM2 fine-tuning variants, warmed up."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from ceu_jax.finetune import task as cer_task  # pylint: disable=g-import-not-at-top
  from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
  from configs import smollm2_cer  # pylint: disable=g-import-not-at-top
  config = smollm2_cer.get_config(arg)
  config.data.max_items = 300          # enough pairs for one batch; pairs are not timed
  task = cer_task.SmolLM2CERTask.from_config(config)
  print(f"SmolLM2 {task.model_config.n_layers} layers, LoRA r={config.lora.rank} "
        f"(full={config.lora.full}), batch {config.train.batch_size} x {config.data.max_len} "
        f"tokens, n_tail {config.data.max_answer_tokens}, read port layer "
        f"{config.model.read_layer}")
  out = {}
  for name, reg, path in SMOLLM2_VARIANTS:
    t0 = time.perf_counter()
    c = copy.deepcopy(config)
    c.cer.regularizer, c.cer.k, c.model.cer_path = reg, 3, path
    t = dataclasses.replace(task, config=c)
    tx = state_lib.make_optimizer(c.train)
    rng = jax.random.PRNGKey(0)
    state = jax.jit(loop.custom_init_fn(t, tx))(rng)
    step = state_lib.make_train_step(None, tx, None, None, loss_fn=t.loss, frozen=t.frozen)
    batch = t.train_batch(0, int(c.train.batch_size))
    state, metrics = step(state, batch, rng)
    jax.block_until_ready(metrics)
    out[name] = [step, state, batch, rng]
    print(f"compiled {name} in {time.perf_counter() - t0:.1f} s", flush=True)
  return out


def smollm2_main() -> None:
  variants = build_smollm2_variants(FLAGS.smollm2)
  times = {name: [] for name in variants}
  for _ in range(FLAGS.rounds):
    for name, v in variants.items():
      times[name].append(time_steps(v, FLAGS.steps))
  med = {name: statistics.median(ts) for name, ts in times.items()}
  print(f"{'variant':<12} {'s/step':>8} {'ratio':>6}  (median of {FLAGS.rounds} rounds x "
        f"{FLAGS.steps} steps)")
  for name in variants:
    print(f"{name:<12} {med[name]:8.3f} {med[name] / med['plain']:6.2f}")
  print(f"causal tail vs full recompute at k = 3: {med['cer_k3_full'] / med['cer_k3']:.2f}x "
        "faster")
  ratio = med["cer_k3"] / med["plain"]
  goal = DEFAULT_GOAL if FLAGS.target is None else FLAGS.target
  verdict = "PASS" if ratio <= goal else "MISS"
  print(f"TARGET cer_step_cost_k3 {ratio:.2f} <= {goal:.1f} {verdict}")


def main(argv) -> None:
  del argv
  if FLAGS.smollm2:
    smollm2_main()
    return
  config = with_scan_impl(FLAGS.config, FLAGS.scan_impl)
  scan = f"; scan {FLAGS.scan_impl}" if FLAGS.scan_impl else ""
  print(f"device: {jax.devices()[0].platform} x{jax.device_count()}; model "
        f"{config.model.family}/{config.model.preset} bypass={config.model.bypass}{scan}; "
        f"batch {config.train.batch_size}; context {config.data.context_len}")
  chosen = [v for v in VARIANTS_ALL if v[0] == "plain" or v[0] in FLAGS.variants]
  unknown = set(FLAGS.variants) - {v[0] for v in VARIANTS_ALL}
  if unknown:
    raise app.UsageError(f"--variants: unknown {sorted(unknown)}; choose from "
                         f"{[v[0] for v in VARIANTS_ALL]}")
  variants = {}
  for name, reg, k in chosen:
    t0 = time.perf_counter()
    variants[name] = build_variant(config, reg, k)
    print(f"compiled {name} in {time.perf_counter() - t0:.1f} s", flush=True)
  times = {name: [] for name in variants}
  for _ in range(FLAGS.rounds):
    for name, v in variants.items():
      times[name].append(time_steps(v, FLAGS.steps))
  med = {name: statistics.median(ts) for name, ts in times.items()}
  print(f"{'variant':<8} {'ms/step':>9} {'ratio':>6}  (median of {FLAGS.rounds} rounds x "
        f"{FLAGS.steps} steps)")
  for name, _, k in chosen:
    print(f"{name:<8} {1e3 * med[name]:9.2f} {med[name] / med['plain']:6.2f}"
          + ("" if name == "plain" else f"  (SPEC ~{2 + k} forwards vs 1)"))
  if "cer_k3" in med:
    print(target_line(config.model.family, med["cer_k3"] / med["plain"], FLAGS.target))


def with_scan_impl(config, scan_impl: str):
  """`config` with the ssm's scan_impl overridden ('' leaves it alone); refuses another
  family or an unknown scan before anything compiles."""
  if not scan_impl:
    return config
  from architectures import SCAN_IMPLS  # pylint: disable=g-import-not-at-top
  if config.model.family != "ssm":
    raise app.UsageError(f"--scan_impl: the ssm family's option; model.family is "
                         f"{config.model.family!r}")
  if scan_impl not in SCAN_IMPLS:
    raise app.UsageError(f"--scan_impl must be one of {list(SCAN_IMPLS)}, got "
                         f"{scan_impl!r}")
  config = copy.deepcopy(config)
  with config.unlocked():
    config.model.overrides = dict(config.model.get("overrides", None) or {},
                                  scan_impl=scan_impl)
  return config


def target_line(family: str, ratio: float, target: float | None = None) -> str:
  """`TARGET cer_k3_step_ratio_<family> <ratio> <= <goal> PASS|MISS`."""
  goal = GOALS.get(family, DEFAULT_GOAL) if target is None else target
  verdict = "PASS" if ratio <= goal else "MISS"
  return f"TARGET cer_k3_step_ratio_{family} {ratio:.2f} <= {goal:.1f} {verdict}"


if __name__ == "__main__":
  app.run(main)
