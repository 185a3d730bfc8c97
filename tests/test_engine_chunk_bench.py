"""Smoke run of benchmarks/engine_chunk_bench.py on a tiny model (seconds)."""
import pytest

from benchmarks import engine_chunk_bench as bench


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def test_chunk_bench_runs_and_prints_one_target_per_model(capsys):
  lines = bench.main(["--models", "lm_tiny", "--k", "2", "--repeats", "1"])
  assert len(lines) == 1
  assert lines[0].startswith("TARGET chunk_auto_over_best_lm_tiny ")
  assert lines[0].split()[-1] in ("PASS", "MISS")
  out = capsys.readouterr().out
  assert "lm_tiny: w=" in out and "C=1:" in out and "C=2:" in out
