"""Issue #34.6: the audit's own settings and validator (nothing compiles here).

ε of the audit is `eval.eps` (CER training keeps `cer.eps`), probes per vmapped
chunk are `eval.probe_chunk` ('auto' = the engine's measured rule, or an int),
and `ceu_jax.audit_config.validate` checks what an audit reads (data, model,
eval, sharding) with one-line errors naming the field, before the workdir is
looked at. A config recorded before these fields existed is read in today's form
(`upgrade`) with the values its audits used.
"""
from __future__ import annotations

import json
import os

import pytest

from ceu_jax import audit_config, auditor, workdir as wd
from configs import atr_insert


def _tiny():
  return atr_insert.get_config("tiny")


def _set(config, path: str, value):
  *parents, leaf = path.split(".")
  node = config
  for p in parents:
    node = node[p]
  with node.ignore_type():
    node[leaf] = value
  return config


BAD = [  # (field, value, what the one-line error starts with)
    ("eval.eps", 0.0, "eval.eps must be a number > 0, got 0.0"),
    ("eval.eps", -1e-3, "eval.eps must be a number > 0"),
    ("eval.eps", "small", "eval.eps must be a number > 0"),
    ("eval.probe_chunk", 0, "eval.probe_chunk must be 'auto' or an integer >= 1, got 0"),
    ("eval.probe_chunk", 2.5, "eval.probe_chunk must be 'auto' or an integer >= 1"),
    ("eval.probe_chunk", True, "eval.probe_chunk must be 'auto' or an integer >= 1"),
    ("eval.probe_chunk", "big", "eval.probe_chunk must be 'auto' or an integer >= 1"),
    ("eval.batch_size", 0, "eval.batch_size must be an integer >= 1"),
    ("eval.seed", -1, "eval.seed must be an integer >= 0"),
    ("eval.num_examples", 100, "eval.num_examples (100) must be a multiple of eval.batch_size"),
    ("eval.num_resamples", -2, "eval.num_resamples must be an integer >= 0"),
    ("eval.corruptions", ("value_swap", "typo"), "eval.corruptions must be a non-empty subset"),
    ("eval.corruptions", (), "eval.corruptions must be a non-empty tuple"),
    ("model.family", "rnn", "model.family"),
    ("data.task", "factqa_v9", "data.task must be one of"),
    ("sharding.mesh_shape", (3,), "sharding.mesh_shape (3,) does not divide the device count"),
]


@pytest.mark.parametrize("field,value,message", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_bad_audit_values_are_one_line_naming_the_field(field, value, message, tmp_path):
  config = _set(_tiny(), field, value)
  with pytest.raises(ValueError) as e:
    audit_config.validate(config, num_devices=8)
  assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
  # experiments.audit: the same line before the workdir is looked at (none is created)
  from ceu_jax import audit_job  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="^" + field.replace(".", r"\.")):
    audit_job.run_audit(config, str(tmp_path / "missing"))
  assert not os.path.exists(tmp_path / "missing")


def test_the_audit_validates_only_what_it_reads():
  config = _tiny()
  with config.unlocked():
    del config["train"], config["cer"]         # training's sections: not the audit's
  audit_config.validate(config, num_devices=1)
  with pytest.raises(ValueError, match="^eval is missing from the config"):
    audit_config.validate(atr_insert.ml_collections.ConfigDict(
        {k: v for k, v in config.items() if k != "eval"}))
  with config.unlocked():
    del config.eval["eps"]
  with pytest.raises(ValueError, match=r"^eval\.eps is missing"):
    audit_config.validate(config)


def test_audit_eps_is_eval_eps_not_cer_eps():
  config = _tiny()
  assert config.eval.eps == config.cer.eps == 1e-3      # the default is unchanged
  config.cer.eps = 0.25                                 # CER training's ε
  settings = auditor.AuditSettings.of_config(config)
  assert settings.eps == 1e-3 and settings.probe_chunk == "auto"
  config.eval.eps = 0.01
  config.eval.probe_chunk = 4                           # 'auto' or an int, one field
  settings = auditor.AuditSettings.of_config(config)
  assert (settings.eps, settings.probe_chunk) == (0.01, 4)
  with pytest.raises(ValueError, match=r"^eval\.probe_chunk must be"):
    auditor.AuditSettings(probe_chunk=0)


def test_probe_chunk_from_the_command_line_is_an_int_or_auto():
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  def parse(*args):
    argv = ["prog", *args]
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_dict("config", _tiny(), flag_values=values,
                                             sys_argv=argv)
    values(argv)
    return holder.value.eval
  e = parse("--config.eval.probe_chunk=8", "--config.eval.eps=0.01")
  assert (e.probe_chunk, e.eps) == (8, 0.01)
  assert parse("--config.eval.probe_chunk=auto").probe_chunk == "auto"


def _recorded_before_34(config) -> dict:
  """W/config.json as runs before eval.probe_chunk / eval.eps wrote it."""
  stored = json.loads(config.to_json_best_effort())
  del stored["eval"]["probe_chunk"], stored["eval"]["eps"]
  stored["eval"]["chunk_size"] = 16
  return stored


def test_an_earlier_workdir_still_resumes_and_audits(tmp_path):
  """W/config.json without eval.eps: training resumes (eval fields are free: the
  change is recorded), an audit with --config accepts it, and --use_workdir_config
  reads it with the ε and probe chunk its audits used."""
  w = str(tmp_path)
  config = _tiny()
  config.cer.eps = 0.002
  with open(os.path.join(w, wd.CONFIG_FILE), "w") as f:
    json.dump(_recorded_before_34(config), f)
  rerun = _tiny()
  rerun.cer.eps = 0.002
  changes = wd.check_same_config(rerun, w)                 # training's restart rule
  assert [(f, kind) for f, _, _, kind in changes] == [
      ("eval.chunk_size", "free"), ("eval.eps", "free"), ("eval.probe_chunk", "free")]
  _, changes = wd.resolve_config(rerun, w)                 # an audit with --config
  assert [f for f, _, _, _ in changes] == ["eval.chunk_size", "eval.eps", "eval.probe_chunk"]
  stored = audit_config.upgrade(wd.load_workdir_config(w))     # --use_workdir_config
  audit_config.validate(stored, num_devices=1)
  assert "chunk_size" not in stored.eval
  assert (stored.eval.probe_chunk, stored.eval.eps) == (16, 0.002)
  assert audit_config.upgrade(config) is config                 # today's config: as is
