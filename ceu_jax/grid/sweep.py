"""Sweep expansion: a config's `sweep` -> validated cells with stable ids (SPEC §6).

A sweep is data in the config: a tuple of *axes*; the grid is the product of the
axes, and the fields inside one axis are zipped (they move together):

  c.sweep = (
      (("model.family", ("attention", "ssm", "memory_port")),),          # product axis
      (("cer.regularizer", ("none", "evidence")),                        # zipped axis:
       ("cer.lambda_ev", (0.0, 1.0))),                                   #   2 cells, not 4
  )

Every cell is expanded and validated before anything trains; an invalid cell is
reported with its index, its overrides and the field at fault.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from typing import Any, Callable, Sequence

import ml_collections

# Config sections that describe how a grid is run, not what a cell computes:
# they do not enter the cell id.
NON_CELL_FIELDS = ("sweep", "grid")


@dataclasses.dataclass(frozen=True)
class Cell:
  index: int                                   # position in the expanded grid
  cell_id: str                                 # hash of the cell's config
  overrides: tuple[tuple[str, Any], ...]       # the swept (field, value) pairs
  config: ml_collections.ConfigDict            # the full cell config (unlocked copy)

  def label(self) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in self.overrides) or "(base)"


def _get(cfg: ml_collections.ConfigDict, dotted: str):
  node = cfg
  for part in dotted.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise KeyError(dotted)
    node = node[part]
  return node


def _set(cfg: ml_collections.ConfigDict, dotted: str, value) -> None:
  *parents, leaf = dotted.split(".")
  node = cfg
  for part in parents:
    node = node[part]
  with node.unlocked():
    node[leaf] = value


def _axes(sweep) -> list[list[tuple[str, tuple]]]:
  """Normalise and check the sweep's shape; returns a list of zipped axes."""
  if not sweep:
    raise ValueError("sweep is empty: declare at least one axis, e.g. "
                     "((('model.family', ('attention', 'ssm')),),)")
  axes = []
  for a, axis in enumerate(sweep):
    fields = [(str(f), tuple(v)) for f, v in axis]
    if not fields:
      raise ValueError(f"sweep axis {a} is empty")
    lengths = {f: len(v) for f, v in fields}
    if len(set(lengths.values())) != 1:
      raise ValueError(f"sweep axis {a} zips fields of different lengths: {lengths}")
    if 0 in lengths.values():
      raise ValueError(f"sweep axis {a}: field {fields[0][0]!r} has no values")
    axes.append(fields)
  return axes


# Cell ids hash the eval section as it was written before eval.probe_chunk and
# eval.eps existed (issue #34), so a grid directory from before keeps its cells:
# the probe chunk does not change a cell's rows (one fixed value, the old
# eval.chunk_size = 16, stands for every choice) and eval.eps enters the hash only
# where it differs from cer.eps, the ε those audits used.
LEGACY_PROBE_CHUNK = 16


def _as_hashed_before_34(d: dict) -> dict:
  e = d.get("eval")
  if not isinstance(e, dict) or "probe_chunk" not in e:
    return d
  e = dict(e)
  del e["probe_chunk"]
  e["chunk_size"] = LEGACY_PROBE_CHUNK
  cer_eps = (d.get("cer") or {}).get("eps")
  if "eps" in e and cer_eps is not None and float(e["eps"]) == float(cer_eps):
    del e["eps"]
  return dict(d, eval=e)


def canonical_json(cfg: ml_collections.ConfigDict) -> str:
  d = cfg.to_dict()
  for key in NON_CELL_FIELDS:
    d.pop(key, None)
  return json.dumps(_as_hashed_before_34(d), sort_keys=True, default=str)


def cell_id(cfg: ml_collections.ConfigDict) -> str:
  """Stable 12-hex id: a hash of everything that determines the cell's results."""
  return hashlib.sha1(canonical_json(cfg).encode()).hexdigest()[:12]


def expand(base: ml_collections.ConfigDict, sweep=None,
           validate: Callable[[ml_collections.ConfigDict], None] | None = None
           ) -> list[Cell]:
  """All cells of the grid, each validated; raises ValueError naming cell and field."""
  sweep = base.get("sweep") if sweep is None else sweep
  axes = _axes(sweep)
  cells, seen = [], {}
  combos = itertools.product(*[list(zip(*[v for _, v in axis])) for axis in axes])
  for index, combo in enumerate(combos):
    overrides = tuple((f, val) for axis, values in zip(axes, combo)
                      for (f, _), val in zip(axis, values))
    cfg = ml_collections.ConfigDict(base.to_dict())
    for field, value in overrides:
      try:
        _get(cfg, field)
      except KeyError:
        raise ValueError(f"grid cell {index} ({_fmt(overrides)}): unknown field "
                         f"{field!r}") from None
      _set(cfg, field, value)
    if validate is not None:
      try:
        validate(cfg)
      except ValueError as e:
        raise ValueError(f"grid cell {index} ({_fmt(overrides)}): {e}") from None
    cid = cell_id(cfg)
    if cid in seen:
      raise ValueError(f"grid cells {seen[cid]} and {index} are identical "
                       f"({_fmt(overrides)}); remove the duplicate sweep value")
    seen[cid] = index
    cells.append(Cell(index=index, cell_id=cid, overrides=overrides, config=cfg))
  return cells


def _fmt(overrides: Sequence[tuple[str, Any]]) -> str:
  return ", ".join(f"{k}={v!r}" for k, v in overrides)


def parse_shard(spec: str | None) -> tuple[int, int]:
  """'i/N' -> (i, N) with 0 <= i < N; None -> (0, 1)."""
  if not spec:
    return 0, 1
  try:
    i, n = (int(x) for x in spec.split("/"))
  except ValueError:
    raise ValueError(f"--shard must look like i/N (e.g. 0/2), got {spec!r}") from None
  if n < 1 or not 0 <= i < n:
    raise ValueError(f"--shard i/N needs N >= 1 and 0 <= i < N, got {spec!r}")
  return i, n


def shard_cells(cells: Sequence[Cell], shard: tuple[int, int]) -> list[Cell]:
  i, n = shard
  return [c for c in cells if c.index % n == i]


def flatten(cfg: ml_collections.ConfigDict | dict, prefix: str = "") -> dict[str, Any]:
  """{'model.family': 'ssm', ...}: every leaf field of a config, for CSV columns."""
  d = cfg.to_dict() if isinstance(cfg, ml_collections.ConfigDict) else cfg
  out = {}
  for k, v in d.items():
    if k in NON_CELL_FIELDS and not prefix:
      continue
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else v
  return out
