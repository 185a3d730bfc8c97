"""How fast is this host today: three fixed workloads, to read wall times measured on
different days (or CI runners) against each other.

  python -m benchmarks.host_bench            # about 15 s
  python -m benchmarks.host_bench --reps 1   # a smoke run

The project's time goals (the main job, the test suite) are wall times "on this 2-core
machine", but one 2-core virtual machine is not always as fast as another: the same code's
test suite took 14:46 on one session's host and 29:03 on a later session's (docs/tests.md). Run
this beside a timing and quote its numbers with it. The four workloads are the suite's
four kinds of work:

  compile   XLA:CPU compiling one fixed program (a small scanned MLP's loss and
            gradients), a fresh function each rep so nothing is cached: seconds (median)
  matmul    a jitted float32 (1024 x 1024) @ (1024 x 1024), XLA's threads: GFLOP/s (median)
  python    a fixed pure-Python loop: ns per iteration (median)
  start     a fresh Python process importing the training entry point (`import
            experiments.train`: jax, flax, orbax, the library), as every entry point and
            each of the ~100 Python processes of a test-suite run does: CPU seconds, user +
            system (median).
            Unlike the others it also moves with the installed packages: ml-dtypes 0.7.0
            alone added 0.6 s to it (pyproject.toml pins < 0.7).

No targets: the lines are `HOST <name> <value> <unit>`, after one line naming the CPU,
its core count and the JAX version. Lower compile, python and start, higher matmul, is faster.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import ceu_jax  # noqa: F401  (the library's XLA:CPU settings, before JAX starts)
from ceu_jax import code_version
import jax
import jax.numpy as jnp
import numpy as np


def _program():
  """A fresh loss-and-gradients function (a new Python object, so jit caches nothing):
  an 8-step scanned 2-layer MLP of width 128 with a softmax cross-entropy."""
  def loss(w1, w2, x, y):
    def step(h, _):
      h = jnp.tanh(h @ w1) @ w2 + h
      return h, jnp.mean(h ** 2)
    h, aux = jax.lax.scan(step, x, None, length=8)
    logp = jax.nn.log_softmax(h)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], 1)) + 1e-3 * aux.sum()
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def compile_seconds(reps: int) -> float:
  """Median wall seconds to lower and compile `_program` (persistent cache off)."""
  w = jnp.zeros((128, 128), jnp.float32)
  x, y = jnp.zeros((16, 128), jnp.float32), jnp.zeros((16,), jnp.int32)
  was = jax.config.jax_enable_compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  try:
    out = []
    for _ in range(reps):
      t = time.perf_counter()
      _program().lower(w, w, x, y).compile()
      out.append(time.perf_counter() - t)
  finally:
    jax.config.update('jax_enable_compilation_cache', was)
  return statistics.median(out)


def matmul_gflops(reps: int, n: int = 1024) -> float:
  """Median GFLOP/s of a jitted float32 n x n matmul (compiled first)."""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
  f = jax.jit(lambda p, q: p @ q)
  f(a, a).block_until_ready()
  out = []
  for _ in range(5 * reps):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    out.append(time.perf_counter() - t)
  return 2 * n ** 3 / statistics.median(out) / 1e9


def python_ns(reps: int, n: int = 2_000_000) -> float:
  """Median ns per iteration of a fixed pure-Python loop."""
  out = []
  for _ in range(reps):
    t = time.perf_counter()
    acc = 0
    for i in range(n):
      acc += i * i % 7
    out.append((time.perf_counter() - t) / n * 1e9)
  return statistics.median(out)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_cpu_seconds(reps: int) -> float:
  """Median CPU seconds (user + system) of a fresh `python -c 'import experiments.train'`."""
  out = []
  for _ in range(reps):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, '-c', 'import experiments.train'], cwd=ROOT, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
  return statistics.median(out)


def measure(reps: int) -> dict:
  """{name: (value, unit)} of the four workloads (module doc)."""
  return {'compile': (compile_seconds(reps), 's'),
          'matmul': (matmul_gflops(reps), 'GFLOP/s'),
          'python': (python_ns(reps), 'ns/iter'),
          'start': (start_cpu_seconds(reps), 'CPU-s')}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--reps', type=int, default=5, help='repetitions per workload (>= 1)')
  a = p.parse_args(argv)
  if a.reps < 1:
    p.error(f'--reps must be >= 1, got {a.reps}')
  print(f'HOST cpu "{code_version.cpu_model()}" cores {os.cpu_count()} jax {jax.__version__} '
        f'backend {jax.default_backend()}', flush=True)
  for name, (value, unit) in measure(a.reps).items():
    print(f'HOST {name} {value:.3f} {unit}', flush=True)


if __name__ == '__main__':
  main()
