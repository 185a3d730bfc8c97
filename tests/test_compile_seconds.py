"""`pytest --compile-seconds=PATH` (tests/conftest.py) and its summary,
scripts/compile_seconds.py: events attributed to the module and the jitted function,
cache hits counted, the workers' files merged."""
from __future__ import annotations

import collections
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scripts import compile_seconds
from tests import conftest


def test_function_names_of_the_three_events_agree():
  for name in ("f", "jit(f)", "jit_f"):
    assert conftest.function_name(name) == "f"
  assert conftest.function_name("jit(<lambda>)") == "<lambda>"


def test_a_fresh_program_is_traced_lowered_and_compiled_under_its_name(monkeypatch, request):
  """Listeners as --compile-seconds registers them: a new jitted function gives one
  program under its own name, with tracing, lowering and compiling seconds."""
  registered = bool(request.config.getoption("--compile-seconds"))   # this run's already
  modules = collections.defaultdict(lambda: collections.defaultdict(float))
  functions = collections.defaultdict(lambda: collections.defaultdict(float))
  monkeypatch.setattr(conftest, "_compile_seconds", modules)
  monkeypatch.setattr(conftest, "_by_function", functions)
  monkeypatch.setattr(conftest, "_current_module", ["here.py"])
  if not registered:
    jax.monitoring.register_event_duration_secs_listener(conftest.record_compile_event)
    jax.monitoring.register_event_listener(conftest.record_cache_hit)
  try:
    def a_function_named_for_this_test(x):
      return jnp.sin(x) * 3.0 + 17.0
    jax.jit(a_function_named_for_this_test)(jnp.arange(7.0)).block_until_ready()
  finally:
    if not registered:
      jax.monitoring.unregister_event_duration_listener(conftest.record_compile_event)
      jax.monitoring.unregister_event_listener(conftest.record_cache_hit)
  fn = functions["a_function_named_for_this_test"]
  assert fn["programs"] == 1 and all(fn[k] > 0 for k in ("trace", "lower", "compile"))
  assert modules["here.py"]["programs"] >= 1
  conftest.record_cache_hit(conftest.CACHE_HIT_EVENT)
  conftest.record_cache_hit("/jax/some_other_event")
  assert modules["here.py"]["cache_hits"] == 1


def test_summary_merges_the_workers_files(tmp_path, capsys):
  path = str(tmp_path / "cs")
  for worker, (t, c, n) in {"gw0": (1.0, 4.0, 3), "gw1": (0.5, 2.0, 2)}.items():
    with open(f"{path}.{worker}.json", "w") as f:
      json.dump({"test_a.py": {"trace": t, "lower": 0.5, "compile": c, "programs": n,
                               "cache_hits": 1, "measured": 10.0},
                 f"test_{worker}.py": {"compile": 0.25, "programs": 1, "measured": 1.0}}, f)
    with open(f"{path}.{worker}.functions.json", "w") as f:
      json.dump({"train_step": {"trace": t, "compile": c, "programs": n}}, f)
  assert compile_seconds.main([path, "--top", "2"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == ("2 worker(s): tracing 1.5 s, lowering 1.0 s, XLA compiling 6.5 s; "
                    "7 programs requested, 2 of them from the persistent cache; the "
                    "modules' measured time 22.0 s")
  rows = [l for l in out if l.endswith("  test_a.py")]
  assert rows == ["    1.5     1.0      6.0        5      20.0  test_a.py"]
  assert "    1.5     0.0      6.0        5  train_step" in out
  assert sum(l.endswith(".py") for l in out) == 2          # --top 2


def test_summary_refuses_a_path_without_files_and_a_bad_top(tmp_path):
  with pytest.raises(SystemExit, match="run pytest with --compile-seconds="):
    compile_seconds.main([str(tmp_path / "none")])
  with pytest.raises(SystemExit):
    compile_seconds.main([str(tmp_path / "none"), "--top", "0"])


def test_census_fingerprints_a_program_defined_twice_alike(monkeypatch, request):
  """--program-census: the same body jitted by two new wrappers is one fingerprint; another
  shape, or the same program with most optimisations off, is another."""
  from tests import program_census  # pylint: disable=g-import-not-at-top
  rows: list = []
  monkeypatch.setattr(program_census, "ROWS", rows)
  monkeypatch.setattr(program_census, "_CURRENT", ["here.py"])
  installed = bool(request.config.getoption("--program-census"))   # this run's already
  if not installed:
    program_census.install()
  try:
    x = np.arange(11.0, dtype=np.float32)      # numpy: no program of its own
    for arg in (x, x, np.arange(12.0, dtype=np.float32)):
      jax.jit(lambda v: jnp.cos(v) * 5.0 - 13.0)(arg).block_until_ready()
    with conftest.fast_compile():
      jax.jit(lambda v: jnp.cos(v) * 5.0 - 13.0)(x).block_until_ready()
  finally:
    if not installed:
      program_census.uninstall()
  assert [r[0] for r in rows] == ["here.py"] * 4 and {r[1] for r in rows} == {"jit__lambda"}
  keys = [r[2] for r in rows]
  assert keys[0] == keys[1] and len(set(keys)) == 3, keys
  assert all(r[3] >= 0 for r in rows)


def test_census_summary_counts_repeats_within_a_process(tmp_path, capsys):
  path = str(tmp_path / "cs")
  with open(f"{path}.gw0.json", "w") as f:
    json.dump({"test_a.py": {"compile": 1.0, "programs": 4, "measured": 2.0}}, f)
  census = {"gw0": [["test_a.py", "jit_f", "k1", 1.5], ["test_a.py", "jit_f", "k1", 1.25],
                    ["test_b.py", "jit_g", "k2", 0.01], ["test_b.py", "jit_f", "k1", 0.5]],
            "gw1": [["test_c.py", "jit_f", "k1", 0.05]]}     # another process: not a repeat
  for worker, rows in census.items():
    with open(f"{path}.{worker}.census.json", "w") as f:
      json.dump(rows, f)
  assert compile_seconds.main([path]) == 0
  out = capsys.readouterr().out.splitlines()
  i = out.index("program census (2 process(es)): 5 requests, 3 distinct programs, 3.3 CPU-s; "
                "requested again in the same process: 2 (1.8 CPU-s)")
  assert out[i + 1:i + 5] == ["  requests of  0-0.02 s:     1,      0.0 CPU-s",
                              "  requests of 0.02-0.1 s:     1,      0.1 CPU-s",
                              "  requests of   0.1-1 s:     1,      0.5 CPU-s",
                              "  requests of    >= 1 s:     2,      2.8 CPU-s"]
  assert out[i + 7:] == ["      1      1.2  test_a.py", "      1      0.5  test_b.py"]
