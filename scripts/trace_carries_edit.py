"""How often a World B arithmetic regeneration carries the edit through its own steps.

  python scripts/trace_carries_edit.py W/rows.csv

For every applied arithmetic intervention whose regeneration parses: does the answer come
from the forced block's last stated result through the regenerated steps
(`ceu_jax.audits.traces.arithmetic.carries_edit`)? Printed per τ beside the follow rate's
counts, so that a low follow rate (the answer is not where the edited trace leads on the
problem) can be told apart from an answer that ignores the edit.
"""
import collections
import csv
import sys

from ceu_jax.audits.traces import arithmetic as ar
from ceu_jax.audits.traces import text as tt


def counts(rows):
  out = collections.defaultdict(collections.Counter)
  for r in rows:
    if r['domain'] != 'arithmetic' or r['applied'] != 'True' or r['regen_parsed'] != 'True':
      continue
    full = tt.parse_text(r['forced'] + r['continuation'])
    n_forced = len(tt.parse_text(r['forced'] + 'Answer: -').steps)
    c = out[r['tau']]
    c['n'] += 1
    c[f"carries_edit={ar.carries_edit(full.steps[:n_forced], full.steps[n_forced:], full.answer)}"] += 1
    c[f"follows={r['follows'] or 'unknown'}"] += 1
  return out


def main(path):
  with open(path) as f:
    out = counts(list(csv.DictReader(f)))
  for tau, c in sorted(out.items()):
    print(tau, dict(sorted(c.items())))


if __name__ == '__main__':
  main(sys.argv[1])
