"""One process of tests/test_multiprocess.py's audit-digest test (run as a script).

Joins a two-process cluster (4 fake CPU devices each) and lays the parameters of a
tiny audited model out as a model-parallel audit does (`audit_job.on_mesh`: a
2 x 4 'model' x 'data' mesh, kv / mlp features split over 'model'), so parameters
are split across devices of both processes and `np.asarray` of one fails (the
defect of issue #34.7). Prints the audit's checkpoint digest of the placed
parameters (`audit_job.params_digest`) and of the host copy:

  python tests/_digest_worker.py --coordinator_address=H:P --num_processes=2 --process_id=I
"""
from __future__ import annotations

import sys

MODEL_RULES = (("batch", "data"), ("kv", "model"), ("mlp", "model"), ("length", None),
               ("ctx", None), ("embed", None), ("heads", None), ("vocab", None),
               ("ports", None), ("state", None))


def config():
  """A tiny attention model on a 2 x 4 model x data mesh."""
  from configs import atr_insert  # pylint: disable=g-import-not-at-top
  c = atr_insert.get_config("tiny,context_len=64")
  c.data.num_passages = 4
  c.data.n_ids = c.data.n_keys = c.data.n_values = 8
  c.eval.num_examples = c.eval.batch_size = 16
  c.sharding.mesh_shape = (2, 4)
  c.sharding.mesh_axes = ("model", "data")
  c.sharding.logical_axis_rules = MODEL_RULES
  return c


def host_variables(cfg):
  """{'params': host numpy} of the model, the same in every process (numpy draws)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ceu_jax import auditor  # pylint: disable=g-import-not-at-top
  bundle = auditor.audited_model(cfg)
  shapes = nn.meta.unbox(jax.eval_shape(lambda r: bundle.model.init(r, *bundle.dummy_inputs),
                                        jax.random.PRNGKey(0))["params"])
  rng = np.random.default_rng(0)
  return {"params": jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype),
                                 shapes)}


def main(argv: list[str]) -> None:
  flags = dict(a[2:].split("=", 1) for a in argv[1:])
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ceu_jax import audit_job, auditor  # pylint: disable=g-import-not-at-top
  from ceu_jax.train import cluster  # pylint: disable=g-import-not-at-top
  cluster.join(cluster.Cluster(coordinator_address=flags["coordinator_address"],
                               num_processes=int(flags["num_processes"]),
                               process_id=int(flags["process_id"])))
  cfg = config()
  host = host_variables(cfg)
  with audit_job.on_mesh(cfg, auditor.audited_model(cfg), host) as (placed, _):
    split = [x for x in jax.tree.leaves(placed)
             if not x.is_fully_addressable and not x.is_fully_replicated]
    try:
      np.asarray(split[0])
      refused = False
    except RuntimeError:
      refused = True
    digest = audit_job.params_digest(placed)
  print(f"DIGEST placed={digest} host={audit_job.params_digest(host)} "
        f"split_leaves={len(split)} asarray_refused={refused}", flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv)
