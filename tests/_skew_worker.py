"""One process of tests/test_multiprocess.py's skew test (run as a script).

Joins a two-process cluster (4 fake CPU devices each), builds a global [8, 4]
array split over all 8 devices, then process 1 sleeps SKEW seconds — standing in
for a slow compile on a loaded machine — before both call a jitted global sum
(its CPU collective is gloo's first contact, which waits only 30 s for a peer).
Mode `synced` calls it through `ceu_jax.multihost.Synced`; `plain` calls
the jitted function directly. Prints `result <value>` on success.

  python tests/_skew_worker.py MODE SKEW --coordinator_address=H:P --num_processes=2 --process_id=I
"""
from __future__ import annotations

import sys
import time


def main(argv: list[str]) -> None:
  mode, skew = argv[1], float(argv[2])
  flags = dict(a[2:].split("=", 1) for a in argv[3:])
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from ceu_jax import multihost  # pylint: disable=g-import-not-at-top
  from ceu_jax.train import cluster  # pylint: disable=g-import-not-at-top
  pid = int(flags["process_id"])
  cluster.join(cluster.Cluster(coordinator_address=flags["coordinator_address"],
                               num_processes=int(flags["num_processes"]), process_id=pid))
  mesh = jax.make_mesh((8,), ("d",))
  host = np.arange(32, dtype=np.float32).reshape(8, 4)
  x = jax.make_array_from_callback(host.shape, NamedSharding(mesh, P("d")),
                                   lambda idx: host[idx])
  total = jax.jit(lambda a: (a * 2).sum(), out_shardings=NamedSharding(mesh, P()))
  fn = multihost.Synced(total, "skew test") if mode == "synced" else total
  if pid == 1:
    time.sleep(skew)
  print("result", float(fn(x)), flush=True)
  print("again", float(fn(x + 1)), flush=True)   # same signature: no second barrier
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv)
