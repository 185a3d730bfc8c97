"""Issue #34 item 2: a user's mistake cannot mix or overwrite a job's results, for each of
the six jobs on the one job contract (tests/_job_cases.py: their cheapest configs).

Per job:
- a rerun with a changed fixed field is refused, naming the field, and writes nothing;
- another job in the workdir is refused, naming the job that owns it, and writes nothing;
- a run killed by SIGKILL halfway resumes (a rerun with the same config) to outputs
  identical to an uninterrupted run's: every unit, every text output, summary.json
  (wall-clock fields aside) and the same set of files (plots included).
The contract itself is tested on a toy job in tests/test_jobs.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ceu_jax import jobs
from ceu_jax import workdir as workdir_lib
from tests import _job_cases
from tests.test_multiprocess_helpers import REPO, env_for

pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: XLA opts off

TIMING = ("wall_s", "reader_wall_s", "wall_s_this_run", "units_this_run")  # differ run to run


def _model_missing() -> str | None:
  from ceu_jax.pretrained import gguf_loader  # pylint: disable=g-import-not-at-top
  return gguf_loader.is_available()


def _cases():
  out = []
  for c in _job_cases.CASES:
    marks = []
    if c.needs_model:
      why = _model_missing()
      marks.append(pytest.mark.skipif(why is not None, reason=f"no SmolLM2 weights: {why}"))
    out.append(pytest.param(c, id=c.name, marks=marks))
  return out


CASES = _cases()


def _quiet(_):
  pass


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return tmp_path_factory.mktemp("job_contract")


@pytest.fixture(scope="module")
def trained(root):
  """The audit's training workdir: the micro run of tests/test_audit_job.py."""
  from ceu_jax.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
  w = str(root / "trained")
  train_and_evaluate(_job_cases.audit_config(), w)
  return w


def _fresh(case, root, name: str, trained_dir) -> str:
  """A new workdir for `case` (a copy of the trained run for the audit)."""
  w = str(root / f"{case.name}_{name}")
  if case.trained:
    shutil.copytree(trained_dir, w, ignore=shutil.ignore_patterns("audit"))
  return w


_REFERENCE: dict[str, str] = {}


@pytest.fixture
def reference(request, root):
  """Workdir of an uninterrupted run of the case (one per module and case)."""
  def get(case):
    if case.name not in _REFERENCE:
      trained_dir = request.getfixturevalue("trained") if case.trained else None
      w = _fresh(case, root, "reference", trained_dir)
      case.run(case.config(), w, _quiet)
      _REFERENCE[case.name] = w
    return _REFERENCE[case.name]
  return get


def _tree(d: str) -> dict:
  """Every file under d: relative path -> (size, mtime_ns)."""
  out = {}
  for base, _, names in os.walk(d):
    for n in names:
      p = os.path.join(base, n)
      st = os.stat(p)
      out[os.path.relpath(p, d)] = (st.st_size, st.st_mtime_ns)
  return out


def _strip(obj):
  if isinstance(obj, dict):
    return {k: _strip(v) for k, v in obj.items() if k not in TIMING}
  if isinstance(obj, list):
    return [_strip(v) for v in obj]
  return obj


def _outputs(d: str, workdir: str) -> dict:
  """What a run leaves in its folder d, comparable between runs: JSON without wall-clock
  fields, unit arrays bit for bit, text files as text, plots by name only (not the lock file or
  provenance.json, the run's event log); the run's workdir path reads 'W'."""
  out = {}
  for rel in sorted(_tree(d)):
    name = os.path.basename(rel)
    if name.startswith(".") or name == "provenance.json":
      continue
    p = os.path.join(d, rel)
    if rel.endswith(".npz"):
      with np.load(p) as f:
        out[rel] = {k: (f[k].dtype.str, f[k].shape, f[k].tobytes()) for k in f.files}  # NaN too
    elif rel.endswith((".png", ".pdf")):
      out[rel] = "plot"
    else:
      with open(p) as f:
        text = f.read().replace(workdir, "W")
      out[rel] = _strip(json.loads(text)) if rel.endswith(".json") else text
  return out


@pytest.mark.parametrize("case", CASES)
def test_a_changed_fixed_field_is_refused_naming_it_and_writing_nothing(case, reference):
  w = reference(case)
  before = _tree(w)
  with pytest.raises(workdir_lib.WorkdirConfigError) as e:
    case.run(case.changed(), w, _quiet)
  assert case.field in str(e.value).split(":", 1)[1], str(e.value)
  assert len(str(e.value).splitlines()) == 1
  assert _tree(w) == before


def _other(case):
  """Another job (not the audit, which needs a training workdir) for `case`'s workdir."""
  names = [c for c in _job_cases.CASES if not c.trained and c is not case
           and not c.needs_model]
  return names[0]


@pytest.mark.parametrize("case", CASES)
def test_another_job_in_the_workdir_is_refused_naming_the_owner(case, reference):
  w = reference(case)
  out = case.out(w)
  before = _tree(w)
  other = _other(case)
  with pytest.raises(jobs.JobMismatchError) as e:
    other.run(other.config(), out, _quiet)
  msg = str(e.value)
  assert f" {case.name} run ({out}/job.json); this is " in msg, msg
  assert f" {other.name} job: use another --workdir" in msg, msg
  assert _tree(w) == before


@pytest.mark.parametrize("case", CASES)
def test_kill_9_halfway_resumes_to_the_uninterrupted_outputs(case, reference, request, root):
  ref = reference(case)
  trained_dir = request.getfixturevalue("trained") if case.trained else None
  w = _fresh(case, root, "killed", trained_dir)
  proc = subprocess.run([sys.executable, "-m", "tests._job_cases", case.name, w,
                         str(case.kill_at)], cwd=REPO, env=env_for(1, fast_compile=True),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert f"KILL in unit {case.kill_at}" in proc.stdout
  out = case.out(w)
  n_units = len(os.listdir(os.path.join(case.out(ref), jobs.UNITS_DIR)))
  stored = os.listdir(os.path.join(out, jobs.UNITS_DIR))
  assert len(stored) == case.kill_at - 1 < n_units, stored
  assert not os.path.exists(os.path.join(out, jobs.SUMMARY_FILE))
  lines = []
  case.run(case.config(), w, lines.append)        # the same command again: resumes
  assert any(f"{n_units} units, {case.kill_at - 1} finished before (resumed)" in l
             for l in lines), lines[:5]
  assert _outputs(out, w) == _outputs(case.out(ref), ref)
