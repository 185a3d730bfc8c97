"""What every entry point in experiments/ shares: quiet logs and one-line errors.

  cli.run(main)                # = app.run(cli.guard(main), flags_parser=cli.parse_flags)

- Third-party INFO logging (Orbax writes ~40 lines per checkpoint) is dropped,
  third-party errors are one line each without their traceback (the main thread's
  error names the cause); this project's INFO lines and everyone's warnings stay. absl's own
  `--verbosity=1` (also `-v 1`) shows everything.
- A bad flag or config argument (`configs/x.py:tiny,bypass=treu`) is one line too,
  not ml_collections' embedded traceback.
- Known errors — a bad config, an unusable workdir or checkpoint, bad data (the
  project raises ValueError subclasses for these, e.g. `ceu_jax.workdir.WorkdirError`)
  and OSError (a missing file, a read-only workdir, a full disk: the message names the
  path) — end the program with one line on stderr and exit code 1;
  `--verbosity=1` shows the traceback instead.
"""
from __future__ import annotations

import functools
import logging as py_logging
import os
import re
import sys
from typing import Any, Callable, Sequence

from absl import app, flags, logging

KNOWN_ERRORS = (ValueError, OSError)   # OSError: missing files, permissions, a full disk
                                       # (its message names the path)
EXIT_ERROR = 1


def _project_dirs() -> tuple[str, ...]:
  import architectures  # pylint: disable=g-import-not-at-top
  import ceu_jax  # pylint: disable=g-import-not-at-top
  dirs = [os.path.dirname(os.path.abspath(m.__file__)) for m in (architectures, ceu_jax)]
  root = os.path.dirname(dirs[1])
  dirs += [os.path.join(root, d) for d in ("experiments", "configs", "benchmarks", "tests",
                                           "scripts")]
  return tuple(d + os.sep for d in dirs)


# Third-party warnings that say nothing a user can act on (tensorflow_datasets, once
# per materialised evaluation set and per read); dropped like INFO at verbosity 0.
BENIGN_WARNINGS = ("Using custom data configuration", "has no dataset_info.json")


class _ThirdPartyInfoFilter(py_logging.Filter):
  """Drops records below WARNING (and BENIGN_WARNINGS) whose source file is outside
  this project."""

  def __init__(self):
    super().__init__()
    self.dirs = _project_dirs()

  def filter(self, record: py_logging.LogRecord) -> bool:
    if os.path.abspath(record.pathname).startswith(self.dirs):
      return True
    if record.levelno >= py_logging.ERROR:
      # One line, no traceback: a background thread's failure (Orbax on a full disk logs
      # one traceback per thread) is re-raised in the main thread, which names it.
      msg = record.getMessage().splitlines()
      record.msg, record.args = (msg[0][:300] if msg else ""), None
      record.exc_info = record.exc_text = record.stack_info = None
      return True
    if record.levelno >= py_logging.WARNING:
      msg = str(record.msg)
      return not any(b in msg for b in BENIGN_WARNINGS)
    return False


def verbosity() -> int:
  """absl's --verbosity (0 when flags are not parsed yet)."""
  try:
    return int(flags.FLAGS.verbosity)
  except (AttributeError, flags.UnparsedFlagAccessError):
    return 0


def quiet_third_party_logs(level: int | None = None) -> None:
  """Install the third-party INFO filter on the absl handler (verbosity 0 only)."""
  level = verbosity() if level is None else level
  handler = logging.get_absl_handler()
  for f in list(handler.filters):
    if isinstance(f, _ThirdPartyInfoFilter):
      handler.removeFilter(f)
  if level < 1:
    handler.addFilter(_ThirdPartyInfoFilter())


def one_line(e: BaseException) -> str:
  """'error: <message>' on one line; a non-ValueError's type is named too."""
  msg = " ".join(str(e).split())
  head = msg if isinstance(e, ValueError) else f"{type(e).__name__}: {msg}"
  return f"error: {head} (--verbosity=1 shows the traceback)"


def guard(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
  """Wrap an absl `main`: quiet logs, known errors as one line and exit code 1."""
  @functools.wraps(main)
  def wrapped(argv):
    quiet_third_party_logs()
    try:
      return main(argv)
    except KNOWN_ERRORS as e:
      if verbosity() >= 1:
        raise
      logging.flush()
      print(one_line(e), file=sys.stderr, flush=True)
      sys.exit(EXIT_ERROR)
  return wrapped


def _verbose_argv(argv: Sequence[str]) -> bool:
  """--verbosity / -v >= 1 among raw arguments (before flags are parsed)."""
  for i, a in enumerate(argv):
    m = re.fullmatch(r"--?(?:v|verbosity)(?:=(-?\d+))?", a)
    if m:
      value = m.group(1) if m.group(1) is not None else (
          argv[i + 1] if i + 1 < len(argv) else "0")
      try:
        return int(value) >= 1
      except ValueError:
        return False
  return False


def flag_error_line(e: BaseException) -> str:
  """One line for a flag parsing error; for a config file's error (ml_collections puts
  the traceback into the message) the exception's own last line."""
  msg = str(e)
  if "Traceback (most recent call last)" in msg:
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    last = lines[-1]
    flag = re.match(r"flag (--\S+?)=", msg)
    msg = (f"{flag.group(1)}: " if flag else "") + re.sub(r"^\w+(Error|Exception): ", "",
                                                            last)
  return "error: " + " ".join(msg.split())


def _flag_value(argv: Sequence[str], name: str) -> str | None:
  """The raw value of --name (as --name=v or --name v) among `argv`, else None."""
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _load_config_file(spec: str):
  """get_config(arg) of 'path.py[:arg]' (as ml_collections' config flag loads it)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_cli_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _paths(tree: Any, prefix: str = "") -> list[str]:
  """Every dotted field of a config (sections and leaves)."""
  out = []
  for k, v in tree.items():
    out.append(prefix + k)
    if hasattr(v, "items"):
      out += _paths(v, prefix + k + ".")
  return out


def unknown_field_line(argv: Sequence[str]) -> str | None:
  """'error: --config.train.learning_rat: no such field in configs/x.py:tiny; the nearest
  known field is train.learning_rate' for the first override of a field the config lacks
  (None when every override names a field, or the config cannot be loaded)."""
  import difflib  # pylint: disable=g-import-not-at-top
  for a in argv:
    m = re.match(r"--(\w+)\.([\w.]+)(=|$)", a)
    if not m:
      continue
    flag, path = m.group(1), m.group(2)
    spec = _flag_value(argv, flag)
    if spec is None:
      continue
    try:
      config = _load_config_file(spec)
      known = _paths(config)
    except Exception:  # pylint: disable=broad-except  (any failure: the generic message)
      continue
    if path in known:
      continue
    leaf = path.rsplit(".", 1)[-1]
    near = (difflib.get_close_matches(path, known, n=1, cutoff=0.6)
            or [p for p in known if p.rsplit(".", 1)[-1] in
                difflib.get_close_matches(leaf, [q.rsplit(".", 1)[-1] for q in known], n=1,
                                          cutoff=0.6)][:1])
    hint = f"; the nearest known field is {near[0]}" if near else ""
    return f"error: --{flag}.{path}: no such field in {spec}{hint}"
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl flags parser for `app.run`: a bad flag or config argument, or an override of a
  config field that does not exist, is one line, exit 1."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError) as e:
    if _verbose_argv(argv[1:]):
      raise
    line = unknown_field_line(argv[1:]) or (
        flag_error_line(e) if isinstance(e, flags.Error) else
        f"error: {type(e).__name__}: {' '.join(str(e).split())}")
    print(line + " (--verbosity=1 shows the traceback)", file=sys.stderr, flush=True)
    sys.exit(EXIT_ERROR)


# glibc's mallopt parameters (malloc.h) and the values the entry points set.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX, M_ARENA_MAX = -1, -2, -4, -8
ALLOCATOR_ENV = "CEU_JAX_MALLOC"   # 'default': leave glibc's settings alone


def keep_freed_memory() -> bool:
  """Make glibc keep the buffers a jitted step frees and allocates again.

  XLA:CPU allocates each execution's temporaries as one block (236 MiB for the ssm's
  tiny train step) and frees it afterwards; glibc serves such a block with mmap and
  unmaps it on free, so every step faults every page in again (60,500 minor faults
  and 0.15 s of system time per ssm step, measured). Here, before JAX starts its
  threads: one malloc arena, no mmap'd blocks, and freed heap kept (trim threshold
  2 GiB, 64 MiB top pad): after the first steps a typical step faults no page
  (measured: 0 faults, 0.002 s system time per step; the resident set grows by the kept
  blocks, 1.07 -> 1.52 GB there); an occasional call faults its block in again
  (tests/test_allocator.py). glibc only; CEU_JAX_MALLOC=default skips it. Returns
  whether the settings were applied."""
  if os.environ.get(ALLOCATOR_ENV, "") == "default" or not sys.platform.startswith("linux"):
    return False
  import ctypes  # pylint: disable=g-import-not-at-top
  try:
    mallopt = ctypes.CDLL("libc.so.6").mallopt
  except (OSError, AttributeError):
    return False
  return all(mallopt(param, value) == 1 for param, value in (
      (M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1),
      (M_TOP_PAD, 64 * 2**20)))


def run(main: Callable[[list[str]], Any]) -> None:
  """`app.run` with one-line flag/config errors, quiet logs and known errors guarded;
  glibc keeps freed memory (`keep_freed_memory`)."""
  keep_freed_memory()
  app.run(guard(main), flags_parser=parse_flags)
