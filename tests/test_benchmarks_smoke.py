"""Every benchmark runs in CI (issue #37, item 6): each script in a smoke mode — tiny
shapes, one round, most XLA optimisations off — must exit 0 and end with well-formed
`TARGET <name> <measured> <op> <goal> PASS|MISS` lines, so that a refactor cannot break a
benchmark silently. The numbers of a smoke run mean nothing (a MISS is fine here).

Covered elsewhere: train_bench, audit_bench --quick, decode_bench and one main-job cell
(tests/test_accelerator_check.py, its tiny run); engine_chunk_bench
(tests/test_engine_chunk_bench.py); audit_bench's main (tests/test_audit_bench.py).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.test_multiprocess_helpers import fast_compile_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = re.compile(r"^TARGET [\w.\-]+ [+\-]?\d+(\.\d+)?(e[+\-]?\d+)? (<=|>=) \d+(\.\d+)? (PASS|MISS)$")

SMOKE = {   # benchmark -> the smoke run's arguments
    "data_bench": ["--n", "64", "--batch_size", "64", "--jax_batches", "1",
                   "--reference_examples", "16"],
    "arch_bench": ["--preset", "p100k", "--batch", "1", "--reps", "1", "--lengths", "16,32",
                   "--passage_len", "8"],
    # one family: the compiled CER-step costs are the expensive part (tests/test_scale_bench.py
    # checks the cost accounting of every family on stubbed and small inputs)
    "scale_bench": ["--presets", "p100k", "--families", "memory_port", "--lengths", "64",
                    "--matmul", "64", "--time_batch", "1", "--reps", "1", "--no_grid",
                    "--compare_scan_impl", "", "--time_scan_impls", ""],
    "pretrained_audit_bench": ["--batch", "1", "--n_layers", "2"],
    "unembed_bench": ["--vocab", "512", "--width", "16", "--rows", "1,4", "--reps", "1"],
}


def _why_not(name: str) -> str | None:
  """Why the benchmark cannot run here (SmolLM2's weights missing), or None."""
  if name != "pretrained_audit_bench":
    return None
  from ceu_jax.pretrained import gguf_loader  # pylint: disable=g-import-not-at-top
  return gguf_loader.is_available()


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_benchmark_smoke_run_ends_with_target_lines(name):
  why = _why_not(name)
  if why:
    pytest.skip(why)
  env = fast_compile_env(dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
  p = subprocess.run([sys.executable, os.path.join("benchmarks", f"{name}.py"), *SMOKE[name]],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                     check=False)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
  lines = p.stdout.strip().splitlines()
  targets = [l for l in lines if l.startswith("TARGET ")]
  assert targets, p.stdout[-2000:]
  assert all(TARGET.match(l) for l in targets), targets
  assert lines[-len(targets):] == targets      # the TARGET lines end the output


def test_host_bench_prints_the_cpu_and_four_workloads(capsys):
  """benchmarks/host_bench (no targets: a calibration to quote beside a timing)."""
  from benchmarks import host_bench  # pylint: disable=g-import-not-at-top
  host_bench.main(["--reps", "1"])
  lines = capsys.readouterr().out.strip().splitlines()
  assert re.match(r'^HOST cpu ".+" cores \d+ jax \S+ backend cpu$', lines[0]), lines
  got = {}
  for line in lines[1:]:
    m = re.match(r"^HOST (\w+) (\d+\.\d{3}) (\S+)$", line)
    assert m, line
    got[m[1]] = (float(m[2]), m[3])
  assert [(k, u) for k, (_, u) in got.items()] == [
      ("compile", "s"), ("matmul", "GFLOP/s"), ("python", "ns/iter"), ("start", "CPU-s")]
  assert all(v > 0 for v, _ in got.values())


def test_host_bench_refuses_zero_reps(capsys):
  from benchmarks import host_bench  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit):
    host_bench.main(["--reps", "0"])
  assert "--reps must be >= 1, got 0" in capsys.readouterr().err
