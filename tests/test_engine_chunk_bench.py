"""Smoke run of benchmarks/engine_chunk_bench.py on a tiny model (seconds)."""
import pytest

from benchmarks import engine_chunk_bench as bench


@pytest.fixture(autouse=True, scope="module")
def _fast_compile():
  """Compile-bound tests: compile with most XLA optimisations off."""
  from tests.conftest import fast_compile  # pylint: disable=g-import-not-at-top
  with fast_compile():
    yield


def test_chunk_bench_runs_and_prints_one_target_per_model(capsys):
  lines = bench.main(["--models", "lm_tiny", "--k", "2", "--repeats", "1"])
  assert len(lines) == 1
  assert lines[0].startswith("TARGET chunk_auto_over_best_lm_tiny ")
  assert lines[0].split()[-1] in ("PASS", "MISS")
  out = capsys.readouterr().out
  assert "lm_tiny: w=" in out and "C=1:" in out and "C=2:" in out
