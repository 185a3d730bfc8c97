"""Where the test suite's compiling goes: the files `pytest --compile-seconds=PATH` wrote
(PATH.<worker>.json per module, PATH.<worker>.functions.json per jitted function), merged
over the workers and printed: totals, the modules and the functions that cost most.

  python -m pytest -q -n 2 --compile-seconds=/tmp/cs
  python scripts/compile_seconds.py /tmp/cs [--top 25]

Seconds are the test processes' own (tracing, lowering, XLA compiling); a test's
subprocesses are not counted. `programs` counts the programs requested from XLA, the
persistent cache's hits among them (`cache_hits`). With `pytest --program-census` beside
`--compile-seconds`, also the programs each test process compiled more than once (one
fingerprint twice: tests/program_census.py) and the requests by their CPU seconds.
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
                  if not p.endswith((".functions.json", ".census.json"))]
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
  census_files = sorted(glob.glob(f"{glob.escape(path)}.*.census.json"))
  if census_files:
    lines += [""] + census(census_files, top)
  return lines


SIZES = ((0.0, 0.02), (0.02, 0.1), (0.1, 1.0), (1.0, float("inf")))   # CPU-s of a request


def census(paths: list[str], top: int) -> list[str]:
  """The programs requested from XLA by their CPU seconds, and those requested again in
  the same process (one fingerprint seen before there): per module, top `top`."""
  rows = []
  for path in paths:                   # one file per process: repeats are counted within it
    with open(path) as f:
      rows += [(path, *r) for r in json.load(f)]
  seen, again = set(), collections.defaultdict(lambda: [0, 0.0])
  for path, module, _, key, secs in rows:
    if (path, key) in seen:
      again[module][0] += 1
      again[module][1] += secs
    seen.add((path, key))
  n_again, s_again = sum(n for n, _ in again.values()), sum(s for _, s in again.values())
  lines = [f"program census ({len(paths)} process(es)): {len(rows)} requests, "
           f"{len(seen)} distinct programs, {sum(r[4] for r in rows):.1f} CPU-s; "
           f"requested again in the same process: {n_again} ({s_again:.1f} CPU-s)"]
  for lo, hi in SIZES:
    part = [r[4] for r in rows if lo <= r[4] < hi]
    span = f">= {lo:g} s" if hi == float("inf") else f"{lo:g}-{hi:g} s"
    lines.append(f"  requests of {span:>9}: {len(part):5d}, {sum(part):8.1f} CPU-s")
  if again:
    lines += [f"requested again, by module (top {top}):", f"{'again':>7} {'CPU-s':>8}  module"]
    lines += [f"{n:7d} {s:8.1f}  {m}" for m, (n, s) in
              sorted(again.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]]
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
