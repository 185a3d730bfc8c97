"""Validation of one grid cell's config, run for every cell before anything trains."""
from __future__ import annotations

import ml_collections

# The test conditions; their examples, seed and corruption come from `config.eval`
# (the grid's rows use the first of eval.corruptions, ceu_jax.grid.cell).
# `compilation_cache` (bool): keep compiled programs in W/jax_cache (grid.main).
GRID_FIELDS = ("delta_test", "n_test", "eta_test", "compilation_cache")


def validate_grid_section(g: ml_collections.ConfigDict) -> None:
  unknown = sorted(set(g.keys()) - set(GRID_FIELDS))
  if unknown:
    raise ValueError(f"grid: unknown field(s) {unknown}; known: {list(GRID_FIELDS)}")
  if not isinstance(g.get("compilation_cache", False), bool):
    raise ValueError("grid.compilation_cache must be true or false, got "
                     f"{g.compilation_cache!r}")
  for name in ("delta_test", "eta_test"):
    for v in getattr(g, name):
      if not 0.0 <= v <= 1.0:
        raise ValueError(f"grid.{name} values must be in [0, 1], got {v!r}")


def validate_cell(cfg: ml_collections.ConfigDict) -> None:
  """Everything a cell needs, checked without compiling: training config, grid
  section, and every test condition's data config."""
  from ceu_jax.grid.cell import test_conditions
  from ceu_jax.train import config as train_config
  validate_grid_section(cfg.grid)
  core = ml_collections.ConfigDict({k: v for k, v in cfg.to_dict().items()
                                    if k not in ("grid", "sweep")})
  train_config.validate(core)
  try:
    test_conditions(cfg)
  except ValueError as e:
    raise ValueError(f"grid test condition: {e}") from None
