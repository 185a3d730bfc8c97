"""Per family and preset: parameter count, read-port sites, span decomposition.

Used by `python -m experiments.describe --config configs/atr_insert.py:tiny` and tests.
Task sizes come from `config.data` (context_len, num_passages, answer_len, variant,
n_* vocabulary sizes) when it can be turned into a `ceu_jax.data.atr_config.ATRConfig`,
else from the reference sizes.
"""
from __future__ import annotations

from typing import Any

from architectures.api import build_model, count_params, read_port_sites, span_decomposition
from architectures.spec import FAMILIES, PRESETS, REFERENCE_VOCAB, make_spec


def task_sizes(config: Any) -> dict[str, int]:
  """vocab_size, context_len, num_passages, query_len, answer_len of config.data."""
  data = getattr(config, "data", None) if config is not None else None
  if data is not None:
    from ceu_jax.data.atr_config import ATRConfig  # pylint: disable=g-import-not-at-top
    atr = ATRConfig.from_config(data)
    return dict(vocab_size=atr.vocab.size, context_len=atr.context_len,
                num_passages=atr.num_passages, query_len=atr.query_len,
                answer_len=atr.answer_len)
  return dict(vocab_size=REFERENCE_VOCAB, context_len=128, num_passages=8, query_len=6,
              answer_len=1)


def describe_rows(config: Any = None) -> list[dict[str, Any]]:
  """One row per (family, preset) with the model config's other fields kept."""
  sizes = task_sizes(config)
  base = dict(getattr(config, "model", None) or {}) if config is not None else {}
  rows = []
  for preset in PRESETS:
    for family in FAMILIES:
      cfg = dict(base, family=family, preset=preset)
      cfg.setdefault("retrieval_layers", "last")
      spec = make_spec(cfg, **sizes)
      rows.append(dict(
          family=family, preset=preset, params=count_params(build_model(cfg, **sizes)),
          ports=spec.num_ports, sites=[str(s) for s in read_port_sites(cfg)],
          span_decomposition=span_decomposition(family),
          exact=span_decomposition(family) == "exact"))
  return rows


def describe(config: Any = None) -> str:
  """A printable table of `describe_rows(config)`."""
  sizes = task_sizes(config)
  lines = [f"task sizes: {sizes}",
           f"{'preset':<7} {'family':<12} {'params':>9} {'P':>3}  {'span Π_S':<12} read ports"]
  for r in describe_rows(config):
    lines.append(f"{r['preset']:<7} {r['family']:<12} {r['params']:>9,d} {r['ports']:>3}  "
                 f"{r['span_decomposition']:<12} {', '.join(r['sites'])}")
  return "\n".join(lines)
