"""Where the test suite's compiling goes: the files `pytest --compile-seconds=PATH` wrote
(PATH.<worker>.json per module, PATH.<worker>.functions.json per jitted function), merged
over the workers and printed: totals, the modules and the functions that cost most.

  python -m pytest -q -n 2 --compile-seconds=/tmp/cs
  python scripts/compile_seconds.py /tmp/cs [--top 25]

Seconds are the test processes' own (tracing, lowering, XLA compiling); a test's
subprocesses are not counted. `programs` counts the programs requested from XLA, the
persistent cache's hits among them (`cache_hits`).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import sys

KINDS = ("trace", "lower", "compile")


def merge(paths: list[str]) -> dict:
  """{name: {kind: value}} summed over the files."""
  out: dict = collections.defaultdict(lambda: collections.defaultdict(float))
  for path in paths:
    with open(path) as f:
      for name, d in json.load(f).items():
        for k, v in d.items():
          out[name][k] += v
  return out


def _seconds(d: dict) -> float:
  return sum(d.get(k, 0.0) for k in KINDS)


def table(rows: dict, top: int, extra: str | None = None) -> list[str]:
  """The `top` rows by tracing + lowering + compiling seconds; `extra`: one more column."""
  tail = f" {extra:>9}" if extra else ""
  lines = [f"{'trace':>7} {'lower':>7} {'compile':>8} {'programs':>8}{tail}  name"]
  for name, d in sorted(rows.items(), key=lambda kv: -_seconds(kv[1]))[:top]:
    tail = f" {d.get(extra, 0):9.1f}" if extra else ""
    lines.append(f"{d.get('trace', 0):7.1f} {d.get('lower', 0):7.1f} {d.get('compile', 0):8.1f} "
                 f"{int(d.get('programs', 0)):8d}{tail}  {name}")
  return lines


def report(path: str, top: int = 25) -> list[str]:
  module_files = [p for p in sorted(glob.glob(f"{glob.escape(path)}.*.json"))
                  if not p.endswith(".functions.json")]
  function_files = sorted(glob.glob(f"{glob.escape(path)}.*.functions.json"))
  if not module_files:
    raise SystemExit(f"no {path}.<worker>.json: run pytest with --compile-seconds={path}")
  modules, functions = merge(module_files), merge(function_files)
  total = {k: sum(d.get(k, 0.0) for d in modules.values())
           for k in (*KINDS, "programs", "cache_hits", "measured")}
  lines = [f"{len(module_files)} worker(s): tracing {total['trace']:.1f} s, lowering "
           f"{total['lower']:.1f} s, XLA compiling {total['compile']:.1f} s; "
           f"{int(total['programs'])} programs requested, {int(total['cache_hits'])} of them "
           f"from the persistent cache; the modules' measured time {total['measured']:.1f} s",
           "", f"modules (top {top}; `measured`: their tests' seconds):"]
  lines += table(modules, top, "measured")
  if functions:
    lines += ["", f"jitted functions (top {top}):"]
    lines += table(functions, top)
  return lines


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("path", help="the PATH given to pytest --compile-seconds")
  ap.add_argument("--top", type=int, default=25, help="rows per table (>= 1)")
  args = ap.parse_args(argv)
  if args.top < 1:
    ap.error(f"--top must be >= 1, got {args.top}")
  print("\n".join(report(args.path, args.top)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
