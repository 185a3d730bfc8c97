"""The one job contract (ceu_jax/jobs.py): lock, record, refusal, resume, atomic units."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from ceu_jax import jobs
from ceu_jax import workdir as workdir_lib
from tests._toy_job import OtherJob, ToyJob, toy_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _outputs(w) -> dict:
  out = {}
  for name in ("summary.json", "table.md"):
    with open(os.path.join(w, name)) as f:
      out[name] = f.read()
  units = sorted(os.listdir(os.path.join(w, "units")))
  out["units"] = {u: open(os.path.join(w, "units", u)).read() for u in units}
  s = json.loads(out["summary.json"])
  s["produced_by"].pop("wall_s_this_run")
  s["produced_by"].pop("units_this_run")
  out["summary.json"] = s
  return out


def test_run_writes_record_units_summary_and_resume_skips(tmp_path):
  w = str(tmp_path / "w")
  job = ToyJob(toy_config())
  s = jobs.run_job(job, w, log=lambda m: None)
  assert s["total"] == sum(i * i for i in range(6)) and s["n"] == 6
  assert json.load(open(os.path.join(w, "job.json")))["job"] == "toy"
  assert s["produced_by"]["job"] == "toy" and s["produced_by"]["config"]["n"] == 6
  assert sorted(os.listdir(os.path.join(w, "units"))) == [f"u{i:03d}.json" for i in range(6)]
  again = ToyJob(toy_config())
  lines = []
  s2 = jobs.run_job(again, w, log=lines.append)
  assert again.ran == [] and s2["total"] == s["total"]
  assert "6 units, 6 finished before (resumed)" in lines[0]
  events = [e["event"] for e in workdir_lib.history(w)]
  assert events == ["start", "resume"]


def test_partial_run_resumes_to_the_uninterrupted_outputs(tmp_path):
  full, part = str(tmp_path / "full"), str(tmp_path / "part")
  jobs.run_job(ToyJob(toy_config()), full, log=lambda m: None)

  class Dies(ToyJob):
    def run_unit(self, ctx, spec):
      if spec == 3:
        raise KeyboardInterrupt
      return super().run_unit(ctx, spec)
  with pytest.raises(KeyboardInterrupt):
    jobs.run_job(Dies(toy_config()), part, log=lambda m: None)
  assert len(os.listdir(os.path.join(part, "units"))) == 3
  assert not os.path.exists(os.path.join(part, "summary.json"))
  job = ToyJob(toy_config())
  jobs.run_job(job, part, log=lambda m: None)
  assert job.ran == [3, 4, 5]
  assert _outputs(part) == _outputs(full)


def test_kill_9_halfway_resumes_to_identical_outputs(tmp_path):
  full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
  jobs.run_job(ToyJob(toy_config()), full, log=lambda m: None)
  p = subprocess.Popen([sys.executable, "-m", "tests._toy_job", killed, "0.3"], cwd=REPO,
                       stdout=subprocess.PIPE, text=True)
  for line in p.stdout:
    if "unit 2/6" in line:
      os.kill(p.pid, signal.SIGKILL)
      break
  p.wait()
  assert p.returncode == -signal.SIGKILL
  assert not os.path.exists(os.path.join(killed, "summary.json"))
  assert 2 <= len(os.listdir(os.path.join(killed, "units"))) < 6
  lines = []
  jobs.run_job(ToyJob(toy_config()), killed, log=lines.append)   # the stale lock is taken over
  assert _outputs(killed) == _outputs(full)


def test_changed_config_is_refused_naming_only_the_fields_and_writing_nothing(tmp_path):
  w = str(tmp_path / "w")
  jobs.run_job(ToyJob(toy_config()), w, log=lambda m: None)
  before = {n: os.path.getmtime(os.path.join(w, n)) for n in ("job.json", "summary.json")}
  with pytest.raises(jobs.JobConfigError) as e:
    jobs.run_job(ToyJob(toy_config(scale=2.0)), w, log=lambda m: None)
  msg = str(e.value)
  assert "toy run of another config: scale 1.0 -> 2.0. Its" in msg and "n 6" not in msg
  assert e.value.fields == ["scale"] and len(msg.splitlines()) == 1
  assert {n: os.path.getmtime(os.path.join(w, n)) for n in before} == before


def test_refusal_names_at_most_a_few_fields(tmp_path):
  w = str(tmp_path / "w")
  jobs.run_job(ToyJob(toy_config(**{f"f{i}": i for i in range(9)})), w, log=lambda m: None)
  with pytest.raises(jobs.JobConfigError) as e:
    jobs.run_job(ToyJob(toy_config(**{f"f{i}": i + 1 for i in range(9)})), w,
                 log=lambda m: None)
  assert "(and 4 more fields)" in str(e.value) and str(e.value).count("->") == 5


def test_free_field_change_resumes_and_is_recorded(tmp_path):
  w = str(tmp_path / "w")
  jobs.run_job(ToyJob(toy_config()), w, log=lambda m: None)
  lines = []
  jobs.run_job(ToyJob(toy_config(plots=False)), w, log=lines.append)
  assert any("changed free fields: plots True -> False" in l for l in lines)
  assert json.load(open(os.path.join(w, "job.json")))["config"]["plots"] is False
  last = workdir_lib.history(w)[-1]
  assert last["changed_free_fields"] == [dict(field="plots", old=True, new=False)]


class _Grown(ToyJob):
  """The toy job after two fields were added: `mode` ('plain' is how earlier runs ran) and
  `budget` (earlier runs did not depend on it)."""
  added_fields = {"mode": "plain", "budget": jobs.ANY_VALUE}


def test_a_field_added_later_resumes_an_earlier_run_only_at_the_value_it_ran_as(tmp_path):
  w = str(tmp_path / "w")
  jobs.run_job(ToyJob(toy_config()), w, log=lambda m: None)        # recorded before the fields
  job = _Grown(toy_config(mode="plain", budget=7))
  jobs.run_job(job, w, log=lambda m: None)
  assert job.ran == []                                              # resumed: every unit done
  with pytest.raises(jobs.JobConfigError) as e:
    jobs.run_job(_Grown(toy_config(mode="greedy", budget=7)), w, log=lambda m: None)
  assert e.value.fields == ["mode"]
  with pytest.raises(jobs.JobConfigError) as e:                     # not an added field
    jobs.run_job(ToyJob(toy_config(mode="plain")), w, log=lambda m: None)
  assert e.value.fields == ["mode"]


def test_another_job_in_the_workdir_is_refused_naming_the_owner(tmp_path):
  w = str(tmp_path / "w")
  jobs.run_job(ToyJob(toy_config()), w, log=lambda m: None)
  with pytest.raises(jobs.JobMismatchError, match=r"holds a toy run .*this is an other job"):
    jobs.run_job(OtherJob(toy_config()), w, log=lambda m: None)


def test_a_training_workdir_is_refused(tmp_path):
  w = tmp_path / "train"
  w.mkdir()
  (w / "config.json").write_text("{}")
  with pytest.raises(jobs.JobMismatchError, match="config.json but no job.json"):
    jobs.run_job(ToyJob(toy_config()), str(w), log=lambda m: None)
  assert sorted(os.listdir(w)) == ["config.json"]


def test_a_second_job_in_the_same_workdir_is_refused_while_one_runs(tmp_path):
  w = str(tmp_path / "w")

  class Nested(ToyJob):
    def run_unit(self, ctx, spec):
      if spec == 0:
        with pytest.raises(workdir_lib.WorkdirLocked, match="job lock"):
          jobs.run_job(ToyJob(toy_config()), w, log=lambda m: None)
      return super().run_unit(ctx, spec)
  jobs.run_job(Nested(toy_config()), w, log=lambda m: None)


def test_bad_config_fails_before_the_workdir_exists(tmp_path):
  with pytest.raises(ValueError, match="n must be >= 1, got 0"):
    jobs.run_job(ToyJob(toy_config(n=0)), str(tmp_path / "never"))
  assert not os.path.exists(tmp_path / "never")


def test_move_aside_job_keeps_the_earlier_run(tmp_path):
  class Audit(ToyJob):
    name = "audit_like"
    mismatch = "move_aside"
  w = str(tmp_path / "w")
  jobs.run_job(Audit(toy_config()), w, log=lambda m: None)
  lines = []
  s = jobs.run_job(Audit(toy_config(scale=3.0)), w, log=lines.append)
  assert s["total"] == 3 * sum(i * i for i in range(6))
  prev = os.path.join(w, "previous")
  (stamp,) = os.listdir(prev)
  assert json.load(open(os.path.join(prev, stamp, "summary.json")))["total"] == 55
  assert any("moved it to" in l for l in lines)


def test_npz_units_round_trip_exactly(tmp_path):
  class Arrays(ToyJob):
    name = "arrays"
    unit_format = "npz"

    def run_unit(self, ctx, spec):
      return {"x": np.float32([spec, np.nan, 1 / 3]), "ok": np.array([True, False])}

    def summarize(self, ctx, results):
      return {"sum": float(np.nansum([r["x"] for r in results.values()]))}

    def write(self, ctx, results, summary):
      pass
  w = str(tmp_path / "w")
  a = jobs.run_job(Arrays(toy_config()), w, log=lambda m: None)
  b = jobs.run_job(Arrays(toy_config()), w, log=lambda m: None)
  assert a["sum"] == b["sum"]


def test_read_only_workdir_is_an_oserror_naming_the_path(tmp_path):
  ro = tmp_path / "ro"
  ro.mkdir()
  os.chmod(ro, 0o555)
  try:
    if os.access(ro, os.W_OK):
      pytest.skip("running as a user who can write anywhere (root)")
    with pytest.raises(OSError) as e:
      jobs.run_job(ToyJob(toy_config()), str(ro / "w"), log=lambda m: None)
    assert str(ro) in str(e.value)
  finally:
    os.chmod(ro, 0o755)
