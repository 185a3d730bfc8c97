"""Behavioural audits of generating readers (SPEC §8): one subpackage per audit.

  answer_presence/  seed 001: answer presence and the sentinel panel (§8.1)
  traces/           seed 002: causal sensitivity of reasoning traces (§8.2)
  mediator/         seed 003: faithfulness to an intermediate structure (§8.3)
What they share lives here: `trained` (World A readers trained as in the smoke
grid) and `position_probe` (the §8.4 mechanistic companion at one position).
Each audit's `job` module is its resumable job on the one job contract
(`ceu_jax.jobs`); each builds its worlds through its own `worlds.make_world`.
"""
