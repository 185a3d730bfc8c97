"""ceu_jax.xla_cpu: YNNPACK fusions off unless the user decides (the SmolLM2 CER crash).

The crash itself is exercised by tests/test_smollm2_cer_train.py and
tests/test_smollm2_prior_world.py (tiny CER fine-tunes through the entry point), which
segfaulted on an AMD EPYC host before this setting."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ceu_jax import xla_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_flag_added_once_and_the_users_choice_wins():
  f = xla_cpu.YNN_FLAG
  assert xla_cpu.ynn_off_flags("", (0, 10, 2)) == f"{f}="
  assert xla_cpu.ynn_off_flags("--a=1", (0, 11, 0)) == f"--a=1 {f}="
  assert xla_cpu.ynn_off_flags(f"{f}=dot", (0, 10, 2)) == f"{f}=dot"   # user's value kept
  assert xla_cpu.ynn_off_flags("--a=1", (0, 10, 2), "keep") == "--a=1"
  assert xla_cpu.ynn_off_flags("--a=1", (0, 10, 0)) == "--a=1"       # older jaxlib: unknown flag
  once = xla_cpu.ynn_off_flags("", (0, 10, 2))
  assert xla_cpu.ynn_off_flags(once, (0, 10, 2)) == once


def test_importing_ceu_jax_sets_xla_flags_before_jax_starts():
  code = ("import os, ceu_jax, jax; print(os.environ.get('XLA_FLAGS', '')); "
          "print(float(jax.numpy.ones(3).sum()))")
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_cpu.ENV)}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(env, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"), check=True)
  flags, total = out.stdout.split("\n")[:2]
  assert total == "3.0"
  if xla_cpu._jaxlib_version() >= (0, 10, 1):   # pylint: disable=protected-access
    assert flags.split() == [f"{xla_cpu.YNN_FLAG}="]
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(env, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
                                **{xla_cpu.ENV: "keep"}), check=True)
  assert out.stdout.split("\n")[0] == ""


def test_one_thread_per_op_flag_added_once_and_the_users_choice_wins():
  f = xla_cpu.EIGEN_FLAG
  assert xla_cpu.one_thread_per_op_flags("") == f"{f}=false"
  assert xla_cpu.one_thread_per_op_flags("--a=1") == f"--a=1 {f}=false"
  assert xla_cpu.one_thread_per_op_flags(f"{f}=true") == f"{f}=true"
  once = xla_cpu.one_thread_per_op_flags("")
  assert xla_cpu.one_thread_per_op_flags(once) == once


@pytest.mark.parametrize("fn, flag, value, users", [
    ("one_thread_per_op", xla_cpu.EIGEN_FLAG, "false", "true"),
    ("one_piece_codegen", xla_cpu.CODEGEN_FLAG, "1", "4")])
def test_grid_setting_only_before_the_backend_starts(fn, flag, value, users):
  """Set before JAX's backend starts (children inherit it); after, left alone (a worker
  would otherwise differ from the process that started it); the user's value wins."""
  code = ("import os, ceu_jax, jax; from ceu_jax import xla_cpu; "
          f"a = xla_cpu.{fn}(); f = os.environ['XLA_FLAGS']; "
          "jax.numpy.ones(2).block_until_ready(); os.environ['XLA_FLAGS'] = ''; "
          f"b = xla_cpu.{fn}(); print(a, b, f, os.environ['XLA_FLAGS'], sep='|')")
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
  run = lambda **extra: subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True, check=True,
      env=dict(env, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **extra)).stdout.strip().split("|")
  a, b, flags, after = run()
  assert (a, b, after) == ("True", "False", "")
  assert f"{flag}={value}" in flags.split()
  a, _, flags, _ = run(XLA_FLAGS=f"{flag}={users}")
  assert a == "False" and flags.split()[0] == f"{flag}={users}"


def test_with_flag_appends_once():
  f = xla_cpu.CODEGEN_FLAG
  assert xla_cpu.with_flag("--a=1", f, "1") == f"--a=1 {f}=1"
  assert xla_cpu.with_flag(f"--a=1 {f}=1", f, "1") == f"--a=1 {f}=1"
  assert xla_cpu.with_flag(f"{f}=4", f, "1") == f"{f}=4"
