"""One line per World A trained reader, pooled over the chain / chain_prior groups, from the
summary.json of one or more trace-sensitivity runs (docs/trace_sensitivity.md's reader table).

  python scripts/trace_worldA_table.py runs/traces_chain_attn/summary.json [more summary.json ...]

Columns: answer = gold per group, answer = own trace, regeneration parse failures (count /
rate over applied edits), φ, ρ per τ and pooled, the follow rate pooled and per τ (the share of
edits whose a* is the edited trace's implied answer), identity (identical / n) and the §8.4
probe. Every number is read from the summaries (`ceu_jax.audits.traces.summary`); nothing is
recomputed here. Readers without a probe (the oracles) are skipped.
"""
from __future__ import annotations

import json
import sys

from ceu_jax.audits.traces.summary import fmt

TAUS = ('fact_reversal', 'premise_negation', 'causal_inversion')


def _v(a) -> str:
  return '—' if not a or a.get('value') is None else f"{a['value']:.3f}"


def lines(summary: dict) -> list[str]:
  out = []
  for r, s in summary['readers'].items():
    probe = summary.get('probes', {}).get(r)
    if probe is None:
      continue
    st = summary['reader_stats'][r]
    gold = ' / '.join(f"{st[g]['answer_gold'] / st[g]['n']:.3f}" for g in ('chain', 'chain_prior'))
    own = sum(st[g]['own_trace'] for g in st) / sum(st[g]['n'] for g in st)
    a, bt, i = s['all'], s['by_tau'], s['identity']
    nondeg = probe['n'] - probe['n_degenerate']
    ceu = probe['ceu_answer']
    pr = f"{nondeg} / {probe['n']}" + (f", CEU_answer {ceu['value']:.2f}" if nondeg else '')
    out.append(
        f"| {r} | {gold} | {own:.3f} | {a['n_regen_unparsed']} ({a['regen_parse_failure']:.3f}) | "
        f"{fmt(a['phi'])} | " + ' | '.join(_v(bt[t]['rho']) for t in TAUS if t in bt)
        + f" | {fmt(a['rho'])} | {fmt(a['follow'])} | "
        + ' / '.join(_v(bt[t]['follow']) for t in TAUS if t in bt)
        + f" | {i['n_identical']} / {i['n']} | {fmt(probe['delta_L'])} | {pr} |")
  return out


HEADER = ('| reader | answer = gold (chain / chain_prior) | answer = own trace | regen parse fail '
          '(rate) | φ [95% CI] | ρ FactReversal | ρ PremiseNegation | ρ CausalInversion | '
          'ρ all [95% CI] | follow all [95% CI] | follow FR / PN / CI | identity identical | '
          'probe ΔL (nats) [95% CI] | probe: non-degenerate |\n'
          '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|')


def main(paths: list[str]) -> None:
  print(HEADER)
  for p in paths:
    with open(p) as f:
      print('\n'.join(lines(json.load(f))))


if __name__ == '__main__':
  main(sys.argv[1:])
