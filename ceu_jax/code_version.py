"""Which code produced a result: the ceu_jax version and, when ceu_jax runs from a git
checkout (the README's `pip install -e .`), the commit and the files changed since it.

Recorded in every workdir event (W/provenance.json), in every job's summary.json
(`produced_by.versions.code`) and in every grid cell's result.json; the grid report
names the code of its cells and warns when they differ. `versions()` adds the Python, jax,
flax and numpy versions and the CPU: XLA:CPU compiles for the CPU it runs on, so the same
code and libraries can round differently on another CPU (README, the main job on a third
host).
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys

import ceu_jax

MAX_LISTED = 20     # changed files listed by name (the count is always complete)
GIT_TIMEOUT_S = 10  # a git that hangs (network file system) gives no commit, not a hang


def _git(root: str, *args: str) -> str:
  return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                        timeout=GIT_TIMEOUT_S, check=True).stdout


def package_root() -> str:
  """The directory that holds the ceu_jax package (a checkout's root, or site-packages)."""
  return os.path.dirname(os.path.dirname(os.path.abspath(ceu_jax.__file__)))


@functools.lru_cache(maxsize=None)
def code_version(root: str | None = None) -> dict:
  """{ceu_jax, commit, dirty, changed, n_changed} of the code in `root` (default: the
  package's). commit/dirty/changed are None unless `root` is the top of a git checkout
  (an installed copy inside some other repository is not that repository's commit).
  `changed`: tracked files that differ from the commit (at most MAX_LISTED names)."""
  root = os.path.realpath(root or package_root())
  out = dict(ceu_jax=ceu_jax.__version__, commit=None, dirty=None, changed=None,
             n_changed=None)
  try:
    top = _git(root, "rev-parse", "--show-toplevel").strip()
    if os.path.realpath(top) != root:
      return out
    commit = _git(root, "rev-parse", "HEAD").strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=no").splitlines()
  except (OSError, subprocess.SubprocessError):
    return out
  changed = sorted(line[3:] for line in status if line.strip())
  return dict(out, commit=commit, dirty=bool(changed), changed=changed[:MAX_LISTED],
              n_changed=len(changed))


def describe(code: dict | None) -> str:
  """One line: 'ceu_jax 0.1.0 at commit 1a2b3c4d5e6f (+ 2 changed files)'."""
  if not code:
    return "unrecorded code"
  where = (f"at commit {code['commit'][:12]}" if code.get("commit")
           else "outside a git checkout")
  extra = f" (+ {code['n_changed']} changed files)" if code.get("dirty") else ""
  return f"ceu_jax {code.get('ceu_jax', '?')} {where}{extra}"


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo on Linux, else `platform.processor()`), and the
  architecture when neither names it."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "?"


def versions() -> dict:
  """What produced a result: the code (`code_version`), Python, jax / flax / numpy where
  imported, and the CPU (recorded in summary.json and in every grid cell's result.json)."""
  out = {"python": sys.version.split()[0], "code": code_version(), "cpu": cpu_model()}
  for name in ("jax", "flax", "numpy"):
    mod = sys.modules.get(name)
    if mod is not None:
      out[name] = getattr(mod, "__version__", "?")
  return out
