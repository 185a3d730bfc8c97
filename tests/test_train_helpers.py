"""Helpers of the training tests: a tiny config file and a subprocess runner.

Runs go through the real CLI (`python -m experiments.train`) in a subprocess,
with a persistent JAX compilation cache shared by the runs of one test
session so that only the first run of a program pays for compiling it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from tests.test_multiprocess_helpers import env_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY_CONFIG = textwrap.dedent('''
    from configs import atr_insert

    def get_config(arg=None):
      c = atr_insert.get_config("tiny")
      c.data.context_len = 64
      t = c.train
      t.num_steps, t.batch_size, t.warmup_steps, t.learning_rate = 20, 16, 2, 3e-3
      t.log_every, t.eval_every, t.checkpoint_every = 1, 10, 5
      t.keep_latest, t.keep_best = 2, 1
      c.cer.regularizer, c.cer.k = "evidence", 2
      e = c.eval
      e.num_examples, e.batch_size, e.num_resamples = 16, 16, 10
      e.corruptions = ("value_swap",)
      c.model.overrides = dict(embed_dim=16, reader_mlp_dim=32, enc_mlp_dim=32,
                               read_heads=2, read_head_dim=8, reader_heads=2,
                               reader_layers=1)
      return c
''')


def write_config(directory: str) -> str:
  path = os.path.join(directory, "tiny_train_config.py")
  with open(path, "w") as f:
    f.write(TINY_CONFIG)
  return path


def run_train(config_path: str, workdir: str, *overrides: str, devices: int = 1,
              cache_dir: str | None = None, timeout: int = 900,
              module: str = "experiments.train",
              fast_compile: bool = False) -> subprocess.CompletedProcess:
  """`python -m <module> --config <path> --workdir <workdir> <overrides>`.

  fast_compile: compile with most XLA optimisations off (as `tests.conftest.fast_compile`),
  for compile-bound runs.
  """
  env = env_for(devices, cache_dir, fast_compile)
  cmd = [sys.executable, "-m", module, f"--config={config_path}",
         f"--workdir={workdir}", *overrides]
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=timeout)


def metric_rows(workdir: str, split: str | None = None) -> list[dict]:
  """metrics.jsonl rows without the wall-clock 'perf/' keys."""
  rows = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if split is None or row["split"] == split:
        rows.append({k: v for k, v in row.items() if not k.startswith("perf/")})
  return rows


def remove_units(workdir: str, prefixes: tuple[str, ...], expect: int) -> list[str]:
  """Delete the job units W/units/<prefix>… (exactly `expect` of them) so that a rerun
  computes them again and the rest are resumed; returns the deleted names."""
  units = os.path.join(workdir, "units")
  gone = sorted(u for u in os.listdir(units) if u.startswith(prefixes))
  assert len(gone) == expect, os.listdir(units)
  for u in gone:
    os.remove(os.path.join(units, u))
  return gone


def status(workdir: str) -> dict:
  with open(os.path.join(workdir, "status.json")) as f:
    return json.load(f)


def checkpoint_steps(workdir: str) -> list[int]:
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(s) for s in os.listdir(d) if s.isdigit()) if os.path.isdir(d) else []


def load_state(workdir: str, step: int) -> dict:
  """The saved train state of `step` as host numpy arrays (no model needed)."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  # numpy leaves: restored as jax arrays, orbax would guess their sharding from the files
  meta = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path)).tree
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
  with ocp.PyTreeCheckpointer() as ckptr:
    tree = ckptr.restore(path, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
  return tree


def assert_trees_equal(a, b) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def describe(proc: subprocess.CompletedProcess) -> str:
  return f"rc={proc.returncode}\nstderr tail:\n{proc.stderr[-3000:]}"
