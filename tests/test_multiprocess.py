"""Issue #20.1: training in two processes joined by jax.distributed (CPU, gloo);
issue #34.7: the audit's checkpoint digest of model-parallel parameters there.

Two local processes, each with 4 fake CPU devices, join a localhost coordinator
(`experiments.train --coordinator_address/--num_processes/--process_id`) and
train one tiny CER run on the 8-device mesh. The slow test runs 20 steps and
compares them with one process of 8 devices, then stops both processes by
SIGTERM at step 10 (checkpoint from both processes), resumes, and compares the
result bit for bit with the uninterrupted two-process run. The CI test does the
same at 3 steps (preempted at 2) against one device in the test process (1 and
8 devices agree to 1e-5: tests/test_train_sharding.py). `Cluster` parsing is
unit-tested.

Compared at 1e-5: every metric that is not a ratio (loss, task_nll, cer_ev, gap,
grad/param/update norms, lr, train_em, eval em/nll/counts) and the trained
parameters. The mean CEU metrics (ceu_ev, ceu_dis, eval ceu_*) are per-example
ratios (L_int − L−) / (L+ − L−) that amplify float error by |L| / gap; at these
untrained sizes the gap is ~1e-3 for |L| ~ 5, so a 1e-7 reordering of a float32
reduction moves them by ~5e-4: they are compared through their ingredients (gap,
cer_ev, the parameters) and equal bit for bit between the two-process runs.
"""
from __future__ import annotations

import csv
import json
import os
import shutil

import numpy as np
import pytest

from ceu_jax.train import cluster as cluster_lib
from tests.test_multiprocess_helpers import describe_all, launch, load_state_here
from tests.test_train_helpers import (assert_trees_equal, checkpoint_steps, describe,
                                      metric_rows, run_train, status, write_config)

EXIT_PREEMPTED = 75
RATIO_METRICS = ("ceu_ev", "ceu_dis", "ceu_control")


def _train_argv(cfg: str, workdir: str, *overrides: str) -> list[str]:
  return ["-m", "experiments.train", f"--config={cfg}", f"--workdir={workdir}", *overrides]


def _two(cfg, workdir, log_dir, *overrides, tag, cache=None, fast_compile=False):
  return launch(_train_argv(cfg, workdir, *overrides), log_dir, processes=2, devices=4,
                cache_dir=cache, tag=tag, fast_compile=fast_compile)


def _assert_close_metrics(got: list[dict], want: list[dict]) -> None:
  assert [(r["step"], r["split"]) for r in got] == [(r["step"], r["split"]) for r in want]
  for g, w in zip(got, want):
    assert set(g) == set(w)
    for k, v in w.items():
      if k in ("step", "split") or k in RATIO_METRICS or k.endswith(tuple(
          f"/{m}" for m in RATIO_METRICS)):
        continue
      np.testing.assert_allclose(g[k], v, rtol=1e-5, atol=1e-5,
                                 err_msg=f"{k} at step {w['step']} ({w['split']})")


def _params(workdir: str, step: int):
  return load_state_here(workdir, step)["params"]


def _assert_params_close(a, b) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def _assert_both_wrote(workdir: str, step: int) -> None:
  """Orbax multi-process save: each process leaves its own array metadata."""
  d = os.path.join(workdir, "checkpoints", str(step), "state", "array_metadatas")
  assert sorted(os.listdir(d)) == ["process_0", "process_1"], os.listdir(d)


def _run_and_resume(cfg, root, steps: int, stop_at: int, cache: str, extra=()):
  """(uninterrupted two-process workdir, preempted-then-resumed two-process workdir)."""
  logs = str(root / "logs")
  full = str(root / "two_full")
  res = _two(cfg, full, logs, *extra, tag="full", cache=cache)
  assert all(r.returncode == 0 for r in res), describe_all(res)
  assert status(full)["status"] == "completed" and status(full)["step"] == steps
  assert "joined the cluster: process 1 of 2, 4 local / 8 global devices" in res[1].stderr

  resumed = str(root / "two_resumed")
  res = _two(cfg, resumed, logs, *extra, f"--config.train.debug_kill=sigterm:{stop_at}",
             tag="stop", cache=cache)
  assert [r.returncode for r in res] == [EXIT_PREEMPTED] * 2, describe_all(res)
  assert status(resumed)["status"] == "preempted"
  assert max(checkpoint_steps(resumed)) == stop_at
  _assert_both_wrote(resumed, stop_at)
  res = _two(cfg, resumed, logs, *extra, tag="resume", cache=cache)
  assert all(r.returncode == 0 for r in res), describe_all(res)
  assert f"resumed from checkpoint step {stop_at}" in res[1].stderr
  _assert_both_wrote(resumed, steps)
  return full, resumed


@pytest.mark.slow
def test_two_processes_equal_eight_devices_and_resume_bit_identically(tmp_path):
  """20 steps (eval at 10 and 20, checkpoints every 5); SIGTERM at step 10."""
  cfg = write_config(str(tmp_path))
  cache = str(tmp_path / "jax_cache")
  one = str(tmp_path / "one_process")
  proc = run_train(cfg, one, devices=8, cache_dir=cache)
  assert proc.returncode == 0, describe(proc)
  full, resumed = _run_and_resume(cfg, tmp_path, steps=20, stop_at=10, cache=cache)
  _assert_close_metrics(metric_rows(full), metric_rows(one))
  _assert_params_close(_params(full, 20), _params(one, 20))
  assert metric_rows(resumed) == metric_rows(full)
  assert_trees_equal(load_state_here(resumed, 20), load_state_here(full, 20))
  # The two-process checkpoint is an ordinary one: audited here, on one device.
  from ceu_jax import audit_job  # pylint: disable=g-import-not-at-top
  summary = audit_job.run_audit(_tiny_config(cfg), full, data_dir=str(tmp_path / "evalsets"),
                                log=lambda s: None)
  assert summary["train_run"]["checkpoint_step"] == 20


def _tiny_config(path: str, **train):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("tiny_train_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  for k, v in train.items():
    setattr(config.train, k, v)
  return config


def test_two_processes_tiny(tmp_path):
  """CI version: 3 steps on 2 x 4 devices (eval at step 3), SIGTERM after step 2 (a
  checkpoint from both processes), resume; equal to one device (this process) to 1e-5.
  Compile-bound: every run compiles with most XLA optimisations off, and the resumed
  run's process 0 finds the stopped run's programs in a persistent compilation cache."""
  from ceu_jax.train import loop  # pylint: disable=g-import-not-at-top
  from tests.conftest import fast_compile  # pylint: disable=g-import-not-at-top
  cfg = write_config(str(tmp_path))
  steps = dict(num_steps=3, eval_every=3, checkpoint_every=10)
  one = str(tmp_path / "one_device")
  with fast_compile():
    loop.train_and_evaluate(_tiny_config(cfg, **steps), one)
  extra = [f"--config.train.{k}={v}" for k, v in steps.items()]
  logs, two = str(tmp_path / "logs"), str(tmp_path / "two_processes")
  cache = str(tmp_path / "jax_cache")
  res = _two(cfg, two, logs, *extra, "--config.train.debug_kill=sigterm:2", tag="stop",
             cache=cache, fast_compile=True)
  assert [r.returncode for r in res] == [EXIT_PREEMPTED] * 2, describe_all(res)
  assert "joined the cluster: process 1 of 2, 4 local / 8 global devices" in res[1].stderr
  assert checkpoint_steps(two) == [2] and status(two)["status"] == "preempted"
  _assert_both_wrote(two, 2)
  res = _two(cfg, two, logs, *extra, tag="resume", cache=cache, fast_compile=True)
  assert all(r.returncode == 0 for r in res), describe_all(res)
  assert "resumed from checkpoint step 2" in res[1].stderr
  assert status(two)["status"] == "completed"
  _assert_both_wrote(two, 3)
  _assert_close_metrics(metric_rows(two), metric_rows(one))
  _assert_params_close(_params(two, 3), _params(one, 3))
  _assert_two_process_audit_equals_one(two, str(tmp_path), logs, cache)


def _examples(audit_dir: str) -> list[dict]:
  with open(os.path.join(audit_dir, "examples.csv")) as f:
    return list(csv.DictReader(f))


def _assert_two_process_audit_equals_one(trained: str, tmp: str, logs: str, cache: str):
  """Issue #34.7: `experiments.audit` in two processes of 4 devices (the cluster flags, as
  training's) audits the two-process checkpoint on the 8-device mesh; its record (the
  checkpoint digest, taken of host-local data, and the eval set) equals a one-process
  audit's of the same checkpoint, and so do its log-likelihoods to 1e-5."""
  from ceu_jax import audit_job  # pylint: disable=g-import-not-at-top
  from tests.conftest import fast_compile  # pylint: disable=g-import-not-at-top
  data = os.path.join(tmp, "evalsets")
  alone = os.path.join(tmp, "audited_alone")
  shutil.copytree(trained, alone)
  with fast_compile():
    audit_job.run_audit(None, alone, use_workdir_config=True, data_dir=data,
                        log=lambda s: None)
  res = launch(["-m", "experiments.audit", "--use_workdir_config", f"--workdir={trained}",
                f"--data_dir={data}"], logs, tag="audit", cache_dir=cache, fast_compile=True)
  assert all(r.returncode == 0 for r in res), describe_all(res)
  assert "split 8 ways" in res[0].stdout and "split 8 ways" in res[1].stdout, res[0].stdout
  assert ": EM " in res[0].stdout and ": EM " not in res[1].stdout  # process 0 prints
  assert "[audit] finished (process 1; process 0 writes" in res[1].stdout, res[1].stdout
  record = lambda d: json.load(open(os.path.join(d, "audit", "job.json")))  # noqa: E731
  assert record(trained) == record(alone)
  assert record(trained)["config"]["params_digest"]
  two, one = _examples(os.path.join(trained, "audit")), _examples(os.path.join(alone, "audit"))
  assert [(r["corruption"], r["example_id"]) for r in two] == [
      (r["corruption"], r["example_id"]) for r in one]
  for field in ("L_plus", "L_minus", "L_int_ev"):
    np.testing.assert_allclose([float(r[field]) for r in two], [float(r[field]) for r in one],
                               rtol=1e-5, atol=1e-5, err_msg=field)


def test_audit_digest_of_model_parallel_parameters_in_two_processes(tmp_path):
  """Issue #34.7: the audit's checkpoint digest (`audit_job.params_digest`) of
  parameters laid out model-parallel on a 2 x 4 mesh across two processes, where
  `np.asarray` of a parameter fails: both processes get the same digest, equal to
  the one-process digest of the same parameters (computed here). No training: the
  parameters are numpy draws of the model's shapes (tests/_digest_worker.py)."""
  from ceu_jax import audit_job  # pylint: disable=g-import-not-at-top
  from tests import _digest_worker as worker  # pylint: disable=g-import-not-at-top
  res = launch([os.path.join("tests", "_digest_worker.py")], str(tmp_path), tag="digest",
               timeout=300)
  assert all(r.returncode == 0 for r in res), describe_all(res)
  want = audit_job.params_digest(worker.host_variables(worker.config()))
  lines = [next(ln for ln in r.stdout.splitlines() if ln.startswith("DIGEST ")) for r in res]
  for line in lines:
    got = dict(kv.split("=") for kv in line.split()[1:])
    assert got["asarray_refused"] == "True" and int(got["split_leaves"]) > 0, line
    assert got["placed"] == got["host"] == want, (line, want)


@pytest.mark.slow
def test_synced_survives_a_peer_arriving_after_gloos_30_s_first_contact(tmp_path):
  """A process 45 s late to the first collective of a program (a slow compile under load)
  aborts a plain jitted call: gloo's first contact waits 30 s for a peer ('Gloo context
  initialization failed: ... GetKeyValue() timed out'), as seen in CI under load. Through
  `multihost.Synced` (compile ahead, then a coordination-service barrier) both finish."""
  argv = [os.path.join("tests", "_skew_worker.py")]
  want = float(2 * np.arange(32).sum())
  plain = launch(argv + ["plain", "45"], str(tmp_path), tag="plain", timeout=300)
  assert any(r.returncode != 0 for r in plain), describe_all(plain)
  assert "Gloo context initialization failed" in plain[0].stderr, describe_all(plain)
  synced = launch(argv + ["synced", "45"], str(tmp_path), tag="synced", timeout=300)
  assert all(r.returncode == 0 for r in synced), describe_all(synced)
  for r in synced:
    assert f"result {want}" in r.stdout and f"again {want + 64.0}" in r.stdout, r.stdout


def test_synced_is_a_plain_call_in_one_process(monkeypatch):
  """One process: no ahead-of-time compile, no barrier; the jit's own cache as before."""
  import jax  # pylint: disable=g-import-not-at-top
  from ceu_jax import multihost  # pylint: disable=g-import-not-at-top
  met = []
  monkeypatch.setattr(multihost, "meet", lambda name, *a, **k: met.append(name))
  fn = jax.jit(lambda a: a * 3)
  synced = multihost.Synced(fn, "unit")
  np.testing.assert_array_equal(synced(np.arange(4.0)), np.arange(4.0) * 3)
  assert met == [] and fn._cache_size() == 1
  assert synced.lower(np.arange(4.0)).compile()(np.arange(4.0)).shape == (4,)


# ------------------------------------------------------------------ Cluster (no JAX use)
def test_cluster_from_env():
  c = cluster_lib.Cluster.from_env({"JAX_COORDINATOR_ADDRESS": "host0:1234",
                                    "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"})
  assert (c.coordinator_address, c.num_processes, c.process_id, c.multi) == (
      "host0:1234", 4, 3, True)
  assert cluster_lib.Cluster.from_env({"SLURM_NTASKS": "8"}).detect == "slurm"
  assert cluster_lib.Cluster.from_env({"SLURM_NTASKS": "1"}).multi is False
  assert cluster_lib.Cluster.from_env({"OMPI_COMM_WORLD_SIZE": "2"}).detect == "ompi"
  assert cluster_lib.Cluster.from_env({}) == cluster_lib.Cluster()
  assert not cluster_lib.join(None) and not cluster_lib.join(cluster_lib.Cluster())


def test_cluster_flags_override_the_environment(monkeypatch):
  monkeypatch.setenv("SLURM_NTASKS", "8")
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(k, raising=False)
  assert cluster_lib.flag_values("", -1, -1).detect == "slurm"
  c = cluster_lib.flag_values("localhost:999", 2, 1)
  assert (c.detect, c.coordinator_address, c.num_processes, c.process_id) == (
      "", "localhost:999", 2, 1)


@pytest.mark.parametrize("kwargs, env, match", [
    (dict(num_processes=2, process_id=2, coordinator_address="h:1"), None, "process_id must"),
    (dict(num_processes=0), None, "num_processes must be >= 1"),
    (dict(num_processes=2, process_id=0, coordinator_address="h"), None, "coordinator_address"),
    (dict(detect="pbs"), None, "detect must be one of"),
    (None, {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"}, "JAX_PROCESS_ID"),
    (None, {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two",
            "JAX_PROCESS_ID": "0"}, "must be integers"),
])
def test_bad_cluster_is_refused_naming_the_field(kwargs, env, match):
  with pytest.raises(cluster_lib.ClusterError, match=match):
    if env is not None:
      cluster_lib.Cluster.from_env(env)
    else:
      cluster_lib.Cluster(**kwargs).validate()


def test_bad_cluster_flags_fail_before_jax_starts(tmp_path):
  """A process_id outside [0, num_processes) is one error line, exit 1."""
  cfg = write_config(str(tmp_path))
  proc = run_train(cfg, str(tmp_path / "w"), "--coordinator_address=localhost:1",
                   "--num_processes=2", "--process_id=5", timeout=120)
  assert proc.returncode == 1
  assert "process_id must be in [0, 1]" in proc.stderr
  assert not os.path.exists(tmp_path / "w")
