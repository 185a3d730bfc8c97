"""ceu_jax.workdir: config diffs and the restart policy, locks (with a second process),
earlier-run evidence, --fresh's move aside, run info, progress lines. No JAX."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from ceu_jax import progress, workdir as wd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cfg(**changes):
  from configs import atr_insert
  c = atr_insert.get_config("tiny")
  for dotted, value in changes.items():
    section, field = dotted.split("__")
    c[section][field] = value
  return c


def write_config(workdir, config) -> None:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))


# ---------------------------------------------------------------- diffs
def test_config_diff_names_every_field_and_ignores_json_round_trip():
  stored = json.loads(cfg().to_json_best_effort())          # tuples became lists
  assert wd.config_diff(stored, cfg()) == []
  diff = wd.config_diff(stored, cfg(model__family="ssm", cer__lambda_ev=0.5,
                                    train__learning_rate=2e-3))
  assert diff == [("cer.lambda_ev", 1.0, 0.5), ("model.family", "attention", "ssm"),
                  ("train.learning_rate", 1e-3, 2e-3)]
  assert wd.config_diff(stored, cfg(model__family="ssm"), fields=("cer", "train")) == []


def test_config_diff_bool_is_not_int_and_empty_is_absent():
  assert wd.config_diff({"a": {"b": True}}, {"a": {"b": 1}}) == [("a.b", True, 1)]
  assert wd.config_diff({"a": {"b": 1}}, {"a": {"b": 1.0}}) == []
  assert wd.config_diff({"model": {}}, {"model": {"overrides": {}}}) == []
  assert wd.config_diff({"m": {"o": {"x": 1}}}, {"m": {}}) == [("m.o.x", 1, wd.ABSENT)]
  assert wd.config_diff({"lora": {"rank": 8}}, {"lora": {"rank": 8, "init_from": ""}}) == []
  assert wd.config_diff({"lora": {"init_from": "../a"}}, {"lora": {"init_from": ""}}) == [
      ("lora.init_from", "../a", wd.ABSENT)]


def test_classify():
  assert wd.classify("model.overrides.embed_dim") == "fixed"
  assert wd.classify("data.context_len") == "fixed"
  assert wd.classify("data.delta") == "training"
  assert wd.classify("cer.lambda_ev") == "training"
  assert wd.classify("train.num_steps") == "training"
  assert wd.classify("train.log_every") == "free"
  assert wd.classify("eval.num_examples") == "free"
  assert wd.classify("grid.eval_seed") == "free"


def test_restart_policy_fixed_never_training_only_declared():
  stored = cfg()
  # A model field: refused even when declared.
  with pytest.raises(wd.WorkdirConfigError, match=r"model\.bypass False -> True") as e:
    wd.check_config_change(stored, cfg(model__bypass=True), allow=["model.bypass"])
  assert e.value.fields == ["model.bypass"]
  # Training fields: every undeclared one is named, with the flag that declares them.
  changed = cfg(cer__lambda_ev=0.5, train__learning_rate=2e-3, data__delta=0.6)
  with pytest.raises(wd.WorkdirConfigError) as e:
    wd.check_config_change(stored, changed, allow="cer.lambda_ev")
  assert e.value.fields == ["data.delta", "train.learning_rate"]
  assert "--allow_config_change=data.delta,train.learning_rate" in str(e.value)
  # Declared (a field or a whole section): continues; free fields are reported as free.
  changed.train.log_every = 7
  out = wd.check_config_change(stored, changed, allow=("cer", "train.learning_rate",
                                                       "data.delta"))
  assert [(f, k) for f, _, _, k in out] == [("cer.lambda_ev", "declared"),
                                            ("data.delta", "declared"),
                                            ("train.learning_rate", "declared"),
                                            ("train.log_every", "free")]


def test_check_same_config_and_load_workdir_config(tmp_path):
  w = str(tmp_path / "w")
  assert wd.check_same_config(cfg(model__family="ssm"), w) == []      # nothing stored
  write_config(w, cfg())
  with pytest.raises(wd.WorkdirConfigError, match="model.family 'attention' -> 'ssm'"):
    wd.check_same_config(cfg(model__family="ssm", cer__lambda_ev=0.0), w,
                         fields=wd.FIXED_FIELDS)
  wd.check_same_config(cfg(cer__lambda_ev=0.0), w, fields=wd.FIXED_FIELDS)  # model same
  loaded = wd.load_workdir_config(w)
  assert isinstance(loaded, ml_collections.ConfigDict)
  assert loaded.eval.corruptions == ("value_swap", "evidence_swap", "removal")
  assert wd.config_diff(loaded, cfg()) == []
  from ceu_jax.train import config as config_lib
  config_lib.validate(loaded, 1)                                      # usable as is
  with pytest.raises(wd.WorkdirError, match="not a training workdir"):
    wd.load_workdir_config(str(tmp_path / "none"))


def test_resolve_config_for_an_audit(tmp_path):
  w = str(tmp_path / "cell")
  stored = cfg(model__family="memory_port", cer__regularizer="evidence")
  write_config(w, stored)
  plain = cfg()
  with pytest.raises(wd.WorkdirConfigError) as e:
    wd.resolve_config(plain, w)
  assert e.value.fields == ["cer.regularizer", "model.family"]
  assert "--use_workdir_config" in str(e.value)
  assert "--allow_config_change=cer.regularizer;" in str(e.value)
  assert "model.family define the model and can never differ" in str(e.value)
  logs = []
  used, _ = wd.resolve_config(plain, w, use_workdir_config=True, log=logs.append)
  assert used.model.family == "memory_port" and "ignored" in logs[0]
  # Eval settings may differ; a declared data knob may too.
  ok = cfg(model__family="memory_port", cer__regularizer="evidence", data__delta=0.9)
  ok.eval.num_examples = 64
  used, changes = wd.resolve_config(ok, w, allow="data.delta")
  assert used is ok and {c[0] for c in changes} == {"data.delta", "eval.num_examples"}
  with pytest.raises(wd.WorkdirError, match="--use_workdir_config"):
    wd.resolve_config(None, w)


# ---------------------------------------------------------------- history, evidence, fresh
def test_record_event_appends_history(tmp_path):
  w = str(tmp_path)
  wd.record_event(w, "start", step=0)
  wd.record_event(w, "resume", step=10, changes=[["train.num_steps", 10, 20, "declared"]])
  h = wd.history(w)
  assert [e["event"] for e in h] == ["start", "resume"]
  assert h[1]["changes"][0][0] == "train.num_steps" and h[1]["pid"] == os.getpid()


def _status(w, **st):
  os.makedirs(w, exist_ok=True)
  with open(os.path.join(w, "status.json"), "w") as f:
    json.dump(st, f)


def test_earlier_run_evidence(tmp_path):
  w = str(tmp_path / "w")
  assert wd.earlier_run_evidence(w, 5) == []
  _status(w, status="running", step=3)                   # killed before checkpoint 5
  with open(os.path.join(w, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps({"step": s, "split": "train"}) + "\n" for s in (1, 2, 3)))
    f.write('{"step": 4, "spl')                           # torn line
  assert wd.earlier_run_evidence(w, 5) == []
  _status(w, status="completed", step=20, checkpoint_step=20)
  assert wd.earlier_run_evidence(w, 5) == ["status.json says the run completed at step 20"]
  _status(w, status="running", step=12, checkpoint_step=10)
  assert "a checkpoint was written at step 10" in wd.earlier_run_evidence(w, 5)[0]
  os.remove(os.path.join(w, "status.json"))
  with open(os.path.join(w, "metrics.jsonl"), "a") as f:
    f.write("\n" + json.dumps({"step": 9, "split": "train"}) + "\n")
  assert wd.earlier_run_evidence(w, 5) == ["metrics.jsonl has 4 lines up to step 9"]
  os.makedirs(os.path.join(w, "corrupt_checkpoints", "10_123"))
  assert "corrupt_checkpoints/ holds ['10_123']" in wd.earlier_run_evidence(w, 50)


def test_move_aside_keeps_everything(tmp_path):
  w = str(tmp_path / "w")
  assert wd.move_aside(w) is None
  _status(w, status="completed", step=3)
  os.makedirs(os.path.join(w, "checkpoints", "3"))
  open(os.path.join(w, ".train.lock"), "w").close()
  dest = wd.move_aside(w)
  assert dest.startswith(os.path.join(w, "previous"))
  assert sorted(os.listdir(w)) == [".train.lock", "previous"]
  assert sorted(os.listdir(dest)) == ["checkpoints", "status.json"]
  _status(w, status="completed", step=4)
  dest2 = wd.move_aside(w)
  assert dest2 != dest and os.path.exists(os.path.join(dest, "status.json"))
  assert len(os.listdir(os.path.join(w, "previous"))) == 2


def test_run_info(tmp_path):
  w = str(tmp_path / "w")
  write_config(w, cfg(train__num_steps=3000))
  _status(w, status="preempted", step=810, checkpoint_step=810)
  for s in (500, 810):
    os.makedirs(os.path.join(w, "checkpoints", str(s)))
  os.makedirs(os.path.join(w, "checkpoints", "1000.orbax-checkpoint-tmp-1"))  # uncommitted
  info = wd.run_info(w)
  assert (info["checkpoint_step"], info["num_steps"], info["completed"]) == (810, 3000, False)
  assert "did not complete: status 'preempted' at step 810 of 3000" in info["warning"]
  _status(w, status="completed", step=3000, checkpoint_step=3000)
  os.makedirs(os.path.join(w, "checkpoints", "3000"))
  info = wd.run_info(w)
  assert info["completed"] and info["warning"] is None and info["checkpoint_step"] == 3000


# ---------------------------------------------------------------- locks
HOLD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from ceu_jax import workdir as wd
    with wd.WorkdirLock({w!r}, "train"):
      print("HELD", flush=True)
      time.sleep(60)
""")


def test_lock_refuses_a_second_holder_naming_the_first(tmp_path):
  w = str(tmp_path / "w")
  proc = subprocess.Popen([sys.executable, "-c", HOLD.format(root=ROOT, w=w), "--tag"],
                          stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == "HELD"
    with pytest.raises(wd.WorkdirLocked) as e:
      wd.WorkdirLock(w, "train").acquire()
    msg = str(e.value)
    assert f"pid {proc.pid} on host" in msg and "--tag" in msg and "since 20" in msg
    with wd.WorkdirLock(w, "audit"):                     # another role: independent
      pass
  finally:
    proc.kill()
    proc.wait()
  # The holder was killed (-9): the kernel released the flock; its file still names it.
  logs = []
  with wd.WorkdirLock(w, "train", log=logs.append) as lock:
    assert lock.stale["pid"] == proc.pid
    assert "taking over the stale train lock" in logs[0]
    assert f"pid {proc.pid} is no longer running" in logs[0]
  with wd.WorkdirLock(w, "train", log=logs.append) as lock:  # released cleanly: not stale
    assert lock.stale is None and len(logs) == 1


def test_lock_in_one_process_is_exclusive_too(tmp_path):
  with wd.WorkdirLock(str(tmp_path), "audit"):
    with pytest.raises(wd.WorkdirLocked, match=f"pid {os.getpid()}"):
      wd.WorkdirLock(str(tmp_path), "audit").acquire()


# ---------------------------------------------------------------- progress
def test_progress_eta_from_the_rate_since_the_first_update():
  now = [100.0]
  p = progress.Progress(total=1000, done=200, clock=lambda: now[0])
  assert p.line() == "elapsed 0:00:00, ETA ?"
  now[0] = 130.0                                          # first step done (compiling)
  assert p.update(201) == "elapsed 0:00:30, ETA ?"
  now[0] = 140.0
  assert p.update(301) == "elapsed 0:00:40, ETA 0:01:10"   # 100 steps / 10 s, 699 left
  assert progress.fmt_duration(90061) == "1d 1:01:01"
  assert progress.fmt_duration(None) == "?"
  now[0] = 150.0
  assert p.update(1000).endswith("ETA 0:00:00")
