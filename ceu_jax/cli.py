"""What every entry point in experiments/ shares: quiet logs and one-line errors.

  cli.run(main)                # = app.run(cli.guard(main), flags_parser=cli.parse_flags)

- Third-party INFO logging (Orbax writes ~40 lines per checkpoint) is dropped;
  this project's INFO lines and everyone's warnings stay. absl's own
  `--verbosity=1` (also `-v 1`) shows everything.
- A bad flag or config argument (`configs/x.py:tiny,bypass=treu`) is one line too,
  not ml_collections' embedded traceback.
- Known errors — a bad config, an unusable workdir or checkpoint, bad data (the
  project raises ValueError subclasses for these, e.g. `ceu_jax.workdir.WorkdirError`)
  and missing files — end the program with one line on stderr and exit code 1;
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

KNOWN_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                PermissionError)
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


def parse_flags(argv: list[str]) -> list[str]:
  """absl flags parser for `app.run`: a bad flag or config argument is one line, exit 1."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    if _verbose_argv(argv[1:]):
      raise
    print(flag_error_line(e) + " (--verbosity=1 shows the traceback)", file=sys.stderr,
          flush=True)
    sys.exit(EXIT_ERROR)


def run(main: Callable[[list[str]], Any]) -> None:
  """`app.run` with one-line flag/config errors, quiet logs and known errors guarded."""
  app.run(guard(main), flags_parser=parse_flags)
