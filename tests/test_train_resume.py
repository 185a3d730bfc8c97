"""Crash safety of training (issue #5 acceptance 2-5), through the real CLI.

Every run is a subprocess of `python -m experiments.train` on a tiny CER config
(20 steps, checkpoints every 5, eval every 10); the reference is one
uninterrupted run. Interrupted-then-resumed runs must end with bit-identical
state and metrics (CPU).
"""
from __future__ import annotations

import functools
import os
import re
import shutil

import pytest

from tests import test_train_helpers
from tests.conftest import SESSION_CACHE
from tests.test_train_helpers import (assert_trees_equal, checkpoint_steps, describe, load_state,
                                metric_rows, status, write_config)

# Every run compiles with most XLA optimisations off (compile-bound; all runs alike).
run_train = functools.partial(test_train_helpers.run_train, fast_compile=True)

EXIT_PREEMPTED, EXIT_DIVERGED = 75, 65


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
  d = tmp_path_factory.mktemp("train_resume")
  cfg = write_config(str(d))
  cache = SESSION_CACHE   # every program cached; shared with test_train_sharding's 1-device run
  workdir = str(d / "reference")
  proc = run_train(cfg, workdir, cache_dir=cache)
  assert proc.returncode == 0, describe(proc)
  assert status(workdir)["status"] == "completed"
  return dict(dir=d, cfg=cfg, cache=cache, workdir=workdir)


def _resumed_from(proc) -> int | None:
  m = re.search(r"resumed from checkpoint step (\d+)", proc.stderr)
  return int(m.group(1)) if m else None


def _assert_same_as_reference(ref: dict, workdir: str) -> None:
  assert status(workdir)["status"] == "completed"
  assert_trees_equal(load_state(workdir, 20), load_state(ref["workdir"], 20))
  assert metric_rows(workdir) == metric_rows(ref["workdir"])


def _tmp_dirs(workdir: str) -> list[str]:
  d = os.path.join(workdir, "checkpoints")
  return [n for n in os.listdir(d) if "tmp" in n] if os.path.isdir(d) else []


def _run_killed(ref: dict, workdir: str, point: str) -> None:
  """Run with train.debug_kill=point; check it died by SIGKILL after resuming from the
  newest committed step (a kill inside a save leaves only an uncommitted tmp dir)."""
  committed = checkpoint_steps(workdir)
  proc = run_train(ref["cfg"], workdir, f"--config.train.debug_kill={point}",
                   cache_dir=ref["cache"])
  assert proc.returncode == -9, f"{point}: " + describe(proc)
  assert _resumed_from(proc) == (max(committed) if committed else None), point
  if point.startswith("in_save"):
    step = int(point.split(":")[1])
    assert step not in checkpoint_steps(workdir), checkpoint_steps(workdir)
    assert any(n.startswith(f"{step}.") for n in _tmp_dirs(workdir)), _tmp_dirs(workdir)
    # status.json names the last committed step, not the one whose save was cut off (#34.3)
    st = status(workdir)
    assert (st["step"], st["saving_step"]) == (step, step), st
    assert st["checkpoint_step"] == max(checkpoint_steps(workdir)) < step, st


def _finish(ref: dict, workdir: str, *overrides: str):
  committed = checkpoint_steps(workdir)
  proc = run_train(ref["cfg"], workdir, *overrides, cache_dir=ref["cache"])
  assert _resumed_from(proc) == max(committed), describe(proc)
  return proc


def test_kill9_in_save_then_sigterm_then_resume_equals_uninterrupted(ref):
  """Tiny variant of acceptance 2 + 3: SIGKILL inside the save of step 10, rerun,
  SIGTERM after step 13 (checkpoint at 13, exit 75), rerun to the end."""
  workdir = str(ref["dir"] / "kill_sigterm")
  _run_killed(ref, workdir, "in_save:10")
  proc = _finish(ref, workdir, "--config.train.debug_kill=sigterm:13")
  assert proc.returncode == EXIT_PREEMPTED, describe(proc)
  st = status(workdir)
  assert (st["status"], st["step"]) == ("preempted", 13)
  assert 13 in checkpoint_steps(workdir)
  proc = _finish(ref, workdir)
  assert proc.returncode == 0, describe(proc)
  assert _resumed_from(proc) == 13
  _assert_same_as_reference(ref, workdir)


@pytest.mark.slow
def test_kill9_at_three_points_resumes_bit_for_bit(ref):
  workdir = str(ref["dir"] / "killed")
  for point in ("after_step:7", "in_save:10", "after_step:17"):
    _run_killed(ref, workdir, point)
  proc = _finish(ref, workdir)
  assert proc.returncode == 0, describe(proc)
  _assert_same_as_reference(ref, workdir)


@pytest.mark.slow
def test_sigterm_checkpoints_exits_75_and_resumes(ref):
  workdir = str(ref["dir"] / "sigterm")
  proc = run_train(ref["cfg"], workdir, "--config.train.debug_kill=sigterm:8",
                   cache_dir=ref["cache"])
  assert proc.returncode == EXIT_PREEMPTED, describe(proc)
  st = status(workdir)
  assert (st["status"], st["step"]) == ("preempted", 8)
  assert 8 in checkpoint_steps(workdir)
  proc = _finish(ref, workdir)
  assert proc.returncode == 0, describe(proc)
  assert _resumed_from(proc) == 8
  _assert_same_as_reference(ref, workdir)


def _corrupt_step(workdir: str, step: int) -> None:
  """Truncate every file of the step's state item to half its size."""
  root = os.path.join(workdir, "checkpoints", str(step), "state")
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      size = os.path.getsize(path)
      with open(path, "r+b") as f:
        f.truncate(size // 2)


def test_corrupted_latest_checkpoint_falls_back_with_warning(ref):
  workdir = str(ref["dir"] / "corrupt_latest")
  shutil.copytree(ref["workdir"], workdir)
  steps = checkpoint_steps(workdir)
  assert steps[-1] == 20 and 15 in steps, steps
  _corrupt_step(workdir, 20)
  proc = run_train(ref["cfg"], workdir, cache_dir=ref["cache"])
  assert proc.returncode == 0, describe(proc)
  assert "checkpoint step 20 is unusable" in proc.stderr
  assert _resumed_from(proc) == 15
  assert os.listdir(os.path.join(workdir, "corrupt_checkpoints"))
  _assert_same_as_reference(ref, workdir)


def test_all_checkpoints_corrupted_stops_with_clear_message(ref):
  workdir = str(ref["dir"] / "corrupt_all")
  shutil.copytree(ref["workdir"], workdir)
  for step in checkpoint_steps(workdir):
    _corrupt_step(workdir, step)
  proc = run_train(ref["cfg"], workdir, cache_dir=ref["cache"])
  assert proc.returncode not in (0, EXIT_PREEMPTED), describe(proc)
  assert "refusing to start from scratch" in proc.stderr
  assert "step 1/" not in proc.stderr          # never trained from a fresh state


def test_nan_at_step_k_marks_diverged_without_later_checkpoint(ref):
  workdir = str(ref["dir"] / "nan")
  proc = run_train(ref["cfg"], workdir, "--config.train.debug_nan_step=7",
                   cache_dir=ref["cache"])
  assert proc.returncode == EXIT_DIVERGED, describe(proc)
  st = status(workdir)
  assert (st["status"], st["step"]) == ("diverged", 7), st
  assert "non-finite" in st["message"] and "diverged" in proc.stderr
  assert checkpoint_steps(workdir) == [5]
  rows = metric_rows(workdir, "train")
  assert rows[-1]["step"] == 7 and rows[-1]["finite"] == 0
