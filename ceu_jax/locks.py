"""Exclusive per-file locks that name their holder (pure Python, no JAX).

`FileLock(path, what)` takes a non-blocking flock on `path`: the kernel releases
it when the holder dies (even by kill -9), so a dead holder never blocks. The
file holds the holder as JSON (pid, host, start time, command); a second
process is refused with `Locked` (or the caller's subclass) naming the holder.
Acquiring a lock whose file still names another process means that process
ended without releasing it (killed): a stale lock, taken over with a warning.
Used for workdirs (`ceu_jax.workdir.WorkdirLock`) and the grid driver and cells.
"""
from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
from typing import Any, Callable, Mapping


class Locked(ValueError):
  """Another process holds the lock (entry points print it as one line)."""


def who() -> dict:
  """This process: {pid, host, time, cmd}."""
  return dict(pid=os.getpid(), host=socket.gethostname(), time=time.time(),
              cmd=" ".join([os.path.basename(sys.executable)] + sys.argv)[:1000])


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except OSError as e:
    return e.errno == errno.EPERM
  return True


def _fmt_time(t: Any) -> str:
  try:
    return datetime.datetime.fromtimestamp(float(t)).strftime("%Y-%m-%d %H:%M:%S")
  except (TypeError, ValueError, OverflowError):
    return "?"


def describe_holder(info: Mapping) -> str:
  """'pid 123 on host h since 2025-01-01 12:00:00 (cmd: python -m experiments.train ...)'."""
  return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} since "
          f"{_fmt_time(info.get('time'))} (cmd: {info.get('cmd', '?')})")


def _warn(msg: str) -> None:
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.warning("%s", msg)


class FileLock:
  """`with FileLock(path, 'grid shard 0/1'):` — see the module docstring."""

  def __init__(self, path: str, what: str, *, log: Callable[[str], None] | None = None,
               error: type[Locked] = Locked, advice: str = ""):
    self.path, self.what = path, what
    self.log = log or _warn
    self.error, self.advice = error, advice
    self.stale: dict | None = None      # the dead holder this lock was taken over from
    self._fd: int | None = None

  @staticmethod
  def _read(fd: int) -> dict:
    raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if not raw:
      return {}
    try:
      out = json.loads(raw)
      return out if isinstance(out, dict) else {"pid": raw}
    except ValueError:
      return {"pid": raw}

  def acquire(self) -> "FileLock":
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = self._read(fd)
      os.close(fd)
      pid = holder.get("pid")
      note = ""
      if holder.get("host") == socket.gethostname() and isinstance(pid, int) and \
          not _pid_alive(pid):
        note = "; that pid is no longer running here, so a child process still holds it"
      advice = f". {self.advice}" if self.advice else ""
      raise self.error(f"{self.what} is locked by another process "
                       f"({describe_holder(holder)}){note}{advice} ({self.path})") from None
    previous = self._read(fd)
    if previous and previous.get("pid") != os.getpid():
      self.stale = previous
      pid = previous.get("pid")
      dead = (previous.get("host") == socket.gethostname() and isinstance(pid, int)
              and not _pid_alive(pid))
      self.log(f"taking over the stale {self.what}: its file names "
               f"{describe_holder(previous)}, which ended without releasing it"
               + (f" (pid {pid} is no longer running)" if dead else ""))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(who()).encode(), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is None:
      return
    try:
      os.ftruncate(self._fd, 0)       # a later holder sees a clean release, not a stale lock
    finally:
      os.close(self._fd)              # closing drops the flock
      self._fd = None

  def __enter__(self) -> "FileLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()
