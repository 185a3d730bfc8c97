"""Smoke run of benchmarks/audit_bench.py on a tiny model (seconds)."""
import jax
import jax.numpy as jnp
import pytest

from benchmarks import audit_bench as ab
from ceu_jax import engine


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def _setup(family="attention"):
  return ab.make_setup(family, "p100k", context_len=64, batch=2)


def test_random_spans_are_windows_of_the_given_length():
  spans = ab.random_spans(jax.random.PRNGKey(0), 3, 2, 20, 7)
  assert spans.shape == (3, 2, 20)
  assert (spans.sum(-1) == 7).all()
  starts = jnp.argmax(spans, -1)
  assert (spans == ((jnp.arange(20) >= starts[..., None])
                    & (jnp.arange(20) < starts[..., None] + 7))).all()


def test_engine_and_sequential_agree_at_an_approximate_port():
  st = _setup("memory_port")
  spans = ab.random_spans(jax.random.PRNGKey(1), 3, 2, 64, st.span_len)
  eng, seq = ab.engine_audit(st, chunk_size=2), ab.sequential_audit(st)
  assert ab.check_agree(eng, seq, spans) < 1e-4
  assert bool(eng(engine.span_probes(spans)).approximate)


def test_ideal_speedup_and_target_lines():
  assert ab.ideal_speedup(1, 0.0) == 1.0
  assert abs(ab.ideal_speedup(16, 0.25) - 16 / 5) < 1e-9
  assert ab.target_line("x", 0.9, ">=", 0.8).endswith("PASS")
  assert ab.target_line("x", 1.2, "<=", 1.0).endswith("MISS")


def test_main_prints_every_target(capsys):
  lines = ab.main(["--preset", "p100k", "--batch", "2", "--context_len", "64",
                   "--ks", "16,64", "--repeats", "1", "--chunk_size", "16",
                   "--families", "attention"])
  out = capsys.readouterr().out
  assert "loadavg" in out and "s = w/u" in out
  names = [line.split()[1] for line in lines]
  assert names == ["audit_speedup_vs_ideal_k16_attention",
                   "audit_speedup_vs_ideal_k64_attention",
                   "audit_per_probe_k64_over_k16_attention"]
  assert all(line.startswith("TARGET ") and line.split()[-1] in ("PASS", "MISS")
             for line in lines)
