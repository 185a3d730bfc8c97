"""`pytest --compile-seconds=PATH --program-census`: a fingerprint of every program a test
process requests from XLA (its MLIR text without locations, and its compile options), with
the test module that requested it and the CPU seconds the request took, written to
PATH.<worker>.census.json. Two requests with one fingerprint in one process are the same
program compiled twice (a persistent-cache hit included): what sharing compiled programs
between tests could still save. `python scripts/compile_seconds.py PATH` sums it up.

The hook wraps jax's private `compiler.compile_or_get_cached` (jax has no public event that
carries the program), for this measurement only: without the option nothing is wrapped.
"""
from __future__ import annotations

import hashlib
import json
import time

from jax._src import compiler as _compiler

ROWS: list = []        # [module, program name, fingerprint, CPU-s of the request]
_CURRENT = ["(collection)"]
_ORIGINAL = _compiler.compile_or_get_cached


def fingerprint(computation, compile_options) -> str:
  """The program's identity as XLA sees it: MLIR text without source locations (a jitted
  function defined again elsewhere gives the same text), and the compile options
  (optimisation level and the XLA flags set for it)."""
  digest = hashlib.sha256(computation.operation.get_asm(enable_debug_info=False).encode())
  digest.update(compile_options.SerializeAsString())
  return digest.hexdigest()[:16]


def _census_compile(backend, computation, devices, compile_options, *args, **kwargs):
  key = fingerprint(computation, compile_options)
  name = str(computation.operation.attributes["sym_name"]).strip('"')
  start = time.process_time()
  out = _ORIGINAL(backend, computation, devices, compile_options, *args, **kwargs)
  ROWS.append([_CURRENT[0], name, key, round(time.process_time() - start, 4)])
  return out


def install() -> None:
  _compiler.compile_or_get_cached = _census_compile


def uninstall() -> None:
  _compiler.compile_or_get_cached = _ORIGINAL


def set_module(module: str) -> None:
  _CURRENT[0] = module


def write(path: str) -> None:
  with open(path, "w") as f:
    json.dump(ROWS, f)
