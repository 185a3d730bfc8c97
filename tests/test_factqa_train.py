"""data.task = 'factqa' end to end: a few training steps, then the audit, on a micro config."""
from __future__ import annotations

import json
import os

import pytest

import configs.factqa
from ceu_jax import audit_job
from ceu_jax.data import tasks
from ceu_jax.train import config as config_lib
from ceu_jax.train import loop


pytestmark = pytest.mark.usefixtures("fast_compiled_module")  # compile-bound: most XLA optimisations off


def _micro_config():
  c = configs.factqa.get_config("tiny")
  c.data.context_len = 128
  t = c.train
  t.num_steps, t.batch_size, t.warmup_steps, t.learning_rate = 4, 8, 1, 3e-3
  t.log_every, t.eval_every, t.checkpoint_every = 2, 4, 4
  t.keep_latest, t.keep_best = 1, 1
  c.cer.regularizer, c.cer.k = "evidence", 2
  e = c.eval
  e.num_examples, e.batch_size, e.num_resamples = 8, 8, 10
  e.corruptions = ("value_swap", "paraphrase")
  c.model.overrides = dict(embed_dim=16, reader_mlp_dim=32, enc_mlp_dim=32, read_heads=2,
                           read_head_dim=8, reader_heads=2, reader_layers=1)
  return c


def test_config_validation_is_per_task():
  c = _micro_config()
  config_lib.validate(c, 1)
  assert tasks.get("factqa").config_cls.__name__ == "FactQAConfig"
  c.eval.corruptions = ("no_such_corruption",)
  with pytest.raises(ValueError, match="eval.corruptions"):
    config_lib.validate(c, 1)
  c = _micro_config()
  c.data.num_passages = 3
  with pytest.raises(ValueError, match="data.context_len"):
    config_lib.validate(c, 1)
  c = _micro_config()
  c.data.task = "nope"
  with pytest.raises(ValueError, match="data.task"):
    config_lib.validate(c, 1)


def test_train_then_audit_write_outputs(tmp_path):
  c, workdir = _micro_config(), str(tmp_path / "run")
  loop.train_and_evaluate(c, workdir)
  with open(os.path.join(workdir, "status.json")) as f:
    assert json.load(f)["status"] == "completed"
  assert os.path.exists(os.path.join(workdir, "metrics.jsonl"))
  summary = audit_job.run_audit(c, workdir, log=lambda *_: None)
  assert set(summary["corruptions"]) == {"value_swap", "paraphrase"}
  for name in ("examples.csv", "summary.json"):
    assert os.path.exists(os.path.join(workdir, "audit", name))
  em = summary["corruptions"]["value_swap"]["accuracy"]["em"]["value"]
  assert 0.0 <= em <= 1.0
