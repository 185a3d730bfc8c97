"""Answer presence and the sentinel panel (seed 001, SPEC §8.1).

  audit         edits, buckets, effects, Δcausal (the audit itself)
  sentinels     the sentinel / placebo panel
  worlds        the worlds (generated, ATR = World A, factual QA = World B): `make_world`
  atr_world, factqa_world   the two data worlds' records and rewriters
  report, plots the tables and figures
  job           the resumable job (`AnswerPresenceJob`, experiments/answer_presence.py)
"""
