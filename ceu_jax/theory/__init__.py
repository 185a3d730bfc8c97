"""Model-independent theory for SPEC §7: T1 identifiability, T2 lower bound,
T3 upper bound (paper 000), with estimators and plots.

Submodules: `stats` (bootstrap estimates), `identifiability` (T1),
`two_channel` (exact synthetic model for T1), `upper_bound` (T3),
`lower_bound` (T2), `plots` (matplotlib, Agg).
"""
