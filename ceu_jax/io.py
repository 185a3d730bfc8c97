"""Atomic file writes: a result file is either complete or absent, never half-written."""
from __future__ import annotations

import json
import os
import tempfile
from typing import IO, Any, Callable


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def write_atomic(path: str, write: Callable[[IO[bytes]], None]) -> None:
  """Call `write(f)` on a temp file beside `path`, fsync, then os.replace it into place.

  The file gets the usual mode for new files (mkstemp's 0600 is widened by umask).
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path),
                             dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def write_text_atomic(path: str, text: str) -> None:
  write_atomic(path, lambda f: f.write(text.encode()))


def write_json_atomic(path: str, obj: Any) -> None:
  write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def read_jsonl(path: str) -> list:
  """The JSON lines of a file, a torn or unreadable line (a writer killed mid-line)
  skipped."""
  out = []
  with open(path) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except ValueError:
        continue
  return out


def cached_json(path: str, key: Any, compute: Callable[[], dict]) -> dict:
  """The JSON dict at `path` when it was computed for `key` (its 'key' field), else
  compute() with the key added, written atomically and returned."""
  if os.path.exists(path):
    old = read_json(path)
    if old.get('key') == key:
      return old
  out = dict(compute(), key=key)
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  write_json_atomic(path, out)
  return out
