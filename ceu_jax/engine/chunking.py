"""How many probes to vmap together (the chunk size C).

Shape legend (einsum letters): K probes, C probes per chunk.

One chunk's working set is C times the per-probe working set w: the bytes of
every value the loop body makes for one probe (Π_S on the clean run, the
patched site and the suffix after it), measured from the hoisting split
(`hoist.Split.body_bytes`, traced with C = 1; nothing is compiled). The
rule: all K probes in one chunk when K · w ≤ budget(backend) (K ≤ MAX_CHUNK), else
the largest power of two C with C · w ≤ budget, at least 1; the budget is below.

Why: vmapping C probes turns each suffix op into one op C times larger.
Larger chunks amortise per-op overhead until the chunk's intermediates stop
fitting in fast memory; on CPU that happens early (SPEC §9: one vmap over 64
probes cost 128 ms/probe against 53 ms/probe in chunks of 4), on a GPU late.
`benchmarks/engine_chunk_bench.py` times every power-of-two C on several
models and reports how far the rule's choice is from the best (TARGET line).
"""
from __future__ import annotations

from typing import Any, Callable

import jax

from ceu_jax.engine import hoist
from ceu_jax.engine.errors import EngineError

MiB = 1 << 20
# Per-chunk working-set budget by backend, bytes (CPU: measured with
# benchmarks/engine_chunk_bench.py; GPU/TPU: not measured here, set so that a
# chunk stays a small share of device memory).
BUDGET = {"cpu": 128 * MiB, "gpu": 2048 * MiB, "tpu": 2048 * MiB}
MAX_CHUNK = 256


def check(chunk_size: Any) -> None:
  if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
    raise EngineError(
        f"chunk_size must be an int >= 1 or 'auto', got {chunk_size!r}")


def rule(per_probe_bytes: int, num_probes: int, backend: str | None = None) -> int:
  """K when all K probes fit the budget (one vmap, no padded probe: an audit's 3
  probes are one chunk of 3, not two of 2), else the largest power of two C with
  C · per_probe_bytes ≤ budget, in [1, K]."""
  backend = backend or jax.default_backend()
  budget = BUDGET.get(backend, BUDGET["gpu"])
  if num_probes <= MAX_CHUNK and num_probes * max(per_probe_bytes, 1) <= budget:
    return max(int(num_probes), 1)
  c = 1
  while (c * 2 <= min(num_probes, MAX_CHUNK)
         and c * 2 * max(per_probe_bytes, 1) <= budget):
    c *= 2
  return c


def per_probe_bytes(fn: Callable[[Any, Any], Any], consts: Any, probes: Any) -> int:
  """The loop body's bytes for one probe (traced, not run)."""
  one = jax.tree.map(lambda m: m[:1], probes)
  sizes = {}

  def measure(c, p):
    sizes["w"] = hoist.split(fn, c, p).body_bytes
    return 0

  jax.eval_shape(measure, consts, one)
  return sizes["w"]


def choose(fn: Callable[[Any, Any], Any], consts: Any, probes: Any,
           batch_shards: int = 1) -> int:
  """`rule` applied to the measured per-probe working set of ``fn`` on one device:
  traced shapes are global, so with the batch split over ``batch_shards`` devices
  each holds 1 / batch_shards of it (the budget is per device)."""
  per_device = -(-per_probe_bytes(fn, consts, probes) // max(int(batch_shards), 1))
  return rule(per_device, probes.num)
