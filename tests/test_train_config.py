"""Acceptance 8: bad configs are rejected before anything compiles, naming the field;
resuming with a changed architecture, n or task names the field."""
from __future__ import annotations

import json
import os

import jax
import pytest

from ceu_jax.train import config as config_lib
from ceu_jax.train import loop
from configs import atr_insert


def _tiny():
  return atr_insert.get_config("tiny")


def _set(path: str, value):
  def edit(c):
    *parents, leaf = path.split(".")
    node = c
    for p in parents:
      node = node[p]
    with node.unlocked() if hasattr(node, "unlocked") else _null():
      node[leaf] = value
  return edit


class _null:
  def __enter__(self):
    return self

  def __exit__(self, *a):
    return False


BAD = [  # (edit, field named in the error)
    (_set("train.bogus", 1), "train.bogus"),
    (_set("cer.lamda_ev", 1.0), "cer.lamda_ev"),
    (_set("extra_section", {}), "extra_section"),
    (_set("model.width", 3), "model.width"),
    (_set("data.n_colors", 3), "data"),
    (_set("cer.lambda_ev", -1.0), "cer.lambda_ev"),
    (_set("cer.lambda_dis", -0.5), "cer.lambda_dis"),
    (_set("cer.beta_swap", -0.1), "cer.beta_swap"),
    (_set("cer.lambda_noret", -2.0), "cer.lambda_noret"),
    (_set("cer.alpha", 0.0), "cer.alpha"),
    (_set("cer.alpha", 1.5), "cer.alpha"),
    (_set("cer.k", 0), "cer.k"),
    (_set("cer.k", 4), "cer.k"),
    (_set("cer.regularizer", "both"), "cer.regularizer"),
    (_set("cer.grad_path", "denominator"), "cer.grad_path"),
    (_set("cer.swap_form", "margin"), "cer.swap_form"),
    (_set("cer.corruption", "paraphrase"), "cer.corruption"),
    (_set("cer.eps", 0.0), "cer.eps"),
    (_set("model.read_port", 5), "model.read_port"),
    (_set("cer.site", -1), "cer.site is an unknown field"),
    (_set("train.batch_size", 0), "train.batch_size"),
    (_set("train.learning_rate", -1e-3), "train.learning_rate"),
    (_set("train.warmup_steps", 10**6), "train.warmup_steps"),
    (_set("train.keep_latest", 0), "train.keep_latest"),
    (_set("train.debug_kill", "now"), "train.debug_kill"),
    (_set("eval.best_metric", "f1"), "eval.best_metric"),
    (_set("eval.eps", 0.0), "eval.eps"),
    (_set("eval.probe_chunk", 0), "eval.probe_chunk"),
    (_set("eval.chunk_size", 16), "eval.chunk_size is an unknown field"),
    (_set("eval.num_examples", 100), "eval.num_examples"),
    (_set("eval.corruptions", ("value_swap", "typo")), "eval.corruptions"),
    (_set("data.task", "factqa_v9"), "data.task"),
    (_set("data.eta", 1.5), "data.eta"),
    (_set("data.context_len", 100), "data.context_len"),
    (_set("model.family", "rnn"), "model.family"),
    (_set("model.preset", "huge"), "model.preset"),
    (_set("sharding.mesh_shape", (3,)), "sharding.mesh_shape"),
    (_set("sharding.mesh_shape", (-1, 2)), "sharding.mesh_axes"),
    (_set("sharding.logical_axis_rules", (("batch", "model"),)), "sharding.logical_axis_rules"),
    (_set("sharding.logical_axis_rules", (("bogus", None),)), "sharding.logical_axis_rules"),
    (_set("seed", -3), "seed"),
]


def _both(*edits):
  def edit(c):
    for e in edits:
      e(c)
  return edit


BAD += [
    (_both(_set("cer.regularizer", "evidence_distractor"), _set("cer.k", 1)), "cer.k"),
    (_both(_set("cer.beta_swap", 1.0), _set("cer.gamma", 0.0)), "cer.gamma"),
]


@pytest.mark.parametrize("edit,field", BAD, ids=[f for _, f in BAD])
def test_bad_config_rejected_before_compiling(edit, field, tmp_path, monkeypatch):
  config = _tiny()
  edit(config)
  compiled = []
  monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a) or (lambda *x: None))
  workdir = str(tmp_path / "w")
  with pytest.raises(ValueError) as info:
    loop.train_and_evaluate(config, workdir)
  assert str(info.value).startswith(field) or f"{field}" in str(info.value).split(" ")[0], (
      field, str(info.value))
  assert not compiled and not os.path.exists(workdir)


def test_mesh_must_divide_device_count():
  config = _tiny()
  config.sharding.mesh_shape = (3,)
  with pytest.raises(ValueError, match=r"^sharding\.mesh_shape .* device count 8"):
    config_lib.validate(config, num_devices=8)
  config.sharding.mesh_shape = (-1,)
  config.train.batch_size = 12
  with pytest.raises(ValueError, match=r"^train\.batch_size"):
    config_lib.validate(config, num_devices=8)


def test_good_configs_pass():
  for arg in ("tiny", "base", "tiny,family=ssm,bypass=true", "tiny,family=memory_port"):
    config_lib.validate(atr_insert.get_config(arg), num_devices=1)
  config = _tiny()
  with config.unlocked():
    config.grid = {"corruption": "value_swap"}     # the grid runner's own section
  config_lib.validate(config, num_devices=8)


@pytest.mark.parametrize("edit,field", [
    (_set("model.family", "ssm"), "model.family"),
    (_set("model.bypass", True), "model.bypass"),
    (_set("model.preset", "p400k"), "model.preset"),
    (_set("data.context_len", 256), "data.context_len"),
    (_set("data.task", "factqa"), "data.task"),
])
def test_resume_with_changed_architecture_n_or_task_names_field(edit, field, tmp_path):
  workdir = str(tmp_path)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config_lib.to_json(_tiny()))
  changed = _tiny()
  edit(changed)
  with pytest.raises(ValueError, match=rf"trained with a different config: {field} "):
    with open(os.path.join(workdir, "config.json")) as f:
      config_lib.check_resume_compatible(json.load(f), changed)
  config_lib.check_resume_compatible(json.load(open(os.path.join(workdir, "config.json"))),
                                     _tiny())   # unchanged: fine


def test_resume_check_runs_in_train_and_evaluate(tmp_path):
  workdir = str(tmp_path)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config_lib.to_json(_tiny()))
  changed = _tiny()
  changed.model.family = "ssm"
  with pytest.raises(ValueError, match=r"different config: model\.family 'attention' -> 'ssm'"):
    loop.train_and_evaluate(changed, workdir)
  assert sorted(os.listdir(workdir)) == [".train.lock", "config.json"]  # nothing else written
