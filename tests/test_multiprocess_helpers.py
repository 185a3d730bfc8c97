"""Launch N local processes that join one JAX cluster (localhost coordinator).

Each process gets `devices` fake CPU devices (XLA_FLAGS, set before jax starts)
and the cluster flags --coordinator_address / --num_processes / --process_id;
their output goes to files (no pipe can fill up), and a process still running
at the timeout is killed together with the others.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A compile-bound test subprocess compiles with most XLA optimisations off plus the options
# of tests/conftest.py FAST_COMPILE_OPTIONS (XLA's CPU loop emitters, codegen in one piece;
# a tiny training run 26.7 -> 16.1 CPU-s, the same metrics). They change float rounding, so
# such a run is only compared with other runs of the test (bit identities, 1 vs 8 devices
# at 1e-5), never with a number a user sees.
FAST_COMPILE_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false "
                          "--xla_cpu_parallel_codegen_split_count=1")


def fast_compile_env(env: dict) -> dict:
  """`env` with the fast-compile settings of a test subprocess (see above) added."""
  flags = f"{env.get('XLA_FLAGS', '')} {FAST_COMPILE_XLA_FLAGS}".strip()
  return dict(env, JAX_DISABLE_MOST_OPTIMIZATIONS="1", XLA_FLAGS=flags)


def subprocess_xla_flags(devices: int) -> str:
  """XLA_FLAGS of a subprocess with `devices` fake CPU devices: this process's XLA_FLAGS
  (a user's settings are kept) plus the device count."""
  count = f"--xla_force_host_platform_device_count={devices}" if devices > 1 else ""
  return f"{os.environ.get('XLA_FLAGS', '')} {count}".strip()


@dataclasses.dataclass
class Finished:
  returncode: int
  stdout: str
  stderr: str


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def env_for(devices: int, cache_dir: str | None = None, fast_compile: bool = False,
            **extra: str) -> dict:
  """The environment of a test subprocess: this repo importable, CPU with `devices` fake
  devices, no inherited cluster variables, JAX's persistent cache in `cache_dir` (every
  program cached), most XLA optimisations off if `fast_compile` (compile-bound runs, as
  `tests.conftest.fast_compile`), then `extra`."""
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = subprocess_xla_flags(devices)   # inherited XLA_FLAGS + fake devices
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "SLURM_NTASKS",
            "OMPI_COMM_WORLD_SIZE"):
    env.pop(k, None)
  if cache_dir:
    env.update(JAX_COMPILATION_CACHE_DIR=cache_dir,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  if fast_compile:
    env = fast_compile_env(env)
  env.update(extra)
  return env


def launch(argv: list[str], log_dir: str, *, processes: int = 2, devices: int = 4,
           cache_dir: str | None = None, timeout: float = 900, tag: str = "run",
           fast_compile: bool = False) -> list[Finished]:
  """Run `python <argv> --coordinator_address=localhost:<port> --num_processes=N
  --process_id=i` for i < N; returns each process's outcome (rc -9 if killed at the
  timeout). fast_compile: most XLA optimisations off (compile-bound runs)."""
  port = free_port()
  os.makedirs(log_dir, exist_ok=True)
  procs, files = [], []
  for i in range(processes):
    out = open(os.path.join(log_dir, f"{tag}.p{i}.out"), "w+")
    err = open(os.path.join(log_dir, f"{tag}.p{i}.err"), "w+")
    files.append((out, err))
    cmd = [sys.executable, *argv, f"--coordinator_address=localhost:{port}",
           f"--num_processes={processes}", f"--process_id={i}"]
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env_for(devices, cache_dir, fast_compile),
                                  stdout=out, stderr=err))
  deadline = time.time() + timeout
  for p in procs:
    try:
      p.wait(timeout=max(deadline - time.time(), 1))
    except subprocess.TimeoutExpired:
      for q in procs:
        if q.poll() is None:
          q.kill()
      for q in procs:
        q.wait()
      break
  results = []
  for p, (out, err) in zip(procs, files):
    out.seek(0)
    err.seek(0)
    results.append(Finished(p.returncode, out.read(), err.read()))
    out.close()
    err.close()
  return results


def describe_all(results: list[Finished]) -> str:
  return "\n".join(f"--- process {i}: rc={r.returncode}\n{r.stderr[-2500:]}"
                   for i, r in enumerate(results))


def load_state_here(workdir: str, step: int) -> dict:
  """A checkpoint's train state as host numpy arrays on this (one-device) process,
  whatever mesh or processes saved it (the stored shardings are ignored)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  path = epath.Path(workdir) / "checkpoints" / str(step) / "state"
  meta = ocp.StandardCheckpointHandler().metadata(path)
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                          getattr(meta, "tree", meta))
  with ocp.StandardCheckpointer() as ckptr:
    return jax.tree.map(np.asarray, ckptr.restore(path, abstract))
