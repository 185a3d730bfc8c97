"""Shared fixtures: memoised ATR-insert batches as numpy (compiled once per worker); one
persistent compilation cache per test session; modules sent longest first."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import tempfile
import time
from typing import Callable, Iterator


def _session_compilation_cache() -> str:
  """One JAX persistent compilation cache for the whole test session: both xdist workers
  and every subprocess a test starts (the environment is inherited) reuse the programs
  any of them compiled. Made by the controller before the workers start; a fresh
  directory per session (nothing carries over between runs); a cache a user set is kept."""
  global _MADE_CACHE
  path = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if not path:
    path = _MADE_CACHE = tempfile.mkdtemp(prefix="ceu_jax_test_jit_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", str(CACHE_MIN_COMPILE_S))
  return path


CACHE_MIN_COMPILE_S = 0.1   # programs that compile faster are not worth a disk round trip
_MADE_CACHE = None          # the directory this process made (removed at the session's end)
SESSION_CACHE = _session_compilation_cache()

import jax  # noqa: E402  (after the cache's environment: jax reads it at import)
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# In case a plugin imported jax before this file: the same settings through jax.config.
jax.config.update("jax_compilation_cache_dir", SESSION_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))

from ceu_jax.data import atr, corruptions
from ceu_jax.data.atr_config import ATRConfig
from ceu_jax.data.types import RetrievalBatch
from tests import program_census

BATCH = 1024   # one batch size everywhere (also evalsets.CHUNK): one compile per config


def tiny_atr(**overrides) -> ATRConfig:
  """The data section of configs/atr_insert.py:tiny with η = 0.2 (plus overrides)."""
  from configs import atr_insert
  cfg = ATRConfig.from_config(atr_insert.get_config("tiny,eta=0.2").data)
  return dataclasses.replace(cfg, **overrides)


# Several (η, δ, n), both variants, answer lengths 1-3, tiny vocabularies.
ATR_CONFIGS = {
    "vfk_n128": tiny_atr(),
    "kfv_n256": ATRConfig(variant="key_for_value", context_len=256, value_len=2, eta=0.5,
                          delta=0.7, paraphrase_rate=0.3, overlap_rate=0.25,
                          n_ids=32, n_keys=32, n_values=32),
    "vfk_n96": ATRConfig(num_passages=4, context_len=96, value_len=3, eta=0.0, delta=1.0,
                         hard_negative_kinds="same_id", paraphrase_rate=0.5),
    "kfv_n48": ATRConfig(variant="key_for_value", num_passages=3, context_len=48, eta=1.0,
                         delta=0.0, hard_negative_kinds="same_key", filler_rate=0.2,
                         n_ids=2, n_keys=2, n_values=2, n_filler=2),
}


# What `fast_compile` adds to most optimisations off: XLA's CPU loop emitters instead of its
# fusion emitters, and codegen in one piece (a CER loss-and-gradients program: 8.0 -> 3.7
# CPU-s to compile, bit-identical values and gradients; the subprocess flags in
# tests/test_multiprocess_helpers.py are the same). Like most optimisations off, they may
# change float rounding: such tests compare computations with each other, never a number a
# user sees, and every tolerance stays as it was.
FAST_COMPILE_OPTIONS = {"xla_cpu_use_fusion_emitters": False,
                        "xla_cpu_parallel_codegen_split_count": 1}


def _with_fast_compile_options(get_compile_options):
  """jax's compile-options builder with FAST_COMPILE_OPTIONS added while most
  optimisations are off (test-only: jax has no public default for compiler options)."""
  def wrapped(*args, env_options_overrides=None, **kwargs):
    if jax.config.read("jax_disable_most_optimizations"):
      env_options_overrides = {**FAST_COMPILE_OPTIONS, **dict(env_options_overrides or {})}
    return get_compile_options(*args, env_options_overrides=env_options_overrides, **kwargs)
  return wrapped


from jax._src import compiler as _jax_compiler  # noqa: E402
_jax_compiler.get_compile_options = _with_fast_compile_options(
    _jax_compiler.get_compile_options)


@contextlib.contextmanager
def fast_compile() -> Iterator[None]:
  """Compile with most XLA optimisations off, plus FAST_COMPILE_OPTIONS: for compile-bound
  tests."""
  old = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture
def fast_compiled() -> Iterator[None]:
  """The test compiles with most XLA optimisations off (`fast_compile`): for compile-bound
  tests in modules where other tests are not."""
  with fast_compile():
    yield


@pytest.fixture(scope="module")
def fast_compiled_module() -> Iterator[None]:
  """Every test of the module compiles with most XLA optimisations off (`fast_compile`):
  `pytestmark = pytest.mark.usefixtures("fast_compiled_module")` in compile-bound modules."""
  with fast_compile():
    yield


RUNS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                        "runs")


def extract_recorded_run(archive: str, into) -> str:
  """Unpack docs/runs/<archive> (a recorded run's files) into the folder `into`; returns
  `into`. The 'data' filter (no absolute paths, links or devices) where Python has it."""
  import tarfile  # pylint: disable=g-import-not-at-top
  with tarfile.open(os.path.join(RUNS_DIR, archive)) as tar:
    kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    tar.extractall(into, **kw)
  return str(into)


def to_numpy(batch: RetrievalBatch) -> RetrievalBatch:
  return jax.tree.map(np.asarray, batch)


def concat(batches: list[RetrievalBatch]) -> RetrievalBatch:
  return jax.tree.map(lambda *xs: np.concatenate(xs), *batches)


@pytest.fixture(scope="session")
def atr_data() -> Callable[..., RetrievalBatch]:
  """make(cfg, num_examples, seed=0) -> D+ as numpy (first batches of the train stream)."""
  cache: dict = {}

  def make(cfg: ATRConfig, num_examples: int, seed: int = 0) -> RetrievalBatch:
    key = (cfg, num_examples, seed)
    if key not in cache:
      n_batches = -(-num_examples // BATCH)
      with fast_compile():
        parts = [to_numpy(atr.generate_batch(cfg, seed, i, BATCH)) for i in range(n_batches)]
      cache[key] = jax.tree.map(lambda x: x[:num_examples], concat(parts))
    return cache[key]

  return make


@pytest.fixture(scope="session")
def atr_corrupted(atr_data) -> Callable[..., RetrievalBatch]:
  """make(cfg, num_examples, name, seed=0) -> D− of `atr_data(cfg, num_examples, seed)`."""
  cache: dict = {}

  def make(cfg: ATRConfig, num_examples: int, name: str, seed: int = 0) -> RetrievalBatch:
    key = (cfg, num_examples, name, seed)
    if key not in cache:
      plus = atr_data(cfg, num_examples, seed)
      n_batches = -(-num_examples // BATCH)
      parts = []
      with fast_compile():
        for i in range(n_batches):
          chunk = jax.tree.map(lambda x: x[i * BATCH:(i + 1) * BATCH], plus)
          chunk = _pad_to(chunk, BATCH)
          out = corruptions.corrupt(cfg, chunk, name, jax.random.PRNGKey(seed + 99))
          parts.append(to_numpy(out))
      cache[key] = jax.tree.map(lambda x: x[:num_examples], concat(parts))
    return cache[key]

  return make


def _pad_to(batch: RetrievalBatch, size: int) -> RetrievalBatch:
  """Pad a short batch to `size` rows by repeating its last row (same compile)."""
  rows = batch.example_id.shape[0]
  if rows == size:
    return batch
  return jax.tree.map(lambda x: np.concatenate([x, np.repeat(x[-1:], size - rows, 0)]), batch)


# The order of modules: longest first, from tests/module_seconds.json (seconds per module
# of the last full run, written by pytest itself: `pytest -n 2 --write-module-seconds`).
# With `--dist loadfile` (pyproject addopts) a module runs on one worker, so its module
# fixtures are computed once; sending the longest first keeps a long module from starting
# last while the other worker idles. Unlisted modules (new since the file was written; their
# cost unknown) go first, in collection order: a cheap one sent early costs nothing, an
# expensive one sent last keeps one worker busy alone (2026-11-29: the 150-s checklist
# fine-tune module, unlisted, ran last).
MODULE_SECONDS_FILE = os.path.join(os.path.dirname(__file__), "module_seconds.json")


def _module_seconds() -> dict:
  try:
    with open(MODULE_SECONDS_FILE) as f:
      return json.load(f)
  except FileNotFoundError:
    return {}


def pytest_addoption(parser):
  parser.addoption("--write-module-seconds", action="store_true",
                   help="write each module's measured seconds (setup + call + teardown of "
                        "its tests) to tests/module_seconds.json (the order of the next runs)")
  parser.addoption("--compile-seconds", metavar="PATH", default=None,
                   help="write per module the seconds this process spent tracing, lowering "
                        "and compiling (jax.monitoring events; not counting subprocesses) to "
                        "PATH.<worker>.json: where a module's time goes")
  parser.addoption("--cpu-seconds", metavar="PATH", default=None,
                   help="write per test the CPU seconds (user + system) of this process and "
                        "of the subprocesses it waited for, and the wall seconds, to "
                        "PATH.<worker>.json: a profile that other load on the machine "
                        "inflates far less than wall time")
  parser.addoption("--program-census", action="store_true",
                   help="with --compile-seconds=PATH: a fingerprint of every program "
                        "requested from XLA, per module, to PATH.<worker>.census.json "
                        "(tests/program_census.py): programs compiled more than once")


# jax.monitoring event -> short name, for --compile-seconds.
COMPILE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
                  "/jax/core/compile/backend_compile_duration": "compile"}
_compile_seconds: dict = collections.defaultdict(lambda: collections.defaultdict(float))
_by_function: dict = collections.defaultdict(lambda: collections.defaultdict(float))
_current_module = ["(collection)"]
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def function_name(name: str) -> str:
  """The jitted function's name as the three events give it ('f', 'jit(f)', 'jit_f')."""
  if name.startswith("jit(") and name.endswith(")"):
    return name[4:-1]
  return name[4:] if name.startswith("jit_") else name


def record_compile_event(event: str, duration: float, fun_name: str = "?", **kwargs) -> None:
  """--compile-seconds: add one tracing / lowering / compiling event to the current module
  and to its function. A compile event is one program requested from XLA (a persistent
  cache hit included: those are counted apart, `cache_hits`)."""
  del kwargs
  kind = COMPILE_EVENTS.get(event)
  if kind is None:
    return
  _compile_seconds[_current_module[0]][kind] += duration
  fn = _by_function[function_name(str(fun_name))]
  fn[kind] += duration
  if kind == "compile":     # many small ones: op-by-op (eager) code
    _compile_seconds[_current_module[0]]["programs"] += 1
    fn["programs"] += 1


def record_cache_hit(event: str, **kwargs) -> None:
  del kwargs
  if event == CACHE_HIT_EVENT:
    _compile_seconds[_current_module[0]]["cache_hits"] += 1


def pytest_configure(config):
  if config.getoption("--compile-seconds", default=None):
    jax.monitoring.register_event_duration_secs_listener(record_compile_event)
    jax.monitoring.register_event_listener(record_cache_hit)
    if config.getoption("--program-census"):
      program_census.install()
  elif config.getoption("--program-census"):
    raise pytest.UsageError("--program-census needs --compile-seconds=PATH (its files' path)")


def _cpu_now() -> tuple[float, float, float]:
  """(own CPU s, waited-for children's CPU s, wall s) of this process now."""
  me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
      resource.RUSAGE_CHILDREN)
  return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, time.perf_counter()


_cpu_seconds: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """--cpu-seconds: the CPU time of each test (setup, call and teardown)."""
  del nextitem
  if not item.config.getoption("--cpu-seconds", default=None):
    yield
    return
  start = _cpu_now()
  yield
  end = _cpu_now()
  _cpu_seconds[item.nodeid] = {k: round(b - a, 2) for k, a, b in zip(
      ("cpu", "children_cpu", "wall"), start, end)}


def pytest_runtest_setup(item):
  _current_module[0] = _module(item.nodeid)
  program_census.set_module(_current_module[0])


def pytest_collection_modifyitems(session, config, items):
  """Unlisted modules first, then the longest (stable: the order within a module is kept)."""
  del session, config
  seconds = _module_seconds()
  items.sort(key=lambda item: -seconds.get(_module(item.nodeid), float("inf")))


def _module(nodeid: str) -> str:
  return nodeid.split("::")[0].split("/")[-1]


_measured: dict = collections.defaultdict(float)


def pytest_runtest_logreport(report):
  _measured[_module(report.nodeid)] += report.duration
  if report.when == "call":
    _compile_seconds[_module(report.nodeid)]["total"] += 0.0   # listed even if 0


def pytest_sessionfinish(session, exitstatus):
  del exitstatus
  if _MADE_CACHE:
    shutil.rmtree(_MADE_CACHE, ignore_errors=True)
  cpu_path = session.config.getoption("--cpu-seconds")
  if cpu_path and _cpu_seconds:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{cpu_path}.{worker}.json", "w") as f:
      json.dump(_cpu_seconds, f, indent=0)
  path = session.config.getoption("--compile-seconds")
  xdist_controller = (not os.environ.get("PYTEST_XDIST_WORKER")
                      and bool(getattr(session.config.option, "numprocesses", 0)))
  if path and _compile_seconds and not xdist_controller:   # the workers compile, not it
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    data = {m: {k: round(v, 2) for k, v in d.items() if k != "total"} | {
        "measured": round(_measured.get(m, 0.0), 1)} for m, d in _compile_seconds.items()}
    with open(f"{path}.{worker}.json", "w") as f:
      json.dump(data, f, indent=1)
    functions = {k: {kind: round(v, 3) for kind, v in d.items()} for k, d in sorted(
        _by_function.items(), key=lambda kv: -sum(kv[1].values()))}
    with open(f"{path}.{worker}.functions.json", "w") as f:
      json.dump(functions, f, indent=0)
    if session.config.getoption("--program-census"):
      program_census.write(f"{path}.{worker}.census.json")
  if (session.config.getoption("--write-module-seconds") and _measured
      and not os.environ.get("PYTEST_XDIST_WORKER")):
    data = {k: round(v, 1) for k, v in sorted(_measured.items(), key=lambda kv: -kv[1])}
    tmp = MODULE_SECONDS_FILE + ".tmp"
    with open(tmp, "w") as f:
      json.dump(data, f, indent=0)
      f.write("\n")
    os.replace(tmp, MODULE_SECONDS_FILE)
