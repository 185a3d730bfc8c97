"""Which code produced a result: the ceu_jax version and, when ceu_jax runs from a git
checkout (the README's `pip install -e .`), the commit and the files changed since it.

Recorded in every workdir event (W/provenance.json), in every job's summary.json
(`produced_by.versions.code`) and in every grid cell's result.json; the grid report
names the code of its cells and warns when they differ. `versions()` adds the Python, jax,
flax and numpy versions, the CPU (its model name and instruction-set extensions) and
XLA_FLAGS: XLA:CPU compiles for the CPU it runs on, so the same code and libraries can round
differently on another CPU, even one /proc/cpuinfo names alike (README, "Results").
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import subprocess
import sys
from typing import Mapping, Sequence

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
def _cpuinfo() -> dict[str, str]:
  """The first value of each /proc/cpuinfo field ({} where there is none: not Linux)."""
  out: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, sep, value = line.partition(":")
        if sep:
          out.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  return out


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo on Linux, else `platform.processor()`), and the
  architecture when neither names it."""
  return (_cpuinfo().get("model name") or platform.processor() or platform.machine()
          or "?")


# The CPU's instruction-set extensions that can change what XLA:CPU (through LLVM) emits:
# x86 SIMD, matrix and bit-manipulation sets; on Arm every `Features` entry is one.
_ISA_FLAG = re.compile(r"^(sse\S*|ssse3|avx\S*|amx\S*|fma\S*|f16c|bmi\d|abm|lzcnt|movbe|popcnt|"
                       r"gfni|vaes|vpclmulqdq|pclmulqdq|sha_ni)$")


@functools.lru_cache(maxsize=None)
def cpu_features() -> tuple[str, ...]:
  """The CPU's instruction-set extensions (sorted; /proc/cpuinfo `flags`, x86, filtered by
  `_ISA_FLAG`, or `Features`, Arm), () where the system does not list them. Two hosts
  whose /proc/cpuinfo gives the same model name can differ here (a virtual machine's
  "Intel(R) Xeon(R) Processor" with or without AVX-512), and XLA:CPU compiles for them."""
  info = _cpuinfo()
  if "flags" in info:
    return tuple(sorted(x for x in info["flags"].split() if _ISA_FLAG.match(x)))
  return tuple(sorted(info.get("Features", "").split()))


def _isa_family(features: Sequence[str]) -> str:
  """The widest vector / matrix set among `features`, in words ('AVX-512 + AMX', 'SVE')."""
  f = set(features)
  if "avx512f" in f:
    return "AVX-512 + AMX" if "amx_tile" in f else "AVX-512"
  for flag, name in (("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"), ("sve2", "SVE2"),
                     ("sve", "SVE"), ("asimd", "NEON")):
    if flag in f:
      return name
  return "no SIMD listed"


def cpu_kind(recorded: Mapping | None = None) -> str:
  """One line naming what computed a result, from its `versions` record (default: this
  process): the model name, then — when recorded — the widest instruction set and a short
  hash of all `cpu_features`, and an `--xla_cpu_max_isa` cap from XLA_FLAGS. Results with
  different kinds can round differently; 'unrecorded CPU' for records made before the CPU
  was recorded."""
  v = versions() if recorded is None else (recorded or {})
  name = v.get("cpu")
  if not name:
    return "unrecorded CPU"
  features = v.get("cpu_features")
  if features is None:                  # recorded before the features were
    return name
  digest = hashlib.sha1(" ".join(features).encode()).hexdigest()[:6]
  cap = re.search(r"--xla_cpu_max_isa=(\S+)", v.get("xla_flags") or "")
  return (f"{name} [{_isa_family(features)}, {len(features)} ISA flags #{digest}"
          + (f", XLA capped at {cap.group(1)}" if cap else "") + "]")


def versions() -> dict:
  """What produced a result: the code (`code_version`), Python, jax / flax / numpy where
  imported, the CPU (model name and `cpu_features`) and XLA_FLAGS ('' when unset) —
  recorded in summary.json and in every grid cell's result.json."""
  out = {"python": sys.version.split()[0], "code": code_version(), "cpu": cpu_model(),
         "cpu_features": list(cpu_features()), "xla_flags": os.environ.get("XLA_FLAGS", "")}
  for name in ("jax", "flax", "numpy"):
    mod = sys.modules.get(name)
    if mod is not None:
      out[name] = getattr(mod, "__version__", "?")
  return out
