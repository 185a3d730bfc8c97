"""Acceptance 1: the same tiny CER run on 1 and on 8 fake CPU devices (batch split
over the `data` axis) gives equal losses for 20 steps at the same global batch."""
from __future__ import annotations

import numpy as np

from tests.test_train_helpers import describe, metric_rows, run_train, write_config


def test_same_losses_on_1_and_8_devices(tmp_path):
  cfg = write_config(str(tmp_path))
  losses = {}
  for devices in (1, 8):
    workdir = str(tmp_path / f"devices_{devices}")
    proc = run_train(cfg, workdir, "--config.train.eval_every=0", devices=devices,
                     fast_compile=True)  # compile-bound
    assert proc.returncode == 0, describe(proc)
    rows = metric_rows(workdir, "train")
    assert [r["step"] for r in rows] == list(range(1, 21))
    losses[devices] = {k: np.array([r[k] for r in rows])
                       for k in ("loss", "task_nll", "cer_ev", "grad_norm")}
  for key, one in losses[1].items():
    np.testing.assert_allclose(losses[8][key], one, rtol=1e-5, atol=1e-5, err_msg=key)
