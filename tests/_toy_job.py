"""A toy job on the job contract (tests/test_jobs.py): unit i holds i² · scale."""
from __future__ import annotations

import sys
import time

import ml_collections

from ceu_jax import jobs


def toy_config(**kw) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(dict(n=6, scale=1.0, plots=True, sleep_s=0.0))
  c.update(kw)
  return c


class ToyJob(jobs.Job):
  name = "toy"
  free_fields = ("plots", "sleep_s")

  def __init__(self, config):
    if int(config.n) < 1:
      raise ValueError(f"n must be >= 1, got {config.n!r}")
    super().__init__(config)
    self.ran = []

  def plan(self, ctx):
    return [jobs.Unit(f"u{i:03d}", i) for i in range(int(self.config.n))]

  def run_unit(self, ctx, spec):
    time.sleep(float(self.config.sleep_s))
    self.ran.append(spec)
    return {"i": spec, "value": spec * spec * float(self.config.scale)}

  def summarize(self, ctx, results):
    return {"total": sum(r["value"] for r in results.values()), "n": len(results)}

  def write(self, ctx, results, summary):
    ctx.write_text("table.md", "\n".join(f"{k} {r['value']}" for k, r in results.items()))


class OtherJob(ToyJob):
  name = "other"


if __name__ == "__main__":   # python -m tests._toy_job WORKDIR SLEEP_S
  jobs.run_job(ToyJob(toy_config(sleep_s=float(sys.argv[2]))), sys.argv[1],
               log=lambda m: print(m, flush=True))
