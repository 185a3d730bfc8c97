"""The six jobs of issue #34 at their cheapest configs, for tests/test_job_contract.py.

Each `Case` says how to run its job (`run(config, workdir, log)`), its config, the same
config with one fixed field changed (and that field's name), where the job writes
(`out`: the audit writes W/audit of a training workdir) and the job class (the kill
below patches it). Run as a script, a case is killed halfway, as `kill -9` would:

  python -m tests._job_cases NAME WORKDIR K   # SIGKILLs itself once unit K is computed,
                                              # before it is stored
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
from typing import Any, Callable

import ml_collections


@dataclasses.dataclass(frozen=True)
class Case:
  name: str                                      # the job's name (W/job.json)
  config: Callable[[], ml_collections.ConfigDict]
  changed: Callable[[], ml_collections.ConfigDict]   # one fixed field changed
  field: str                                     # that field, as a refusal names it
  job_class: Callable[[], type]
  run: Callable[[Any, str, Callable[[str], None]], dict]
  kill_at: int                                   # the unit a killed run dies in (of > kill_at)
  trained: bool = False                          # runs in a copy of a trained workdir
  needs_model: bool = False                      # the SmolLM2 weights

  def out(self, workdir: str) -> str:
    """The folder the job owns (its job.json, units, outputs)."""
    return os.path.join(workdir, "audit") if self.trained else workdir


def _with(config, **fields):
  with config.unlocked():
    for k, v in fields.items():
      node = config
      *parents, leaf = k.split(".")
      for p in parents:
        node = node[p]
      node[leaf] = v
  return config


# ----------------------------------------------------------------------------- answer presence
def _ap_config(**kw):
  from configs import answer_presence
  return _with(answer_presence.get_config("tiny,world=generated"), **kw)


def _ap_class():
  from ceu_jax.audits.answer_presence import job
  return job.AnswerPresenceJob


def _ap_run(config, workdir, log):
  from ceu_jax.audits.answer_presence import job
  return job.run_answer_presence(config, workdir, log=log)


# ----------------------------------------------------------------------------- traces
def _trace_config(n_items=12):
  from configs import trace_sensitivity
  return _with(trace_sensitivity.get_config(f"tiny,n_items={n_items}"), items_per_chunk=5,
               **{"chain.readers": ("mixture",)})


def _trace_class():
  from ceu_jax.audits.traces import job
  return job.TraceSensitivityJob


def _trace_run(config, workdir, log):
  from ceu_jax.audits.traces import job
  return job.run_trace_sensitivity(config, workdir, log=log)


# ----------------------------------------------------------------------------- mediator
def _mediator_config(**kw):
  from configs import mediator
  return _with(mediator.get_config("tiny,world=oracle"), items_per_chunk=32, **kw)


def _mediator_class():
  from ceu_jax.audits.mediator import job
  return job.MediatorJob


def _mediator_run(config, workdir, log):
  from ceu_jax.audits.mediator import job
  return job.run_mediator(config, workdir, log=log)


# ----------------------------------------------------------------------------- reader evaluation
def _reader_config(**kw):
  from configs import reader_eval
  return _with(reader_eval.get_config("tiny"), **kw)


def _reader_class():
  from ceu_jax.readers import factqa_eval
  return factqa_eval.ReaderEvalJob


def _reader_run(config, workdir, log):
  from ceu_jax.readers import factqa_eval
  from tests.test_reader_eval_job import _reader   # the gold-copying oracle reader
  return factqa_eval.run_reader_eval(config, workdir, reader=_reader(config), log=log)


# ----------------------------------------------------------------------------- audit
def audit_config(**kw):
  from tests.test_audit_job import micro_config
  return _with(micro_config(), **kw)


def _audit_class():
  from ceu_jax import audit_job
  return audit_job.AuditJob


def _audit_run(config, workdir, log):
  from ceu_jax import audit_job
  data_dir = os.path.join(os.path.dirname(os.path.abspath(workdir)), "evalsets")
  return audit_job.run_audit(config, workdir, data_dir=data_dir, log=log)


# ----------------------------------------------------------------------------- pretrained audit
def _nq_config(**kw):
  from configs import smollm2_nq
  return _with(smollm2_nq.get_config("tiny,n_layers=2"), **kw)


def _nq_class():
  from ceu_jax.pretrained import audit_nq
  return audit_nq.PretrainedAuditJob


def _nq_run(config, workdir, log):
  from ceu_jax.pretrained import audit_nq
  return audit_nq.run_pretrained_audit(config, workdir, log=log)


CASES = (
    Case("answer_presence", _ap_config, lambda: _ap_config(n_records=100), "n_records",
         _ap_class, _ap_run, kill_at=3),                       # 4 chunks of 50 records
    Case("trace_sensitivity", _trace_config, lambda: _trace_config(13), "n_items",
         _trace_class, _trace_run, kill_at=2),                 # 3 chunks
    Case("mediator", _mediator_config, lambda: _mediator_config(n_items=32), "n_items",
         _mediator_class, _mediator_run, kill_at=7),           # 6 settings x 2 chunks
    Case("reader_eval", _reader_config, lambda: _reader_config(seed=1), "seed",
         _reader_class, _reader_run, kill_at=3),               # 2 sources x 2 conditions
    Case("audit", audit_config, lambda: audit_config(**{"model.bypass": True}),
         "model.bypass", _audit_class, _audit_run, kill_at=3, trained=True),  # 2 x 2 batches
    Case("pretrained_audit", _nq_config, lambda: _nq_config(eps=0.01), "eps",
         _nq_class, _nq_run, kill_at=2, needs_model=True),     # 2 batches
)
BY_NAME = {c.name: c for c in CASES}


def die_in_unit(cls: type, k: int) -> None:
  """`cls.run_unit` SIGKILLs this process once its k-th call has computed its result
  (before `run_job` stores it): a kill -9 halfway through a run."""
  run_unit, calls = cls.run_unit, [0]

  def killed(self, ctx, spec):
    out = run_unit(self, ctx, spec)
    calls[0] += 1
    if calls[0] == k:
      print(f"KILL in unit {k}", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    return out
  cls.run_unit = killed


if __name__ == "__main__":
  case = BY_NAME[sys.argv[1]]
  die_in_unit(case.job_class(), int(sys.argv[3]))
  case.run(case.config(), sys.argv[2], lambda m: print(m, flush=True))


def refuses_a_record_without(job, field: str, workdir) -> None:
  """A workdir whose job.json holds `job`'s record less `field` (a run written before the
  field existed) is refused by the job contract, the message naming the field."""
  import json  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  from ceu_jax import jobs  # pylint: disable=g-import-not-at-top
  old = {k: v for k, v in job.record().items() if k != field}
  with open(os.path.join(str(workdir), jobs.JOB_FILE), 'w') as f:
    json.dump({'job': job.name, 'config': old}, f)
  with pytest.raises(jobs.JobConfigError, match=field):
    jobs.check_record(job, str(workdir), dry=True)
