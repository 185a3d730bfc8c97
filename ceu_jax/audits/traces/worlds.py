"""The worlds of the trace-sensitivity job (configs/trace_sensitivity.py `world`).

  world = make_world(config)     # validated: ValueError naming the field, nothing built

A world has `title`, `readers` (names), `items` and `domains` (per domain name),
`prepare(workdir, log)`, `reader(name)` and `describe()`; World A also
`probes(config)` and `reader_stats(rows)`:
  chain    World A (`chain_world.ChainWorld`): chained ATR items read by the trace
           oracles and by readers trained here;
  smollm2  World B (`smollm2_world.SmolLM2World`): SmolLM2-135M-Instruct with few-shot
           "Step i:" traces on arithmetic and factual questions.
"""
from __future__ import annotations

from ceu_jax.audits.traces import audit as ts

WORLDS = ('chain', 'smollm2')


def make_world(config):
  """The world of a config (validated before anything is built or written)."""
  if config.world not in WORLDS:
    raise ValueError(f'world must be one of {WORLDS}, got {config.world!r}')
  if int(config.n_items) < 1:
    raise ValueError(f'n_items must be >= 1, got {config.n_items!r}')
  if int(config.items_per_chunk) < 1:
    raise ValueError(f'items_per_chunk must be >= 1, got {config.items_per_chunk!r}')
  for t in config.taus:
    if t not in ts.TAUS:
      raise ValueError(f'taus: {t!r} is not one of {ts.TAUS}')
  for name, lo, hi in (('tau_sim', 0.0, 1.0), ('lam', 0.0, 1.0)):
    if not lo <= float(config[name]) <= hi:
      raise ValueError(f'{name} must lie in [{lo}, {hi}], got {config[name]!r}')
  if config.world == 'chain':
    from ceu_jax.audits.traces.chain_world import ChainWorld
    return ChainWorld(config)
  from ceu_jax.audits.traces.smollm2_world import SmolLM2World
  return SmolLM2World(config)
