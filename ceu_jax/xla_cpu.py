"""XLA:CPU settings the library applies before JAX's backend starts (imported by `ceu_jax`).

YNNPACK fusions off. jaxlib 0.10.2 hands some CPU fusions to YNNPACK (`__ynn_fusion`, its
slinky buffers); on Linux x86-64 some of them crash the process (SIGSEGV) or hang at their
first execution — a known regression of jaxlib 0.10.2 and 0.11.0 for high-rank
multiply-reduce fusions (jax-ml/jax#39257, #40412; backtrace in slinky::optimize_dims). Here
it hit the compiled gradient of the SmolLM2 CER objective's causal-tail path (rank-5 tail
tensors) on an AMD EPYC host: every tiny `configs/smollm2_cer.py:tiny` CER run segfaulted,
while the forward alone and the `cer_path=full` path ran. `--xla_cpu_experimental_ynn_fusion_type=`
(empty: no YNNPACK fusion) makes the same program run (measured 2026-11-28; the tiny CER
fine-tunes of tests/test_smollm2_cer_train.py and tests/test_smollm2_prior_world.py are the
crashing case, tests/test_xla_cpu.py checks the setting). No narrower value is safe: of the
fusion types (dot, eltwise, reduce, individual_dot, ...) `eltwise` alone and `reduce` alone
still crash, and `dot` alone runs but computes wrong numbers — the CER objective of
tests/test_losses_cer.py came out NaN (one case) and 3e-4 off the engine's terms (another),
against 1e-5 agreement with fusions off. The cost: the 2-layer SmolLM2 trace test ran 35.1 s
with fusions off against 29.0 s with XLA's default (tests/test_trace_text.py::
test_tiny_smollm2, same machine); the whole suite 18:52 against 16:49 with `dot` kept. The flag is added to XLA_FLAGS only
when the user has not set it (their value wins) and only for jaxlib >= 0.10.1, which parses it
(XLA aborts on an unknown flag). It acts when `ceu_jax` is imported before the first
computation, as the entry points and tests do; CEU_JAX_YNN=keep leaves XLA_FLAGS alone.
"""
from __future__ import annotations

import os

YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
ENV = "CEU_JAX_YNN"   # 'keep': leave XLA's YNNPACK fusions as they are


def _jaxlib_version() -> tuple[int, ...]:
  try:
    from jaxlib import version  # pylint: disable=g-import-not-at-top
  except ImportError:
    return ()
  out = []
  for part in version.__version__.split(".")[:3]:
    digits = "".join(ch for ch in part if ch.isdigit())
    out.append(int(digits or 0))
  return tuple(out)


def ynn_off_flags(xla_flags: str, jaxlib_version: tuple[int, ...], env: str = "") -> str:
  """XLA_FLAGS with YNNPACK fusions switched off (see the module doc); unchanged when the
  user set the flag, when env == 'keep', or for jaxlib older than 0.10.1."""
  if env == "keep" or jaxlib_version < (0, 10, 1):
    return xla_flags
  return with_flag(xla_flags, YNN_FLAG, "")


def apply() -> None:
  """Set os.environ['XLA_FLAGS'] (see `ynn_off_flags`)."""
  flags = os.environ.get("XLA_FLAGS", "")
  new = ynn_off_flags(flags, _jaxlib_version(), os.environ.get(ENV, ""))
  if new != flags:
    os.environ["XLA_FLAGS"] = new


# ---------------------------------------------------------------- one thread per op
EIGEN_FLAG = "--xla_cpu_multi_thread_eigen"


def one_thread_per_op_flags(xla_flags: str) -> str:
  """XLA_FLAGS with XLA:CPU's Eigen kernels on one thread (`EIGEN_FLAG=false`); unchanged
  when the user set the flag."""
  return with_flag(xla_flags, EIGEN_FLAG, "false")


def with_flag(xla_flags: str, flag: str, value: str) -> str:
  """XLA_FLAGS with `flag=value` added; unchanged when it names the flag already."""
  if flag in xla_flags:
    return xla_flags
  return f"{xla_flags} {flag}={value}".strip()


def one_thread_per_op() -> bool:
  """For the grid: each process runs an op's Eigen kernel on one thread. A grid keeps the
  host's cores busy with its worker processes (`--processes`), one cell each; the tiny
  cells' ops, split over threads, then spin and switch on cores the other workers need.
  Measured on 2 cores, two ssm CER cells of the smoke grid at once: 239 → 204 s wall
  (user 231 → 194 s per process). Every process of a grid uses the same setting, so a
  grid's numbers do not depend on `--processes` (the setting changes XLA's reduction
  splits, hence float rounding, against a multi-threaded run of the same cell).

  Applied to os.environ (worker processes inherit it) only before JAX's backend starts
  and unless XLA_FLAGS already names the flag (the user's value wins); returns whether
  the flag is in effect for this process."""
  return _set_before_backend(EIGEN_FLAG, "false")


# ---------------------------------------------------------------- codegen in one piece
CODEGEN_FLAG = "--xla_cpu_parallel_codegen_split_count"


def one_piece_codegen() -> bool:
  """For the grid: each process generates a program's machine code in one piece
  (`CODEGEN_FLAG=1`) instead of splitting it over threads, for the reason above: the
  other workers have the cores. It changes no value: the smoke grid's 18 cells came out
  value for value as without it; cells 0, 5 and 6 (attention, ssm, memory_port), one
  process each on 2 cores, took user 107.7 → 95.1, 204.7 → 174.0, 98.8 → 100.8 s
  (2026-12-02). Applied like `one_thread_per_op`."""
  return _set_before_backend(CODEGEN_FLAG, "1")


def _set_before_backend(flag: str, value: str) -> bool:
  """Add `flag=value` to os.environ['XLA_FLAGS'] before JAX's backend starts, unless
  XLA_FLAGS names the flag already (the user's value wins); whether `flag=value` is in
  effect for this process."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  flags = os.environ.get("XLA_FLAGS", "")
  if flag in flags:
    return f"{flag}={value}" in flags.split()
  if xla_bridge.backends_are_initialized():
    return False
  os.environ["XLA_FLAGS"] = with_flag(flags, flag, value)
  return True
