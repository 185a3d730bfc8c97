"""Causal sensitivity of reasoning traces (seed 002, SPEC §8.2).

  audit         interventions on a trace, φ, ρ, Strength, summaries (the audit itself)
  chain_world   World A: chained ATR items, the trace oracles and trained chain readers
  text          World B: SmolLM2 with few-shot "Step i:" traces (arithmetic, factual)
  probe         §8.4: the answer-position probe with the trace held fixed
  job           the resumable job (`TraceSensitivityJob`, experiments/trace_sensitivity.py)
"""
