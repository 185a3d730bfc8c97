"""The headline claims of a finished trace-sensitivity or mediator run, decided by the rule
its job prints (`ceu_jax.audits.traces.verdicts`, `ceu_jax.audits.mediator.verdicts`), from
the workdir's summary.json and rows.csv: for runs made before the jobs printed them.

  python scripts/claims_of_run.py runs/traces_smollm2_25 [more workdirs ...]
"""
from __future__ import annotations

import json
import os
import sys

from ceu_jax import claims
from ceu_jax.audits.mediator import verdicts as mediator_verdicts
from ceu_jax.audits.traces import verdicts as trace_verdicts

JUDGES = {"trace_sensitivity": trace_verdicts, "mediator": mediator_verdicts}


def main(workdirs: list[str]) -> int:
  if not workdirs:
    print(__doc__.strip(), file=sys.stderr)
    return 2
  for w in workdirs:
    with open(os.path.join(w, "job.json")) as f:
      job = json.load(f).get("job")
    if job not in JUDGES:
      print(f"{w}: a {job!r} run; claims are read for {sorted(JUDGES)} runs", file=sys.stderr)
      return 1
    print(f"## {w} ({job})\n\n{claims.table(JUDGES[job].claims_of_workdir(w))}\n")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
