"""Causal sensitivity of reasoning traces (seed 002, SPEC §8.2).

  audit         interventions on a trace, regeneration, φ, ρ, Strength, follow (the audit itself)
  summary       cells (φ, ρ, follow rate, parse failures, undefined / unknown by reason), tables
  chain_world   World A: chained ATR items, the trace oracles and trained chain readers
  text          World B's text traces ("Step i:" lines) and the factual domain
  arithmetic    World B's arithmetic domain: the implied answer from the trace's own steps
  smollm2_world World B for the job: SmolLM2-135M-Instruct reading both domains
  probe         §8.4: the answer-position probe with the trace held fixed
  job           the resumable job (`TraceSensitivityJob`, experiments/trace_sensitivity.py)
"""
