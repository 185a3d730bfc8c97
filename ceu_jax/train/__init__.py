"""Training of retrieval models with the CER objective (SPEC §4).

Modules: losses (CER objective), state (optimizer, jitted train_step),
sharding (mesh, logical rules), checkpoint (orbax, status file, signals),
task (data stream, model), evaluation (EM / NLL / CEU via the engine),
metric_writer (JSON lines + TensorBoard), config (validation), loop
(`train_and_evaluate`, `load_checkpoint`). Workdir provenance (config checks,
locks, run info) is `ceu_jax.workdir`.
"""
from ceu_jax.train.config import check_resume_compatible, validate
from ceu_jax.train.loop import (EXIT_DIVERGED, EXIT_PREEMPTED, Diverged, LoadedCheckpoint,
                                Preempted, load_checkpoint, load_trained_params,
                                train_and_evaluate)

__all__ = ["EXIT_DIVERGED", "EXIT_PREEMPTED", "Diverged", "LoadedCheckpoint", "Preempted",
           "check_resume_compatible", "load_checkpoint", "load_trained_params",
           "train_and_evaluate", "validate"]
