"""Faithfulness to an intermediate structure (seed 003, SPEC §8.3).

  audit            F_ID, F_Strong, Δ, COR / CNF consistency (the audit itself)
  checklist_world  World A: the checklist ATR task
  checklist_text   World B: text checklists on the shipped passages (SmolLM2)
  probe            §8.4: the decision-position probe with M held fixed
  plots            the figures
  job              the resumable job (`MediatorJob`, experiments/mediator.py)
"""
