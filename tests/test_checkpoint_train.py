"""Checkpointer retention (latest N + best N, never the newest), digest check,
atomic status file and the SIGTERM/SIGINT handler."""
from __future__ import annotations

import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ceu_jax.train import checkpoint as ckpt_lib


def _state(x: float):
  return {"w": jnp.full((3, 2), x, jnp.float32), "step": jnp.asarray(int(x), jnp.int32)}


def _abstract(state):
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                      state)


def _ckpt(workdir, **kw):
  args = dict(keep_latest=2, keep_best=1, best_metric="em", best_mode="max", async_save=True)
  args.update(kw)
  return ckpt_lib.Checkpointer(str(workdir), **args)


@pytest.mark.parametrize("mode,best", [("max", 2), ("min", 4)])
def test_keeps_latest_and_best_never_deletes_newest(tmp_path, mode, best):
  ck = _ckpt(tmp_path, best_mode=mode)
  em = {1: 0.1, 2: 0.9, 3: 0.5, 4: 0.05, 5: 0.2, 6: None}
  for step, value in em.items():
    ck.save(step, _state(step), {} if value is None else {"em": value})
  ck.close()
  assert sorted(ck.all_steps()) == sorted({best, 5, 6})


def test_best_worse_than_latest_keeps_only_latest(tmp_path):
  ck = _ckpt(tmp_path)
  for step in range(1, 5):
    ck.save(step, _state(step), {"em": float(step)})    # the newest is also the best
  ck.close()
  assert ck.all_steps() == [3, 4]


def test_restore_newest_and_digest_mismatch_falls_back(tmp_path):
  ck = _ckpt(tmp_path, keep_latest=3, keep_best=0)
  for step in (1, 2, 3):
    ck.save(step, _state(step))
  ck.close()
  # Tamper with the newest step's stored digest: the state no longer matches it.
  meta_path = os.path.join(tmp_path, "checkpoints", "3", "meta", "metadata")
  with open(meta_path) as f:
    meta = json.load(f)
  meta["digest"] = "0" * 16 + "-2"
  with open(meta_path, "w") as f:
    json.dump(meta, f)
  ck = _ckpt(tmp_path, keep_latest=3, keep_best=0)
  state, step, _ = ck.restore(_abstract(_state(0)))
  assert step == 2
  np.testing.assert_array_equal(state["w"], _state(2)["w"])
  assert os.listdir(os.path.join(tmp_path, "corrupt_checkpoints"))
  assert ck.all_steps() == [1, 2]
  ck.close()


def test_restore_empty_is_none(tmp_path):
  ck = _ckpt(tmp_path)
  assert ck.restore(_abstract(_state(0))) is None
  ck.close()


def test_digest_exact_and_order_independent():
  a = {"x": jnp.arange(6.0).reshape(2, 3), "y": jnp.ones((4,), jnp.bfloat16)}
  b = jax.tree.map(lambda v: v + 0, a)
  assert ckpt_lib.state_digest(a) == ckpt_lib.state_digest(b)
  c = dict(a, x=a["x"].at[1, 2].set(np.nextafter(np.float32(5.0), np.float32(6.0))))
  assert ckpt_lib.state_digest(a) != ckpt_lib.state_digest(c)
  swapped = dict(a, x=a["x"][::-1])
  assert ckpt_lib.state_digest(a) != ckpt_lib.state_digest(swapped)


def test_status_file_written_atomically(tmp_path):
  ckpt_lib.write_status(str(tmp_path), "diverged", 7, "nan")
  st = ckpt_lib.read_status(str(tmp_path))
  assert (st["status"], st["step"], st["message"]) == ("diverged", 7, "nan")
  assert os.listdir(tmp_path) == ["status.json"]    # no temp file left behind


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_preemption_handler_turns_signal_into_flag(sig):
  before = signal.getsignal(sig)
  with ckpt_lib.PreemptionHandler() as handler:
    assert not handler.should_stop()
    os.kill(os.getpid(), sig)
    assert handler.should_stop() and handler.requested == sig
  assert signal.getsignal(sig) == before
