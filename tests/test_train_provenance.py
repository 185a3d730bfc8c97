"""Workdir provenance in training and loading (issue #13 acceptance 1 and 2), in process.

Two micro runs (4 and 2 steps, a 1-layer 16-wide model, no training-time eval):
- a grid cell of `configs/smoke.py:tiny` (memory_port, baseline) loaded with the
  plain smoke config, with another family and with bypass flipped: each raises
  "trained with a different config" naming the fields, nothing is moved, and a
  later `train` resumes from the cell's checkpoint;
- an attention run: a rerun with other training settings is refused naming every
  field, continues when declared (recorded in provenance.json); a deleted
  checkpoints/ is refused unless fresh (old files moved aside); a held lock refuses;
  a truly corrupt step is skipped by the read-only loader and left in place.
"""
from __future__ import annotations

import hashlib
import os
import shutil

import ml_collections
import pytest

from ceu_jax import workdir as wd
from ceu_jax.grid import sweep
from ceu_jax.train import checkpoint as ckpt_lib
from ceu_jax.train import load_checkpoint, load_trained_params, train_and_evaluate
from configs import smoke

SMALL = dict(embed_dim=16, reader_mlp_dim=32, enc_mlp_dim=32, reader_heads=2, reader_layers=1,
             read_heads=2, read_head_dim=8, mem_dim=16)


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def _micro(c, steps: int):
  c.model.overrides = dict(SMALL)
  t = c.train
  t.num_steps, t.batch_size, t.warmup_steps = steps, 8, 1
  t.eval_every, t.checkpoint_every, t.log_every = 0, 2, 1
  t.keep_latest, t.keep_best = 3, 0
  c.eval.num_examples, c.eval.batch_size = 8, 8
  return c


def _clone(config) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(config.to_dict())


def _files(workdir: str) -> dict[str, str]:
  """{relative path: sha1} of every file under checkpoints/ (what must stay untouched)."""
  out = {}
  root = os.path.join(workdir, "checkpoints")
  for d, _, names in os.walk(root):
    for n in names:
      p = os.path.join(d, n)
      with open(p, "rb") as f:
        out[os.path.relpath(p, root)] = hashlib.sha1(f.read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def cell_run(tmp_path_factory):
  """A smoke:tiny grid cell (memory_port, baseline) trained 2 steps in cells/<id>/train."""
  base = _micro(smoke.get_config("tiny"), 2)
  cell = [c for c in sweep.expand(base) if c.config.model.family == "memory_port"
          and c.config.cer.regularizer == "none"][0]
  workdir = str(tmp_path_factory.mktemp("grid") / "cells" / cell.cell_id / "train")
  train_and_evaluate(cell.config, workdir)
  return cell.config, workdir


def test_loading_with_another_config_names_fields_touches_nothing_and_train_resumes(
    cell_run, tmp_path):
  config, original = cell_run
  workdir = str(tmp_path / "train")
  shutil.copytree(original, workdir)
  before = _files(workdir)
  assert wd.checkpoint_steps(workdir) == [2]
  plain = smoke.get_config()                         # the README's plain smoke config
  other_family = _micro(smoke.get_config("tiny"), 2)  # attention, else identical
  flipped = _clone(config)
  flipped.model.bypass = True
  for cfg, fields in ((plain, {"model.family", "model.overrides.embed_dim"}),
                      (other_family, {"model.family"}), (flipped, {"model.bypass"})):
    with pytest.raises(wd.WorkdirConfigError,
                       match="this workdir .* was trained with a different config") as e:
      load_trained_params(cfg, workdir)
    assert fields <= set(e.value.fields), e.value.fields
    assert set(e.value.fields) <= {f for f, _, _ in wd.config_diff(config, cfg)}
  # The audit job (experiments.audit's library call) stops the same way, and the entry
  # point's config check names every differing field before loading anything.
  from ceu_jax import audit_job  # pylint: disable=g-import-not-at-top
  with pytest.raises(wd.WorkdirConfigError, match="model.family 'memory_port' -> 'attention'"):
    audit_job.run_audit(plain, workdir, data_dir=str(tmp_path / "evalsets"))
  with pytest.raises(wd.WorkdirConfigError, match="--use_workdir_config") as e:
    wd.resolve_config(plain, workdir)
  assert {"model.family", "train.num_steps"} <= set(e.value.fields)
  used, _ = wd.resolve_config(None, workdir, use_workdir_config=True)
  assert used.model.family == "memory_port" and used.model.overrides.embed_dim == 16
  assert _files(workdir) == before                   # every checkpoint byte in place
  assert not os.path.exists(os.path.join(workdir, "corrupt_checkpoints"))
  assert not os.path.exists(os.path.join(workdir, "audit"))
  # Without config.json the stored array layout still tells (and nothing moves).
  os.rename(os.path.join(workdir, "config.json"), os.path.join(tmp_path, "config.json"))
  with pytest.raises(wd.WorkdirConfigError, match=r"arrays of its checkpoint step 2 differ"):
    load_trained_params(other_family, workdir)
  assert _files(workdir) == before
  os.rename(os.path.join(tmp_path, "config.json"), os.path.join(workdir, "config.json"))
  # A later train resumes from the cell's checkpoint (a declared longer run).
  longer = _clone(config)
  longer.train.num_steps = 4
  out = train_and_evaluate(longer, workdir, allow_config_change="train.num_steps")
  assert out["step"] == 4
  resume = wd.history(workdir)[-1]
  assert (resume["event"], resume["step"]) == ("resume", 2)
  assert resume["changes"] == [["train.num_steps", 2, 4, "declared"]]
  assert wd.checkpoint_steps(workdir) == [2, 4]
  loaded = load_checkpoint(longer, workdir)
  assert loaded.step == 4 and loaded.run["completed"] and loaded.run["checkpoint_step"] == 4


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
  from configs import atr_insert
  c = atr_insert.get_config("tiny,context_len=64")
  c.data.num_passages = 4
  c.data.n_ids = c.data.n_keys = c.data.n_values = 8
  c = _micro(c, 4)
  c.eval.corruptions = ("value_swap",)
  workdir = str(tmp_path_factory.mktemp("attention") / "run")
  train_and_evaluate(c, workdir)
  return c, workdir


def _copy(run, tmp_path):
  config, original = run
  workdir = str(tmp_path / "run")
  shutil.copytree(original, workdir)
  return _clone(config), workdir


def test_rerun_with_other_training_settings_is_refused_or_declared(attention_run, tmp_path):
  config, workdir = _copy(attention_run, tmp_path)
  st = wd.read_status(workdir)
  assert (st["status"], st["step"], st["checkpoint_step"], st["num_steps"]) == (
      "completed", 4, 4, 4)
  config.train.learning_rate = 1e-2
  config.cer.regularizer, config.cer.lambda_ev = "evidence", 0.5
  config.train.num_steps = 6
  config.data.delta = 0.6
  with pytest.raises(wd.WorkdirConfigError) as e:
    train_and_evaluate(config, workdir, allow_config_change=["cer"])
  assert e.value.fields == ["data.delta", "train.learning_rate", "train.num_steps"]
  assert "--allow_config_change=data.delta,train.learning_rate,train.num_steps" in str(e.value)
  assert wd.history(workdir)[-1]["event"] == "start"          # nothing recorded, no training
  assert wd.read_status(workdir)["status"] == "completed"
  # The same set, a model field too: named, never allowed.
  config.model.bypass = True
  with pytest.raises(wd.WorkdirConfigError, match="model.bypass False -> True"):
    train_and_evaluate(config, workdir, allow_config_change="model.bypass")
  config.model.bypass = False
  config.cer.regularizer, config.cer.lambda_ev = "none", 1.0
  config.data.delta = 0.3
  out = train_and_evaluate(config, workdir,
                           allow_config_change="train.learning_rate,train.num_steps")
  assert out["step"] == 6
  event = wd.history(workdir)[-1]
  assert (event["event"], event["step"]) == ("resume", 4)
  assert [c[0] for c in event["changes"]] == ["train.learning_rate", "train.num_steps"]
  stored = wd.read_config_json(workdir)
  assert stored["train"]["learning_rate"] == 1e-2 and stored["train"]["num_steps"] == 6


def test_no_checkpoint_but_an_earlier_run_is_refused_unless_fresh(attention_run, tmp_path):
  config, workdir = _copy(attention_run, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  with pytest.raises(wd.EarlierRunError, match="status.json says the run completed at step 4"):
    train_and_evaluate(config, workdir)
  assert sorted(os.listdir(workdir)) == sorted(
      [".train.lock", "config.json", "metrics.jsonl", "provenance.json", "status.json",
       "tensorboard"])      # refused before Orbax makes an empty checkpoints/
  out = train_and_evaluate(config, workdir, fresh=True)
  assert out["step"] == 4 and wd.checkpoint_steps(workdir) == [2, 4]
  previous = os.path.join(workdir, "previous")
  (moved,) = os.listdir(previous)
  kept = sorted(os.listdir(os.path.join(previous, moved)))
  assert {"status.json", "metrics.jsonl", "config.json", "provenance.json"} <= set(kept)
  assert [e["event"] for e in wd.history(workdir)] == ["start"]   # a new history


def test_second_train_on_a_locked_workdir_is_refused(attention_run, tmp_path):
  config, workdir = _copy(attention_run, tmp_path)
  with wd.WorkdirLock(workdir, "train"):
    with pytest.raises(wd.WorkdirLocked, match=rf"train lock of .* is locked by another "
                                               rf"process \(pid {os.getpid()} on host"):
      train_and_evaluate(config, workdir)


def test_read_only_load_skips_a_corrupt_step_and_leaves_it(attention_run, tmp_path):
  config, workdir = _copy(attention_run, tmp_path)
  root = os.path.join(workdir, "checkpoints", "4", "state")
  for d, _, names in os.walk(root):
    for n in names:
      p = os.path.join(d, n)
      with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) // 2)
  loaded = load_checkpoint(config, workdir)
  assert loaded.step == 2
  assert wd.checkpoint_steps(workdir) == [2, 4]
  assert not os.path.exists(os.path.join(workdir, "corrupt_checkpoints"))
  with pytest.raises(ckpt_lib.CheckpointError, match="no checkpoint"):
    load_checkpoint(config, str(tmp_path / "empty"))


def test_a_layout_mismatch_names_the_code_that_wrote_the_run(tmp_path):
  """With the same config a checkpoint's arrays can differ because the code changed (a
  preset's widths): the refusal names the commit the run's provenance records, which
  loads it, when it is not this code's; nothing when it is, or when none is known."""
  from ceu_jax import code_version  # pylint: disable=g-import-not-at-top
  from ceu_jax import io as ceu_io  # pylint: disable=g-import-not-at-top
  here = code_version.code_version()
  if not here.get("commit"):
    pytest.skip("this code is not a git checkout: no commit to compare")
  w = str(tmp_path)
  assert ckpt_lib._other_code_hint(w) == ""                     # no provenance
  wd.record_event(w, "start")
  assert ckpt_lib._other_code_hint(w) == ""                     # written by this code
  other = dict(here, commit="ab" * 20, dirty=False)
  ceu_io.write_json_atomic(os.path.join(w, wd.PROVENANCE_FILE),
                          {"history": [{"event": "start", "code": other}]})
  hint = ckpt_lib._other_code_hint(w)
  assert "written by ceu_jax" in hint and "at commit abababababab" in hint
  assert code_version.describe(here) in hint
