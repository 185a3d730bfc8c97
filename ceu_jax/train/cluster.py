"""Joining a multi-process JAX cluster (`jax.distributed`) before any JAX use.

A `Cluster` says which processes train together: the coordinator's host:port
(process 0 serves it), the number of processes and this process's id, or
`detect` to let jax read them from a launcher (SLURM, Open MPI, Cloud TPU).
`Cluster.from_env()` reads the environment:

  JAX_COORDINATOR_ADDRESS=host:port JAX_NUM_PROCESSES=N JAX_PROCESS_ID=i
                                    explicit (one command per host)
  SLURM_NTASKS > 1 (srun)           detect='slurm': coordinator on the first node
                                    of the step, port from the job id
                                    (JAX_COORDINATOR_PORT overrides it)
  OMPI_COMM_WORLD_SIZE > 1 (mpirun) detect='ompi'
  TPU_WORKER_HOSTNAMES of > 1 host detect='auto' (jax's Cloud TPU detection)
  none of these                     a single process (nothing to join)

`join(cluster)` calls `jax.distributed.initialize` once per process; it must
run before anything touches a JAX device (jax.devices(), an array). On CPU the
processes exchange collectives through gloo (`jax_cpu_collectives_implementation`,
jax's default since 0.4.3x; set explicitly here). `ceu_jax.train.train_and_evaluate`
joins the cluster it is given, so a run of N processes is N copies of one command.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable, Mapping, Sequence

import jax
from absl import flags, logging

# jax.distributed cluster detection methods (jax/_src/clusters/*.py `name`s).
DETECT_METHODS = ("auto", "slurm", "ompi", "gce_tpu", "gke_tpu", "k8s", "mpi4py")
_ADDRESS = re.compile(r"^\[?[A-Za-z0-9_.:-]+\]?:[0-9]{1,5}$")


class ClusterError(ValueError):
  """A bad cluster specification, or joining at the wrong moment."""


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The processes of one run (every process gets the same spec but its own id)."""
  coordinator_address: str = ""      # 'host:port' served by process 0; '' = not explicit
  num_processes: int = 1             # processes in the run (one per host, or per accelerator)
  process_id: int = 0                # this process, 0 <= process_id < num_processes
  detect: str = ""                   # jax's launcher detection ('slurm', 'ompi', 'auto', ...)
                                     # instead of the three fields above; '' = explicit
  local_device_ids: tuple[int, ...] | None = None   # devices of this process (GPU: one per
                                                    # process); None = all local devices

  @property
  def multi(self) -> bool:
    """Whether there is anything to join."""
    return bool(self.detect) or self.num_processes > 1

  def validate(self) -> "Cluster":
    """ClusterError naming the field and its allowed values; returns self."""
    if self.detect:
      if self.detect not in DETECT_METHODS:
        raise ClusterError(f"cluster detect must be one of {DETECT_METHODS}, got "
                           f"{self.detect!r}")
      return self
    if int(self.num_processes) < 1:
      raise ClusterError(f"num_processes must be >= 1, got {self.num_processes}")
    if not 0 <= int(self.process_id) < int(self.num_processes):
      raise ClusterError(f"process_id must be in [0, {int(self.num_processes) - 1}] for "
                         f"num_processes={self.num_processes}, got {self.process_id}")
    if self.num_processes > 1 and not _ADDRESS.match(self.coordinator_address or ""):
      raise ClusterError("coordinator_address must be 'host:port' (process 0's host and a "
                         f"free port) when num_processes > 1, got {self.coordinator_address!r}")
    return self

  @classmethod
  def from_env(cls, environ: Mapping[str, str] | None = None) -> "Cluster":
    """The cluster the launcher describes (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("JAX_COORDINATOR_ADDRESS"):
      missing = [k for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if not env.get(k)]
      if missing:
        raise ClusterError(f"JAX_COORDINATOR_ADDRESS is set but {missing[0]} is not: set "
                           "JAX_NUM_PROCESSES and JAX_PROCESS_ID too")
      try:
        n, i = int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"])
      except ValueError:
        raise ClusterError("JAX_NUM_PROCESSES and JAX_PROCESS_ID must be integers, got "
                           f"{env['JAX_NUM_PROCESSES']!r}, {env['JAX_PROCESS_ID']!r}") from None
      return cls(coordinator_address=env["JAX_COORDINATOR_ADDRESS"], num_processes=n,
                 process_id=i).validate()
    if _int(env.get("SLURM_NTASKS")) > 1:
      return cls(detect="slurm")
    if _int(env.get("OMPI_COMM_WORLD_SIZE")) > 1:
      return cls(detect="ompi")
    if len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1:
      return cls(detect="auto")
    return cls()

  def with_overrides(self, *, coordinator_address: str | None = None,
                     num_processes: int | None = None, process_id: int | None = None
                     ) -> "Cluster":
    """Explicit values (e.g. command-line flags) over this one; explicit fields turn
    launcher detection off."""
    if coordinator_address is None and num_processes is None and process_id is None:
      return self
    base = self if not self.detect else Cluster()
    return dataclasses.replace(
        base, detect="",
        coordinator_address=base.coordinator_address if coordinator_address is None
        else coordinator_address,
        num_processes=base.num_processes if num_processes is None else int(num_processes),
        process_id=base.process_id if process_id is None else int(process_id)).validate()


def _int(value: str | None) -> int:
  try:
    return int(value or 1)
  except ValueError:
    return 1


def join(cluster: Cluster | None) -> bool:
  """`jax.distributed.initialize` for a multi-process `cluster` (None or one process:
  nothing to do). Returns whether this call joined. Idempotent: a process that already
  joined is not joined again. ClusterError if JAX devices were used before."""
  if cluster is None or not cluster.validate().multi:
    return False
  if jax.distributed.is_initialized():
    return False
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs: dict = {}
  if cluster.detect:
    if cluster.detect != "auto":
      kwargs["cluster_detection_method"] = cluster.detect
  else:
    kwargs = dict(coordinator_address=cluster.coordinator_address,
                  num_processes=int(cluster.num_processes), process_id=int(cluster.process_id))
  if cluster.local_device_ids is not None:
    kwargs["local_device_ids"] = list(cluster.local_device_ids)
  try:
    jax.distributed.initialize(**kwargs)
  except RuntimeError as e:
    if "before" in str(e):
      raise ClusterError(f"cannot join the cluster {cluster}: JAX devices were already used in "
                         f"this process ({e}); join before any JAX computation") from None
    raise
  want = None if cluster.detect else int(cluster.num_processes)
  if want is not None and jax.process_count() != want:
    raise ClusterError(f"joined {jax.process_count()} processes, expected {want}")
  logging.info("joined the cluster: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


def describe(cluster: Cluster | None) -> str:
  if cluster is None or not cluster.multi:
    return "single process"
  if cluster.detect:
    return f"detected by jax ({cluster.detect})"
  return (f"process {cluster.process_id} of {cluster.num_processes}, coordinator "
          f"{cluster.coordinator_address}")


def flag_values(coordinator_address: str, num_processes: int, process_id: int
                ) -> Cluster:
  """The cluster of an entry point: the environment, overridden by non-default flags
  ('' / -1 / -1 mean 'from the environment')."""
  return Cluster.from_env().with_overrides(
      coordinator_address=coordinator_address or None,
      num_processes=None if num_processes < 0 else num_processes,
      process_id=None if process_id < 0 else process_id)


def define_flags(what: str = "runs") -> Callable[[], Cluster]:
  """The entry point's --coordinator_address / --num_processes / --process_id flags
  (experiments.train, experiments.audit); returns a function for `main` that gives the
  cluster they and the environment describe (`flag_values`)."""
  address = flags.DEFINE_string(
      "coordinator_address", "", f"Multi-process {what}: 'host:port' of process 0's "
      "coordinator ('' = $JAX_COORDINATOR_ADDRESS, or SLURM / Open MPI detection, or a "
      "single process).")
  count = flags.DEFINE_integer("num_processes", -1, f"Multi-process {what}: the number of "
                               "processes (-1 = $JAX_NUM_PROCESSES or the launcher's).")
  index = flags.DEFINE_integer("process_id", -1, f"Multi-process {what}: this process's id "
                               "in [0, num_processes) (-1 = $JAX_PROCESS_ID or the "
                               "launcher's).")
  return lambda: flag_values(address.value, count.value, index.value)


__all__: Sequence[str] = ("Cluster", "ClusterError", "DETECT_METHODS", "define_flags",
                          "describe", "join", "flag_values")
