"""Search helper for a bounds config (issue #33 item 7): trains ONE model of a
configs/bounds.py variant and prints its clean accuracy and mean CEU_ev.

  python scripts/bounds_search.py mid,steps=1500 port_only /tmp/search   # model name from config.models

Prints one `RESULT {...}` line: training wall and CPU seconds (user + system of this
process, compilation included), exact-match accuracy on 256 test examples at η = 0
and δ = 0, 0.3, 0.9 (the T3 sets' δ), and on the bounds run's 128 first base examples
(δ = 0.3) the accuracy, mean CEU_ev and degenerate count. The record of the search
behind `mid` is in docs/bounds.md.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time

import numpy as np

from ceu_jax.theory import experiment, measure
from ceu_jax.train import train_and_evaluate
from configs import bounds as bounds_config


def _cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def main(arg: str, name: str, workdir: str) -> dict:
  config = bounds_config.get_config(arg)
  cfg = experiment.model_config(config, dict(config.models)[name])
  tic, cpu = time.time(), _cpu()
  mdir = os.path.join(workdir, name)
  train_and_evaluate(cfg, mdir)
  out = {"arg": arg, "name": name, "train_wall": round(time.time() - tic),
         "train_cpu": round(_cpu() - cpu)}
  tm = measure.load_trained(name, cfg, mdir)
  for delta in (0.0, 0.3, 0.9):
    clean = measure.eval_set(tm.data_cfg, int(config.eval.seed), 256, delta=delta)
    z = measure.logits(tm, clean)
    out[f"acc_d{delta:g}"] = round(float((z.argmax(-1) == np.asarray(clean.answer)).all(-1).mean()), 3)
  clean = measure.eval_set(tm.data_cfg, int(config.eval.seed), 128, delta=0.3)
  rows = experiment._measure(config, tm, clean)  # pylint: disable=protected-access
  out.update(acc128=round(float(rows["correct"].mean()), 3),
             ceu_ev=round(float(np.nanmean(rows["ceu_ev"])), 3),
             n_degen=int(rows["degenerate"].sum()))
  print("RESULT", json.dumps(out), flush=True)
  return out


if __name__ == "__main__":
  if len(sys.argv) != 4:
    raise SystemExit(__doc__)
  main(*sys.argv[1:])
